"""Generated shapes, axes, indices (negative ones and repeats included) and batch axes for
gather and scatter_add: values and gradients against per-item NumPy loops."""

from __future__ import annotations

import numpy as np
import semigrad as sg
from hypothesis import given
from hypothesis import strategies as st


def shapes(min_rank, max_rank, min_side=0):
    return st.lists(st.integers(min_side, 3), min_size=min_rank, max_size=max_rank).map(tuple)


@st.composite
def gather_cases(draw):
    x_shape = draw(shapes(1, 3, min_side=1))
    axis = draw(st.integers(-len(x_shape), len(x_shape) - 1))
    n = x_shape[axis]
    i_shape = draw(shapes(0, 2))
    x_batch, i_batch = draw(st.sampled_from([((), ()), ((2,), ()), ((), (2,)), ((2, 1), (3,))]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=x_batch + x_shape)
    idx = rng.integers(-n, n, size=i_batch + i_shape)
    return x_shape, axis, i_shape, x, idx, rng


def per_item(x, idx, x_rank, i_rank):
    """Pairs of items of x and idx over their broadcast batch axes, with the batch index."""
    lead = np.broadcast_shapes(x.shape[: x.ndim - x_rank], idx.shape[: idx.ndim - i_rank])
    xb = np.broadcast_to(x, lead + x.shape[x.ndim - x_rank:])
    ib = np.broadcast_to(idx, lead + idx.shape[idx.ndim - i_rank:])
    return lead, [(b, xb[b], ib[b]) for b in np.ndindex(*lead)]


def scatter_loop(u, idx, size, axis):
    out = np.zeros(u.shape[:axis] + (size,) + u.shape[axis + idx.ndim:])
    for k in np.ndindex(*idx.shape):
        out[(slice(None),) * axis + (idx[k] % size,)] += u[(slice(None),) * axis + k]
    return out


@given(gather_cases())
def test_gather_values_and_gradients_match_numpy_loops(client, case):
    x_shape, axis, i_shape, x, idx, rng = case
    g = sg.Graph()
    out = sg.gather(g.input("x", x_shape), g.input("i", i_shape, dtype="int64"), axis=axis)
    g.output("out", out)
    f = client.register(g)
    got = f.evaluate({"x": x, "i": idx})["out"]
    seed = rng.normal(size=got.shape)
    grad = f.gradient({"x": x, "i": idx}, seeds={"out": seed})["x"]
    a = axis % len(x_shape)
    lead, items = per_item(x, idx, len(x_shape), len(i_shape))
    assert got.shape == lead + out.shape and grad.shape == lead + x_shape
    for b, xi, ii in items:
        np.testing.assert_array_equal(got[b], np.take(xi, ii, axis=a))
        np.testing.assert_allclose(grad[b], scatter_loop(seed[b], ii, x_shape[a], a), rtol=1e-12, atol=1e-12)


@given(gather_cases())
def test_scatter_add_values_and_gradients_match_numpy_loops(client, case):
    x_shape, axis, i_shape, x, idx, rng = case
    a = axis % len(x_shape)
    size = x_shape[a]
    u_shape = x_shape[:a] + i_shape + x_shape[a + 1:]
    u = rng.normal(size=x.shape[: x.ndim - len(x_shape)] + u_shape)
    g = sg.Graph()
    g.output("out", sg.scatter_add(g.input("u", u_shape), g.input("i", i_shape, dtype="int64"), size, axis=a))
    f = client.register(g)
    got = f.evaluate({"u": u, "i": idx})["out"]
    seed = rng.normal(size=got.shape)
    grad = f.gradient({"u": u, "i": idx}, seeds={"out": seed})["u"]
    lead, items = per_item(u, idx, len(u_shape), len(i_shape))
    for b, ui, ii in items:
        np.testing.assert_allclose(got[b], scatter_loop(ui, ii, size, a), rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(grad[b], np.take(seed[b], ii, axis=a))
