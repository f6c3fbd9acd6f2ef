"""Where a request's result arrays are allocated.

By default, fresh NumPy arrays. A caller may set an allocator for the duration of a request, and
kernels then write their results into its arrays. The service used one to compute results
straight into a client's shared-memory output region; since issue 13 it no longer maps client
memory (a region its client truncates would be SIGBUS) and sets none, so today only
`results_in(None)` is used (to keep scratch results out of a caller's allocator).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

import numpy as np

# (shape, dtype) -> a writable C-ordered array of that shape and dtype, or None (no room)
Allocator = Callable[[tuple[int, ...], np.dtype], "np.ndarray | None"]

_CURRENT: ContextVar[Allocator | None] = ContextVar("semigrad_result_allocator", default=None)


@contextmanager
def results_in(allocate: Allocator | None) -> Iterator[None]:
    token = _CURRENT.set(allocate)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def result_array(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised array for a result: the request's allocator's when it has room."""
    allocate = _CURRENT.get()
    if allocate is not None:
        array = allocate(tuple(shape), np.dtype(dtype))
        if array is not None:
            return array
    return np.empty(shape, dtype=dtype)


def active() -> bool:
    return _CURRENT.get() is not None
