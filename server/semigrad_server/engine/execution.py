"""Running a compiled plan for a request: the backend it asked for, its work limit and its
time bound."""

from __future__ import annotations

import contextlib
import contextvars
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


def _cost(plan, arrays):
    """The plan's cost for these input arrays (Plan.cost: what depends on no batched input counted
    once), or None for executables that count everything per item."""
    return plan.cost(arrays) if arrays is not None and hasattr(plan, "cost") else None


def max_items(plan, limits: Limits, arrays=None) -> int:
    """The most batch items a request may carry for `plan` within the limits (sent with
    RESOURCE_EXHAUSTED so that a client can cut its batch into chunks that pass)."""
    cost = _cost(plan, arrays)
    if cost is not None:
        return min(limits.max_batch, cost.items_within(limits.max_request_elements, limits.max_request_operations,
                                                       limits.max_request_bytes))
    return min(limits.max_batch, limits.max_request_elements // plan.item_elements,
               limits.max_request_operations // plan.item_operations,
               limits.max_request_bytes // max(plan.item_bytes, 1))


def _counted(items: int, per: int, once: int) -> str:
    return f"{items} batch items × {per} per item" + (f" + {once} computed once" if once else "")


def check_work(plan, batch_shape: tuple[int, ...], limits: Limits, arrays=None) -> int:
    """RESOURCE_EXHAUSTED unless running `plan` over the batch (its elements and operations) is
    within the limits, and the memory it would hold at once within max_request_bytes; returns
    that memory (bytes). With the request's input `arrays`, what depends on no batched input is
    counted once (Plan.cost: a weight shared by the batch), else everything per item."""
    items = math.prod(batch_shape)
    cost = _cost(plan, arrays)
    if cost is not None:
        elements, operations = cost.elements, cost.operations
        needed, at = cost.bytes_at(items)
    else:
        elements, operations = (plan.item_elements, 0), (plan.item_operations, 0)
        needed, at = items * plan.item_bytes, plan.peak_node
    work = items * elements[0] + elements[1]
    if work > limits.max_request_elements:
        heaviest = getattr(plan, "heaviest", None)
        at_heaviest = f", node {quoted(heaviest[1])} alone {heaviest[0]} products per item" if heaviest else ""
        raise ResourceExhausted(
            f"request would compute {work} elements ({_counted(items, *elements)}{at_heaviest}); "
            f"the limit is {limits.max_request_elements}: send smaller batches", max_items(plan, limits, arrays))
    total_operations = items * operations[0] + operations[1]
    if total_operations > limits.max_request_operations:
        raise ResourceExhausted(
            f"request would take {total_operations} scalar operations "
            f"({_counted(items, *operations)}, a matmul's products counted); the limit is "
            f"max_request_operations = {limits.max_request_operations}: send smaller batches or operands",
            max_items(plan, limits, arrays))
    if needed > limits.max_request_bytes:
        where = f" (at node '{at}')" if at else ""
        per_item = f"{items} batch items" if cost is not None else f"{items} batch items × {plan.item_bytes} bytes per item"
        raise ResourceExhausted(
            f"request would hold {needed} bytes at once{where}: {per_item}; the budget is max_request_bytes = "
            f"{limits.max_request_bytes}: send smaller batches", max_items(plan, limits, arrays))
    return needed


class MemoryBudget:
    """The memory a worker's requests in flight may hold together (their estimates, reserved
    before they run): past it a request is RESOURCE_EXHAUSTED instead of pushing the worker
    into swap or the OOM killer."""

    def __init__(self, limit: int):
        self.limit = limit
        self.reserved = 0
        self._lock = threading.Lock()

    def hold(self, needed: int) -> int:
        """`reserve(needed)` until the current `held_until_answered` ends, when there is one:
        then 0, else `needed`, which the caller gives back with `release` once its run is done."""
        self.reserve(needed)
        kept = _KEPT.get()
        if kept is None:
            return needed
        kept.append((self, needed))
        return 0

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
        owed = self.hold(needed)
        try:
            yield
        finally:
            if owed:
                self.release(owed)


_KEPT: contextvars.ContextVar[list | None] = contextvars.ContextVar("semigrad_kept_reservations", default=None)


@contextlib.contextmanager
def held_until_answered():
    """Memory reserved within (MemoryBudget.hold) is given back when this ends, not when its
    plan's run does: a request's estimate counts what it holds after the run too (its results
    and the response's copies of them; every adjoint, while its best paths are traced), and a
    request in flight released early let others take memory it still held."""
    kept: list = []
    token = _KEPT.set(kept)
    try:
        yield
    finally:
        _KEPT.reset(token)
        for budget, needed in kept:
            budget.release(needed)


def run_plan(plan, batch: Batch, deadline: float | None, backend: str, limits: Limits,
             memory: MemoryBudget | None) -> dict:
    """`plan` over the batch, once its work and memory are within the limits (memory None: the
    caller holds the plan's reservation already, for a run it repeats)."""
    needed = check_work(plan, batch.shape, limits, batch.arrays)
    with memory.reserved_for(needed) if memory is not None else contextlib.nullcontext():
        return plan.run(batch.arrays, time_bound(deadline, limits), backend, batch.shape)
