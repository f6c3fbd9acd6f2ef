"""Found by attacking the new ops as a careless client (branch attack-import): each test fails on
the code before its fix. References are NumPy and PyTorch, never semigrad itself."""

import numpy as np
import pytest

import semigrad as sg

BACKENDS = ("tensor", "scalar")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["sum", "max", "mean", "softmax", "log_softmax", "layer_norm", "logsumexp"])
def test_row_ops_over_zero_rows_give_empty_results_on_every_backend(in_process_client, op, backend):
    """A (0, 3) input reduced or normalised along its non-empty axis: empty results, as NumPy
    and torch give; the scalar expansion reshaped with -1 and failed INTERNAL."""
    g = sg.Graph()
    x = g.input("x", (0, 3))
    build = {"sum": lambda v: v.sum(axis=1), "max": lambda v: v.max(axis=1), "mean": lambda v: v.mean(axis=1),
             "softmax": lambda v: sg.softmax(v, -1), "log_softmax": lambda v: sg.log_softmax(v, -1),
             "layer_norm": lambda v: sg.layer_norm(v), "logsumexp": lambda v: sg.logsumexp(v, axis=1)}[op]
    g.output("y", build(x))
    f = in_process_client.register(g)
    grads, outs = f.gradient({"x": np.ones((0, 3))}, backend=backend, return_outputs=True)
    expected = (0,) if op in ("sum", "max", "mean", "logsumexp") else (0, 3)
    assert outs["y"].shape == expected
    assert grads["x"].shape == (0, 3)


@pytest.mark.parametrize("op", [sg.softmax, sg.log_softmax])
def test_softmax_over_an_empty_axis_is_refused_naming_the_node(client, op):
    """As logsumexp and layer_norm: INVALID_ARGUMENT at registration, not INTERNAL per request."""
    g = sg.Graph()
    x = g.input("x", (2, 0))
    g.output("y", op(x, -1, name="rows"))
    with pytest.raises(sg.SemigradError) as info:
        client.register(g)
    assert info.value.code.name == "INVALID_ARGUMENT"
    assert "'rows'" in str(info.value) and "empty axis" in str(info.value)


def test_softmax_over_a_non_empty_axis_of_size_one_is_accepted(in_process_client):
    """The other side of the empty-axis refusal: one element per row is a softmax of 1."""
    g = sg.Graph()
    x = g.input("x", (2, 1))
    g.output("y", sg.softmax(x, -1))
    out = in_process_client.register(g).evaluate({"x": np.array([[3.0], [-2.0]])})["y"]
    np.testing.assert_array_equal(out, np.ones((2, 1)))


@pytest.mark.parametrize("backend", ("tensor", "scalar", "jit"))
def test_logsumexp_of_infinite_rows_is_the_same_on_every_backend(in_process_client, backend):
    """torch.logsumexp gives -inf for a row of -inf (a fully masked row) and +inf for a row
    holding +inf; the scalar and jit backends gave NaN (inf - inf), the tensor one ±inf."""
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("y", sg.logsumexp(x, axis=0))
    f = in_process_client.register(g)
    inf = np.inf
    expected = {(-inf, -inf, -inf): -inf, (inf, 1.0, 2.0): inf, (-inf, 0.0, 1.0): np.log(1.0 + np.e)}
    for row, value in expected.items():
        got = f.evaluate({"x": np.array(row)}, backend=backend)["y"]
        assert got == pytest.approx(value, rel=1e-12), (row, got)


# ---------------------------------------------------------------- einsum's contraction work


def _outer_sum_graph(n):
    """einsum("ij,kl->") of two n×n inputs: 2n² elements in, one out, n⁴ products."""
    g = sg.Graph()
    a, b = g.input("a", (n, n)), g.input("b", (n, n))
    g.output("y", sg.einsum("ij,kl->", a, b, name="outer"))
    return g


@pytest.mark.parametrize("limit, refused", [(150_000, True), (200_000, False)])
def test_einsum_contraction_work_counts_in_max_request_elements(limit, refused):
    """n = 20: 801 values per item but 160,000 products; before, only the 801 counted, so an
    einsum of two 3000×3000 inputs (under every element limit) ran ~10^14 products past any
    deadline. Both sides of the limit, on the tensor backend (the one that runs NumPy's einsum)."""
    from semigrad_server.limits import Limits

    n = 20
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(n, n)), rng.normal(size=(n, n))
    with sg.Client(limits=Limits(max_request_elements=limit)) as client:
        f = client.register(_outer_sum_graph(n))
        if refused:
            with pytest.raises(sg.SemigradError) as info:
                f.evaluate({"a": a, "b": b}, backend="tensor")
            assert info.value.code.name == "RESOURCE_EXHAUSTED"
            assert "'outer'" in str(info.value) and str(limit) in str(info.value)
        else:
            y = f.evaluate({"a": a, "b": b}, backend="tensor")["y"]
            assert y == pytest.approx(a.sum() * b.sum(), rel=1e-10)


def test_a_huge_einsum_contraction_is_refused_before_it_runs(server_address):
    """400×400 inputs (320,000 elements): 2.56·10^10 products, refused at once with the node
    named; before, the worker computed it for tens of seconds after the client's deadline."""
    import time

    with sg.Client(server_address, timeout=5) as client:
        f = client.register(_outer_sum_graph(400))
        start = time.monotonic()
        with pytest.raises(sg.SemigradError) as info:
            f.evaluate({"a": np.ones((400, 400)), "b": np.ones((400, 400))}, backend="tensor")
    assert info.value.code.name == "RESOURCE_EXHAUSTED", info.value
    assert "'outer'" in str(info.value)
    assert time.monotonic() - start < 4


def test_three_operand_einsum_work_is_its_pairwise_steps():
    """"ij,jk,kl->il" of n×n operands runs as two matmul-like steps of n³ products each: 2n³
    products plus the values, under a limit that n⁴ (one joint loop) would exceed."""
    from semigrad_server.limits import Limits

    n = 30
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(n, n)) for _ in range(3)]
    g = sg.Graph()
    ins = [g.input(name, (n, n)) for name in "abc"]
    g.output("y", sg.einsum("ij,jk,kl->il", *ins))
    with sg.Client(limits=Limits(max_request_elements=2 * n ** 3 + 10 * n * n)) as client:
        y = client.register(g).evaluate(dict(zip("abc", xs)), backend="tensor")["y"]
    np.testing.assert_allclose(y, xs[0] @ xs[1] @ xs[2], rtol=1e-10)


# ---------------------------------------------------------------- x[int array]: NumPy's integer-array indexing


def test_indexing_by_an_int_array_gathers_like_numpy(in_process_client):
    """``table[tokens]`` (an int64 input, or a list of ints) is what NumPy code writes for an
    embedding lookup; sg.trace and Handles refused it (TypeError: basic indexing only). Values
    against NumPy's fancy indexing, gradients against np.add.at (duplicates add up)."""
    g = sg.Graph()
    table = g.input("table", (6, 3))
    tokens = g.input("tokens", (2, 4), dtype="int64")
    g.output("y", table[tokens])
    g.output("z", table[[5, -1, 0]])
    f = in_process_client.register(g)
    t = np.arange(18.0).reshape(6, 3)
    ids = np.array([[0, 5, -2, 1], [3, 3, 3, 0]])
    grads, outs = f.gradient({"table": t, "tokens": ids}, wrt=["table"], return_outputs=True)
    np.testing.assert_array_equal(outs["y"], t[ids])
    np.testing.assert_array_equal(outs["z"], t[[5, -1, 0]])
    expected = np.zeros((6, 3))
    np.add.at(expected, ids, 1.0)
    np.add.at(expected, [5, -1, 0], 1.0)
    np.testing.assert_array_equal(grads["table"], expected)


def test_traced_embedding_lookup_by_indexing(in_process_client):
    def embed(table, tokens):
        return np.tanh(table[tokens]).sum()

    rng = np.random.default_rng(2)
    t, ids = rng.normal(size=(7, 4)), np.array([1, 6, 1, 0])
    f = in_process_client.register(sg.trace(embed, t, ids))
    assert f.evaluate({"table": t, "tokens": ids})["out"] == pytest.approx(embed(t, ids), rel=1e-12)


def test_a_boolean_mask_is_still_refused_naming_basic_indexing():
    g = sg.Graph()
    x = g.input("x", (3,))
    with pytest.raises(TypeError, match="basic indexing"):
        x[np.array([True, False, True])]


# ---------------------------------------------------------------- from_torch: adaptive average pooling


@pytest.mark.parametrize("out, hw", [((2, 2), (8, 8)), ((4, None), (8, 6)), ((1, 1), (6, 4))])
def test_adaptive_avg_pool_imports_when_the_output_divides_the_input(in_process_client, out, hw):
    """A CNN head (nn.AdaptiveAvgPool2d) was refused as an unsupported ATen op; values and
    gradients against torch.autograd."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(out)).double().eval()
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    imported = sg.from_torch(model, (x,))
    f = in_process_client.register(imported.graph)
    grads, outs = f.gradient(imported.inputs_for(x), wrt=imported.parameter_names, return_outputs=True)
    y = model(x)
    y.sum().backward()
    np.testing.assert_allclose(outs["output"], y.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads["0.weight"], model[0].weight.grad.numpy(), rtol=1e-10, atol=1e-13)


def test_adaptive_avg_pool_with_unequal_windows_matches_torch(in_process_client):
    """8 -> 3 windows are unequal (torch's start/end rule): once refused by name, now imported
    (constant averaging matrices), values and input gradients equal torch.autograd's."""
    torch = pytest.importorskip("torch")
    model = torch.nn.AdaptiveAvgPool2d((3, 3))
    x = torch.randn(1, 2, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    imported = sg.from_torch(model, (x.detach(),))
    inputs = imported.inputs_for(x.detach())
    (name,) = inputs
    out = model(x)
    out.sum().backward()
    grads, outs = in_process_client.register(imported.graph).gradient(inputs, wrt=[name], return_outputs=True)
    np.testing.assert_allclose(outs["output"], out.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(grads[name], x.grad.numpy(), rtol=1e-12)


# ---------------------------------------------------------------- from_torch: embedding padding_idx


def test_embedding_padding_idx_row_gets_no_gradient_like_torch(client):
    """nn.Embedding(padding_idx=0) (BERT's word embeddings): torch's backward leaves the padding
    row's gradient 0; the import gave it the gradient of every padding token (silently wrong).
    Values, gradients (against torch.autograd) and max_product paths (none reach the row)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4, padding_idx=0)
            self.head = torch.nn.Linear(4, 2)

        def forward(self, tokens):
            return torch.tanh(self.head(self.emb(tokens))).sum(1)

    model = Model().double().eval()
    with torch.no_grad():
        model.emb.weight[0] = torch.tensor([0.5, -1.0, 2.0, 0.25])  # a non-zero padding row still reads as is
    tokens = torch.tensor([[0, 3, 0, 7, 3]])
    imported = sg.from_torch(model, (tokens,))
    f = client.register(imported.graph)
    inputs = imported.inputs_for(tokens)
    grads, outs = f.gradient(inputs, wrt=imported.parameter_names, return_outputs=True)
    y = model(tokens)
    y.sum().backward()
    np.testing.assert_allclose(outs["output"], y.detach().numpy(), rtol=1e-12)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=name)
    assert not grads["emb.weight"][0].any() and grads["emb.weight"][3].any()
    best = f.gradient(inputs, wrt=["emb.weight"], semiring="max_product")["emb.weight"]
    assert not best[0].any() and best[3].all()
