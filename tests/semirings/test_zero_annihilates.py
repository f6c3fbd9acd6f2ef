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
