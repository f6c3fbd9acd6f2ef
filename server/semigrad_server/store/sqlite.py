"""The embedded store: serialised graphs in one SQLite file (WAL mode) that every worker process
of a host shares, so a graph registered through one worker is found by the others and survives
restarts. Each write is one transaction, committed (and so durable) before it returns."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

from ..errors import ResourceExhausted, Unavailable
from .base import Quota, StoreUsage, check_quota

# SQLite's result codes (the primary code: the low byte of an extended one).
SQLITE_FULL = 13  # the disk (or the file system, or max_page_count) is full
SQLITE_BUSY, SQLITE_LOCKED = 5, 6  # another connection held the lock past the busy timeout

SCHEMA = """
CREATE TABLE IF NOT EXISTS tenant_graphs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- registration order: the oldest go first
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    data BLOB NOT NULL,
    UNIQUE (tenant, id)
)
"""


class SqliteGraphStore:
    name = "sqlite"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a committed registration survives a power cut
        with self._transaction():
            self._db.execute(SCHEMA)
            # Files written before tenants: their graphs belong to the anonymous tenant.
            if self._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='graphs'").fetchone():
                self._db.execute("INSERT OR IGNORE INTO tenant_graphs (tenant, id, data) "
                                 "SELECT '', id, data FROM graphs ORDER BY stored")
                self._db.execute("DROP TABLE graphs")

    def _transaction(self):
        db = self._db

        class Transaction:
            def __enter__(self):
                db.execute("BEGIN IMMEDIATE")  # takes the write lock now: the quota check and the write are one step

            def __exit__(self, kind, *_):
                if kind is None:
                    db.execute("COMMIT")
                elif db.in_transaction:  # SQLite rolls back by itself on some errors (SQLITE_FULL, SQLITE_IOERR)
                    db.execute("ROLLBACK")

        return Transaction()

    @contextlib.contextmanager
    def _errors(self):
        """SQLite's refusals as the service's statuses: a full disk is RESOURCE_EXHAUSTED (as a full
        Redis is), a lock not given up within the busy timeout UNAVAILABLE; not INTERNAL, which a
        client reads as a bug of the server."""
        try:
            yield
        except sqlite3.OperationalError as e:
            code = getattr(e, "sqlite_errorcode", 0) & 0xFF
            if code == SQLITE_FULL:
                raise ResourceExhausted(f"the graph store (SQLite at {self.path}) is full: {e}") from None
            if code in (SQLITE_BUSY, SQLITE_LOCKED):
                raise Unavailable(f"the graph store (SQLite at {self.path}) is busy: {e}") from None
            raise

    def put(self, tenant: str, key: str, data: bytes, quota: Quota) -> bool:
        with self._errors(), self._lock, self._transaction():
            if self._db.execute("SELECT 1 FROM tenant_graphs WHERE tenant = ? AND id = ?", (tenant, key)).fetchone():
                return False
            usage = self._usage(tenant)
            check_quota(tenant, quota, usage.graphs, usage.bytes, len(data))
            self._db.execute("INSERT INTO tenant_graphs (tenant, id, data) VALUES (?, ?, ?)", (tenant, key, data))
            if usage.graphs + 1 > quota.capacity:
                self._db.execute("DELETE FROM tenant_graphs WHERE seq IN (SELECT seq FROM tenant_graphs WHERE tenant = ? "
                                 "ORDER BY seq LIMIT ?)", (tenant, usage.graphs + 1 - quota.capacity))
            return True

    def get(self, tenant: str, key: str) -> bytes | None:
        with self._errors(), self._lock:
            row = self._db.execute("SELECT data FROM tenant_graphs WHERE tenant = ? AND id = ?", (tenant, key)).fetchone()
        return row[0] if row else None

    def contains(self, tenant: str, key: str) -> bool:
        with self._errors(), self._lock:
            return self._db.execute("SELECT 1 FROM tenant_graphs WHERE tenant = ? AND id = ?",
                                    (tenant, key)).fetchone() is not None

    def delete(self, tenant: str, key: str) -> bool:
        with self._errors(), self._lock:
            return self._db.execute("DELETE FROM tenant_graphs WHERE tenant = ? AND id = ?", (tenant, key)).rowcount == 1

    def usage(self, tenant: str) -> StoreUsage:
        with self._errors(), self._lock:
            return self._usage(tenant)

    def _usage(self, tenant: str) -> StoreUsage:
        graphs, nbytes = self._db.execute("SELECT count(*), coalesce(sum(length(data)), 0) FROM tenant_graphs "
                                          "WHERE tenant = ?", (tenant,)).fetchone()
        return StoreUsage(graphs, nbytes)

    def close(self) -> None:
        self._db.close()
