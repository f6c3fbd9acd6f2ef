"""Which outputs a request differentiates by default: every float output, for Gradient as for
CrossCheck, DescribeGraph and DrawGraph. An int or bool output beside a loss (a predicted class,
a mask) is left out; naming one is refused. Found by an attacker: a default gradient of such a
graph failed naming the int output, even when the request's real fault was a bool wrt input."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg


def loss_and_class() -> sg.Graph:
    g = sg.Graph()
    x, m = g.input("x", (3,)), g.input("m", (3,), dtype="bool")
    g.output("loss", sg.sum(sg.where(m, sg.sin(x), x)))
    g.output("best", sg.argmax(x))
    return g


INPUTS = {"x": np.array([0.1, 0.2, 0.3]), "m": np.array([True, False, True])}
EXPECTED = np.where(INPUTS["m"], np.cos(INPUTS["x"]), 1.0)


def test_a_default_gradient_differentiates_the_float_outputs(client):
    f = client.register(loss_and_class())
    np.testing.assert_allclose(f.gradient(INPUTS)["x"], EXPECTED, rtol=1e-15)
    grads, outputs = f.gradient(INPUTS, return_outputs=True)
    np.testing.assert_allclose(grads["x"], EXPECTED, rtol=1e-15)
    assert set(outputs) == {"loss"}
    np.testing.assert_allclose(f.gradient_many({"x": np.stack([INPUTS["x"]] * 4), "m": INPUTS["m"]})["x"],
                               np.stack([EXPECTED] * 4), rtol=1e-15)


def test_naming_an_int_output_or_a_bool_input_is_refused_naming_it(client):
    f = client.register(loss_and_class())
    with pytest.raises(sg.InvalidArgument, match=r"output 'best' has dtype int64 and cannot be differentiated"):
        f.gradient(INPUTS, outputs="best")
    with pytest.raises(sg.InvalidArgument, match=r"wrt input 'm' has dtype bool"):
        f.gradient(INPUTS, wrt="m")


def test_a_graph_without_float_outputs_says_so(client):
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("best", sg.argmax(x))
    with pytest.raises(sg.InvalidArgument, match=r"no float outputs to differentiate"):
        client.register(g).gradient({"x": np.ones(3)})
