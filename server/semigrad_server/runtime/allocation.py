"""Where a request's result arrays are allocated.

By default, fresh NumPy arrays. The service sets an allocator for the duration of a request
that offered a shared-memory output region: kernels then write their results straight into
the region, and the response references them there instead of copying them in.
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
