"""Where registered graphs live.

`MemoryStore` is a bounded LRU map (compiled graphs, per process). `SqliteStore` is the
embedded persistent store: serialised graphs in one SQLite file that every worker process
of a server shares, so a graph registered through one worker is found by the others and
survives restarts.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Generic, TypeVar

from .errors import NotFound, quoted

T = TypeVar("T")


class MemoryStore(Generic[T]):
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def put_if_absent(self, key: str, value: T) -> tuple[T, bool]:
        """Store `value` unless `key` is present; return the stored value and whether it is new."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key], False
            self._items[key] = value
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
            return value, True

    def get(self, key: str) -> T:
        with self._lock:
            try:
                self._items.move_to_end(key)
                return self._items[key]
            except KeyError:
                raise NotFound(f"unknown graph id {quoted(key)} (register the graph first)") from None

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


class SqliteStore:
    """Serialised graphs by id in a SQLite file (WAL mode: many processes read and write)."""

    def __init__(self, path: str | Path, capacity: int = 100_000):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS graphs (id TEXT PRIMARY KEY, data BLOB NOT NULL, "
                         "stored REAL NOT NULL DEFAULT (julianday('now')))")

    def put(self, key: str, data: bytes) -> bool:
        """Store unless present; True when this call stored it. Past `capacity`, the oldest go."""
        with self._lock:
            created = self._db.execute("INSERT OR IGNORE INTO graphs (id, data) VALUES (?, ?)",
                                       (key, data)).rowcount == 1
            if created:
                self._db.execute("DELETE FROM graphs WHERE id IN (SELECT id FROM graphs ORDER BY stored DESC "
                                 "LIMIT -1 OFFSET ?)", (self.capacity,))
            return created

    def get(self, key: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT data FROM graphs WHERE id = ?", (key,)).fetchone()
        return row[0] if row else None

    def close(self) -> None:
        self._db.close()
