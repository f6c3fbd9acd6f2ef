"""Running a compiled plan for a request: the backend it asked for, its work limit and its
time bound."""

from __future__ import annotations

import contextlib
import math
import threading
import time

from ..errors import InvalidArgument, ResourceExhausted, quoted
from ..limits import Limits
from ..runtime.compiled import BACKENDS
from .graphs import Batch


def checked_backend(backend: str) -> str:
    backend = backend or "auto"
    if backend not in BACKENDS:
        raise InvalidArgument(f"unknown backend {quoted(backend)} (backends: {', '.join(BACKENDS)})")
    return backend


def compile_kind(backend: str) -> str:
    """What a backend choice compiles to: scalar and jit share the scalar program."""
    return "scalar" if backend in ("scalar", "jit") else backend


def time_bound(deadline: float | None, limits: Limits) -> float:
    """The request's deadline, or sooner the server's bound on one request."""
    bound = time.monotonic() + limits.max_request_seconds
    return min(deadline, bound) if deadline is not None else bound


def max_items(plan, limits: Limits) -> int:
    """The most batch items a request running `plan` may carry within the limits on its work and
    memory (check_work) and on its batch (max_batch); 0 when not even one item fits."""
    return min(limits.max_batch, limits.max_request_elements // plan.item_elements,
               limits.max_request_operations // plan.item_operations,
               limits.max_request_bytes // max(plan.item_bytes, 1))


def check_work(plan, batch_shape: tuple[int, ...], limits: Limits) -> int:
    """RESOURCE_EXHAUSTED unless running `plan` over the batch (batch items × elements per item)
    is within the limit, and the memory it would hold at once within max_request_bytes; returns
    that memory (bytes)."""
    items = math.prod(batch_shape)
    work = items * plan.item_elements
    if work > limits.max_request_elements:
        heaviest = getattr(plan, "heaviest", None)
        at = f", node {quoted(heaviest[1])} alone {heaviest[0]} products per item" if heaviest else ""
        raise ResourceExhausted(
            f"request would compute {work} elements ({items} batch items × {plan.item_elements} per item{at}); "
            f"the limit is {limits.max_request_elements}: send smaller batches", max_items(plan, limits))
    operations = items * plan.item_operations
    if operations > limits.max_request_operations:
        raise ResourceExhausted(
            f"request would take {operations} scalar operations ({items} batch items × {plan.item_operations} per "
            f"item, a matmul's products counted); the limit is max_request_operations = "
            f"{limits.max_request_operations}: send smaller batches or operands", max_items(plan, limits))
    needed = items * plan.item_bytes
    if needed > limits.max_request_bytes:
        at = f" (at node '{plan.peak_node}')" if plan.peak_node else ""
        raise ResourceExhausted(
            f"request would hold {needed} bytes at once{at}: {items} batch items × {plan.item_bytes} bytes per item; "
            f"the budget is max_request_bytes = {limits.max_request_bytes}: send smaller batches",
            max_items(plan, limits))
    return needed


class MemoryBudget:
    """The memory a worker's requests in flight may hold together (their estimates, reserved
    before they run): past it a request is RESOURCE_EXHAUSTED instead of pushing the worker
    into swap or the OOM killer."""

    def __init__(self, limit: int):
        self.limit = limit
        self.reserved = 0
        self._lock = threading.Lock()

    def reserve(self, needed: int) -> None:
        """Take `needed` bytes of the budget (RESOURCE_EXHAUSTED when they are not left); give
        them back with `release`."""
        with self._lock:
            if self.reserved + needed > self.limit:
                held = self.reserved
                raise ResourceExhausted(
                    f"request would hold {needed} bytes while requests in flight hold {held}: the worker's budget "
                    f"is max_memory_bytes = {self.limit}; retry later or send smaller batches")
            self.reserved += needed

    def release(self, needed: int) -> None:
        with self._lock:
            self.reserved -= needed

    @contextlib.contextmanager
    def reserved_for(self, needed: int):
        self.reserve(needed)
        try:
            yield
        finally:
            self.release(needed)


def run_plan(plan, batch: Batch, deadline: float | None, backend: str, limits: Limits,
             memory: MemoryBudget) -> dict:
    """`plan` over the batch, once its work and memory are within the limits."""
    with memory.reserved_for(check_work(plan, batch.shape, limits)):
        return plan.run(batch.arrays, time_bound(deadline, limits), backend, batch.shape)
