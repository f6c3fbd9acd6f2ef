"""Every op: forward value against NumPy and gradient against central finite differences,
at random points, with broadcasting, with and without batch dimensions, over gRPC.

One table row per case: (id, graph function, NumPy reference, input shapes, sampler).
"""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg
from reference import finite_difference_gradient

import math

try:
    from scipy.special import erf as np_erf, erfc as np_erfc
except ImportError:  # the reference must not be the server's kernel: use math.erf elementwise
    np_erf = np.vectorize(math.erf)
    np_erfc = np.vectorize(math.erfc)


def normal(rng, shape):
    return rng.normal(size=shape)


def positive(rng, shape):
    return rng.uniform(0.5, 2.0, size=shape)


def away_from_zero(rng, shape):
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.3, 2.0, size=shape)


def small(rng, shape):
    return rng.uniform(-1.0, 1.0, size=shape)


def distinct(rng, shape):
    """Values far apart, so max/min/maximum have no near-ties that finite differences would straddle."""
    n = int(np.prod(shape))
    return (rng.permutation(n).reshape(shape) * 0.5 + rng.uniform(-0.1, 0.1, size=shape))


def shifted(rng, shape):
    return distinct(rng, shape) + 0.25


# ---- NumPy references for the neural-network ops, written out independently of the server's kernels


def np_softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def np_logsumexp(x, axis):
    return np.log(np.sum(np.exp(x), axis=axis))


def np_layer_norm(x, axes, eps=1e-5):
    return (x - np.mean(x, axis=axes, keepdims=True)) / np.sqrt(np.var(x, axis=axes, keepdims=True) + eps)


def np_conv(x, w, stride=1, padding=0, dilation=1, groups=1):
    """Convolution by the definition, one output element at a time (x: N, C, *S; w: O, C/g, *K)."""
    nd = x.ndim - 2
    st, pd, dl = ([v] * nd if np.isscalar(v) else list(v) for v in (stride, padding, dilation))
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pd])
    out_sp = [(xp.shape[2 + i] - dl[i] * (w.shape[2 + i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    out = np.zeros((x.shape[0], w.shape[0], *out_sp))
    cg, og = x.shape[1] // groups, w.shape[0] // groups
    for n in range(x.shape[0]):
        for o in range(w.shape[0]):
            for pos in np.ndindex(*out_sp):
                for c in range(cg):
                    for k in np.ndindex(*w.shape[2:]):
                        src = tuple(pos[i] * st[i] + k[i] * dl[i] for i in range(nd))
                        out[(n, o) + pos] += w[(o, c) + k] * xp[(n, (o // og) * cg + c) + src]
    return out


def np_pool(x, kernel, stride=None, padding=0, kind="max"):
    """Pooling by the definition (PyTorch's: -inf padding for max, zeros counted for avg)."""
    nd = x.ndim - 2
    k, st, pd = ([v] * nd if np.isscalar(v) else list(v) for v in (kernel, kernel if stride is None else stride, padding))
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pd], constant_values=-np.inf if kind == "max" else 0.0)
    out_sp = [(xp.shape[2 + i] - k[i]) // st[i] + 1 for i in range(nd)]
    out = np.zeros(x.shape[:2] + tuple(out_sp))
    for index in np.ndindex(*out.shape):
        window = xp[index[:2] + tuple(slice(index[2 + i] * st[i], index[2 + i] * st[i] + k[i]) for i in range(nd))]
        out[index] = window.max() if kind == "max" else window.sum() / np.prod(k)
    return out
def indices(n):
    """int64 indices into an axis of length n, negative ones included (they count from the end),
    with one slot always hit twice (once by a negative index), so scatters must add up."""

    def sample(rng, shape):
        idx = rng.integers(-n, n, size=shape)
        flat = idx.reshape(-1)
        if flat.size >= 2:
            flat[-1] = flat[0] - n if flat[0] >= 0 else flat[0] + n
        return idx

    sample.dtype = "int64"
    return sample


def scatter_add_reference(size, axis):
    """out[..., idx[k], ...] += u[..., k, ...], one index at a time (wrapped as NumPy does)."""

    def reference(u, idx):
        out = np.zeros(u.shape[:axis] + (size,) + u.shape[axis + idx.ndim:])
        for k in np.ndindex(*idx.shape):
            out[(slice(None),) * axis + (idx[k] % size,)] += u[(slice(None),) * axis + k]
        return out

    return reference


# id, graph fn, numpy reference, input shapes, samplers (one per input)
CASES = [
    ("add", lambda x, y: x + y, np.add, [(3, 4), (3, 4)], [normal, normal]),
    ("add-broadcast", lambda x, y: x + y, np.add, [(3, 1), (1, 4)], [normal, normal]),
    ("sub-broadcast-rank", lambda x, y: x - y, np.subtract, [(4,), (3, 4)], [normal, normal]),
    ("mul-scalar-operand", lambda x, y: x * y, np.multiply, [(), (3,)], [normal, normal]),
    ("mul", lambda x, y: x * y, np.multiply, [(2, 3), (2, 3)], [normal, normal]),
    ("div", lambda x, y: x / y, np.divide, [(3,), (2, 3)], [normal, away_from_zero]),
    ("neg", lambda x: -x, np.negative, [(5,)], [normal]),
    ("pow", lambda x, y: x ** y, np.power, [(4,), (4,)], [positive, normal]),
    ("pow-const", lambda x: x ** 3, lambda x: x ** 3, [(4,)], [normal]),
    ("square", sg.square, np.square, [(4,)], [normal]),
    ("sqrt", sg.sqrt, np.sqrt, [(4,)], [positive]),
    ("exp", sg.exp, np.exp, [(4,)], [normal]),
    ("log", sg.log, np.log, [(4,)], [positive]),
    ("log1p", sg.log1p, np.log1p, [(4,)], [positive]),
    ("expm1", sg.expm1, np.expm1, [(4,)], [normal]),
    ("sin", sg.sin, np.sin, [(4,)], [normal]),
    ("cos", sg.cos, np.cos, [(4,)], [normal]),
    ("tan", sg.tan, np.tan, [(4,)], [small]),
    ("tanh", sg.tanh, np.tanh, [(4,)], [normal]),
    ("asinh", lambda x: sg.elementwise("asinh", x), np.arcsinh, [(4,)], [normal]),
    ("atan", lambda x: sg.elementwise("atan", x), np.arctan, [(4,)], [normal]),
    ("softsign", lambda x: sg.elementwise("softsign", x), lambda x: x / (1 + np.abs(x)), [(4,)], [away_from_zero]),
    # GELU by other formulas than the kernels': x·erfc(-x/√2)/2, and x·sigmoid(2z) for the tanh form.
    ("gelu", sg.gelu, lambda x: x * np_erfc(-x / np.sqrt(2)) / 2, [(6,)], [normal]),
    ("gelu_tanh", lambda x: sg.gelu(x, approximate="tanh"),
     lambda x: x / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), [(6,)], [normal]),
    ("clamp", lambda x: sg.clamp(x, -0.5, 0.7), lambda x: np.where(x < -0.5, -0.5, np.where(x > 0.7, 0.7, x)),
     [(3, 4)], [normal]),
    ("clamp-one-sided", lambda x: sg.clamp(x * x, min=0.3) + sg.clamp(x, max=0.1),
     lambda x: np.where(x * x < 0.3, 0.3, x * x) + np.where(x > 0.1, 0.1, x), [(5,)], [normal]),
    ("sigmoid", sg.sigmoid, lambda x: 1 / (1 + np.exp(-x)), [(4,)], [normal]),
    ("softplus", sg.softplus, lambda x: np.log1p(np.exp(x)), [(4,)], [normal]),
    ("abs", sg.abs, np.abs, [(4,)], [away_from_zero]),
    ("relu", sg.relu, lambda x: np.where(x > 0, x, 0.0), [(4,)], [away_from_zero]),
    ("maximum", sg.maximum, np.maximum, [(3, 4), (4,)], [distinct, shifted]),
    ("minimum", sg.minimum, np.minimum, [(3, 4), (4,)], [distinct, shifted]),
    ("sign", sg.sign, np.sign, [(4,)], [away_from_zero]),
    ("erf", sg.erf, np_erf, [(4,)], [normal]),
    ("where", lambda c, a, b: sg.where(c > 0, a, b), lambda c, a, b: np.where(c > 0, a, b),
     [(3, 4), (3, 4), (4,)], [away_from_zero, normal, normal]),
    ("comparison-zero-gradient", lambda x, y: sg.where(x < y, x * 0 + 1, x * 0), None,
     [(4,), (4,)], [distinct, shifted]),
    ("le", lambda x, y: sg.where(sg.le(x, y), x, 2 * y), lambda x, y: np.where(x <= y, x, 2 * y),
     [(4,), (4,)], [distinct, shifted]),
    ("ge", lambda x, y: sg.where(sg.ge(x, y), x, 2 * y), lambda x, y: np.where(x >= y, x, 2 * y),
     [(4,), (4,)], [distinct, shifted]),
    ("ne-eq", lambda x, y: sg.where(sg.ne(x, y), x, y) + sg.where(sg.eq(x, x), y, x),
     lambda x, y: np.where(x != y, x, y) + np.where(x == x, y, x), [(4,), (4,)], [distinct, shifted]),
    ("matmul", lambda a, b: a @ b, np.matmul, [(3, 4), (4, 2)], [normal, normal]),
    ("matmul-vector-left", lambda a, b: a @ b, np.matmul, [(4,), (4, 2)], [normal, normal]),
    ("matmul-vector-right", lambda a, b: a @ b, np.matmul, [(3, 4), (4,)], [normal, normal]),
    ("matmul-dot", lambda a, b: a @ b, np.matmul, [(4,), (4,)], [normal, normal]),
    ("matmul-batch-broadcast", lambda a, b: a @ b, np.matmul, [(2, 1, 3, 4), (5, 4, 2)], [normal, normal]),
    ("sum-all", lambda x: sg.sum(x), np.sum, [(3, 4)], [normal]),
    ("sum-axis", lambda x: sg.sum(x, axis=1), lambda x: np.sum(x, axis=1), [(3, 4, 2)], [normal]),
    ("sum-axes-keepdims", lambda x: sg.sum(x, axis=(0, -1), keepdims=True),
     lambda x: np.sum(x, axis=(0, -1), keepdims=True), [(3, 4, 2)], [normal]),
    ("mean", lambda x: sg.mean(x, axis=0), lambda x: np.mean(x, axis=0), [(3, 4)], [normal]),
    ("max-axis", lambda x: sg.max(x, axis=1), lambda x: np.max(x, axis=1), [(3, 4)], [distinct]),
    ("max-all-keepdims", lambda x: sg.max(x, keepdims=True), lambda x: np.max(x, keepdims=True), [(3, 4)],
     [distinct]),
    ("min-axes-and-all-keepdims", lambda x: sg.min(x, axis=(0, 2)) * sg.min(x, keepdims=True),
     lambda x: np.min(x, axis=(0, 2)) * np.min(x, keepdims=True), [(3, 4, 2)], [distinct]),
    ("cumsum", lambda x: sg.cumsum(x, axis=1), lambda x: np.cumsum(x, axis=1), [(3, 4)], [normal]),
    ("cumsum-negative-axis", lambda x: sg.cumsum(sg.exp(x), -1) * x, lambda x: np.cumsum(np.exp(x), -1) * x,
     [(2, 5)], [normal]),
    ("argmax-take-along", lambda x: sg.gather(x, sg.argmax(x, axis=1), axis=1) * x,
     lambda x: np.take(x, np.argmax(x, axis=1), axis=1) * x, [(3, 3)], [distinct]),
    ("argmin-flat-keepdims", lambda x: sg.gather(sg.reshape(x, (-1,)), sg.argmin(x, keepdims=True)) + x,
     lambda x: x.reshape(-1)[np.argmin(x, keepdims=True)] + x, [(2, 3)], [distinct]),
    ("reshape", lambda x: sg.reshape(x, (4, -1)), lambda x: x.reshape(4, -1), [(2, 3, 2)], [normal]),
    ("transpose", lambda x: sg.transpose(x, (2, 0, 1)), lambda x: x.transpose(2, 0, 1), [(2, 3, 4)], [normal]),
    ("transpose-default", lambda x: x.T, lambda x: x.T, [(2, 3)], [normal]),
    ("broadcast_to", lambda x: sg.broadcast_to(x, (2, 3, 4)), lambda x: np.broadcast_to(x, (2, 3, 4)),
     [(3, 1)], [normal]),
    ("index-scalar", lambda x: x[1, 2], lambda x: x[1, 2], [(3, 4)], [normal]),
    ("index-negative", lambda x: x[-1], lambda x: x[-1], [(3, 4)], [normal]),
    ("slice-step", lambda x: x[::2, 1:], lambda x: x[::2, 1:], [(5, 4)], [normal]),
    ("slice-negative-step", lambda x: x[::-1, -3:-1], lambda x: x[::-1, -3:-1], [(3, 4)], [normal]),
    ("index-mixed", lambda x: x[1, ::-2], lambda x: x[1, ::-2], [(3, 5)], [normal]),
    ("concat", lambda x, y: sg.concat([x, y, x], axis=1), lambda x, y: np.concatenate([x, y, x], axis=1),
     [(2, 3), (2, 1)], [normal, normal]),
    ("stack", lambda x, y: sg.stack([x, y], axis=-1), lambda x, y: np.stack([x, y], axis=-1),
     [(2, 3), (2, 3)], [normal, normal]),
    ("softmax", lambda x: sg.softmax(x, axis=0), lambda x: np_softmax(x, axis=0), [(3, 2)], [normal]),
    ("log_softmax", sg.log_softmax, lambda x: np.log(np_softmax(x)), [(2, 3)], [normal]),
    ("logsumexp", lambda x: sg.logsumexp(x, axis=(0, 2), keepdims=True),
     lambda x: np_logsumexp(x, (0, 2))[None, :, None], [(2, 2, 2)], [normal]),
    ("layer_norm", sg.layer_norm, lambda x: np_layer_norm(x, -1), [(2, 4)], [normal]),
    ("layer_norm-axes", lambda x: sg.layer_norm(x, axes=(0, 2), eps=0.1), lambda x: np_layer_norm(x, (0, 2), 0.1),
     [(2, 2, 2)], [normal]),
    ("conv2d-stride-padding-groups", lambda x, w: sg.conv2d(x, w, stride=(2, 1), padding=1, groups=2),
     lambda x, w: np_conv(x, w, (2, 1), 1, 1, 2), [(1, 2, 3, 3), (4, 1, 2, 2)], [normal, normal]),
    ("conv1d-dilation", lambda x, w: sg.conv1d(x, w, padding=1, dilation=2),
     lambda x, w: np_conv(x, w, 1, 1, 2), [(1, 2, 4), (2, 2, 2)], [normal, normal]),
    ("max_pool2d-overlap-padding", lambda x: sg.max_pool2d(x, 3, stride=2, padding=1),
     lambda x: np_pool(x, 3, 2, 1), [(1, 1, 4, 5)], [distinct]),
    ("max_pool1d", lambda x: sg.max_pool1d(x, 3, stride=2, padding=1), lambda x: np_pool(x, 3, 2, 1),
     [(1, 1, 5)], [distinct]),
    ("avg_pool2d", lambda x: sg.avg_pool2d(x, (2, 3), stride=1, padding=1), lambda x: np_pool(x, (2, 3), 1, 1, "avg"),
     [(1, 1, 3, 3)], [normal]),
    ("avg_pool1d", lambda x: sg.avg_pool1d(x, 2), lambda x: np_pool(x, 2, kind="avg"), [(2, 1, 5)], [normal]),
    ("gather-embedding", lambda x, i: sg.gather(x, i), lambda x, i: np.take(x, i, axis=0),
     [(5, 3), (2, 3)], [normal, indices(5)]),
    ("gather-axis1-batched-indices", lambda i, x: sg.gather(x, i, axis=1), lambda i, x: np.take(x, i, axis=1),
     [(4,), (2, 5, 3)], [indices(5), normal]),
    ("gather-last-axis-scalar-index", lambda x, i: sg.gather(x, i, axis=-1) * sg.sum(x),
     lambda x, i: np.take(x, i, axis=-1) * np.sum(x), [(2, 3), ()], [normal, indices(3)]),
    ("scatter_add", lambda u, i: sg.scatter_add(u, i, 4, axis=1), lambda u, i: scatter_add_reference(4, 1)(u, i),
     [(2, 3, 2), (3,)], [normal, indices(4)]),
    ("scatter_add-batched-indices", lambda i, u: sg.scatter_add(sg.tanh(u), i, 3),
     lambda i, u: scatter_add_reference(3, 0)(np.tanh(u), i), [(2, 2), (2, 2, 2)], [indices(3), normal]),
    ("einsum-batched-matmul", lambda a, b: sg.einsum("bij,bjk->bik", a, b),
     lambda a, b: np.stack([a[t] @ b[t] for t in range(2)]), [(2, 3, 4), (2, 4, 2)], [normal, normal]),
    ("einsum-attention-scores", lambda q, k: sg.einsum("hqd,hkd->hqk", q, k),
     lambda q, k: np.stack([q[h] @ k[h].T for h in range(2)]), [(2, 3, 2), (2, 4, 2)], [normal, normal]),
    ("einsum-three-operands-implicit", lambda a, b, c: sg.einsum("ij,jk,k", a, b, c),
     lambda a, b, c: a @ b @ c, [(2, 3), (3, 2), (2,)], [normal, normal, normal]),
    ("einsum-unary-transpose-sum", lambda x: sg.einsum("ijk->ki", x) * 1.5,
     lambda x: x.sum(axis=1).T * 1.5, [(2, 3, 4)], [normal]),
    ("einsum-outer-and-sum-only-in-one", lambda a, b: sg.einsum("ij,k->ik", a, b),
     lambda a, b: np.outer(a.sum(axis=1), b), [(2, 3), (2,)], [normal, normal]),
    ("composite", lambda x, w: sg.sum(sg.tanh(x @ w) ** 2, axis=0) * sg.exp(-sg.mean(x)),
     lambda x, w: np.sum(np.tanh(x @ w) ** 2, axis=0) * np.exp(-np.mean(x)), [(3, 4), (4, 2)], [normal, normal]),
]

BATCHES = {"single": (), "batched": (2,)}


def build(case):
    name, fn, _, shapes, _ = case
    g = sg.Graph()
    samplers = case[4]
    handles = [g.input(f"x{i}", shape, dtype=getattr(sampler, "dtype", "float64"))
               for i, (shape, sampler) in enumerate(zip(shapes, samplers))]
    g.output("out", fn(*handles))
    return g


@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_value_and_gradient(client, rng, case, batch):
    name, fn, reference, shapes, samplers = case
    f = client.register(build(case))
    # Batch dims on the first input only: the others broadcast over the batch.
    inputs = {f"x{i}": sampler(rng, (batch if i == 0 else ()) + shape)
              for i, (shape, sampler) in enumerate(zip(shapes, samplers))}
    out = f.evaluate(inputs)["out"]
    if reference is not None:
        first, *rest = inputs.values()
        expected = np.stack([reference(item, *rest) for item in first]) if batch else reference(first, *rest)
        np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)

    seed = rng.normal(size=out.shape)
    grads = f.gradient(inputs, seeds={"out": seed})
    shape_of = {f"x{i}": s for i, s in enumerate(shapes)}
    assert set(grads) == {x for x, v in inputs.items() if v.dtype.kind == "f"}  # no gradient for indices
    for x in grads:
        assert grads[x].shape == batch + shape_of[x], x
        expected = finite_difference_gradient(lambda a: f.evaluate(a), inputs, shape_of, {"out": seed}, x)
        np.testing.assert_allclose(grads[x], expected, rtol=1e-6, atol=1e-7, err_msg=f"{name}: d/d{x}")
