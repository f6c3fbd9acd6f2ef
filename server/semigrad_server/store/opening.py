"""`open_store`: a --store value to a backend."""

from __future__ import annotations

from ..errors import InvalidArgument
from .base import GraphStore
from .memory import MemoryGraphStore


def open_store(spec: str | None) -> GraphStore:
    """`memory` (or None), `redis://host:port/db` (also `rediss://`, `unix://`), or a SQLite file path."""
    if spec is None or spec == "memory":
        return MemoryGraphStore()
    if spec.startswith(("redis://", "rediss://", "unix://")):
        from .redis import RedisGraphStore

        return RedisGraphStore(spec)
    if "://" in spec:
        raise InvalidArgument(f"unknown store '{spec}': give 'memory', redis://host:port/db or a SQLite file path")
    from .sqlite import SqliteGraphStore

    return SqliteGraphStore(spec)
