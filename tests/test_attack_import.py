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
