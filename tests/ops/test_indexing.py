"""gather / scatter_add beyond the op table: index validation and its status codes, NumPy's
negative indices, batch axes on both operands (vmap semantics), an embedding lookup, and the
semiring scatter-⊕ against a per-element loop."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import semigrad as sg
from semigrad_server.semiring.loader import default_registry


def embedding_graph(vocab=6, dim=3, tokens=(4,)):
    g = sg.Graph()
    table = g.input("table", (vocab, dim))
    ids = g.input("ids", tokens, dtype="int64")
    w = g.input("w", (dim,))
    g.output("out", sg.sum(sg.tanh(sg.gather(table, ids, name="lookup") @ w)))
    return g


def test_an_embedding_lookup_gradient_adds_up_repeated_tokens(client, rng):
    """d/dtable of Σ tanh(table[ids] @ w): each row gets one term per occurrence of its token
    (closed form, written with a Python loop)."""
    f = client.register(embedding_graph())
    table, w = rng.normal(size=(6, 3)), rng.normal(size=3)
    ids = np.array([[1, 4, 1, -5], [0, 0, 0, 5]])  # batched tokens; -5 is row 1
    grads = f.gradient({"table": table, "ids": ids, "w": w})
    for b in range(2):
        want = np.zeros((6, 3))
        for t in ids[b]:
            want[t % 6] += (1 - np.tanh(table[t] @ w) ** 2) * w
        np.testing.assert_allclose(grads["table"][b], want, rtol=1e-13)


@pytest.mark.parametrize("bad", [6, -7, 2**40])
def test_an_out_of_range_index_is_invalid_argument_naming_the_node(client, bad):
    f = client.register(embedding_graph())
    point = {"table": np.ones((6, 3)), "ids": np.array([0, 1, bad, 2]), "w": np.ones(3)}
    for call in (f.evaluate, f.gradient):
        with pytest.raises(sg.SemigradError) as excinfo:
            call(point)
        assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "'lookup'" in excinfo.value.message and str(bad) in excinfo.value.message


def test_the_boundary_indices_are_valid(client):
    """-n and n-1 are the ends of the valid range: both sides of it are tested."""
    g = sg.Graph()
    x = g.input("x", (4,))
    i = g.input("i", (2,), dtype="int64")
    g.output("out", sg.gather(x, i, name="pick"))
    f = client.register(g)
    x = np.array([10.0, 11.0, 12.0, 13.0])
    np.testing.assert_array_equal(f.evaluate({"x": x, "i": np.array([-4, 3])})["out"], [10.0, 13.0])
    for bad in ([-5, 0], [0, 4]):
        with pytest.raises(sg.InvalidArgument, match="'pick'"):
            f.evaluate({"x": x, "i": np.array(bad)})


def test_an_index_error_in_a_gradient_names_the_gather_even_when_only_its_adjoint_runs(client):
    """sum(gather(x, i)) needs no gathered value for its gradient: the scatter of the backward
    pass checks the indices and names the forward node."""
    g = sg.Graph()
    x = g.input("x", (3,))
    i = g.input("i", (2,), dtype="int64")
    g.output("out", sg.sum(sg.gather(x, i, name="pick")))
    f = client.register(g)
    for semiring in ("real", "max_product"):
        with pytest.raises(sg.InvalidArgument, match="'pick'"):
            f.gradient({"x": np.ones(3), "i": np.array([0, 3])}, semiring=semiring)


def test_float_indices_are_refused_at_registration(client):
    g = sg.Graph()
    x = g.input("x", (3,))
    i = g.input("i", (2,))
    g.output("out", g.add_node("gather", [x, i], {"axis": 0}, name="pick"))
    with pytest.raises(sg.InvalidArgument, match="'pick'.*int64"):
        client.register(g)


def test_client_side_shapes_and_index_checks():
    g = sg.Graph()
    x = g.input("x", (5, 3, 2))
    i = g.input("i", (4, 7), dtype="int64")
    assert sg.gather(x, i, axis=1).shape == (5, 4, 7, 2)
    assert sg.scatter_add(sg.gather(x, i, axis=1), i, 3, axis=1).shape == (5, 3, 2)
    assert sg.gather(x, [0, -1]).shape == (2, 3, 2)
    with pytest.raises(TypeError, match="integers"):
        sg.gather(x, [0.5])
    with pytest.raises(ValueError, match="gather"):
        sg.gather(x, i, axis=3)
    with pytest.raises(ValueError, match="scatter_add"):
        sg.scatter_add(x, i, 3, axis=0)
    assert sg.cumsum(x, -1).shape == (5, 3, 2) and sg.argmax(x, 1).shape == (5, 2)
    assert sg.argmin(x).shape == () and sg.argmax(x, keepdims=True).shape == (1, 1, 1)
    assert sg.einsum("ijk,kl->li", x, g.input("w", (2, 4))).shape == (4, 5)
    with pytest.raises(ValueError, match="cumsum"):
        sg.cumsum(x, 3)


def test_both_operands_batched_broadcast_like_vmap(client, rng):
    """x with batch (2, 1) and indices with batch (3,) give batch (2, 3): item (a, b) gathers
    x[a, 0] by indices[b] (a NumPy loop over items is the reference), gradients per item."""
    g = sg.Graph()
    x = g.input("x", (4, 2))
    i = g.input("i", (3,), dtype="int64")
    g.output("out", sg.gather(x, i) ** 2)
    f = client.register(g)
    xs, ids = rng.normal(size=(2, 1, 4, 2)), rng.integers(-4, 4, size=(3, 3))
    out = f.evaluate({"x": xs, "i": ids})["out"]
    seed = rng.normal(size=out.shape)
    grads = f.gradient({"x": xs, "i": ids}, seeds={"out": seed})["x"]
    assert out.shape == (2, 3, 3, 2) and grads.shape == (2, 3, 4, 2)
    for a in range(2):
        for b in range(3):
            np.testing.assert_allclose(out[a, b], xs[a, 0][ids[b]] ** 2, rtol=1e-15)
            want = np.zeros((4, 2))
            for k, t in enumerate(ids[b]):
                want[t] += 2 * xs[a, 0][t] * seed[a, b, k]
            np.testing.assert_allclose(grads[a, b], want, rtol=1e-13)


@pytest.mark.parametrize("name", ["real", "max_product", "minplus", "counting", "entropy", "kbest", "log"])
def test_the_semiring_scatter_sum_matches_a_loop(name, rng):
    """Semiring.scatter_add (pairwise merging of equal indices) equals ⊕ taken one element at a
    time, for multiplicities from 1 to 300 (nine rounds of merging)."""
    s = default_registry().get(name)
    index = np.concatenate([np.zeros(300, dtype=np.int64), rng.integers(1, 40, size=100), [45]])
    rng.shuffle(index)
    values = s.lift(rng.normal(size=index.size) * rng.choice([0.0, 1.0, 1.0], size=index.size))
    got = s.scatter_add(values, index, 50)
    want = s.zeros((50,))
    for k, j in enumerate(index):
        part = s.map(lambda c: c[k:k + 1], values)
        cell = s.add(s.map(lambda c: c[j:j + 1], want), part)
        for target, c in zip(s.components_of(want), s.components_of(cell)):
            target[j:j + 1] = c
    assert np.all(s.equal(got, want, rtol=1e-12, atol=1e-12))
