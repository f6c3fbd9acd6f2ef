"""A compiled plan returns several kinds of value at once (outputs, node values, gradients,
adjoints, seeds); a user's names for inputs and outputs, whatever they spell, must not be
mistaken for another kind. (Results used to be keyed by strings such as "grad:" + input, so an
output named "grad:x" replaced the gradient of x, and an input named "seed:y" was taken for the
cotangent of output y.)"""

from __future__ import annotations

import numpy as np
import pytest
from semigrad_server.engine import Engine
from semigrad_server.ir import Graph, InputSpec, Node

X = np.array([0.3, 0.7])
SEED_LIKE = np.array([2.0, 3.0])


@pytest.fixture(scope="module")
def registered():
    """Outputs "grad:x" = "node:t" = sin(x) and "y" = t = x · s, where the input s is named "seed:y"."""
    engine = Engine()
    graph = Graph((InputSpec("x", (2,)), InputSpec("seed:y", (2,))),
                  (Node("node:x", "sin", ("x",)), Node("t", "mul", ("x", "seed:y"))),
                  (("grad:x", "node:x"), ("y", "t"), ("node:t", "node:x")))
    return engine, engine.register(graph)[0].id


def inputs():
    return {"x": X, "seed:y": SEED_LIKE}


@pytest.mark.parametrize("backend", ["tensor", "scalar"])
def test_an_output_named_like_a_gradient_keeps_both_values(registered, backend):
    engine, gid = registered
    result = engine.gradient(gid, inputs(), wrt=["x"], return_outputs=True, backend=backend)
    np.testing.assert_allclose(result.gradients["x"], 2 * np.cos(X) + SEED_LIKE, rtol=1e-15)
    np.testing.assert_allclose(result.outputs["grad:x"], np.sin(X), rtol=1e-15)


@pytest.mark.parametrize("backend", ["tensor", "scalar"])
def test_an_input_named_like_a_seed_is_not_the_seed(registered, backend):
    engine, gid = registered
    result = engine.gradient(gid, inputs(), wrt=["x"], outputs=["y"], seeds={"y": np.full(2, 10.0)}, backend=backend)
    np.testing.assert_allclose(result.gradients["x"], 10.0 * SEED_LIKE, rtol=1e-15)


@pytest.mark.parametrize("backend", ["tensor", "scalar"])
def test_an_output_named_like_a_node_value_is_not_that_node(registered, backend):
    engine, gid = registered
    outputs, nodes = engine.evaluate(gid, inputs(), nodes=["node:x", "t"], backend=backend)
    np.testing.assert_allclose(outputs["node:t"], np.sin(X), rtol=1e-15)
    np.testing.assert_allclose(outputs["grad:x"], np.sin(X), rtol=1e-15)
    np.testing.assert_allclose(nodes["node:x"], np.sin(X), rtol=1e-15)
    np.testing.assert_allclose(nodes["t"], X * SEED_LIKE, rtol=1e-15)


def test_retained_adjoints_are_not_taken_for_outputs(registered):
    engine, gid = registered
    result = engine.gradient(gid, inputs(), wrt=["x"], retain=["node:x", "t"], backend="tensor")
    np.testing.assert_allclose(result.retained["node:x"], np.full(2, 2.0), rtol=1e-15)  # two outputs are sin(x)
    np.testing.assert_allclose(result.retained["t"], np.ones(2), rtol=1e-15)
    np.testing.assert_allclose(result.gradients["x"], 2 * np.cos(X) + SEED_LIKE, rtol=1e-15)
