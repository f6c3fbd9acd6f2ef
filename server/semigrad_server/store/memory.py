"""Graphs in this process's memory: lost at exit, invisible to other workers."""

from __future__ import annotations

import threading
from collections import OrderedDict

from .base import Quota, StoreUsage, check_quota


class MemoryGraphStore:
    name = "memory"

    def __init__(self):
        self._tenants: dict[str, OrderedDict[str, bytes]] = {}
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, tenant: str, key: str, data: bytes, quota: Quota) -> bool:
        with self._lock:
            graphs = self._tenants.setdefault(tenant, OrderedDict())
            if key in graphs:
                return False
            check_quota(tenant, quota, len(graphs), self._bytes.get(tenant, 0), len(data))
            graphs[key] = data
            self._bytes[tenant] = self._bytes.get(tenant, 0) + len(data)
            while len(graphs) > quota.capacity:  # the tenant's own oldest registration goes
                _, old = graphs.popitem(last=False)
                self._bytes[tenant] -= len(old)
            return True

    def get(self, tenant: str, key: str) -> bytes | None:
        with self._lock:
            return self._tenants.get(tenant, {}).get(key)

    def contains(self, tenant: str, key: str) -> bool:
        with self._lock:
            return key in self._tenants.get(tenant, {})

    def delete(self, tenant: str, key: str) -> bool:
        with self._lock:
            data = self._tenants.get(tenant, {}).pop(key, None)
            if data is None:
                return False
            self._bytes[tenant] -= len(data)
            return True

    def usage(self, tenant: str) -> StoreUsage:
        with self._lock:
            return StoreUsage(len(self._tenants.get(tenant, {})), self._bytes.get(tenant, 0))

    def close(self) -> None:
        pass
