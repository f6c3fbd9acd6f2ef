"""gradient_many takes the batch axes gradient takes (vmap semantics, NumPy broadcasting of the
inputs' batch shapes), and refuses the ones gradient refuses with the same INVALID_ARGUMENT.

Found by using it as a user (attack of issue 12): inputs whose batch shapes broadcast but
differ on the first axis ((1,) against (3,), or (2, 5) against (5,)) were refused by the client
with a bare ValueError, and batch shapes that do not broadcast raised a ValueError naming no input.
The reference is a per-item NumPy loop with the closed-form gradient of sum(tanh(x @ w))."""

import numpy as np
import pytest

import semigrad as sg


def _loss(x, w):
    return np.sum(np.tanh(x @ w))


def _reference(x, w):
    """Per-item gradients (dx, dw) of sum(tanh(x @ w)), by a loop over the broadcast batch."""
    batch = np.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    xs, ws = np.broadcast_to(x, batch + x.shape[-2:]), np.broadcast_to(w, batch + w.shape[-2:])
    dx, dw = np.empty(xs.shape), np.empty(ws.shape)
    for item in np.ndindex(*batch):
        t = np.tanh(xs[item] @ ws[item])
        dz = 1 - t * t
        dx[item], dw[item] = dz @ ws[item].T, xs[item].T @ dz
    return dx, dw


@pytest.fixture(scope="module")
def graph():
    with sg.Client() as client:
        yield client.register(sg.trace(_loss, np.zeros((3, 4)), np.zeros((4, 5))))


@pytest.mark.parametrize("x_batch, w_batch", [((1,), (6,)), ((6,), (1,)), ((2, 5), (5,)), ((2, 1), (3,)),
                                              ((6,), ()), ((7,), (7,))])
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_broadcast_batch_axes_as_gradient(graph, x_batch, w_batch, chunk_size):
    rng = np.random.default_rng(len(x_batch) * 10 + len(w_batch))
    x, w = rng.normal(size=x_batch + (3, 4)), rng.normal(size=w_batch + (4, 5))
    many = graph.gradient_many({"x": x, "w": w}, chunk_size=chunk_size, progress=False)
    dx, dw = _reference(x, w)
    assert many["x"].shape == dx.shape and many["w"].shape == dw.shape
    np.testing.assert_allclose(many["x"], dx, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(many["w"], dw, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_disagreeing_batch_axes_refused_like_gradient(graph, chunk_size):
    rng = np.random.default_rng(0)
    inputs = {"x": rng.normal(size=(3, 3, 4)), "w": rng.normal(size=(4, 4, 5))}
    with pytest.raises(sg.InvalidArgument) as unary:
        graph.gradient(inputs)
    with pytest.raises(sg.InvalidArgument) as streamed:
        graph.gradient_many(inputs, chunk_size=chunk_size, progress=False)
    assert streamed.value.message == unary.value.message
    assert "x: [3]" in streamed.value.message and "w: [4]" in streamed.value.message


@pytest.mark.parametrize("p_batch, q_batch", [((1000, 3), (1000, 3)), ((1000, 1), (1, 3))])
def test_items_allowed_are_counted_over_every_batch_axis(p_batch, q_batch):
    """A chunk refused for its item count says how many items fit (max_items); chunks are cut
    along the first batch axis, whose rows hold the product of the other batch axes' items. With
    two batch axes, (1000, 3), the client cut 500 rows (1,500 items) down to max_items = 1,000 rows
    (3,000 items) and failed every chunk."""
    from semigrad_server.limits import Limits

    g = sg.Graph()
    p, q = g.input("p", ()), g.input("q", ())
    g.output("o", sg.sin(p) * q)
    rng = np.random.default_rng(5)
    pv, qv = rng.normal(size=p_batch), rng.normal(size=q_batch)
    with sg.Client(limits=Limits(max_batch=1000)) as client:
        grads = client.register(g).gradient_many({"p": pv, "q": qv}, progress=False)
    np.testing.assert_allclose(grads["p"], np.cos(pv) * qv, rtol=1e-15)
    np.testing.assert_allclose(grads["q"], np.broadcast_to(np.sin(pv), (1000, 3)), rtol=1e-15)
