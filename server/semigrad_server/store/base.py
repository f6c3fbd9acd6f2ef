"""The graph store interface and per-tenant quotas."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..errors import ResourceExhausted


@dataclass(frozen=True)
class Quota:
    """What one tenant may keep in the store (0: no bound). Past `capacity` graphs the tenant's own
    oldest registration is evicted; past `graphs` or `bytes` a registration is refused."""

    capacity: int = 100_000
    graphs: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class StoreUsage:
    graphs: int
    bytes: int


class GraphStore(Protocol):
    """Serialised graphs by (tenant, content hash). Writes are durable once they return."""

    name: str  # "memory", "sqlite" or "redis", for logs and metrics

    def put(self, tenant: str, key: str, data: bytes, quota: Quota) -> bool:
        """Store unless present; True when this call stored it. Raises ResourceExhausted (nothing
        stored) when the tenant's quota would be crossed."""

    def get(self, tenant: str, key: str) -> bytes | None: ...

    def contains(self, tenant: str, key: str) -> bool: ...

    def delete(self, tenant: str, key: str) -> bool:
        """True when the tenant had the graph."""

    def usage(self, tenant: str) -> StoreUsage: ...

    def close(self) -> None: ...


def refuse(tenant: str, what: str, have: int, adding: int, limit: int) -> ResourceExhausted:
    """The RESOURCE_EXHAUSTED of a registration past a tenant quota."""
    who = f"tenant '{tenant}'" if tenant else "the server's anonymous tenant"
    return ResourceExhausted(f"{who} stores {have} {what}; this graph would add {adding} past the quota of {limit} "
                             f"{what} (delete graphs with DeleteGraph)")


def check_quota(tenant: str, quota: Quota, graphs: int, nbytes: int, adding: int) -> None:
    if quota.graphs and graphs + 1 > quota.graphs:
        raise refuse(tenant, "graphs", graphs, 1, quota.graphs)
    if quota.bytes and nbytes + adding > quota.bytes:
        raise refuse(tenant, "bytes", nbytes, adding, quota.bytes)
