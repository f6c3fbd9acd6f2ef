"""Semiring matmuls leave rows of 0̄ out (semiring/zero_rows.py): the same values as the whole
product, for every installed semiring and products of them, on both sides of
ZERO_ROWS_MIN_COLUMNS; rows really left out from it on; never with a b that is not finite."""

from __future__ import annotations

import types

import numpy as np
import pytest
from semigrad_server.semiring import kernels, zero_rows
from semigrad_server.semiring.loader import SemiringRegistry
from semigrad_server.semiring.zero_rows import ZERO_ROWS_MIN_COLUMNS, matmul_of_rows_not_zero

NAMES = ["real", "max_product", "entropy", "log_entropy", "signed_max_product", "kbest", "log", "counting",
         "boolean", "maxplus", "minplus", "bottleneck"]


@pytest.fixture(scope="module")
def registry():
    return SemiringRegistry()


def lifted(s, rng, shape, zero_rows=()):
    """Lifted partials (some zero), rows `zero_rows` (of the last but one axis) 0̄."""
    d = rng.normal(size=shape) * rng.choice([0.0, 1.0, 1.0, 1.0], size=shape)
    d[..., list(zero_rows), :] = 0.0
    return s.lift(d)


def assert_same(s, got, want, exact):
    for g, w in zip(s.components_of(got), s.components_of(want)):
        assert np.shape(g) == np.shape(w)
        if exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def counting_rows(monkeypatch, s):
    """The row counts of the left operands s.matmul receives (members' for a product)."""
    seen = []
    for member in getattr(s, "members", (s,)):
        original = member.matmul
        monkeypatch.setattr(member, "matmul", lambda a, b, m=member, f=original: (seen.append(m.shape(a)[-2]), f(a, b))[1])
    return seen


@pytest.mark.parametrize("name", NAMES + ["real+max_product+entropy"])
@pytest.mark.parametrize("columns", [ZERO_ROWS_MIN_COLUMNS - 1, ZERO_ROWS_MIN_COLUMNS])
@pytest.mark.parametrize("zero", [(), (0,), (1, 2, 5), (0, 1, 2, 3, 4, 5)], ids=["none", "one", "some", "all"])
@pytest.mark.parametrize("lead", [((), ()), ((3,), (3,)), ((2, 1), (3,))], ids=["2d", "batch", "broadcast"])
def test_the_values_are_the_whole_products(registry, monkeypatch, name, columns, zero, lead):
    s = registry.product(name.split("+"), {"kbest.k": 2} if name == "kbest" else None) if "+" in name else \
        registry.get(name, {"k": 2} if name == "kbest" else None)
    rng = np.random.default_rng(len(zero) + columns)
    a, b = lifted(s, rng, lead[0] + (6, 4), zero), lifted(s, rng, lead[1] + (4, columns))
    want = s.matmul(a, b)
    rows = counting_rows(monkeypatch, s)
    got = matmul_of_rows_not_zero(s, a, b)
    assert_same(s, got, want, exact=s.selective)
    members = len(getattr(s, "members", (s,)))
    if columns < ZERO_ROWS_MIN_COLUMNS or not zero:
        assert rows == [6] * members  # whole products
    else:
        assert all(r in (6, 6 - len(zero)) for r in rows)  # all of them where b is not finite (log's -inf)
        if name in ("real", "max_product", "entropy", "counting", "real+max_product+entropy"):  # finite b
            assert rows == ([6 - len(zero)] * members if len(zero) < 6 else [])


def test_rows_are_kept_when_b_is_not_finite(registry):
    real = registry.get("real")
    a = np.zeros((3, 2))
    a[0] = 1.0
    b = np.ones((2, ZERO_ROWS_MIN_COLUMNS))
    b[1, 0] = np.inf
    out = matmul_of_rows_not_zero(real, a, b)
    assert np.isnan(out[1:, 0]).all() and np.isinf(out[0, 0])  # 0 · ∞: NaN, as the whole product


def test_a_broadcast_component_stays_broadcast(registry, monkeypatch):
    """Entropy's seed 1̄ carries R as a broadcast 0, which its matmul skips without a pass: a
    run of rows left in is a view of it."""
    entropy = registry.get("entropy")
    z = np.zeros((5, 3))
    z[1:3] = 1.0
    a = (z, np.broadcast_to(0.0, (5, 3)))
    b = entropy.lift(np.random.default_rng(0).normal(size=(3, ZERO_ROWS_MIN_COLUMNS)))
    received = []
    original = entropy.matmul
    monkeypatch.setattr(entropy, "matmul", lambda x, y: (received.append(x), original(x, y))[1])
    got = matmul_of_rows_not_zero(entropy, a, b)
    assert not any(received[0][1].strides) and received[0][0].shape == (2, 3)
    assert_same(entropy, got, original(a, b), exact=False)


def test_a_backward_pass_reading_one_row_gives_the_whole_products(monkeypatch):
    """A classifier on the first row: every adjoint below the read is 0̄ on the other rows, and
    each member of a product gives its own request's values, as with no row left out."""
    import semigrad as sg
    from semigrad_server.engine import Engine
    from semigrad_server.service.convert import graph_from_proto

    g = sg.Graph()
    x, w1, w2 = g.input("x", (5, 4)), g.input("w1", (4, 20)), g.input("w2", (20, 18))
    g.output("y", sg.sum(sg.index(sg.matmul(sg.tanh(sg.matmul(x, w1)), w2), 0)))
    rng = np.random.default_rng(3)
    inputs = {"x": rng.normal(size=(5, 4)), "w1": rng.normal(size=(4, 20)), "w2": rng.normal(size=(20, 18))}
    engine = Engine()
    gid = engine.register(graph_from_proto(g.to_proto()))[0].id
    names = ["real", "max_product", "entropy", "counting"]

    def run():
        both = engine.gradient(gid, inputs, wrt=["x"], semirings=names, backend="tensor", return_components=True)
        alone = {n: engine.gradient(gid, inputs, wrt=["x"], semiring=n, backend="tensor", return_components=True)
                 for n in names[1:]}
        return both, alone

    finite_checks = []  # zero_rows checks b only once it has found rows of 0̄ to leave out
    monkeypatch.setattr(zero_rows, "kernels", types.SimpleNamespace(
        all_finite=lambda c: (finite_checks.append(c.shape), kernels.all_finite(c))[1]))
    monkeypatch.setattr(zero_rows, "ZERO_ROWS_MIN_COLUMNS", 16)
    both, alone = run()
    assert (18, 20) in finite_checks  # w2 transposed, the product's b: rows of 0̄ left out
    monkeypatch.setattr(zero_rows, "ZERO_ROWS_MIN_COLUMNS", 10 ** 9)  # every row multiplied
    whole_both, whole_alone = run()
    for name in names:
        want = whole_both.semirings[name].gradients["x"]
        np.testing.assert_allclose(both.semirings[name].gradients["x"], want, rtol=1e-13, atol=1e-15)
        if name != "real":
            np.testing.assert_array_equal(both.semirings[name].gradients["x"], alone[name].gradients["x"])
            np.testing.assert_allclose(alone[name].gradients["x"], whole_alone[name].gradients["x"], rtol=1e-13)
