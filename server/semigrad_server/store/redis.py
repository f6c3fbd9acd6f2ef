"""Graphs in a Redis server that every replica shares (`--store redis://host:port/db`).

A tenant's graphs are three keys, one hash slot (the `{tenant}` hash tag): a hash id -> serialised
graph, a sorted set of ids by registration order (eviction takes the oldest), and the byte count.
Registration, with its quota check and eviction, is one Lua script: atomic however many replicas
write at once. A registration is acknowledged once Redis answered, so it is only as durable as
Redis's own persistence: run Redis with `appendonly yes` and `appendfsync always` (every write
fsync'd before Redis answers; `everysec` may lose the last second on a crash of the host) and
`maxmemory-policy noeviction` (a full Redis refuses writes: RESOURCE_EXHAUSTED; an evicting policy
would drop graphs silently), see docs/deploying.md. The server warns at start when the Redis it
is given is set otherwise.
"""

from __future__ import annotations

import logging
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .. import deadline
from ..errors import DeadlineExceeded, ResourceExhausted, Unavailable
from .base import Quota, StoreUsage, refuse

log = logging.getLogger("semigrad.store")

PREFIX = "semigrad:v1"

# KEYS: graphs hash, order zset, bytes counter, sequence counter.
# ARGV: id, data, capacity, max graphs (0: none), max bytes (0: none).
# Returns 0 (present), 1 (stored), {-1, graphs} or {-2, bytes} (quota).
PUT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
local n = redis.call('HLEN', KEYS[1])
local b = tonumber(redis.call('GET', KEYS[3]) or '0')
local size = string.len(ARGV[2])
local max_graphs, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
if max_graphs > 0 and n + 1 > max_graphs then return {-1, n} end
if max_bytes > 0 and b + size > max_bytes then return {-2, b} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('INCRBY', KEYS[3], size)
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[1])
local capacity = tonumber(ARGV[3])
while redis.call('ZCARD', KEYS[2]) > capacity do
  local old = redis.call('ZPOPMIN', KEYS[2])[1]
  redis.call('DECRBY', KEYS[3], redis.call('HSTRLEN', KEYS[1], old))
  redis.call('HDEL', KEYS[1], old)
end
return 1
"""

# KEYS: graphs hash, order zset, bytes counter. ARGV: id. Returns 1 when deleted.
DELETE = """
local size = redis.call('HSTRLEN', KEYS[1], ARGV[1])
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DECRBY', KEYS[3], size)
return 1
"""


TRANSIENT_REPLIES = ("READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")  # Redis errors that pass with a failover

SOCKET_TIMEOUT = 10.0  # seconds a Redis command may take outside any call (at start-up); a call's deadline bounds it
CONNECT_TIMEOUT = 5.0


def bounded(connection_class: type) -> type:
    """`connection_class` (redis-py's TCP, TLS or unix-socket connection) whose every send and
    read waits at most until the deadline of the call the thread is serving (deadline.py): a
    Redis that stopped answering (SIGSTOP, a full host, a partition) holds a request thread no
    longer than its client waits, instead of SOCKET_TIMEOUT. Past the deadline it raises
    DeadlineExceeded before sending; a read that times out drops the connection (redis-py
    does), so a late answer is never read as the next command's."""

    class Bounded(connection_class):
        def _within_deadline(self) -> None:
            until = deadline.deadline()
            if until is None:
                timeout = SOCKET_TIMEOUT
            else:
                timeout = min(SOCKET_TIMEOUT, until - time.monotonic())
                if timeout <= 0:  # an answer may be on its way: drop the connection, never read it later
                    self.disconnect()
                    raise DeadlineExceeded(f"deadline exceeded waiting for the graph store ({describe(self)})")
            self.socket_timeout = timeout
            self.socket_connect_timeout = min(CONNECT_TIMEOUT, timeout)
            self.update_current_socket_timeout(timeout)  # the open socket's, when there is one

        def send_packed_command(self, command, check_health=True):
            self._within_deadline()
            return super().send_packed_command(command, check_health)

        def read_response(self, *args, **kwargs):
            self._within_deadline()
            return super().read_response(*args, **kwargs)

    Bounded.__name__ = Bounded.__qualname__ = f"Bounded{connection_class.__name__}"
    return Bounded


def describe(connection) -> str:
    where = getattr(connection, "path", None) or f"{getattr(connection, 'host', '?')}:{getattr(connection, 'port', '')}"
    return f"Redis at {where}/{getattr(connection, 'db', 0)}"


class RedisGraphStore:
    name = "redis"

    def __init__(self, url: str):
        self.url = url
        # One retry at once after a dropped connection or a timeout (redis-py's default for
        # retry_on_timeout), never a backoff sleep: the call's deadline bounds every wait.
        pool = redis.ConnectionPool.from_url(url, socket_timeout=SOCKET_TIMEOUT,
                                             socket_connect_timeout=CONNECT_TIMEOUT, health_check_interval=30,
                                             retry_on_timeout=True, retry=Retry(NoBackoff(), 1))
        pool.connection_class = bounded(pool.connection_class)
        self._redis = redis.Redis(connection_pool=pool)
        self._put = self._redis.register_script(PUT)
        self._delete = self._redis.register_script(DELETE)
        self._warn_unless_durable()

    def _warn_unless_durable(self) -> None:
        try:
            appendonly = self._redis.config_get("appendonly").get("appendonly")
            fsync = self._redis.config_get("appendfsync").get("appendfsync")
            policy = self._redis.config_get("maxmemory-policy").get("maxmemory-policy")
        except redis.RedisError:  # CONFIG disabled (managed Redis) or unreachable yet: nothing to say
            return
        if policy != "noeviction":
            log.warning("Redis at %s evicts keys when full (maxmemory-policy %s): registered graphs could vanish; "
                        "use noeviction (a full store then refuses registrations; see docs/deploying.md)",
                        self._where(), policy)
        if appendonly != "yes":
            log.warning("Redis at %s runs without appendonly: acknowledged registrations may be lost on a restart "
                        "(see docs/deploying.md)", self._where())
        elif fsync != "always":
            log.warning("Redis at %s fsyncs its log %s: a crash of its host may lose the last registrations "
                        "(appendfsync always; see docs/deploying.md)", self._where(), fsync)

    def _where(self) -> str:
        kwargs = self._redis.connection_pool.connection_kwargs
        return f"{kwargs.get('host', kwargs.get('path', '?'))}:{kwargs.get('port', '')}/{kwargs.get('db', 0)}"

    @staticmethod
    def _keys(tenant: str) -> list[str]:
        tag = "{" + tenant.replace("}", "%7D") + "}"
        return [f"{PREFIX}:{tag}:graphs", f"{PREFIX}:{tag}:order", f"{PREFIX}:{tag}:bytes", f"{PREFIX}:{tag}:seq"]

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except redis.ConnectionError as e:
            raise Unavailable(f"the graph store (Redis at {self._where()}) is unreachable: {e}") from None
        except redis.TimeoutError as e:
            if deadline.current() is not None and deadline.current().expired():
                raise DeadlineExceeded(f"deadline exceeded waiting for the graph store (Redis at {self._where()})") \
                    from None
            raise Unavailable(f"the graph store (Redis at {self._where()}) timed out: {e}") from None
        except redis.exceptions.OutOfMemoryError as e:  # Redis at its maxmemory (with a noeviction policy)
            raise ResourceExhausted(f"the graph store (Redis at {self._where()}) is full: {e}") from None
        except redis.ResponseError as e:
            # A Redis that cannot take the command now: a replica (READONLY: the primary it was failed
            # over from, or a URL naming a replica), a replica cut off from its primary (MASTERDOWN),
            # a cluster mid-failover (TRYAGAIN, CLUSTERDOWN). The store is unusable for the moment,
            # as if unreachable, not a bug of this server: UNAVAILABLE, which clients retry. Idle
            # connections are dropped, so the next call connects afresh (the name may now lead
            # to the new primary).
            if not isinstance(e, redis.exceptions.ReadOnlyError) and not str(e).startswith(TRANSIENT_REPLIES):
                raise
            self._redis.connection_pool.disconnect(inuse_connections=False)
            raise Unavailable(f"the graph store (Redis at {self._where()}) cannot take the command now: {e}") from None

    def put(self, tenant: str, key: str, data: bytes, quota: Quota) -> bool:
        result = self._call(self._put, keys=self._keys(tenant), args=[key, data, quota.capacity, quota.graphs,
                                                                      quota.bytes])
        if isinstance(result, list):
            code, have = int(result[0]), int(result[1])
            if code == -1:
                raise refuse(tenant, "graphs", have, 1, quota.graphs)
            raise refuse(tenant, "bytes", have, len(data), quota.bytes)
        return int(result) == 1

    def get(self, tenant: str, key: str) -> bytes | None:
        return self._call(self._redis.hget, self._keys(tenant)[0], key)

    def contains(self, tenant: str, key: str) -> bool:
        return bool(self._call(self._redis.hexists, self._keys(tenant)[0], key))

    def delete(self, tenant: str, key: str) -> bool:
        return int(self._call(self._delete, keys=self._keys(tenant)[:3], args=[key])) == 1

    def usage(self, tenant: str) -> StoreUsage:
        keys = self._keys(tenant)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hlen(keys[0])
        pipe.get(keys[2])
        graphs, nbytes = self._call(pipe.execute)
        return StoreUsage(int(graphs), int(nbytes or 0))

    def close(self) -> None:
        self._redis.close()

