"""The neural-network ops (softmax, log_softmax, logsumexp, layer_norm, conv1d/2d, max/avg
pool 1d/2d): values and gradients against PyTorch (float64, with batch axes on every operand,
weights included, as vmap would), the decomposed forms against the fused ops, each op's
element-level edges counted by the counting semiring against counts made by hand here,
PyTorch's tie rule for max pooling, and bad graphs refused naming the node.

The op table (test_op_gradients.CASES) runs these ops on every backend, semiring and
transport; this file checks what that table cannot: agreement with another library and the
path structure itself.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import semigrad as sg

# ---------------------------------------------------------------- against PyTorch


def _torch_cases():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    return [
        ("softmax", lambda x: sg.softmax(x, axis=1), lambda x: F.softmax(x, dim=1), [(2, 3, 4)]),
        ("log_softmax", lambda x: sg.log_softmax(x, axis=0), lambda x: F.log_softmax(x, dim=0), [(3, 4)]),
        ("logsumexp", lambda x: sg.logsumexp(x, axis=(1, 2), keepdims=True),
         lambda x: torch.logsumexp(x, dim=(1, 2), keepdim=True), [(2, 3, 4)]),
        ("layer_norm", lambda x: sg.layer_norm(x, axes=(-2, -1), eps=1e-3),
         lambda x: F.layer_norm(x, (3, 4), eps=1e-3), [(2, 3, 4)]),
        ("conv2d", lambda x, w: sg.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
         lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
         [(2, 4, 6, 5), (6, 2, 3, 2)]),
        ("conv1d", lambda x, w: sg.conv1d(x, w, stride=2, padding=1),
         lambda x, w: F.conv1d(x, w, stride=2, padding=1), [(2, 3, 7), (4, 3, 3)]),
        ("max_pool2d", lambda x: sg.max_pool2d(x, 3, stride=2, padding=1),
         lambda x: F.max_pool2d(x, 3, stride=2, padding=1), [(2, 3, 7, 6)]),
        ("max_pool1d", lambda x: sg.max_pool1d(x, 2), lambda x: F.max_pool1d(x, 2), [(2, 3, 7)]),
        ("avg_pool2d", lambda x: sg.avg_pool2d(x, (3, 2), stride=(2, 1), padding=(1, 0)),
         lambda x: F.avg_pool2d(x, (3, 2), stride=(2, 1), padding=(1, 0)), [(2, 2, 5, 4)]),
        ("avg_pool1d", lambda x: sg.avg_pool1d(x, 3, stride=2, padding=1),
         lambda x: F.avg_pool1d(x, 3, stride=2, padding=1), [(1, 2, 8)]),
    ]


def _torch_value_and_grads(torch_fn, arrays, seed):
    import torch

    tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = torch_fn(*tensors)
    out.backward(torch.tensor(seed))
    return out.detach().numpy(), [t.grad.numpy() for t in tensors]


def _graph(fn, shapes):
    g = sg.Graph()
    g.output("out", fn(*(g.input(f"x{i}", s) for i, s in enumerate(shapes))))
    return g


@pytest.mark.parametrize("case", range(10), ids=["softmax", "log_softmax", "logsumexp", "layer_norm", "conv2d",
                                                 "conv1d", "max_pool2d", "max_pool1d", "avg_pool2d", "avg_pool1d"])
def test_values_and_gradients_match_pytorch_with_batch_axes_on_every_operand(client, rng, case):
    """Each batch item (every operand batched: weights too) equals PyTorch on that item."""
    name, fn, torch_fn, shapes = _torch_cases()[case]
    f = client.register(_graph(fn, shapes))
    batch = 3
    inputs = {f"x{i}": rng.normal(size=(batch,) + s) for i, s in enumerate(shapes)}
    out = f.evaluate(inputs)["out"]
    seed = rng.normal(size=out.shape)
    grads = f.gradient(inputs, seeds={"out": seed})
    for b in range(batch):
        want, want_grads = _torch_value_and_grads(torch_fn, [inputs[f"x{i}"][b] for i in range(len(shapes))], seed[b])
        np.testing.assert_allclose(out[b], want, rtol=1e-12, atol=1e-12, err_msg=name)
        for i, wg in enumerate(want_grads):
            np.testing.assert_allclose(grads[f"x{i}"][b], wg, rtol=1e-10, atol=1e-12, err_msg=f"{name} d/dx{i}")


_E = np.e
# rows holding ±inf: values as PyTorch gives them (torch.softmax, log_softmax, logsumexp of each
# row, float64), written out: a +inf makes softmax and log_softmax NaN everywhere and logsumexp
# +inf; a row of -inf makes NaN and -inf; a -inf beside finite values is an exact 0 (log: -inf)
NONFINITE_ROWS = np.array([[1.0, np.inf, 2.0], [-np.inf, -np.inf, -np.inf], [1.0, -np.inf, 2.0]])
NONFINITE_WANT = {
    "softmax": [[np.nan] * 3, [np.nan] * 3, [_E / (_E + _E**2), 0.0, _E**2 / (_E + _E**2)]],
    "log_softmax": [[np.nan] * 3, [np.nan] * 3, [1 - np.log(_E + _E**2), -np.inf, 2 - np.log(_E + _E**2)]],
    "logsumexp": [np.inf, -np.inf, np.log(_E + _E**2)],
}


@pytest.mark.parametrize("backend", ["tensor", "scalar"])
@pytest.mark.parametrize("name", list(NONFINITE_WANT))
def test_rows_holding_infinities_give_pytorchs_values_on_every_backend(client, name, backend):
    """The tensor kernels and the scalar expansions of the normalisations agree with PyTorch on
    rows holding ±inf. The tensor kernels of softmax and log_softmax had kept a finite part of a
    row holding +inf (log_softmax [-inf, nan, -inf]) where the scalar programs gave NaN: a request
    for best paths, which runs the tensor plan, returned paths through values the plain forward
    said were NaN."""
    g = sg.Graph()
    x = g.input("x", NONFINITE_ROWS.shape)
    g.output("y", getattr(sg, name)(x, axis=-1))
    got = client.register(g).evaluate({"x": NONFINITE_ROWS}, backend=backend)["y"]
    np.testing.assert_allclose(got, NONFINITE_WANT[name], rtol=1e-15, atol=0)


def test_no_best_path_goes_through_a_row_that_a_plus_infinity_makes_nan(client):
    """log_softmax of a row holding +inf is NaN everywhere, so no path to W through its tanh: the
    best paths of every element of W are empty, as the plain max-product gradient is NaN."""
    g = sg.Graph()
    x, w = g.input("x", (1, 3)), g.input("W", (3, 2))
    g.output("y", sg.sum(sg.matmul(sg.tanh(sg.log_softmax(x)), w)))
    f = client.register(g)
    point = {"x": np.array([[1.0, np.inf, 2.0]]), "W": np.ones((3, 2))}
    assert np.isnan(f.gradient(point, semiring="max_product")["W"]).all()
    assert len(f.gradient(point, semiring="max_product", top_paths=3).best_paths) == 0
    assert all(not p.steps for p in f.gradient(point, semiring="max_product", wrt=["W"], best_path="all").best_paths)


def test_max_pool_gives_a_tie_to_the_first_maximum_of_the_window_as_pytorch_does(client):
    """Windows of equal values (ReLU's zeros): the whole gradient goes to the window's first
    element in row-major order, on every backend."""
    torch = pytest.importorskip("torch")
    x = np.zeros((1, 1, 4, 5))
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = 2.0  # a tie between two maxima inside one window
    g = _graph(lambda h: sg.max_pool2d(h, 2, stride=1), [x.shape])
    f = client.register(g)
    xt = torch.tensor(x, requires_grad=True)
    torch.nn.functional.max_pool2d(xt, 2, stride=1).sum().backward()
    for backend in ("tensor", "scalar"):
        np.testing.assert_array_equal(f.gradient({"x0": x}, backend=backend)["x0"], xt.grad.numpy(), err_msg=backend)


# ---------------------------------------------------------------- decomposed forms


DECOMPOSABLE = {
    "softmax": (lambda x, d: sg.softmax(x, axis=0, decomposed=d), (3, 4)),
    "log_softmax": (lambda x, d: sg.log_softmax(x, decomposed=d), (3, 4)),
    "logsumexp": (lambda x, d: sg.logsumexp(x, axis=(0, 1), decomposed=d), (3, 4)),
    "logsumexp-keepdims": (lambda x, d: sg.logsumexp(x, keepdims=True, decomposed=d), (3, 4)),
    "layer_norm": (lambda x, d: sg.layer_norm(x, axes=(0, 1), eps=0.01, decomposed=d), (3, 4)),
}


@pytest.mark.parametrize("name", DECOMPOSABLE)
def test_decomposed_forms_give_the_fused_ops_values_and_gradients_but_other_paths(client, rng, name):
    fn, shape = DECOMPOSABLE[name]
    fused, parts = (client.register(_graph(lambda x, d=d: fn(x, d), [shape])) for d in (False, True))
    ops = {n.op for n in _graph(lambda x: fn(x, True), [shape]).to_proto().nodes}
    assert name.split("-")[0] not in ops and {"exp", "sqrt"} & ops  # built from primitive nodes
    inputs = {"x0": rng.normal(size=(2,) + shape)}
    np.testing.assert_allclose(parts.evaluate(inputs)["out"], fused.evaluate(inputs)["out"], rtol=1e-13, atol=1e-14)
    seed = {"out": rng.normal(size=fused.evaluate(inputs)["out"].shape)}
    np.testing.assert_allclose(parts.gradient(inputs, seeds=seed)["x0"], fused.gradient(inputs, seeds=seed)["x0"],
                               rtol=1e-10, atol=1e-12)
    # path counts: the fused op has one edge per (input, output) pair of a row, the
    # decomposition more (through its max, sum and mean nodes)
    fused_count = fused.gradient(inputs, semiring="counting")["x0"]
    assert not np.array_equal(parts.gradient(inputs, semiring="counting")["x0"], fused_count)


def test_logsumexp_reduces_every_axis_by_default_as_sum_does(client, rng):
    """sg.logsumexp(x), as sg.sum(x), SciPy's and JAX's logsumexp: every axis (it was the last one)."""
    x = rng.normal(size=(3, 4))
    got = client.register(_graph(lambda h: sg.logsumexp(h), [(3, 4)])).evaluate({"x0": x})["out"]
    assert got.shape == ()
    np.testing.assert_allclose(got, np.log(np.exp(x).sum()), rtol=1e-14)


# ---------------------------------------------------------------- element-level edges, counted


def _counts(client, fn, shapes, inputs):
    """Per input: the number of paths from each element to the outputs (counting semiring)."""
    return client.register(_graph(fn, shapes)).gradient(inputs, semiring="counting")


@pytest.mark.parametrize("axes,shape", [((1,), (2, 3, 4)), ((0, 2), (2, 3, 4))])
def test_fused_rows_are_dense(client, rng, axes, shape):
    """softmax, log_softmax and layer_norm: every element has an edge to every output of its
    row, so n paths each (n the row length); logsumexp: one edge to its row's result."""
    x = rng.normal(size=shape)
    n = int(np.prod([shape[a] for a in axes]))
    if len(axes) == 1:
        for fn in (sg.softmax, sg.log_softmax):
            got = _counts(client, lambda h: fn(h, axis=axes[0]), [shape], {"x0": x})["x0"]
            np.testing.assert_array_equal(got, np.full(shape, float(n)))
    got = _counts(client, lambda h: sg.layer_norm(h, axes=axes), [shape], {"x0": x})["x0"]
    np.testing.assert_array_equal(got, np.full(shape, float(n)))
    got = _counts(client, lambda h: sg.logsumexp(h, axis=axes), [shape], {"x0": x})["x0"]
    np.testing.assert_array_equal(got, np.ones(shape))


def _windows(spatial, kernel, stride, padding, dilation):
    """{output position: [unpadded input position or None (padding), one per kernel offset]}, by the definition."""
    nd = len(spatial)
    out = [(spatial[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    table = {}
    for pos in np.ndindex(*out):
        reads = []
        for k in np.ndindex(*kernel):
            src = tuple(pos[i] * stride[i] + k[i] * dilation[i] - padding[i] for i in range(nd))
            reads.append(src if all(0 <= s < spatial[i] for i, s in enumerate(src)) else None)
        table[pos] = reads
    return table


@pytest.mark.parametrize("geometry", [((5, 4), (2, 3), (2, 1), (1, 1), (1, 2), 2), ((7,), (3,), (2,), (2,), (1,), 1)],
                         ids=["conv2d", "conv1d"])
def test_conv_edges_are_one_per_window_read(client, rng, geometry):
    """x[n, c, h] → out[n, o, i] for each window i reading h and each o of c's group (partial
    w[o, c, k]); w[o, c, k] → out[n, o, i] for each window whose offset k is not padding."""
    spatial, kernel, stride, padding, dilation, groups = geometry
    nd = len(spatial)
    n, c, o = 2, 4, 6
    x = rng.uniform(0.5, 1.5, size=(n, c) + spatial)  # no zero partials
    w = rng.uniform(0.5, 1.5, size=(o, c // groups) + kernel)
    conv = sg.conv2d if nd == 2 else sg.conv1d
    got = _counts(client, lambda a, b: conv(a, b, stride, padding, dilation, groups), [x.shape, w.shape],
                  {"x0": x, "x1": w})
    want_x, want_w = np.zeros(spatial), np.zeros(kernel)
    for reads in _windows(spatial, kernel, stride, padding, dilation).values():
        for k, src in zip(np.ndindex(*kernel), reads):
            if src is not None:
                want_x[src] += o // groups  # every output channel of the group
                want_w[k] += n  # every image
    np.testing.assert_array_equal(got["x0"], np.broadcast_to(want_x, x.shape))
    np.testing.assert_array_equal(got["x1"], np.broadcast_to(want_w, w.shape))


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool_edges(client, rng, kind):
    """avg: an edge from each element of each window covering it; max: one edge per window,
    from its first maximum (overlapping windows may pick the same element)."""
    spatial, kernel, stride, padding = (5, 6), (3, 2), (1, 2), (1, 1)
    x = rng.normal(size=(1, 2) + spatial)
    pool = sg.max_pool2d if kind == "max" else sg.avg_pool2d
    got = _counts(client, lambda h: pool(h, kernel, stride, padding), [x.shape], {"x0": x})["x0"]
    want = np.zeros(x.shape)
    for c in range(2):
        for reads in _windows(spatial, kernel, stride, padding, (1, 1)).values():
            inside = [src for src in reads if src is not None]
            if kind == "avg":
                for src in inside:
                    want[(0, c) + src] += 1
            else:
                values = [x[(0, c) + src] for src in inside]
                want[(0, c) + inside[int(np.argmax(values))]] += 1
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- bad graphs


BAD = [
    ("conv2d", [(1, 3, 5, 5), (4, 2, 3, 3)], {"groups": 2}, "groups"),
    ("conv2d", [(1, 2, 5, 5), (4, 1, 3, 3)], {"groups": 1}, "input channels"),
    ("conv2d", [(1, 2, 2, 2), (4, 2, 3, 3)], {}, "does not fit"),
    ("conv2d", [(1, 2, 5, 5), (4, 2, 3, 3)], {"stride": (0,)}, "stride"),
    ("conv2d", [(1, 2, 5, 5), (4, 2, 3, 3)], {"padding": (1, 1, 1)}, "padding"),
    ("conv1d", [(2, 5), (4, 2, 3)], {}, "3 axes"),
    ("max_pool2d", [(1, 2, 5, 5)], {"kernel_size": (2,), "padding": (2,)}, "half the kernel"),
    ("avg_pool1d", [(1, 2, 2)], {"kernel_size": (3,)}, "does not fit"),
    ("max_pool1d", [(1, 2, 5)], {}, "kernel_size"),
    ("softmax", [()], {}, "axis"),
    ("layer_norm", [(3, 4)], {"axes": ()}, "at least one axis"),
    ("layer_norm", [(3, 4)], {"axes": (1, -1)}, "repeated axis"),
    ("logsumexp", [(3, 0)], {}, "empty axis"),
]


@pytest.mark.parametrize("op,shapes,attrs,words", BAD, ids=[f"{b[0]}-{b[3]}" for b in BAD])
def test_bad_graphs_are_invalid_argument_naming_the_node(client, op, shapes, attrs, words):
    g = sg.Graph()
    handles = [g.input(f"x{i}", s) for i, s in enumerate(shapes)]
    g.output("out", g.add_node(op, handles, attrs, name="the_node"))
    with pytest.raises(sg.SemigradError) as excinfo:
        client.register(g)
    assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "the_node" in excinfo.value.message and words in excinfo.value.message, excinfo.value.message


def test_integer_operands_are_refused(client):
    g = sg.Graph()
    x = g.input("x", (2, 3), dtype="int64")
    g.output("out", g.add_node("softmax", [x], {}, name="the_node"))
    with pytest.raises(sg.SemigradError) as excinfo:
        client.register(g)
    assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT and "float" in excinfo.value.message


@pytest.mark.parametrize("build", [
    lambda g: sg.conv2d(g.input("x", (1, 3, 5, 5)), g.input("w", (4, 2, 3, 3)), groups=2),
    lambda g: sg.conv2d(g.input("x", (1, 2, 2, 2)), g.input("w", (4, 2, 3, 3))),
    lambda g: sg.conv1d(g.input("x", (1, 2, 5)), g.input("w", (4, 2, 3)), stride=(1, 1)),
    lambda g: sg.max_pool2d(g.input("x", (1, 2, 5, 5)), 2, padding=2),
    lambda g: sg.softmax(g.input("x", (3,)), axis=1),
    lambda g: sg.layer_norm(g.input("x", (3,)), axes=()),
], ids=["groups", "too-small", "stride-pair-for-1d", "pool-padding", "axis", "no-axes"])
def test_the_client_refuses_bad_shapes_while_building(build):
    with pytest.raises(ValueError):
        build(sg.Graph())


# ---------------------------------------------------------------- batch axes under semirings


@pytest.mark.parametrize("semiring", ["maxplus", "log", "entropy"])
@pytest.mark.parametrize("op", ["conv2d", "softmax", "max_pool2d"])
def test_batched_weights_under_semirings_are_per_item(client, rng, semiring, op):
    """vmap semantics under every kind of semiring (tropical, log, tuple-valued): item b of a
    request whose data and weights both carry a batch axis is the request of item b alone
    (whose path sums test_completeness checks against brute-force enumeration)."""
    if op == "conv2d":
        fn, shapes = (lambda x, w: sg.conv2d(x, w, stride=2, padding=1)), [(1, 2, 4, 3), (3, 2, 2, 2)]
    elif op == "softmax":
        fn, shapes = (lambda x, w: sg.softmax(x @ w, axis=0)), [(3, 2), (2, 4)]
    else:
        fn, shapes = (lambda x, w: sg.max_pool2d(x * w, 2, stride=1)), [(1, 2, 3, 3), (3, 3)]
    f = client.register(_graph(fn, shapes))
    inputs = {f"x{i}": rng.normal(size=(3,) + s) for i, s in enumerate(shapes)}
    batched = f.gradient(inputs, semiring=semiring)
    for b in range(3):
        single = f.gradient({k: v[b] for k, v in inputs.items()}, semiring=semiring)
        for name in inputs:
            np.testing.assert_allclose(batched[name][b], single[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_best_paths_run_through_the_nn_ops(client, rng):
    """Selective semirings trace one best path per element through fused and windowed ops
    (best paths read each node's local Jacobian)."""
    g = sg.Graph()
    x, w = g.input("x", (1, 1, 4, 4)), g.input("w", (2, 1, 2, 2))
    g.output("y", sg.sum(sg.softmax(sg.reshape(sg.max_pool2d(sg.conv2d(x, w), 2, stride=1), (2, 4)))))
    f = client.register(g)
    inputs = {"x": rng.normal(size=(1, 1, 4, 4)), "w": rng.normal(size=(2, 1, 2, 2))}
    grads = f.gradient(inputs, semiring="max_product", best_path=[("w", (1, 0, 1, 1))])
    (path,) = grads.best_paths
    assert path.steps, path


def test_per_row_jacobians_of_semiring_adjoints_are_blocked_and_count_as_operations():
    """Under a semiring other than the real one a softmax row of n has n² edges. The adjoint
    builds the row's n×n Jacobian a block of rows at a time (sr_row_vjp), so it holds O(n)
    values: a request limit of 10·n·100 elements, far below the n² = 2.25 M the Jacobian
    would take at once, lets it run, with the path sums of the closed form. Its n² products
    count in max_request_operations: a budget under 4·n² (its count) refuses it before
    anything runs, one above lets it run, and the real gradient (O(n)) passes both."""
    from semigrad_server.limits import Limits
    from semigrad_server.service import build_server

    n = 1500
    x = np.linspace(-1, 1, n)
    y = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    jac = y[:, None] * (np.eye(n) - y[None, :])  # J[i, j] = ∂y_i/∂x_j
    with np.errstate(divide="ignore"):
        want = np.log(np.abs(jac)).max(axis=0)  # maxplus, seed 1̄ = 0: max over i of log|J[i, j]|
    for operations, refused in ((2 * n * n, True), (6 * n * n, False)):
        limits = Limits(max_request_elements=10 * n * 100, max_request_operations=operations)
        server, port, _ = build_server("127.0.0.1:0", limits=limits)
        server.start()
        try:
            with sg.Client(f"127.0.0.1:{port}") as small:
                f = small.register(_graph(lambda v: sg.softmax(v), [(n,)]))
                assert f.gradient({"x0": x})["x0"].shape == (n,)
                if refused:
                    with pytest.raises(sg.SemigradError) as excinfo:
                        f.gradient({"x0": x}, semiring="maxplus")
                    assert excinfo.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, excinfo.value
                    assert "max_request_operations" in str(excinfo.value)
                else:
                    got = f.gradient({"x0": x}, semiring="maxplus")["x0"]
                    np.testing.assert_allclose(got, want, rtol=1e-12)
        finally:
            server.stop(0).wait()


@pytest.mark.parametrize("semiring", ["maxplus", "entropy"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "conv2d", "max_pool2d", "avg_pool1d"])
def test_semiring_adjoints_run_as_scalar_programs(client, rng, semiring, op):
    """The semiring adjoints' nodes all have element-level forms: the scalar backend gives the
    tensor engine's result (under a tropical and a tuple-valued semiring)."""
    fn, shapes = {
        "softmax": (lambda x: sg.softmax(x, axis=0), [(3, 2)]),
        "log_softmax": (sg.log_softmax, [(2, 3)]),
        "layer_norm": (lambda x: sg.layer_norm(x, axes=(0, 1)), [(2, 3)]),
        "conv2d": (lambda x, w: sg.conv2d(x, w, padding=1, stride=2), [(1, 2, 3, 3), (2, 2, 2, 2)]),
        "max_pool2d": (lambda x: sg.max_pool2d(x, 2, stride=1, padding=1), [(1, 1, 3, 3)]),
        "avg_pool1d": (lambda x: sg.avg_pool1d(x, 3, stride=2, padding=1), [(1, 2, 5)]),
    }[op]
    f = client.register(_graph(fn, shapes))
    inputs = {f"x{i}": rng.normal(size=(2,) + s) for i, s in enumerate(shapes)}
    want = f.gradient(inputs, semiring=semiring, backend="tensor")
    got = f.gradient(inputs, semiring=semiring, backend="scalar")
    for name in inputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_padding_is_never_materialised(client, rng):
    """Huge padding and kernels (PyTorch's rules allow them) cost what the windows read, not
    the padded size: a 10¹²-wide average pool over one element, and a conv padded by 10⁶ with
    stride 10⁶ (its padded input would be 4·10¹² elements), answer at once, by closed form."""
    g = sg.Graph()
    x = g.input("x", (1, 2, 1))
    g.output("out", sg.avg_pool1d(x, 10**12, padding=5 * 10**11))
    f = client.register(g)
    value = rng.normal(size=(1, 2, 1))
    np.testing.assert_allclose(f.evaluate({"x": value})["out"], value / 1e12, rtol=1e-15)
    np.testing.assert_allclose(f.gradient({"x": value})["x"], np.full(value.shape, 1e-12), rtol=1e-15)

    g = sg.Graph()
    x, w = g.input("x", (1, 1, 3, 3)), g.input("w", (1, 1, 2, 2))
    g.output("out", sg.conv2d(x, w, stride=10**6, padding=10**6))
    f = client.register(g)
    point = {"x": rng.normal(size=(1, 1, 3, 3)), "w": rng.normal(size=(1, 1, 2, 2))}
    out = f.evaluate(point)["out"]
    want = np.zeros((1, 1, 3, 3))
    want[0, 0, 1, 1] = np.sum(point["w"][0, 0] * point["x"][0, 0, :2, :2])  # only the middle window reads x
    np.testing.assert_allclose(out, want, rtol=1e-14)
    grads = f.gradient(point)
    dx = np.zeros((1, 1, 3, 3))
    dx[0, 0, :2, :2] = point["w"][0, 0]
    np.testing.assert_allclose(grads["x"], dx, rtol=1e-15)
    np.testing.assert_allclose(grads["w"], point["x"][:, :, :2, :2], rtol=1e-15)


def test_kernel_offsets_are_capped():
    """MAX_WINDOW_OFFSETS: a conv or pool visiting 4,096 kernel offsets runs, 4,097 is
    RESOURCE_EXHAUSTED naming the node and the limit, at registration."""
    from semigrad_server.ops.nn import MAX_WINDOW_OFFSETS
    from semigrad_server.limits import Limits
    from semigrad_server.service import build_server

    assert MAX_WINDOW_OFFSETS == 4096
    server, port, _ = build_server("127.0.0.1:0", limits=Limits())
    server.start()
    try:
        with sg.Client(f"127.0.0.1:{port}") as c:
            for size, ok in ((4096, True), (4097, False)):
                conv = sg.Graph()
                conv.output("y", sg.conv1d(conv.input("x", (1, 1, size)), conv.input("w", (1, 1, size)), name="c"))
                pool = sg.Graph()
                pool.output("y", sg.max_pool1d(pool.input("x", (1, 1, size)), size, name="p"))
                for g, node in ((conv, "c"), (pool, "p")):
                    if ok:
                        f = c.register(g)
                        x = np.linspace(-1, 1, size).reshape(1, 1, size)
                        inputs = {"x": x, "w": np.ones((1, 1, size))} if node == "c" else {"x": x}
                        want = np.sum(x) if node == "c" else 1.0
                        np.testing.assert_allclose(f.evaluate(inputs)["y"].reshape(()), want, atol=1e-9)
                    else:
                        with pytest.raises(sg.SemigradError) as excinfo:
                            c.register(g)
                        assert excinfo.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                        assert f"'{node}'" in excinfo.value.message and "4096" in excinfo.value.message
    finally:
        server.stop(0).wait()


# ---------------------------------------------------------------- fused row adjoints in blocks (sr_row_vjp)


def _layer_norm_paths(x, eps):
    """max_product and entropy of every x element of layer_norm(x) over its last axis, seed 1̄,
    from the closed-form Jacobian J[r, i, j] = (δ_ij − 1/n − y_i y_j / n) / σ (NumPy, dense)."""
    n = x.shape[-1]
    c = x - x.mean(-1, keepdims=True)
    sigma = np.sqrt((c * c).mean(-1, keepdims=True) + eps)
    y = c / sigma
    p = np.abs((np.eye(n) - 1 / n - y[:, :, None] * y[:, None, :] / n) / sigma[:, :, None])
    z = p.sum(1)
    entropy = np.log(z) - (p * np.log(p)).sum(1) / z
    return p.max(1), entropy


@pytest.mark.parametrize("block", [6 * 6 * 5, 6 * 6 * 2, 6 * 6, 6 * 4, 6],
                         ids=["one-block", "three-blocks", "row-by-row", "column-blocks", "column-by-column"])
def test_fused_row_adjoints_give_the_same_path_sums_in_any_blocking(monkeypatch, rng, block):
    """ROW_BLOCK_ELEMENTS on both sides: all 5 rows in one block, blocks of 2 rows (the last
    one short), one row at a time; and past one row's n² (rows wider than ~1,000 by default),
    each row's columns in blocks of 4 (the last one short) or one at a time: the same
    max_product and entropy, equal to the dense closed form."""
    import semigrad_server.ops.semiring_ops as semiring_ops

    monkeypatch.setattr(semiring_ops, "ROW_BLOCK_ELEMENTS", block)
    x = rng.normal(size=(5, 6))
    want_max, want_entropy = _layer_norm_paths(x, 1e-5)
    with sg.Client() as local:  # a fresh engine: its plans are built with this block size
        f = local.register(_graph(lambda v: sg.layer_norm(v, eps=1e-5), [(5, 6)]))
        got = f.gradient({"x0": x}, semiring=["max_product", "entropy"])
    np.testing.assert_allclose(got["max_product"]["x0"], want_max, rtol=1e-12)
    np.testing.assert_allclose(got["entropy"]["x0"], want_entropy, rtol=1e-12)


def test_fused_row_adjoints_never_hold_every_rows_jacobian(rng):
    """A layer_norm of 64 rows of 512 under max_product + entropy: the dense Jacobians would
    be 64 · 512² · 8 bytes = 134 MB per component (268 MB with entropy's two); blocked, the
    request's peak stays far below one component's."""
    import tracemalloc

    x = rng.normal(size=(64, 512))
    with sg.Client() as local:
        f = local.register(_graph(lambda v: sg.layer_norm(v), [(64, 512)]))
        f.gradient({"x0": x}, semiring=["max_product", "entropy"])  # compiled outside the measure
        tracemalloc.start()
        try:
            got = f.gradient({"x0": x}, semiring=["max_product", "entropy"])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 64 * 512 * 512 * 8 / 2, peak
    want_max, want_entropy = _layer_norm_paths(x, 1e-5)
    np.testing.assert_allclose(got["max_product"]["x0"], want_max, rtol=1e-12)
    np.testing.assert_allclose(got["entropy"]["x0"], want_entropy, rtol=1e-10)
