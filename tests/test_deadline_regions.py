"""deadline.interruptibly: library code that never looks at the clock (a pure-Python loop,
SymPy) stops at the bound; nothing is left pending after a region ends; code that catches
`Exception` cannot swallow the interruption; a cancellation interrupts at once."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import sympy as sp
from semigrad_server import deadline
from semigrad_server.semiring import kernels, pointer_kernels
from semigrad_server.errors import Cancelled, DeadlineExceeded

SLACK = 0.1  # seconds


def spin():
    while True:
        pass


def swallowing_spin():
    """Library code that catches every Exception and goes on."""
    while True:
        try:
            spin()
        except Exception:  # noqa: BLE001 - the point of the test
            pass


@pytest.mark.parametrize("work", [spin, swallowing_spin,
                                  lambda: sp.expand((sp.Symbol("x") + 1) ** 4000 * (sp.Symbol("x") - 2) ** 4000)],
                         ids=["loop", "swallowing-loop", "sympy"])
def test_a_region_stops_at_the_deadline(work):
    bound = deadline.Bound(time.monotonic() + 0.2)
    started = time.monotonic()
    with deadline.serving(bound), pytest.raises(DeadlineExceeded, match="deadline exceeded in the test"):
        deadline.interruptibly("in the test", work)
    assert time.monotonic() - started < 0.2 + SLACK + 0.5  # generous: a loaded machine schedules late


def test_a_region_without_a_deadline_leaves_the_watchdog_serving_later_ones():
    """A call without any deadline has an infinite bound; waiting for it once killed the watchdog
    (OverflowError), and no later region was ever interrupted."""
    endless = deadline.Bound(float("inf"))
    with deadline.serving(endless):
        assert deadline.interruptibly("in the test", lambda: time.sleep(0.3) or 42) == 42  # the watchdog waits on it
    started = time.monotonic()
    bound = deadline.Bound(time.monotonic() + 0.2)
    with deadline.serving(bound), pytest.raises(DeadlineExceeded):
        deadline.interruptibly("in the test", spin)
    assert time.monotonic() - started < 0.2 + SLACK + 0.5


def test_a_cancellation_interrupts_at_once():
    bound = deadline.Bound(time.monotonic() + 60)
    threading.Timer(0.2, bound.cancel).start()
    started = time.monotonic()
    with deadline.serving(bound), pytest.raises(Cancelled):
        deadline.interruptibly("in the test", spin)
    assert time.monotonic() - started < 5


def test_nothing_is_pending_after_a_region_and_nested_regions_name_the_inner_phase():
    bound = deadline.Bound(time.monotonic() + 0.3)
    with deadline.serving(bound):
        assert deadline.interruptibly("outer", lambda: deadline.interruptibly("inner", lambda: 42)) == 42
        with pytest.raises(DeadlineExceeded, match="inner"):
            deadline.interruptibly("outer", lambda: deadline.interruptibly("inner", spin))
    time.sleep(0.3)  # past the bound, outside any region: no exception arrives
    x = 0
    for i in range(200_000):
        x += i
    assert x == sum(range(200_000))


def test_outside_a_request_a_region_is_a_plain_call():
    assert deadline.interruptibly("anything", lambda: 7) == 7
    deadline.check("anything")  # no bound: nothing to check


def losing_interruptions(times: int):
    """Work that loses its first `times` interruptions, as Python loses an asynchronous exception
    landing in a weakref or gc callback ("Exception ignored in ..."; CI saw it in hypothesis's gc
    callback and in a WeakValueDictionary's)."""
    def work():
        for _ in range(times):
            try:
                spin()
            except deadline.Interrupted:
                pass
        spin()
    return work


@pytest.mark.parametrize("times", [1, 5])
def test_a_lost_interruption_is_fired_again(times):
    """The watchdog fires a region again every REFIRE_SECONDS until it is left (with one fire the
    work above never ends; with refires every 250 ms a compile went 890 ms past its deadline in CI)."""
    bound = deadline.Bound(time.monotonic() + 0.2)
    started = time.monotonic()
    with deadline.serving(bound), pytest.raises(DeadlineExceeded):
        deadline.interruptibly("in the test", losing_interruptions(times))
    assert time.monotonic() - started < 0.2 + SLACK + 0.5 + times * deadline.REFIRE_SECONDS


# ---------------------------------------------------------------- compiled kernels: deadline.stoppable

K = 10


def kbest_operands(items: int, m: int, kk: int, n: int, nan: bool):
    """a: K ranks with pointers (items, m, kk); b: a lifted partial (kk, n), a NaN in it if `nan`
    (which sends the matmul to the one-pass kernel)."""
    rng = np.random.default_rng()
    shape = (items, m, kk) if items else (m, kk)
    va = -np.sort(-rng.random((K,) + shape), axis=0)
    pa = np.arange(va.size, dtype=float).reshape(va.shape)
    vb = rng.random((kk, n))
    if nan:
        vb[0, 0] = np.nan
    lifted = [vb] + [np.zeros((kk, n))] * (K - 1) + [np.full((kk, n), -1.0)] * K + [vb] + [np.zeros((kk, n))] * (K - 1)
    return tuple(va) + tuple(pa) + tuple(rng.random((K,) + shape)), tuple(lifted)


# sizes for which each kernel runs 1-1.5 s on this project's machines, unstopped
KERNELS = {"block bound": (1024, 512, 512, False), "one pass": (1024, 512, 256, True)}


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_compiled_k_best_matmul_stops_at_the_deadline(kernel):
    """A k-best matmul is one numba call: neither a check between calls nor the watchdog's
    asynchronous exception reaches into it (at top_paths = 64 one ran 9 s past a deadline). It
    polls a flag that deadline.stoppable's watcher sets at the deadline, and returns early: here
    0.5 s into a call of 1-1.5 s, after the operands are stacked (~0.05-0.15 s idle; at 0.3 s a
    full run's other worker once made the stacking itself reach the deadline)."""
    m, kk, n, nan = KERNELS[kernel]
    small_a, small_b = kbest_operands(0, 8, 32, 32, nan)
    pointer_kernels.kbest_pointer_matmul(small_a, small_b, K, "max", "mul", 0.0)  # compiled
    a, b = kbest_operands(0, m, kk, n, nan)
    before = kernels.calls.get(("kbest_pointer_matmul", kernel), 0)
    bound = deadline.Bound(time.monotonic() + 0.5)
    with deadline.serving(bound), pytest.raises(DeadlineExceeded, match="in a k-best matmul"):
        pointer_kernels.kbest_pointer_matmul(a, b, K, "max", "mul", 0.0)
    overrun = time.monotonic() - bound.deadline
    assert kernels.calls.get(("kbest_pointer_matmul", kernel), 0) == before + 1  # this kernel
    assert overrun < allowed_overrun(), f"stopped {overrun:.3f} s late"


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
def test_the_few_rows_k_best_kernel_stops_at_the_deadline():
    """The by-rows kernel (a row-wise Jacobian's k-best adjoint) polls the flag every row: called
    directly here, as kbest_pointer_matmul calls it, with 48 rows of (1, 1024) by (1024, 1024)
    (~0.5 s unstopped) and the deadline 0.1 s into it."""
    items, m, kk, n = 16, 3, 1024, 1024
    rng = np.random.default_rng()
    va = -np.sort(-rng.random((items, m, kk, K)), axis=-1)
    pa, qa = np.arange(va.size, dtype=float).reshape(va.shape), rng.random(va.shape)
    vb, qb = rng.random((items, kk, n)), rng.random((items, kk, n))
    out = [np.full((items, m, n, K), 0.0), np.full((items, m, n, K), -1.0), np.zeros((items, m, n, K))]
    rows = kernels.jit_kernels().kbest_pointers_rows_max_mul

    def run(stop):
        rows(va, pa, qa, vb, qb, 0.0, 40, 1, *out, 0.0, stop)

    small = [np.ascontiguousarray(x) for x in (va[:1, :1, :32], pa[:1, :1, :32], qa[:1, :1, :32], vb[:1, :32, :32],
                                                qb[:1, :32, :32], *(o[:1, :1, :32] for o in out))]
    deadline.stoppable(lambda stop: rows(*small[:5], 0.0, 32, 1, *small[5:], 0.0, stop), "compiling")
    bound = deadline.Bound(time.monotonic() + 0.1)
    with deadline.serving(bound), pytest.raises(DeadlineExceeded, match="in the rows kernel"):
        deadline.stoppable(run, "in the rows kernel")
    overrun = time.monotonic() - bound.deadline
    assert overrun < allowed_overrun(), f"stopped {overrun:.3f} s late"
    assert (out[1][-1] == -1.0).all()  # the last item's rows never reached: it returned early


def allowed_overrun() -> float:
    return SLACK * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
def test_the_kbest_semirings_matmul_stops_at_the_deadline():
    """The kbest semiring's own matmul kernel (kernels.kbest_matmul; at k = 64 over a 4,000 x 64
    matmul it ran 1-4 s past a deadline) polls the same flag: 0.3 s into a call of ~1-2 s."""
    k, m, kk, n = 16, 1500, 256, 256
    rng = np.random.default_rng()

    def ranks(shape):
        return list(-np.sort(-rng.random((k,) + shape), axis=0))

    kernels.kbest_matmul(ranks((8, 32)), ranks((32, 8)), backend="numba")  # compiled
    a, b = ranks((m, kk)), ranks((kk, n))
    bound = deadline.Bound(time.monotonic() + 0.3)
    with deadline.serving(bound), pytest.raises(DeadlineExceeded, match="in a k-best matmul"):
        kernels.kbest_matmul(a, b, backend="numba")
    overrun = time.monotonic() - bound.deadline
    assert overrun < allowed_overrun(), f"stopped {overrun:.3f} s late"
    assert kernels.backend() == "numba"  # the stop is no failure of the kernel
