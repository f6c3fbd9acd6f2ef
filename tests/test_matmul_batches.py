"""Matmul in the tensor plan, and batch axes on any operand (issue 12, items 1 and 2).

Only ops declared elementwise may write their result into a request's shared-memory output
region or into a dying operand's buffer; a matmul (or any other kind) allocates its own. And a
batch is vmap's: any input may carry leading batch axes, weights included. Every expected value
here comes from NumPy (forward passes, hand-written backprop, central differences), never from
the service; each case runs on both sides of the thresholds involved: inline vs shared memory,
dying operands below and above the plan's 32,768-element reuse threshold, batch 1 vs many.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import semigrad as sg
from semigrad_server.runtime.plan import REUSE_MIN_ELEMENTS
from workloads import SEMIGRAD_OPS, _mlp_gradient, mlp_loss

TRANSPORTS = ["default", "inline", "shared"]  # default: shared memory from 128 KiB on loopback


@pytest.fixture(scope="module")
def clients(server_address):
    made = {"default": sg.Client(server_address), "inline": sg.Client(server_address, shared_memory=False),
            "shared": sg.Client(server_address, shared_memory=True)}
    yield made
    for c in made.values():
        c.close()


def central_differences(loss, inputs: dict, name: str, item_shape: tuple, batch: tuple,
                        h: float = 1e-5) -> np.ndarray:
    """Per-item gradient of `loss(**inputs)` (a NumPy function returning one loss per batch item)
    w.r.t. `inputs[name]`, whose trailing axes are `item_shape`. Items are independent, so
    element j of every item is perturbed at once (a shared input's element j once: each item's
    loss then moves by its own derivative)."""
    x = inputs[name]
    grad = np.empty(batch + item_shape)
    for j in np.ndindex(*item_shape):
        at = (Ellipsis,) + j
        step = h * np.maximum(1.0, np.abs(x[at]))
        plus, minus = x.copy(), x.copy()
        plus[at] += step
        minus[at] -= step
        grad[at] = (loss(**{**inputs, name: plus}) - loss(**{**inputs, name: minus})) / (2 * step)
    return grad


# ---------------------------------------------------------------- a transformer block, batched data

T, D, DK, HIDDEN = 8, 3, 4, 6
BLOCK_SHAPES = {"x": (T, D), "Wq": (D, DK), "Wk": (D, DK), "Wv": (D, DK), "Wo": (DK, D),
                "W1": (D, HIDDEN), "b1": (HIDDEN,), "W2": (HIDDEN, D)}


def block_graph() -> sg.Graph:
    """One attention head (softmax over keys) with a residual, then a tanh MLP with a residual."""
    g = sg.Graph()
    x, Wq, Wk, Wv, Wo, W1, b1, W2 = (g.input(n, s) for n, s in BLOCK_SHAPES.items())
    q, k, v = x @ Wq, x @ Wk, x @ Wv
    scores = (q @ k.T) * 0.5
    e = sg.exp(scores - sg.max(scores, axis=1, keepdims=True))
    attention = (e / sg.sum(e, axis=1, keepdims=True)) @ v
    h = x + attention @ Wo
    y = h + sg.tanh(h @ W1 + b1) @ W2
    g.output("loss", sg.sum(y * y))
    g.output("attention", attention)  # a matmul result returned as it is
    return g


def block_numpy(x, Wq, Wk, Wv, Wo, W1, b1, W2):
    """The block in NumPy over leading batch axes: (loss per item, attention)."""
    q, k, v = x @ Wq, x @ Wk, x @ Wv
    scores = (q @ np.swapaxes(k, -1, -2)) * 0.5
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    attention = (e / e.sum(axis=-1, keepdims=True)) @ v
    h = x + attention @ Wo
    y = h + np.tanh(h @ W1 + b1) @ W2
    return np.sum(y * y, axis=(-2, -1)), attention


@pytest.mark.parametrize("batch", [1, 77, 1000])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_transformer_block_over_a_batch_of_sentences(clients, rng, transport, batch):
    """Returned matmul results (the attention output; the weights' per-sentence gradients, each
    x_bᵀ·g_b) were written by the plan straight into the shared-memory output region, as if
    elementwise: INVALID_ARGUMENT shape mismatch (batch, 3, 8) and (batch, 8, 4)."""
    f = clients[transport].register(block_graph())
    inputs = {n: rng.normal(size=((batch,) + s if n == "x" else s)) * (0.5 if n != "x" else 1.0)
              for n, s in BLOCK_SHAPES.items()}
    loss, attention = block_numpy(**inputs)

    values = f.evaluate(inputs)
    np.testing.assert_allclose(values["loss"], loss, rtol=1e-12)
    np.testing.assert_allclose(values["attention"], attention, rtol=1e-12, atol=1e-14)

    grads, outputs = f.gradient(inputs, outputs="loss", return_outputs=True)
    np.testing.assert_allclose(outputs["loss"], loss, rtol=1e-12)
    per_item_loss = lambda **a: block_numpy(**a)[0]  # noqa: E731
    for name, shape in BLOCK_SHAPES.items():
        expected = central_differences(per_item_loss, inputs, name, shape, (batch,))
        assert grads[name].shape == (batch,) + BLOCK_SHAPES[name]
        np.testing.assert_allclose(grads[name], expected, rtol=1e-6, atol=1e-6, err_msg=name)


# ---------------------------------------------------------------- buffer reuse around the threshold


def reuse_layer_expected(x, W):
    t = np.tanh(x)
    ones = np.ones((x.shape[0], W.shape[1]))
    return np.sum(t @ W), (1 - t * t) * (ones @ W.T), t.T @ ones


@pytest.mark.parametrize("n", [181, 182])  # tanh(x) has 32,761 elements (kept) or 33,124 (may be reused)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_matmul_whose_dying_operand_is_large_allocates_its_result(clients, rng, transport, n):
    """tanh(x) dies at the matmul: from 32,768 elements the plan handed its buffer to np.matmul as
    out= (broadcast shape of (n, n) and (n, 7): shape mismatch), in a plain evaluate too."""
    assert (n * n >= REUSE_MIN_ELEMENTS) == (n == 182)
    g = sg.Graph()
    x, W = g.input("x", (n, n)), g.input("W", (n, 7))
    g.output("y", sg.sum(sg.tanh(x) @ W))
    f = clients[transport].register(g)
    xs, Ws = rng.normal(size=(n, n)), rng.normal(size=(n, 7))
    value, dx, dW = reuse_layer_expected(xs, Ws)
    np.testing.assert_allclose(f.evaluate({"x": xs, "W": Ws})["y"], value, rtol=1e-11)
    grads = f.gradient({"x": xs, "W": Ws})
    np.testing.assert_allclose(grads["x"], dx, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(grads["W"], dW, rtol=1e-11, atol=1e-12)


BERT_D, BERT_MLP = 768, 3072


def bert_mlp_expected(x, W1, b1, W2, b2):
    """loss = Σ tanh(x + tanh(x W1 + b1) W2 + b2): the value and hand-written backprop."""
    h = np.tanh(x @ W1 + b1)
    out = np.tanh(x + h @ W2 + b2)
    d_pre = 1 - out * out  # ∂loss/∂(x + h W2 + b2)
    d_hidden = (d_pre @ W2.T) * (1 - h * h)  # ∂loss/∂(x W1 + b1)
    return np.sum(out), {"x": d_pre + d_hidden @ W1.T, "W1": x.T @ d_hidden, "b1": d_hidden.sum(0),
                         "W2": h.T @ d_pre, "b2": d_pre.sum(0)}


@pytest.mark.parametrize("tokens", [8, 16, 64])  # the hidden layer: 24,576 elements (kept), 49,152, 196,608
def test_bert_width_mlp_layer(clients, rng, tokens):
    """d = 768, MLP 3072: the hidden activation dies at its matmul with W2; from 11 tokens it
    has ≥ 32,768 elements and the plan tried to reuse its buffer for the (tokens, 768) result."""
    g = sg.Graph()
    x, W1, b1 = g.input("x", (tokens, BERT_D)), g.input("W1", (BERT_D, BERT_MLP)), g.input("b1", (BERT_MLP,))
    W2, b2 = g.input("W2", (BERT_MLP, BERT_D)), g.input("b2", (BERT_D,))
    g.output("loss", sg.sum(sg.tanh(x + sg.tanh(x @ W1 + b1) @ W2 + b2)))
    inputs = {"x": rng.normal(size=(tokens, BERT_D)), "W1": rng.normal(size=(BERT_D, BERT_MLP)) / np.sqrt(BERT_D),
              "b1": 0.1 * rng.normal(size=BERT_MLP), "W2": rng.normal(size=(BERT_MLP, BERT_D)) / np.sqrt(BERT_MLP),
              "b2": 0.1 * rng.normal(size=BERT_D)}
    value, expected = bert_mlp_expected(**inputs)
    np.testing.assert_allclose(clients["inline"].register(g).evaluate(inputs)["loss"], value, rtol=1e-10)
    grads = clients["default"].register(g).gradient(inputs)
    for name, want in expected.items():
        np.testing.assert_allclose(grads[name], want, rtol=1e-9, atol=1e-11, err_msg=name)


def bert_projection() -> sg.Graph:
    g = sg.Graph()
    x, W = g.input("x", (8, BERT_D)), g.input("W", (BERT_D, BERT_MLP))
    g.output("s", sg.sum(sg.tanh(x) @ W))
    return g


@pytest.mark.parametrize("batch", [76, 77, 250])  # 250: past 167, where evaluate was refused
def test_a_bert_width_layer_over_a_batch_of_sentences_with_a_shared_weight(clients, rng, batch):
    """sum(tanh(x) @ W) over `batch` sentences of 8 tokens, W (768 × 3072) shared: the limits count
    W and what is made from it alone once, not per sentence (counted per sentence, 2.4 M elements
    an item, evaluate was refused from 167 sentences and the gradient from 57, at 10-60 times
    the memory the run took; found by an attacker)."""
    xs, W = rng.normal(size=(batch, 8, BERT_D)), rng.normal(size=(BERT_D, BERT_MLP)) / np.sqrt(BERT_D)
    f = clients["default"].register(bert_projection())
    np.testing.assert_allclose(f.evaluate({"x": xs, "W": W})["s"], (np.tanh(xs) @ W).sum(axis=(1, 2)), rtol=1e-10)
    if batch <= 77:
        np.testing.assert_allclose(f.gradient({"x": xs, "W": W}, wrt="x")["x"], (1 - np.tanh(xs) ** 2) * W.sum(1),
                                   rtol=1e-10)


def refused_counts(f, inputs) -> tuple[int, int]:
    """(elements per item, elements computed once) from the server's refusal of `inputs`."""
    with pytest.raises(sg.ResourceExhausted) as refused:
        f.evaluate(inputs)
    found = re.search(r"batch items × (\d+) per item(?: \+ (\d+) computed once)?", refused.value.message)
    assert found, refused.value.message
    return int(found[1]), int(found[2] or 0)


def test_the_element_limit_with_a_shared_weight_on_both_sides(rng):
    """W shared: the batch that fits the element limit by the refusal's own counts (per item,
    and once for W and what is made from it alone) runs, one item more is refused. With W
    batched too, every item counts its own 2.4 M-element weight and nothing is computed once."""
    from semigrad_server.limits import Limits

    limit = 6_000_000
    with sg.Client(limits=Limits(max_request_elements=limit)) as client:
        f = client.register(bert_projection())
        xs, W = rng.normal(size=(200, 8, BERT_D)), rng.normal(size=(BERT_D, BERT_MLP)) / np.sqrt(BERT_D)
        per_item, once = refused_counts(f, {"x": xs, "W": W})
        assert once >= BERT_D * BERT_MLP > per_item  # W once; each sentence its own activations
        fits = (limit - once) // per_item
        assert 1 < fits < len(xs)
        np.testing.assert_allclose(f.evaluate({"x": xs[:fits], "W": W})["s"],
                                   (np.tanh(xs[:fits]) @ W).sum(axis=(1, 2)), rtol=1e-10)
        refused_counts(f, {"x": xs[:fits + 1], "W": W})
        per_item, once = refused_counts(f, {"x": xs[:3], "W": np.broadcast_to(W, (3,) + W.shape)})
        assert per_item > BERT_D * BERT_MLP and once == 0


# ---------------------------------------------------------------- batched weights


MLP_SHAPES = {"x": (64, 32), "y": (64, 1), "W1": (32, 64), "b1": (64,), "W2": (64, 1), "b2": (1,)}
WEIGHTS = ("W1", "b1", "W2", "b2")


@pytest.mark.parametrize("batch", [1, 7, 8, 100, 1000])  # dz (batch, 64, 64) reaches 32,768 elements at 8
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mlp_loss_over_a_batch_of_parameter_vectors(clients, rng, transport, batch):
    """x and y fixed, every weight batched: the loss of each parameter vector and its gradient
    (x's too, per parameter vector). Was: INVALID_ARGUMENT node '∂19:matmul': shape mismatch
    (32, 64) and (batch, 64, 64), from a batch of 8."""
    g = sg.Graph()
    handles = {n: g.input(n, s) for n, s in MLP_SHAPES.items()}
    g.output("loss", mlp_loss(SEMIGRAD_OPS, **handles))
    f = clients[transport].register(g)
    inputs = {n: rng.normal(size=((batch,) + s if n in WEIGHTS else s)) / np.sqrt(s[0]) for n, s in MLP_SHAPES.items()}
    loss = np.sum((np.tanh(inputs["x"] @ inputs["W1"] + inputs["b1"][:, None, :]) @ inputs["W2"]
                   + inputs["b2"][:, None, :] - inputs["y"]) ** 2, axis=(-2, -1))
    np.testing.assert_allclose(f.evaluate(inputs)["loss"], loss, rtol=1e-12)

    # _mlp_gradient broadcasts over the leading axes of every input: the bias axes line up with
    # the rows once they carry a unit axis for them.
    aligned = {**inputs, "b1": inputs["b1"][:, None, :], "b2": inputs["b2"][:, None, :]}
    expected = _mlp_gradient(aligned)
    h = np.tanh(inputs["x"] @ inputs["W1"] + aligned["b1"])
    d = 2.0 * (h @ inputs["W2"] + aligned["b2"] - inputs["y"])
    expected["x"] = ((d @ np.swapaxes(inputs["W2"], -1, -2)) * (1 - h * h)) @ np.swapaxes(inputs["W1"], -1, -2)
    grads = f.gradient(inputs, wrt=["x", *WEIGHTS])
    for name, want in expected.items():
        assert grads[name].shape == (batch,) + MLP_SHAPES[name], name
        np.testing.assert_allclose(grads[name], want.reshape((batch,) + MLP_SHAPES[name]), rtol=1e-10,
                                   atol=1e-12, err_msg=name)


# ---------------------------------------------------------------- every op, batch axes on any operand

# name: (item shapes of a and b, the op on Handles, the op in NumPy over leading batch axes)
OPS = [
    ("matmul 2-D @ 2-D", [(2, 3), (3, 4)], lambda a, b: a @ b, lambda a, b: a @ b),
    ("matmul 1-D @ 2-D", [(3,), (3, 4)], lambda a, b: a @ b, lambda a, b: (a[..., None, :] @ b)[..., 0, :]),
    ("matmul 2-D @ 1-D", [(2, 3), (3,)], lambda a, b: a @ b, lambda a, b: (a @ b[..., :, None])[..., 0]),
    ("matmul 1-D @ 1-D", [(3,), (3,)], lambda a, b: a @ b, lambda a, b: np.sum(a * b, axis=-1)),
    ("matmul 3-D @ 2-D", [(5, 2, 3), (3, 4)], lambda a, b: a @ b, lambda a, b: a @ b[..., None, :, :]),
    ("matmul 2-D @ 3-D", [(2, 3), (5, 3, 4)], lambda a, b: a @ b, lambda a, b: a[..., None, :, :] @ b),
    ("matmul inner 1", [(2, 1), (1, 4)], lambda a, b: a @ b, lambda a, b: a @ b),
    ("index", [(4, 5), (2, 5)], lambda a, b: a[1:3, ::-1] * b, lambda a, b: a[..., 1:3, ::-1] * b),
    ("index int", [(4, 5), (5,)], lambda a, b: a[2] * b, lambda a, b: a[..., 2, :] * b),
    ("sum", [(3, 4), (4,)], lambda a, b: sg.sum(a * b, axis=0), lambda a, b: np.sum(a * b[..., None, :], axis=-2)),
    ("mean", [(3, 4), (3, 1)], lambda a, b: sg.mean(a * b, axis=1), lambda a, b: np.mean(a * b, axis=-1)),
    ("max", [(3, 4), (4,)], lambda a, b: sg.max(a * b, axis=1), lambda a, b: np.max(a * b[..., None, :], axis=-1)),
    ("concat", [(2, 4), (3, 4)], lambda a, b: sg.concat([a, b], axis=0),
     lambda a, b: np.concatenate(_same_batch(a, b), axis=-2)),
    ("stack", [(2, 4), (2, 4)], lambda a, b: sg.stack([a, b], axis=1), lambda a, b: np.stack(_same_batch(a, b), axis=-2)),
    ("where", [(3, 4), (4,)], lambda a, b: sg.where(a > b, a, b * 2.0),
     lambda a, b: np.where(a > b[..., None, :], a, b[..., None, :] * 2.0)),
    ("broadcasting add", [(3, 4), (4,)], lambda a, b: a + b, lambda a, b: a + b[..., None, :]),
    ("transpose", [(3, 4), (3, 4)], lambda a, b: (a * b).T, lambda a, b: np.swapaxes(a * b, -1, -2)),
    ("reshape", [(3, 4), (4,)], lambda a, b: sg.reshape(a * b, (2, 6)),
     lambda a, b: (a * b[..., None, :]).reshape((a * b[..., None, :]).shape[:-2] + (2, 6))),
    ("broadcast_to", [(4,), (3, 4)], lambda a, b: sg.broadcast_to(a, (3, 4)) * b, lambda a, b: a[..., None, :] * b),
]


def _same_batch(*arrays):
    lead = np.broadcast_shapes(*(a.shape[:-2] for a in arrays))
    return [np.broadcast_to(a, lead + a.shape[-2:]) for a in arrays]


BIG = 4096  # items: a dying (batch, 2, 4) adjoint has 32,768 elements
LEADS = [((), ()), ((1,), ()), ((BIG,), ()), ((), (BIG,)), ((BIG,), (BIG,)), ((2, 1), (3,))]


@pytest.mark.parametrize("leads", LEADS, ids=lambda leads: "a{}-b{}".format(*(list(lead) for lead in leads)))
@pytest.mark.parametrize("case", OPS, ids=[c[0] for c in OPS])
def test_every_op_takes_batch_axes_on_any_operand(clients, rng, case, leads):
    """sum(sin(op(a, b))) through shared memory, each operand batched or not: values against
    NumPy, gradients (one per batch item, for shared operands too) against central differences."""
    name, shapes, op, op_numpy = case
    g = sg.Graph()
    a, b = (g.input(n, s) for n, s in zip("ab", shapes))
    g.output("y", sg.sum(sg.sin(op(a, b))))
    inputs = {n: rng.normal(size=lead + s) for n, lead, s in zip("ab", leads, shapes)}
    batch = tuple(np.broadcast_shapes(*leads))
    item_axes = lambda v: tuple(range(len(batch), v.ndim))  # noqa: E731

    def loss(a, b):
        v = np.sin(op_numpy(a, b))
        return np.broadcast_to(np.sum(v, axis=item_axes(v)), batch)

    # Big batches on the tensor plan, whose buffers and output regions are at stake here ("auto"
    # would compile a JIT kernel per graph in the background: the scalar programs are covered
    # by the small batches, which "auto" runs as such).
    backend = "tensor" if math.prod(batch) >= BIG else "auto"
    f = clients["shared"].register(g)
    np.testing.assert_allclose(f.evaluate(inputs, backend=backend)["y"], loss(**inputs), rtol=1e-12, atol=1e-12)
    grads = f.gradient(inputs, backend=backend)
    for n, s in zip("ab", shapes):
        assert grads[n].shape == batch + s, n
        # a small step: where's condition and max's winner stay put for every item (seeded draw)
        expected = central_differences(loss, inputs, n, s, batch, h=1e-7)
        np.testing.assert_allclose(grads[n], expected, rtol=1e-6, atol=1e-6, err_msg=n)


@pytest.mark.parametrize("dtype", ["float64", "complex128", "int64"])
@pytest.mark.parametrize("stack, n", [((5,), 1), ((2, 3), 4), ((0,), 1), ((4,), 0)])
def test_a_matrix_times_a_stack_is_numpys_matmul(rng, dtype, stack, n):
    """The tensor plan's matmul of a plain matrix and a stack of matrices (a weight matrix over a
    batch, both ways round): every item equals np.dot of that item's matrices (complex: the
    complex-step derivative's operands; int64: NumPy's own), empty stacks and inner sizes too."""
    from semigrad_server.ir import Type
    from semigrad_server.ops import REGISTRY

    matmul = REGISTRY.ops["matmul"].kernel

    def sample(shape):
        x = rng.normal(size=shape) + (1j * rng.normal(size=shape) if dtype == "complex128" else 0)
        return (x * 10).round().astype(dtype) if dtype == "int64" else x.astype(dtype)

    a, b = sample((3, 6)), sample(stack + (6, n))
    matrix_first = matmul({}, [Type((3, 6), dtype), Type((6, n), dtype)], Type((3, n), dtype))(a, b)
    c = sample(stack + (n, 3))
    stack_first = matmul({}, [Type((n, 3), dtype), Type((3, 6), dtype)], Type((n, 6), dtype))(c, a)
    assert matrix_first.shape == stack + (3, n) and stack_first.shape == stack + (n, 6)
    for index in np.ndindex(*stack):
        np.testing.assert_allclose(matrix_first[index], np.dot(a, b[index]), rtol=1e-13, atol=1e-12)
        np.testing.assert_allclose(stack_first[index], np.dot(c[index], a), rtol=1e-13, atol=1e-12)


def test_a_weight_matrix_over_a_batch_of_vectors(clients, rng):
    """sum(tanh(W x + b)^2) over 10,000 points (the replicas benchmark's graph): the gradient
    2 W^T (t (1 - t^2)) per point, by NumPy."""
    w, b = rng.normal(size=(16, 8)) / 3, rng.normal(size=16)
    g = sg.Graph()
    x = g.input("x", (8,))
    t = sg.tanh(sg.matmul(g.const(w, name="W"), x) + g.const(b, name="b"))
    g.output("y", sg.sum(t * t))
    points = rng.normal(size=(10_000, 8))
    tt = np.tanh(points @ w.T + b)
    gradient = clients["inline"].register(g).gradient({"x": points})["x"]
    np.testing.assert_allclose(gradient, (2 * tt * (1 - tt * tt)) @ w, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("backend", ["auto", "tensor", "scalar"])
@pytest.mark.parametrize("semiring", ["real", "max_product"])
@pytest.mark.parametrize("a_shape, b_shape", [((0, 4), (4, 16)), ((4, 0), (0, 16)), ((4, 4), (4, 0)),
                                              ((2, 0, 3), (3, 5))])
def test_a_matmul_with_an_empty_dimension(clients, a_shape, b_shape, semiring, backend):
    """An empty product sums nothing: its value is 0 and every gradient 0 (0̄ under max_product),
    of its operand's shape. The scalar backend's expansion had failed with INTERNAL there
    (reshape to (-1, 0, k))."""
    g = sg.Graph()
    a, b = g.input("a", a_shape), g.input("b", b_shape)
    g.output("y", sg.sum(a @ b))
    f = clients["default"].register(g)
    point = {"a": np.ones(a_shape), "b": np.ones(b_shape)}
    grads, outputs = f.gradient(point, semiring=semiring, backend=backend, return_outputs=True)
    assert outputs["y"] == 0.0
    for name, shape in (("a", a_shape), ("b", b_shape)):
        assert grads[name].shape == shape and not np.any(grads[name])
    assert f.evaluate(point, backend=backend)["y"] == 0.0
