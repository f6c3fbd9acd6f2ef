"""Background compiles (numba: a scalar program's JIT kernel, a hot fused group's ufunc) run on
daemon threads of one name, and the process waits for them as it exits: LLVM aborts the whole
process ("Assertion `!NodePtr->isKnownSentinel()' failed", SIGABRT after every test had passed)
when the interpreter shuts down while a compile is running in another thread."""

from __future__ import annotations

import atexit
import threading
import time
from typing import Callable

THREAD_NAME = "semigrad-jit"
EXIT_WAIT_SECONDS = 120.0  # longer than the longest compile the caps allow (docs/limits.md: ~40 s)


def thread(target: Callable, *args) -> threading.Thread:
    """An unstarted daemon thread running `target(*args)`, waited for at exit."""
    return threading.Thread(target=target, args=args, daemon=True, name=THREAD_NAME)


def running() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


@atexit.register
def _wait_at_exit() -> None:
    stop = time.monotonic() + EXIT_WAIT_SECONDS
    for t in running():
        t.join(max(0.0, stop - time.monotonic()))
