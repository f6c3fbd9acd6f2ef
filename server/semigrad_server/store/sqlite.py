"""The embedded store: serialised graphs in one SQLite file (WAL mode) that every worker process
of a host shares, so a graph registered through one worker is found by the others and survives
restarts. Each write is one transaction, committed (and so durable) before it returns."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from .base import Quota, StoreUsage, check_quota

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
                db.execute("COMMIT" if kind is None else "ROLLBACK")

        return Transaction()

    def put(self, tenant: str, key: str, data: bytes, quota: Quota) -> bool:
        with self._lock, self._transaction():
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
        with self._lock:
            row = self._db.execute("SELECT data FROM tenant_graphs WHERE tenant = ? AND id = ?", (tenant, key)).fetchone()
        return row[0] if row else None

    def contains(self, tenant: str, key: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM tenant_graphs WHERE tenant = ? AND id = ?",
                                    (tenant, key)).fetchone() is not None

    def delete(self, tenant: str, key: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM tenant_graphs WHERE tenant = ? AND id = ?", (tenant, key)).rowcount == 1

    def usage(self, tenant: str) -> StoreUsage:
        with self._lock:
            return self._usage(tenant)

    def _usage(self, tenant: str) -> StoreUsage:
        graphs, nbytes = self._db.execute("SELECT count(*), coalesce(sum(length(data)), 0) FROM tenant_graphs "
                                          "WHERE tenant = ?", (tenant,)).fetchone()
        return StoreUsage(graphs, nbytes)

    def close(self) -> None:
        self._db.close()
