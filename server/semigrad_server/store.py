"""Where registered graphs live: in memory, least recently used evicted past a bound."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from .errors import NotFound

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
                raise NotFound(f"unknown graph id '{key}' (register the graph first)") from None

    def __len__(self) -> int:
        return len(self._items)
