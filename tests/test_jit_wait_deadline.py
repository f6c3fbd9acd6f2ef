"""backend="jit" waits for its program's background compile only until the call's deadline, on
the in-process client's short path too.

Found by the attack of issue 12: sg.Client(timeout=9) asking backend="jit" for the README's
recursive det n=7 (a fresh 1,000-matrix batch) answered DEADLINE_EXCEEDED only after 17.7 s,
when the compile had finished: the short path runs the engine with a deadline but no request
bound, and the JIT wait checked only the bound. The compile here is made slow on purpose (the
program's compile is replaced by one that sleeps), so the test needs no large graph."""

import time

import numpy as np
import pytest

import semigrad as sg
from semigrad_server.runtime import jit

SLOW = 3.0  # seconds the compile takes; the call's deadline is far shorter


@pytest.fixture
def slow_compiles(monkeypatch):
    real = jit.JitProgram._background

    def background(self, batched):
        time.sleep(SLOW)
        return real(self, batched)

    monkeypatch.setattr(jit.JitProgram, "_background", background)


@pytest.mark.parametrize("batch", [None, 300])
def test_jit_wait_ends_at_the_deadline_in_process(slow_compiles, batch):
    g = sg.Graph()
    a = g.input("A", (2, 2))
    g.output("det", a[0, 0] * a[1, 1] - a[0, 1] * a[1, 0])
    with sg.Client(timeout=30) as client:
        f = client.register(g)
        client.timeout = 0.5
        value = np.random.default_rng(0).normal(size=(2, 2) if batch is None else (batch, 2, 2))
        start = time.monotonic()
        with pytest.raises(sg.DeadlineExceeded, match="JIT compile"):
            f.gradient({"A": value}, backend="jit")
        assert time.monotonic() - start < 0.5 + 1.0  # not the compile's SLOW seconds
