"""Bounds on what one request or graph may make the server spend."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    max_nodes: int = 100_000  # nodes in a registered graph
    max_node_elements: int = 10_000_000  # elements of any one value of a graph (per batch item)
    max_batch: int = 1_000_000  # batch items in one request
    max_request_elements: int = 400_000_000  # batch items × elements of all values a request computes
    max_request_operations: int = 100_000_000_000  # scalar operations of one request (a matmul's products counted)
    max_request_bytes: int = 2 * 1024 * 1024 * 1024  # memory one request may hold at once (estimated from shapes)
    max_memory_bytes: int = 4 * 1024 * 1024 * 1024  # memory the requests in flight on one worker hold together
    max_graphs: int = 1024  # compiled graphs kept in memory per process (least recently used ones go first)
    max_stored_graphs: int = 100_000  # graphs kept in the store per tenant (the tenant's oldest ones go first)
    max_tenant_graphs: int = 0  # quota: graphs one tenant may store (0: none; past it RegisterGraph is refused)
    max_tenant_bytes: int = 0  # quota: bytes of serialised graphs one tenant may store (0: none)
    max_tenant_requests: int = 0  # quota: calls of one tenant in flight at once in a server, all its workers (0: none)
    max_plans_per_graph: int = 64  # compiled plans cached per graph
    max_request_seconds: float = 600.0  # the deadline of a request without one, and a bound on every request's
    max_streams: int = 16  # streaming calls served at once per worker (each has a thread of its own)
    max_streams_per_connection: int = 8  # of them from one client connection (channels of a process may share one)
    max_path_steps: int = 1_000_000  # best-path steps one gradient request may return (bounded before work)
    max_message_bytes: int = 512 * 1024 * 1024  # gRPC send and receive message size

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
