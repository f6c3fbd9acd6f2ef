"""The in-process client's short path (a plain gradient or evaluation) stops compiling at the
call's deadline, as a remote call does.

Found by the attack of issue 12: sg.Client(timeout=0.2), the first gradient of the README's
recursive det n=7 traced with sg.trace, answered DEADLINE_EXCEEDED after 0.69 s, once the
whole compile had run (the next call found it compiled): the short path gave the engine a
deadline but no request bound, so `deadline.interruptibly` could not stop the compile. Here the
compile is made slow on purpose (scalarising the program sleeps in Python first), so the test needs
no large graph."""

import time

import numpy as np
import pytest

import semigrad as sg
from semigrad_server.runtime import compiled

SLOW = 3.0


@pytest.fixture
def slow_compiles(monkeypatch):
    real = compiled.scalarize

    def slow(*args, **kwargs):
        end = time.monotonic() + SLOW
        while time.monotonic() < end:  # Python steps: an interruptible phase stops here
            time.sleep(0.001)
        return real(*args, **kwargs)

    monkeypatch.setattr(compiled, "scalarize", slow)


@pytest.mark.parametrize("call", ["gradient", "evaluate"])
def test_compile_ends_at_the_deadline_in_process(slow_compiles, call):
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("y", sg.sum(sg.tanh(x) * x))
    with sg.Client(timeout=30) as client:
        f = client.register(g)
        client.timeout = 0.3
        start = time.monotonic()
        with pytest.raises(sg.DeadlineExceeded):
            getattr(f, call)({"x": np.array([0.1, 0.2, 0.3])})
        assert time.monotonic() - start < 0.3 + 1.0  # not the compile's SLOW seconds
        client.timeout = 30
        x0 = np.array([0.1, 0.2, 0.3])
        if call == "gradient":  # and the graph still works
            np.testing.assert_allclose(f.gradient({"x": x0})["x"], np.tanh(x0) + x0 * (1 - np.tanh(x0) ** 2), rtol=1e-14)
