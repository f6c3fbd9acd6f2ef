"""0̄ annihilates: a path through a zero partial is removed whatever else is on it, an infinite
partial included (0 · ∞ and −∞ + ∞ are NaN in IEEE arithmetic, not 0̄). Closed forms by hand on
one graph, for every semiring, elementwise and through a matmul's adjoint.

    y = A @ x, A = [[0, 1], [2, 3]];  h = y * b, b = [inf, 1];  out = sum(h)

Paths from x[0]: through y[0] (∂ 0, then ∞): removed; through y[1]: 2 · 1 · 1 = 2.
Paths from x[1]: through y[0]: 1 · ∞ = ∞; through y[1]: 3.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import semigrad as sg

INF = math.inf
CASES = {  # semiring: (x[0], x[1])
    "max_product": (2.0, INF),
    "maxplus": (math.log(2), INF),
    "minplus": (math.log(2), math.log(3)),
    "log": (math.log(2), INF),
    "bottleneck": (1.0, 1.0),
    "counting": (1.0, 2.0),
    "kbest": (2.0, INF),
    "signed_max_product": (2.0, INF),
}


def graph(elementwise_only: bool) -> sg.Graph:
    g = sg.Graph()
    x = g.input("x", (2,))
    A = g.input("A", (2, 2))
    b = g.input("b", (2,))
    y = sg.stack([A[0, 0] * x[0] + A[0, 1] * x[1], A[1, 0] * x[0] + A[1, 1] * x[1]]) if elementwise_only else A @ x
    g.output("out", sg.sum(y * b))
    return g


POINT = {"x": np.array([0.5, -1.5]), "A": np.array([[0.0, 1.0], [2.0, 3.0]]), "b": np.array([INF, 1.0])}


@pytest.mark.parametrize("elementwise_only", [False, True], ids=["matmul", "elementwise"])
@pytest.mark.parametrize("semiring", list(CASES))
def test_a_zero_partial_removes_a_path_with_an_infinite_one(client, semiring, elementwise_only):
    f = client.register(graph(elementwise_only))
    got = f.gradient(POINT, wrt=["x"], semiring=semiring)["x"]
    assert got.shape == (2,)
    np.testing.assert_allclose(got, CASES[semiring], rtol=1e-12)


@pytest.mark.parametrize("elementwise_only", [False, True], ids=["matmul", "elementwise"])
def test_best_paths_skip_the_removed_path(client, elementwise_only):
    f = client.register(graph(elementwise_only))
    every = f.gradient(POINT, wrt=["x"], semiring="max_product", best_path="all").best_paths
    assert every[0].value["value"] == 2.0
    assert math.prod(abs(s.partial) for s in every[0].steps) == 2.0
    top = f.gradient(POINT, wrt=["x"], semiring="max_product", top_paths=4).best_paths
    assert [p.value["value"] for p in top] == [INF, 3.0, 2.0]


@pytest.mark.parametrize("elementwise_only", [False, True], ids=["matmul", "elementwise"])
def test_every_kbest_rank_drops_the_removed_path(client, elementwise_only):
    """kbest's ranks past its paths are 0 (no path): an infinite partial times them is no
    path either, not NaN (it had given [nan, nan, inf] for the one infinite path)."""
    f = client.register(graph(elementwise_only))
    got = f.gradient(POINT, wrt=["x"], semiring="kbest", semiring_params={"k": 3}, return_components=True)
    np.testing.assert_array_equal(got.components["x"]["kbest"], [[2.0, 0.0, 0.0], [INF, 3.0, 0.0]])


def test_kbest_of_a_zero_partial_into_an_infinite_one_is_no_path(client):
    """sqrt(square(x)) at 0: 0 (square's partial) times ∞ (sqrt's) is removed, as max_product
    removes it (the real gradient is NaN, as PyTorch's); it had given [nan, 0, 0]."""
    g = sg.Graph()
    x = g.input("x", ())
    g.output("y", sg.sqrt(sg.square(x)))
    f = client.register(g)
    point = {"x": np.float64(0.0)}
    assert f.gradient(point, semiring="max_product")["x"] == 0.0
    got = f.gradient(point, semiring="kbest", semiring_params={"k": 3}, return_components=True)
    np.testing.assert_array_equal(got.components["x"]["kbest"], [0.0, 0.0, 0.0])


@pytest.mark.parametrize("size", [1, 4096], ids=["sorted", "network"])
def test_kbest_times_an_infinite_partial_keeps_its_empty_ranks_empty(size):
    """One path (ranks [v, 0, 0]) ⊗ a lifted ∞: [∞, 0, 0], by the sort (small arrays) and by
    the selection network (large ones). With v = ∞ the sort had put 0 · ∞ = NaN first:
    [nan, nan, inf]."""
    from semigrad_paths.kbest import KBestSemiring

    s = KBestSemiring(3)
    for v in (2.0, INF):
        one_path = s.lift(np.full(size, v))
        for product in (s.mul(one_path, s.lift(np.full(size, INF))), s.mul(s.lift(np.full(size, INF)), one_path)):
            np.testing.assert_array_equal(np.stack(product), [[INF] * size, [0.0] * size, [0.0] * size])
