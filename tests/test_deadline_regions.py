"""deadline.interruptibly: library code that never looks at the clock (a pure-Python loop,
SymPy) stops at the bound; nothing is left pending after a region ends; code that catches
`Exception` cannot swallow the interruption; a cancellation interrupts at once."""

from __future__ import annotations

import threading
import time

import pytest
import sympy as sp
from semigrad_server import deadline
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
