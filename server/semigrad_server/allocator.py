"""glibc's allocator, tuned for a server that moves megabyte messages: freed memory is kept for
the next request instead of being handed back to the kernel and faulted in again.

By default glibc serves every allocation above 128 KiB with a fresh `mmap` (and, once it has
raised that threshold, trims the heap top back to the kernel above twice the threshold), so each
megabyte tensor a request decodes, computes or encodes is memory the kernel must zero and fault
in page by page. On this project's 2-CPU VM a fault costs about 2.5 µs: encoding a 1.28 MB
tensor took 1.6 ms instead of 0.18 ms, and a 10,000-point det4 gradient (1.28 MB each way)
spent 4 of its 10 ms faulting pages. Here allocations up to MMAP_THRESHOLD (the default inline
stream chunk, 2 MiB, and twice that) come from the heap, and each malloc arena keeps up to
TRIM_THRESHOLD of freed memory; larger allocations are mapped afresh as before. glibc makes up to
8 arenas per CPU (threads allocating at once get their own), so a worker keeps at most about
arenas × TRIM_THRESHOLD of freed memory resident: 256 MiB on 2 CPUs (docs/limits.md). With
64 MiB and 256 MiB here, 16 threads each freeing 120 MB left 1.3 GB resident (an attacker's
measurement)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 16 << 20
# glibc's own environment tunables: an operator who sets one keeps glibc's behaviour as set.
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def reuse_freed_memory() -> bool:
    """Set the thresholds above in this process (glibc only); True when it set them."""
    if any(os.environ.get(v) for v in ENVIRONMENT):
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): its own allocator stays
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
