"""Ops for imported models, beyond the op table: the PyTorch rules at their edges (clamp's
bounds, GELU's forms) and refusals with the right status."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import semigrad as sg


def one_op(fn, shape=(5,)):
    g = sg.Graph()
    x = g.input("x", shape)
    g.output("out", fn(x))
    return g


def test_clamp_passes_the_gradient_at_its_bounds_as_pytorch_does(client):
    """torch.clamp's backward is 1 where min <= x <= max: at x == min and x == max too."""
    f = client.register(one_op(lambda x: sg.clamp(x, -1.0, 2.0)))
    x = np.array([-3.0, -1.0, 0.5, 2.0, 7.0])
    np.testing.assert_array_equal(f.evaluate({"x": x})["out"], [-1.0, -1.0, 0.5, 2.0, 2.0])
    np.testing.assert_array_equal(f.gradient({"x": x})["x"], [0.0, 1.0, 1.0, 1.0, 0.0])


def test_clamp_with_min_above_max_gives_max_everywhere_and_no_gradient(client):
    """torch.clamp(x, 2, 1) is 1 everywhere (max applied last); its gradient mask is empty."""
    f = client.register(one_op(lambda x: sg.clamp(x, 2.0, 1.0), (3,)))
    x = np.array([0.0, 1.5, 3.0])
    np.testing.assert_array_equal(f.evaluate({"x": x})["out"], [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(f.gradient({"x": x})["x"], [0.0, 0.0, 0.0])


def test_clamp_without_bounds_is_refused(client):
    with pytest.raises(ValueError, match="clamp"):
        one_op(lambda x: sg.clamp(x))
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("out", g.add_node("clamp", [x], {}, name="c"))
    with pytest.raises(sg.SemigradError) as excinfo:
        client.register(g)
    assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT and "'c'" in excinfo.value.message
