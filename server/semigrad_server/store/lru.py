"""A bounded least-recently-used map (per process): the cache of compiled graphs."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

T = TypeVar("T")


class LruCache(Generic[T]):
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()

    def put_if_absent(self, key: Hashable, value: T) -> T:
        """Store `value` unless `key` is present; return the value now stored under `key`."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            self._items[key] = value
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
            return value

    def get(self, key: Hashable) -> T | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def discard(self, key: Hashable) -> None:
        with self._lock:
            self._items.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
