"""Pausing Python's cyclic garbage collector while the client builds many small objects.

Best paths read as objects (semigrad.paths.BestPaths) are one per path and a tuple per step
(9.5 million steps for every embedding element of BERT-base). Each ~700 allocations start a
young collection and every tenth of those an older one; the full collections these
allocations trigger cost as much as building the objects (2.6 against 1.3 µs a step), more in
a process holding millions of long-lived objects (PyTorch's). None of these objects can form
a cycle, so nothing is lost by not collecting while they are made: the collector resumes when
the last block building them leaves, and its usual thresholds take it from there.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

_lock = threading.Lock()
_inside = 0  # requests building objects now
_was_enabled = False


@contextmanager
def paused():
    """The collector paused for the block (nested and concurrent blocks: until the last ends;
    a collector disabled by the application stays disabled)."""
    global _inside, _was_enabled
    with _lock:
        if _inside == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0 and _was_enabled:
                gc.enable()
