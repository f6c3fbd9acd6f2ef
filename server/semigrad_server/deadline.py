"""The time bound of the request a thread is serving, seen by every long phase.

The service opens a `Bound` for each call (the client's deadline, or the server's default,
and a flag the client's cancellation sets) and makes it current with `serving`. Below it:

* loops that can look at the clock call `check(where)` (a context variable read and a clock
  read: cheap enough for every step of a plan, every traced path, every parsed token);
* phases whose time goes into library code that cannot look (SymPy, building and scalarising
  a plan) run through `interruptibly(what, fn)`: a watchdog thread raises `Interrupted` in the
  thread at the deadline or at the client's cancellation, at the next Python bytecode
  (CPython's asynchronous exceptions, as for KeyboardInterrupt). A region may only build
  fresh objects: nothing shared may be half-updated when it is left that way; caches are
  filled after the region ends. Long calls into C (one NumPy kernel) cannot be interrupted;
  their size is bounded before they start (limits.py);
* compiled kernels that may run for seconds poll a flag instead (`stoppable`), which a
  watcher thread sets at the deadline or the cancellation: they return early, unfinished, and
  the call raises.

`Interrupted` derives from BaseException so that `except Exception` in library code cannot
swallow it; the region turns it into DeadlineExceeded or Cancelled naming the phase.
"""

from __future__ import annotations

import contextvars
import ctypes
import heapq
import itertools
import threading
import time
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np

from .errors import Cancelled, DeadlineExceeded

T = TypeVar("T")


class Interrupted(BaseException):
    """Raised asynchronously inside an interruptible region; never escapes the region."""


class Bound:
    """A request's deadline (time.monotonic() seconds) and whether its client cancelled."""

    __slots__ = ("deadline", "cancelled", "cancelled_at", "regions")

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.cancelled = False
        self.cancelled_at = float("inf")
        self.regions: list[_Region] = []  # armed regions (under _LOCK)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def overrun(self) -> float | None:
        """Seconds since the bound ended (its deadline, or the cancellation if sooner), or None
        while it holds: how long work went on past it."""
        ended = min(self.deadline, self.cancelled_at)
        now = time.monotonic()
        return now - ended if now > ended else None

    def expired(self) -> bool:
        return self.cancelled or time.monotonic() > self.deadline

    def error(self, where: str):
        if self.cancelled and time.monotonic() <= self.deadline:
            return Cancelled(f"the client cancelled the call {where}")
        return DeadlineExceeded(f"deadline exceeded {where}")

    def check(self, where: str) -> None:
        if self.cancelled or time.monotonic() > self.deadline:
            raise self.error(where)

    def cancel(self, *_, deadline_passed: bool = False) -> None:
        """The call ended (the client cancelled or went away; or its deadline passed, as gRPC
        counts it: then the deadline is now): stop its work now. Safe from any thread."""
        now = time.monotonic()
        if deadline_passed:
            self.deadline = min(self.deadline, now)
        else:
            self.cancelled_at = min(self.cancelled_at, now)
            self.cancelled = True
        if not self.regions:  # (every call ends here, most with no region armed: no lock to take.) A region
            return  # armed meanwhile sees the bound's new state when it is armed (_Watchdog.arm)
        with _LOCK:
            for region in list(self.regions):
                region.fire()
                _WATCHDOG.refire(region)


CURRENT: contextvars.ContextVar[Bound | None] = contextvars.ContextVar("semigrad_bound", default=None)


def current() -> Bound | None:
    return CURRENT.get()


def check(where: str) -> None:
    """DeadlineExceeded (or Cancelled) naming `where` once the current request's bound has passed."""
    bound = CURRENT.get()
    if bound is not None and (bound.cancelled or time.monotonic() > bound.deadline):
        raise bound.error(where)


def checking(items: Iterable[T], where: str, every: int = 1024) -> Iterator[T]:
    """`items`, with `check(where)` before every `every`-th one: long Python loops (best paths'
    steps, their messages) stop at the deadline even when the watchdog's interruption was lost
    (Python drops an asynchronous exception that lands in a weakref callback the collector runs)."""
    for k, item in enumerate(items):
        if k % every == 0:
            check(where)
        yield item


STOP_POLL_SECONDS = 0.01  # how often a watcher looks at the bound of a `stoppable` call


def stoppable(call: Callable[[np.ndarray], T], where: str, watched: bool = True) -> T:
    """`call(stop)` for compiled code that polls `stop[0]` (an int8 array) and returns early once
    it is set: set within STOP_POLL_SECONDS of the current request's deadline or cancellation
    by a watcher thread (the code releases the GIL), then DeadlineExceeded or Cancelled naming
    `where`. A numba kernel is beyond both the watchdog's asynchronous exception and a check
    between calls: one k-best matmul ran 9 s past a deadline. Outside a request, or not
    `watched` (a call too short to be worth a thread), never set."""
    stop = np.zeros(1, np.int8)
    bound = CURRENT.get()
    if bound is None:
        return call(stop)
    bound.check(where)
    if not watched:
        return call(stop)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(STOP_POLL_SECONDS):
            if bound.expired():
                stop[0] = 1
                return

    watcher = threading.Thread(target=watch, name="semigrad-stop", daemon=True)
    watcher.start()
    try:
        result = call(stop)
    finally:
        done.set()
    if stop[0]:
        raise bound.error(where)
    return result


def deadline() -> float | None:
    """The current request's deadline (time.monotonic() seconds), or None outside a request."""
    bound = CURRENT.get()
    return None if bound is None else bound.deadline


def start(seconds: float | None, default: float) -> Bound:
    """A bound `seconds` from now (a client's deadline), or `default` seconds (the server's
    default and cap) when there is none or it is later."""
    return Bound(time.monotonic() + (default if seconds is None else min(seconds, default)))


class serving:  # noqa: N801 - used as a function, like contextlib's managers
    """Make `bound` the current request's bound in this thread (and in contexts copied from it),
    for the `with` block. (A class rather than a @contextmanager generator: it is on every call's
    path, where it costs a fifth as much.)"""

    __slots__ = ("bound", "_token")

    def __init__(self, bound: Bound | None):
        self.bound = bound

    def __enter__(self) -> Bound | None:
        self._token = CURRENT.set(self.bound)
        return self.bound

    def __exit__(self, *exc_info) -> None:
        CURRENT.reset(self._token)


# ---------------------------------------------------------------- interruptible regions

_LOCK = threading.Lock()
_ACTIVE = threading.local()  # .region: the armed region of this thread, if any
_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))


class _Region:
    __slots__ = ("thread", "bound", "armed", "fired")

    def __init__(self, thread: int, bound: Bound):
        self.thread, self.bound, self.armed, self.fired = thread, bound, True, False

    def fire(self) -> None:
        """(_LOCK held) Raise Interrupted in the region's thread if it is still inside. (At most
        one is ever pending: a second call replaces the first, it does not queue another.)"""
        if self.armed:
            self.fired = True
            _set_async_exc(self.thread, Interrupted)

    def disarm(self) -> None:
        """Leave the region: after this no Interrupted is raised, and none is pending."""
        while True:
            try:
                with _LOCK:
                    self.armed = False
                    if self in self.bound.regions:
                        self.bound.regions.remove(self)
                if self.fired:
                    _clear_async_exc(self.thread, None)
                return
            except Interrupted:  # delivered while leaving: the work is done, drop it
                continue


REFIRE_SECONDS = 0.02  # a region still armed this long after it was fired is fired again (_Watchdog)
MAX_WAIT_SECONDS = 1.0  # the watchdog's longest sleep (it is woken sooner for a region due before then)
COMPACT_AT = 1024  # regions waiting in the watchdog's heap before the ones already left are dropped


class _Watchdog:
    """One daemon thread firing armed regions at their bound's deadline."""

    def __init__(self):
        self._heap: list[tuple[float, int, _Region]] = []
        self._compact_at = COMPACT_AT
        self._order = itertools.count()
        self._wake = threading.Condition(_LOCK)
        self._thread: threading.Thread | None = None
        self._sleeping_until = 0.0  # when the thread wakes by itself (monotonic seconds; _LOCK)

    def arm(self, region: _Region) -> None:
        with _LOCK:
            region.bound.regions.append(region)
            if len(self._heap) >= self._compact_at:  # regions left long before their deadline
                self._heap = [entry for entry in self._heap if entry[2].armed]
                heapq.heapify(self._heap)
                self._compact_at = max(COMPACT_AT, 2 * len(self._heap))
            heapq.heappush(self._heap, (region.bound.deadline, next(self._order), region))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="semigrad-deadlines", daemon=True)
                self._thread.start()
            elif region.bound.deadline < self._sleeping_until:
                # Woken only when it would sleep past this deadline: waking it for every region
                # (every call) handed the GIL to it and back, ~30% of a small remote Gradient's
                # server time.
                self._wake.notify()
            if region.bound.cancelled:
                region.fire()
                self.refire(region)

    def refire(self, region: _Region) -> None:
        """(_LOCK held) Fire `region` again in REFIRE_SECONDS unless it has been left by then:
        Python drops an asynchronous exception that lands in a weakref callback or a __del__ the
        collector runs ("Exception ignored in ..."), and the region would run to its end (a
        DescribeGraph went on 15 s past its deadline, a SymPy expansion for minutes)."""
        heapq.heappush(self._heap, (time.monotonic() + REFIRE_SECONDS, next(self._order), region))
        self._wake.notify()

    def _run(self) -> None:
        with _LOCK:
            while True:
                while self._heap and not self._heap[0][2].armed:
                    heapq.heappop(self._heap)  # left already
                due = self._heap[0][0] - time.monotonic() if self._heap else MAX_WAIT_SECONDS
                if due > 0:
                    # Capped: a call without a deadline has an infinite bound, and a wait that long
                    # raises OverflowError, which ended this thread and every later interruption.
                    # (Within the cap, regions due later than it are armed without waking it.)
                    due = min(due, MAX_WAIT_SECONDS)
                    self._sleeping_until = time.monotonic() + due
                    self._wake.wait(due)
                    continue
                region = heapq.heappop(self._heap)[2]
                region.fire()
                self.refire(region)


_WATCHDOG = _Watchdog()


def interruptibly(what: str, fn: Callable[..., T], *args, **kwargs) -> T:
    """`fn(*args, **kwargs)`, stopped (DeadlineExceeded or Cancelled naming `what`) within
    moments of the current request's deadline or cancellation, even inside library code.
    Outside a request it is a plain call; inside another region of this thread, the outer
    region interrupts. (A function, not a context manager: an asynchronous exception landing
    as a context manager's __exit__ starts would escape the `with`.)"""
    bound = CURRENT.get()
    if bound is None:
        return fn(*args, **kwargs)
    bound.check(what)
    if getattr(_ACTIVE, "region", None) is not None:
        try:
            return fn(*args, **kwargs)
        except Interrupted:
            raise bound.error(what) from None
    region = _Region(threading.get_ident(), bound)
    try:
        try:
            _ACTIVE.region = region
            _WATCHDOG.arm(region)
            return fn(*args, **kwargs)
        finally:
            region.disarm()
            _ACTIVE.region = None
    except Interrupted:  # a refire may land while leaving: absorbed (leaving is idempotent)
        while True:
            try:
                region.disarm()
                _ACTIVE.region = None
                break
            except Interrupted:
                continue
        raise bound.error(what) from None


def context_of(bound: Bound | None) -> contextvars.Context:
    """A copy of this thread's context with `bound` current: run a request's work on another
    thread with `threading.Thread(target=context_of(bound).run, args=(work,))`."""
    context = contextvars.copy_context()
    context.run(CURRENT.set, bound)
    return context
