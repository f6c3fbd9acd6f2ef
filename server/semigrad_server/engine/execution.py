"""Running a compiled plan for a request: the backend it asked for, its work limit and its
time bound."""

from __future__ import annotations

import math
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


def check_work(plan, batch_shape: tuple[int, ...], limits: Limits) -> None:
    """RESOURCE_EXHAUSTED unless running `plan` over the batch (batch items × elements per item)
    is within the limit."""
    items = math.prod(batch_shape)
    work = items * plan.item_elements
    if work > limits.max_request_elements:
        heaviest = getattr(plan, "heaviest", None)
        at = f", node {quoted(heaviest[1])} alone {heaviest[0]} products per item" if heaviest else ""
        raise ResourceExhausted(
            f"request would compute {work} elements ({items} batch items × {plan.item_elements} per item{at}); "
            f"the limit is {limits.max_request_elements}: send smaller batches")


def run_plan(plan, batch: Batch, deadline: float | None, backend: str, limits: Limits) -> dict:
    """`plan` over the batch, once its work is within the limit."""
    check_work(plan, batch.shape, limits)
    return plan.run(batch.arrays, time_bound(deadline, limits), backend, batch.shape)
