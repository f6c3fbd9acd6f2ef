"""Where registered graphs live: one interface (`GraphStore`), three backends.

- `MemoryGraphStore`: this process only (`--store memory`);
- `SqliteGraphStore`: an embedded SQLite file shared by the worker processes of one host (the default);
- `RedisGraphStore`: a Redis server shared by replicas on many hosts (`--store redis://host:port/db`).

Every stored graph belongs to a tenant: ids are content hashes scoped by tenant, so a tenant
sees, gets, deletes and evicts only its own registrations. `LruCache` is the per-process cache of
compiled graphs in front of a store.
"""

from .base import GraphStore, Quota, StoreUsage
from .lru import LruCache
from .memory import MemoryGraphStore
from .opening import open_store
from .sqlite import SqliteGraphStore

__all__ = ["GraphStore", "LruCache", "MemoryGraphStore", "Quota", "SqliteGraphStore", "StoreUsage", "open_store"]
