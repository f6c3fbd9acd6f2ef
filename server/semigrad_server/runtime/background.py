"""Background compiles (numba: a scalar program's JIT kernel, a hot fused group's ufunc) run on
daemon threads of one name. LLVM aborts the whole process ("Assertion `!NodePtr->isKnownSentinel()'
failed", or SIGSEGV) when the interpreter tears its objects down while a compile is running in
another thread: a pytest run died so after every test had passed. So as the process exits,
compiles still queued do not start, and the one running is waited for, up to EXIT_WAIT_SECONDS
(most compile in 0.1-3 s; a program near the JIT's cap takes minutes, and exiting is not held
that long: such a process can still die at exit). Exit handlers run last-registered first, so
ours is registered when the first thread is made, after numba was imported."""

from __future__ import annotations

import atexit
import functools
import threading
import time
from typing import Callable

THREAD_NAME = "semigrad-jit"
EXIT_WAIT_SECONDS = 10.0
_exiting = threading.Event()


def exiting() -> bool:
    """Whether the process is exiting: a compile still queued should not start."""
    return _exiting.is_set()


def thread(target: Callable, *args) -> threading.Thread:
    """An unstarted daemon thread running `target(*args)`, waited for at exit."""
    _register_exit_wait()
    return threading.Thread(target=target, args=args, daemon=True, name=THREAD_NAME)


def running() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


@functools.cache
def _register_exit_wait() -> None:
    atexit.register(_wait_at_exit)


def _wait_at_exit() -> None:
    _exiting.set()
    stop = time.monotonic() + EXIT_WAIT_SECONDS
    for t in running():
        t.join(max(0.0, stop - time.monotonic()))
