"""collector.paused: the cyclic collector is off inside, back on after the last of nested or
concurrent blocks, and left off when the application had turned it off."""

from __future__ import annotations

import gc
import threading

import pytest

from semigrad import collector


@pytest.fixture(autouse=True)
def restore_collector():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_resumed_after_the_last_nested_block():
    gc.enable()
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_resumed_after_an_exception():
    gc.enable()
    with pytest.raises(RuntimeError):
        with collector.paused():
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_an_application_that_disabled_the_collector_keeps_it_disabled():
    gc.disable()
    with collector.paused():
        pass
    assert not gc.isenabled()


def test_concurrent_blocks_resume_when_the_last_thread_leaves():
    gc.enable()
    first_inside, second_inside, first_may_leave = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with collector.paused():
            first_inside.set()
            first_may_leave.wait(10)
        seen["after first"] = gc.isenabled()
        second_left.wait(10)

    second_left = threading.Event()

    def second():
        first_inside.wait(10)
        with collector.paused():
            second_inside.set()
            first_may_leave.set()
            t1.join(0.5)  # the first leaves while this one is still inside
            seen["second inside after first left"] = gc.isenabled()
        second_left.set()

    t1, t2 = threading.Thread(target=first), threading.Thread(target=second)
    t1.start(), t2.start()
    t2.join(10), t1.join(10)
    assert seen == {"after first": False, "second inside after first left": False}
    assert gc.isenabled()
