"""The compiled plans of one registered graph, each under a key saying what it computes:
built once, shared by every request asking the same question, least recently used evicted
past a limit."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable, TypeVar

from .. import telemetry

T = TypeVar("T")


class PlanCache:
    """Thread-safe. A key is a hashable record naming what its plan computes; each module that
    caches plans uses a key type of its own (frozen dataclasses compare equal only to their own
    class), so two modules' keys never meet. `on_evict(plan)` runs (lock held) for every plan
    that leaves the cache."""

    def __init__(self, limit: int, on_evict: Callable[[object], None] | None = None):
        self.limit = limit
        self.on_evict = on_evict
        self._plans: OrderedDict[Hashable, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The plan under `key`, else `build()`'s, kept. Building runs without the lock: two
        threads may both build the same plan, and the later one is kept."""
        with self._lock:
            if key in self._plans:
                self._plans.move_to_end(key)
                telemetry.event("plan_hit")
                return self._plans[key]
        telemetry.event("plan_compile")
        built = build()
        with self._lock:
            self._plans[key] = built
            while len(self._plans) > self.limit:
                _, evicted = self._plans.popitem(last=False)
                self._evicted(evicted)
        return built

    def items(self) -> list[tuple[Hashable, object]]:
        """(key, plan) pairs, least recently used first (a snapshot)."""
        with self._lock:
            return list(self._plans.items())

    def keys(self) -> list[Hashable]:
        return [key for key, _ in self.items()]

    def values(self) -> list[object]:
        return [plan for _, plan in self.items()]

    def clear(self) -> None:
        with self._lock:
            while self._plans:
                self._evicted(self._plans.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._plans

    def _evicted(self, plan: object) -> None:
        if self.on_evict is not None:
            self.on_evict(plan)
