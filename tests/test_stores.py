"""The graph stores behind one interface (memory, SQLite, Redis): tenant scoping, per-tenant
eviction and quotas, atomic quota checks under concurrent writers, sharing between processes
or replicas, and durability of acknowledged writes (Redis killed with -9 and restarted)."""

from __future__ import annotations

import threading

import pytest
from redis_server import running_redis
from semigrad_server.errors import ResourceExhausted
from semigrad_server.store import MemoryGraphStore, Quota, SqliteGraphStore, open_store

UNBOUNDED = Quota()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture(params=["memory", "sqlite", "redis"])
def make_store(request, tmp_path):
    """A factory of stores on one backing (two calls: two handles on the same data, like two
    workers or replicas, except for memory, which is one process's own)."""
    made = []

    def make():
        if request.param == "memory":
            store = made[0] if made else MemoryGraphStore()
        elif request.param == "sqlite":
            store = SqliteGraphStore(tmp_path / "graphs.sqlite")
        else:
            import redis

            url = request.getfixturevalue("redis_url")
            if not made:
                redis.Redis.from_url(url).flushdb()
            store = open_store(url)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def test_put_get_delete(make_store):
    store = make_store()
    assert store.put("a", "g1", b"one", UNBOUNDED) is True
    assert store.put("a", "g1", b"one", UNBOUNDED) is False  # present: not stored again
    assert store.get("a", "g1") == b"one" and store.contains("a", "g1")
    assert store.get("a", "g2") is None and not store.contains("a", "g2")
    assert store.usage("a").graphs == 1 and store.usage("a").bytes == 3
    assert store.delete("a", "g1") is True
    assert store.delete("a", "g1") is False
    assert store.get("a", "g1") is None and store.usage("a").graphs == 0 and store.usage("a").bytes == 0


def test_tenants_see_only_their_own_graphs(make_store):
    store = make_store()
    store.put("a", "g", b"weights of a", UNBOUNDED)
    assert store.get("b", "g") is None and not store.contains("b", "g")
    assert store.delete("b", "g") is False and store.get("a", "g") == b"weights of a"
    # b registering the same graph is b's first registration (created), and says nothing of a's
    assert store.put("b", "g", b"weights of a", UNBOUNDED) is True
    assert store.delete("a", "g") is True
    assert store.get("b", "g") == b"weights of a" and store.get("a", "g") is None


def test_a_tenant_evicts_only_its_own_oldest(make_store):
    store = make_store()
    quota = Quota(capacity=3)
    store.put("b", "kept", b"b", quota)
    for i in range(4):
        store.put("a", f"g{i}", b"x" * (i + 1), quota)
    assert [store.contains("a", f"g{i}") for i in range(4)] == [False, True, True, True]
    assert store.usage("a").graphs == 3 and store.usage("a").bytes == 2 + 3 + 4
    assert store.get("b", "kept") == b"b"


@pytest.mark.parametrize("limit", ["graphs", "bytes"])
def test_quotas_refuse_past_the_limit_and_store_nothing(make_store, limit):
    store = make_store()
    quota = Quota(graphs=2) if limit == "graphs" else Quota(bytes=10)
    sizes = [b"x" * 4, b"y" * 6] if limit == "bytes" else [b"x", b"y"]
    assert store.put("a", "g0", sizes[0], quota) and store.put("a", "g1", sizes[1], quota)  # at the quota: fine
    with pytest.raises(ResourceExhausted, match=f"tenant 'a'.*quota of {2 if limit == 'graphs' else 10} {limit}"):
        store.put("a", "g2", b"z", quota)
    assert not store.contains("a", "g2") and store.usage("a").graphs == 2
    assert store.put("a", "g1", sizes[1], quota) is False  # present: no quota question
    assert store.put("b", "g2", b"z", quota) is True  # another tenant's quota is its own
    store.delete("a", "g0")
    assert store.put("a", "g2", b"z", quota) is True


def test_quota_holds_under_concurrent_writers(make_store):
    """Two handles (workers or replicas) and 8 threads racing: exactly the quota gets in."""
    stores = [make_store(), make_store()]
    quota = Quota(graphs=5)
    created, refused = [], []

    def write(i):
        try:
            created.append(stores[i % 2].put("a", f"g{i}", b"x", quota))
        except ResourceExhausted:
            refused.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(created) == 5 and len(refused) == 11
    assert stores[0].usage("a").graphs == 5


def test_handles_share_the_store(make_store):
    first, second = make_store(), make_store()
    first.put("a", "g", b"data", UNBOUNDED)
    assert second.get("a", "g") == b"data"


def test_sqlite_store_adopts_files_written_before_tenants(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE graphs (id TEXT PRIMARY KEY, data BLOB NOT NULL, stored REAL NOT NULL "
               "DEFAULT (julianday('now')))")
    db.execute("INSERT INTO graphs (id, data) VALUES ('g', x'0102')")
    db.commit()
    db.close()
    store = SqliteGraphStore(path)
    assert store.get("", "g") == b"\x01\x02" and store.get("a", "g") is None
    store.close()


def test_redis_acknowledged_writes_survive_kill_9(tmp_path):
    """appendfsync always: every acknowledged registration is on disk before Redis answers."""
    with running_redis(tmp_path / "r") as server:
        store = open_store(server.url)
        for i in range(200):
            assert store.put("a", f"g{i}", f"graph {i}".encode(), UNBOUNDED)
        server.kill()
        store.close()
        server.start()
        store = open_store(server.url)
        assert all(store.get("a", f"g{i}") == f"graph {i}".encode() for i in range(200))
        assert store.usage("a").graphs == 200
        store.close()


def test_unreachable_redis_is_unavailable(tmp_path):
    from semigrad_server.errors import Unavailable
    from redis_server import free_port

    store = open_store(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(Unavailable, match="graph store"):
        store.get("a", "g")


def test_a_redis_that_turned_replica_is_unavailable_not_internal(tmp_path):
    """A Redis that cannot take writes for now (a replica: READONLY, the primary it was failed over
    from) is UNAVAILABLE, which clients retry, not INTERNAL with a traceback: redis-py's
    ReadOnlyError is a ResponseError, which the store let through as a server bug. Reads go on, and
    writes once it is a primary again."""
    import redis
    from redis_server import free_port
    from semigrad_server.errors import Unavailable

    with running_redis(tmp_path / "r") as server:
        store = open_store(server.url)
        assert store.put("a", "g1", b"one", UNBOUNDED)
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # a primary that does not answer
        try:
            with pytest.raises(Unavailable, match="graph store .* cannot take the command now"):
                store.put("a", "g2", b"two", UNBOUNDED)
            with pytest.raises(Unavailable, match="read only replica"):
                store.delete("a", "g1")
            assert store.get("a", "g1") == b"one"
        finally:
            admin.execute_command("REPLICAOF", "NO", "ONE")
        assert store.put("a", "g2", b"two", UNBOUNDED) and store.delete("a", "g1")
        store.close()


def test_unknown_store_scheme_is_refused():
    from semigrad_server.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="unknown store"):
        open_store("mongodb://127.0.0.1/x")


def test_two_servers_on_one_redis_serve_each_others_graphs(redis_url):
    """A graph registered through one server is compiled by the other from the stored definition;
    a deletion through either is seen by both."""
    import numpy as np
    import semigrad as sg
    from semigrad_server.engine import Engine
    from semigrad_server.service import build_server

    servers = [build_server("127.0.0.1:0", engine=Engine(store=open_store(redis_url))) for _ in range(2)]
    for server, _, _ in servers:
        server.start()
    try:
        g = sg.Graph()
        x = g.input("x", (3,))
        g.output("y", sg.sum(sg.sin(x) * x))
        point = np.array([0.1, -1.2, 2.5])
        with sg.Client(f"127.0.0.1:{servers[0][1]}") as first, sg.Client(f"127.0.0.1:{servers[1][1]}") as second:
            graph_id = first.register(g).id
            assert ("", graph_id) not in servers[1][2].compiled  # (tenant, id)
            gradient = second.get_graph(graph_id).gradient({"x": point})["x"]
            np.testing.assert_allclose(gradient, np.cos(point) * point + np.sin(point), rtol=1e-12)
            assert second.delete_graph(graph_id) is True
            with pytest.raises(sg.NotFound):
                first.get_graph(graph_id)
            with pytest.raises(sg.NotFound):  # compiled there, but no longer stored
                second.get_graph(graph_id).gradient({"x": point})
    finally:
        for server, _, _ in servers:
            server.stop(0)


def test_a_memory_store_keeps_as_many_graphs_per_tenant_as_the_compiled_cache():
    from semigrad_server.engine import Engine
    from semigrad_server.ir import Graph, InputSpec
    from semigrad_server.limits import Limits

    engine = Engine(Limits(max_graphs=3))
    ids = []
    for n in range(1, 5):  # four distinct graphs: inputs of different shapes
        graph = Graph(inputs=(InputSpec("x", (n,)),), nodes=(), outputs=(("y", "x"),))
        ids.append(engine.register(graph)[0].id)
    assert [engine.graphs.contains("", i) for i in ids] == [False, True, True, True]


def test_a_full_redis_is_resource_exhausted(tmp_path):
    """Redis at its maxmemory refuses writes (noeviction): RESOURCE_EXHAUSTED naming the store; reads go on."""
    import redis

    with running_redis(tmp_path / "r") as server:
        store = open_store(server.url)
        store.put("a", "small", b"x", UNBOUNDED)
        redis.Redis.from_url(server.url).config_set("maxmemory", 1)  # below what Redis already uses
        with pytest.raises(ResourceExhausted, match="graph store .* is full"):
            store.put("a", "big", b"y" * 100_000, UNBOUNDED)
        assert store.get("a", "small") == b"x" and not store.contains("a", "big")
        store.close()


def test_a_full_sqlite_file_is_resource_exhausted(tmp_path):
    """A SQLite store on a full disk refuses registrations RESOURCE_EXHAUSTED naming the store, as a
    full Redis does; it answered INTERNAL 'OperationalError: database or disk is full' (a server
    bug, by the status) with a traceback in the log. Reads go on. (SQLite's max_page_count stands
    in for the disk here: the same SQLITE_FULL; a 256 KiB tmpfs gave it after 15 registrations.)"""
    from semigrad_server.store import SqliteGraphStore

    store = SqliteGraphStore(tmp_path / "g.sqlite")
    store.put("a", "small", b"x", UNBOUNDED)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(ResourceExhausted, match="graph store .* is full"):
        store.put("a", "big", b"y" * 100_000, UNBOUNDED)
    assert store.get("a", "small") == b"x" and not store.contains("a", "big")
    assert store.usage("a").graphs == 1
    store.close()


def test_the_server_warns_about_a_redis_that_may_lose_graphs(tmp_path, caplog):
    import logging

    import redis

    with running_redis(tmp_path / "r") as server:
        admin = redis.Redis.from_url(server.url)
        with caplog.at_level(logging.WARNING, logger="semigrad.store"):
            open_store(server.url).close()
        assert not caplog.records  # appendonly yes, appendfsync always, noeviction: nothing to say
        for setting, value, said in [("appendfsync", "everysec", "fsyncs its log everysec"),
                                     ("appendonly", "no", "without appendonly"),
                                     ("maxmemory-policy", "allkeys-lru", "evicts keys")]:
            admin.config_set(setting, value)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="semigrad.store"):
                open_store(server.url).close()
            assert any(said in r.getMessage() for r in caplog.records), (setting, caplog.records)


def test_a_stopped_redis_holds_a_call_no_longer_than_its_deadline(tmp_path, caplog):
    """SIGSTOP of the real redis-server: a store call made for a request with a 0.5 s deadline
    returns DEADLINE_EXCEEDED at that deadline (not after the 10 s socket timeout), through the
    store and through a gRPC server's request thread (its own log of the call's duration); once
    Redis runs again the same handles serve, and no late answer is read as another's."""
    import logging
    import os
    import signal
    import time

    import numpy as np
    import semigrad as sg
    from redis_server import RedisServer
    from semigrad_server import deadline
    from semigrad_server.engine import Engine
    from semigrad_server.errors import DeadlineExceeded
    from semigrad_server.service import build_server
    from semigrad_server.store.redis import SOCKET_TIMEOUT

    server = RedisServer(tmp_path / "redis").start()
    store = open_store(server.url)
    engine_store = open_store(server.url)
    grpc_server, port, _ = build_server("127.0.0.1:0", engine=Engine(store=engine_store))
    grpc_server.start()
    try:
        store.put("a", "g", b"graph", UNBOUNDED)
        g = sg.Graph()
        x = g.input("x", (3,))
        g.output("y", sg.sum(x * x))
        with sg.Client(f"127.0.0.1:{port}", shared_memory=False) as client:
            f = client.register(g)
            np.testing.assert_allclose(f.gradient({"x": np.ones(3)})["x"], 2 * np.ones(3))
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                for call in (lambda: store.contains("a", "g"), lambda: store.get("a", "g"),
                             lambda: store.put("a", "h", b"other", UNBOUNDED), lambda: store.usage("a")):
                    started = time.monotonic()
                    with deadline.serving(deadline.start(0.5, 60)), pytest.raises(DeadlineExceeded, match="graph store"):
                        call()
                    assert 0.45 < time.monotonic() - started < 1.0 < SOCKET_TIMEOUT
                caplog.set_level(logging.INFO, logger="semigrad.rpc")
                caplog.clear()
                started = time.monotonic()
                with sg.Client(f"127.0.0.1:{port}", timeout=0.5, shared_memory=False) as hurried, \
                        pytest.raises(sg.DeadlineExceeded):
                    hurried.get_graph(f.id)
                # the server's request thread itself came back at the deadline, with the deadline's status
                wait = time.monotonic() + 5
                while time.monotonic() < wait and not any("status=DEADLINE_EXCEEDED" in r.getMessage()
                                                         for r in caplog.records):
                    time.sleep(0.05)
                line = next(r.getMessage() for r in caplog.records if "status=DEADLINE_EXCEEDED" in r.getMessage())
                assert float(line.split(" ms=")[1].split()[0]) < 1000, line
                assert time.monotonic() - started < 2.0
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            # the same handles and server serve again, each answer its own
            assert store.get("a", "g") == b"graph" and store.contains("a", "g") and not store.contains("a", "h")
            np.testing.assert_allclose(f.gradient({"x": np.arange(3.0)})["x"], 2 * np.arange(3.0))
    finally:
        grpc_server.stop(0)
        store.close()
        engine_store.close()
        server.stop()
