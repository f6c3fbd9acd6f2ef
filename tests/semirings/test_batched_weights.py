"""Batch axes on either side of a matmul under every semiring (vmap semantics, issue 12).

y = Σ tanh(x @ W) with the data x, the weights W or both carrying a batch axis. Each item's
result is ⊕ over the paths of φ(∂₁) ⊗ φ(∂₂) ⊗ φ(∂₃): W[i, j] reaches the output through
z[r, j] (∂ = x[r, i]) for every row r, then tanh (∂ = 1 - tanh²), then the sum (∂ = 1); x[r, i]
through z[r, j] (∂ = W[i, j]) for every column j. The expected values fold those paths with the
plugin semiring objects' own zeros, ones, add, mul and lift (no matmul, no backward pass).
"""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg
from test_path_enumeration import CONFIG_IDS, CONFIGS, semiring

ROWS, IN, OUT = 16, 32, 64
LAYOUTS = {"weights batched": (False, True), "data batched": (True, False), "both batched": (True, True)}


def path_sums(s, x: np.ndarray, w: np.ndarray):
    """{"x": ..., "W": ...} semiring values, per item, for x (B, ROWS, IN) and w (B, IN, OUT)."""
    t = np.tanh(x @ w)
    dt = 1.0 - t * t
    batch = x.shape[0]

    def fold(terms, shape):
        total = s.zeros(shape)
        for partials in terms:  # each path: its partials, nearest the input first
            product = s.ones(shape)
            for d in partials:
                product = s.mul(product, s.lift(np.ascontiguousarray(np.broadcast_to(d, shape))))
            total = s.add(total, product)
        return total

    one = np.ones(())
    dw = fold(((x[:, r, :, None], dt[:, r, None, :], one) for r in range(ROWS)), (batch, IN, OUT))
    dx = fold(((w[:, None, :, j], dt[:, :, None, j], one) for j in range(OUT)), (batch, ROWS, IN))
    return {"x": dx, "W": dw}


@pytest.fixture(scope="module")
def graph(client):
    g = sg.Graph()
    x, w = g.input("x", (ROWS, IN)), g.input("W", (IN, OUT))
    g.output("y", sg.sum(sg.tanh(x @ w)))
    return client.register(g)


@pytest.mark.parametrize("batch", [1, 8, 100])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name,params", CONFIGS, ids=CONFIG_IDS)
def test_matmul_with_batch_axes_on_either_operand(graph, rng, name, params, layout, batch):
    s = semiring(name, params)
    x_batched, w_batched = LAYOUTS[layout]
    x = rng.normal(size=((batch,) if x_batched else ()) + (ROWS, IN))
    w = rng.normal(size=((batch,) if w_batched else ()) + (IN, OUT)) / np.sqrt(IN)
    got = graph.gradient({"x": x, "W": w}, semiring=name, semiring_params=params, return_components=True)
    want = path_sums(s, np.broadcast_to(x, (batch, ROWS, IN)), np.broadcast_to(w, (batch, IN, OUT)))
    for input_name, value in want.items():
        expected = s.read(value)
        assert set(got.components[input_name]) == set(expected), input_name
        for key, array in expected.items():
            np.testing.assert_allclose(got.components[input_name][key], array, rtol=1e-9, atol=1e-12,
                                       err_msg=f"{name}: d/d{input_name} ({key})")
