"""top_paths' pruned k-best pass (semiring/pruning.py).

* The k-best matmul kernels (the block-bound one and the one by rows) drop exactly the
  candidates below ratio × their entry's best: a candidate at the threshold stays, one just
  below goes. Checked against plain Python loops over the products.
* A plan's second top_paths request runs pruned by what the first taught it, and its paths are
  the unpruned pass's, step for step, on the random graphs of tests/path_reference.py (the
  unpruned pass is checked against brute force in test_back_pointers.py, where every graph is
  also asked twice).
* A guess that the next answer does not bear out runs the pass again unpruned: the answer is
  still the brute-force one, and the server counts the rerun.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from path_reference import random_case

from semigrad_server import telemetry
from semigrad_server.engine import Engine
from semigrad_server.semiring import _jit_kernels, pointer_kernels, pointers, pruning
from semigrad_server.service.convert import graph_from_proto

import semigrad as sg

K = 3


def candidates(va, vb, i, j):
    """Every product a[i, l, r] · b[l, j] (a's ranks, b lifted: one rank), best first."""
    return sorted((va[r][i, l] * vb[l, j] for l in range(vb.shape[0]) for r in range(K) if va[r][i, l] > 0),
                  reverse=True)


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("ratio", [0.5, 0.95], ids=["with the K-th block's bound", "ratio alone"])
@pytest.mark.parametrize("m", [1, 6], ids=["by rows", "block bound"])
def test_the_kernels_drop_exactly_what_is_below_the_ratio(m, ratio):
    # entry (i, j)'s best is 1 · b; its other candidates sit at the ratio and just below it
    # (ratios on both sides of PRUNED_ALONE, where the K-th best block stops being computed)
    assert (ratio < _jit_kernels.PRUNED_ALONE) == (ratio == 0.5)
    kk, n = 8, 5
    rng = np.random.default_rng(0)
    va = np.zeros((K, m, kk))
    va[0] = 0.25 * rng.random((m, kk))  # heads well below the threshold
    va[0][:, 0], va[1][:, 0], va[2][:, 0] = 1.0, ratio, ratio * (1 - 1e-12)  # one element's ranks: at, just below
    va[0][:, 3] = ratio  # another element's head: at the threshold
    va[0][:, 5] = ratio * (1 - 1e-12)  # and one just below it
    vb = np.ones((kk, n)) * (1 + rng.integers(0, 2, (1, n)))
    pa = [np.arange(m * kk, dtype=float).reshape(m, kk) * K + r for r in range(K)]
    a = tuple(va) + tuple(pa) + tuple(np.ones((K, m, kk)))
    b = (vb,) + (np.zeros((kk, n)),) * (K - 1) + (np.full((kk, n), -1.0),) * K + (np.ones((kk, n)),) + \
        (np.zeros((kk, n)),) * (K - 1)
    unpruned = pointer_kernels.kbest_pointer_matmul(a, b, K, "max", "mul", 0.0)
    pruned = pointer_kernels.kbest_pointer_matmul(a, b, K, "max", "mul", 0.0, ratio)
    for i, j in itertools.product(range(m), range(n)):
        every = candidates(va, vb, i, j)
        kept = [v for v in every if v >= ratio * every[0]][:K]
        assert kept == [every[0], ratio * every[0], ratio * every[0]]  # the two at the threshold, none below
        assert [pruned[r][i, j] for r in range(K)] == kept
        assert [unpruned[r][i, j] for r in range(K)] == every[:K]  # unpruned: the two just below too
        assert every[2] == every[1] and every[K] < every[1]  # (so the test crosses the threshold)
        for r in range(K):  # the ranks kept are the unpruned ones, pointers and partials too
            assert (pruned[K + r][i, j], pruned[2 * K + r][i, j]) == (unpruned[K + r][i, j], unpruned[2 * K + r][i, j])


def test_a_pass_verifies_when_its_kth_path_reaches_the_ratio():
    values = np.array([4.0, 3.0, 2.0])
    assert pruning.verified(values, 3, 0.5)  # 2 ≥ 0.5 · 4: at the bound
    assert not pruning.verified(values, 3, 0.5 + 1e-12)
    assert not pruning.verified(values[:2], 3, 0.1)  # fewer paths than asked: more may have been dropped
    assert pruning.verified(values[:2], 3, 0.0)  # unpruned: whatever it found
    assert not pruning.verified(np.array([np.inf, np.inf, np.inf]), 3, 0.5)  # ties at ∞ prove nothing
    floor = 2 * np.finfo(np.float64).tiny / 0.5  # ρ × a best must be normal, with a factor 2 to spare
    assert pruning.rounded_relatively([np.array([0.0, 1.0]), np.array([floor])], 0.5)
    assert not pruning.rounded_relatively([np.array([1.0]), np.array([0.0, floor * (1 - 1e-15)])], 0.5)
    assert not pruning.rounded_relatively([np.array([1.0, np.inf])], 0.5)
    guess = pruning.Guess()
    assert guess.rho == 0.0
    guess.learn(values, 3)
    assert guess.rho == pytest.approx(0.5 ** pruning.SLACK)
    for odd in (values[:2], np.array([np.inf, 1.0, 1.0]), np.zeros(3)):
        guess.learn(odd, 3)
        assert guess.rho == 0.0


def top_paths(engine, gid, inputs, seeds, k, **options):
    got = engine.gradient(gid, inputs, seeds=seeds or None, semiring="max_product", top_paths=k, **options).best_paths
    return {name: column.tolist() for name, column in got.columns.items()}, got.values["value"].tolist()


def unpruned(graph: sg.Graph, inputs, seeds, k, **options):
    engine = Engine()  # a plan of its own: nothing learnt
    return top_paths(engine, engine.register(graph_from_proto(graph.to_proto()))[0].id, inputs, seeds, k, **options)


@pytest.fixture
def events():
    seen: list[str] = []
    telemetry.listen(seen.append)
    yield seen
    telemetry.listen(None)


@pytest.fixture
def ratios(monkeypatch):
    """The ratio every k-best matmul ran with (the real kernels still run)."""
    seen: list[float] = []
    real = pointers.kbest_pointer_matmul

    def recorded(*args):
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(pointers, "kbest_pointer_matmul", recorded)
    return seen


PRUNED_SEEDS = range(24)
PRUNED: dict = {}  # seed -> whether a pass ran pruned


@pytest.mark.parametrize("seed", PRUNED_SEEDS)
def test_pruned_passes_find_the_unpruned_paths(seed, ratios):
    c = random_case(seed)
    graph = c.graph.client_graph()
    engine = Engine()
    gid = engine.register(graph_from_proto(graph.to_proto()))[0].id
    rng = np.random.default_rng(seed)
    for _ in range(3):  # each request pruned by what the one before taught the plan
        inputs = {x: v * rng.uniform(0.9, 1.1, np.shape(v)) for x, v in c.inputs.items()}
        ratios.clear()
        assert top_paths(engine, gid, inputs, c.seeds, 5) == unpruned(graph, inputs, c.seeds, 5)
        PRUNED[seed] = PRUNED.get(seed, False) or any(r > 0 for r in ratios)


def test_the_random_graphs_ran_pruned_passes():
    """(Runs after the tests above.)"""
    if PRUNED:
        assert sum(PRUNED.values()) >= 8, PRUNED


def product(n: int) -> sg.Graph:
    """y = sum(x @ w), x and w inputs: a path's value is one entry of w or of x."""
    g = sg.Graph()
    x, w = g.input("x", (4, n)), g.input("w", (n, n))
    g.output("y", sg.sum(x @ w))
    return g


def test_a_guess_the_answer_does_not_bear_out_runs_again_unpruned(events, ratios):
    n = 6
    graph = product(n)
    engine = Engine()
    gid = engine.register(graph_from_proto(graph.to_proto()))[0].id
    rng = np.random.default_rng()

    def ask(inputs):
        events.clear()
        ratios.clear()
        assert top_paths(engine, gid, inputs, None, 10) == unpruned(graph, inputs, None, 10)
        return max(ratios), events.count("top_paths_unpruned_rerun")

    ones = {"x": np.ones((4, n)), "w": np.ones((n, n))}
    assert ask(ones) == (0.0, 0)  # nothing learnt yet: unpruned; every path 1, so the guess is 1
    ratio, reruns = ask(ones)  # pruned to the ties, verified
    assert ratio == pytest.approx(1.0) and reruns == 0
    spread = {"x": rng.normal(size=(4, n)), "w": rng.normal(size=(n, n))}
    ratio, reruns = ask(spread)  # the 10 best spread out: the guess fails, and the pass runs unpruned
    assert ratio == pytest.approx(1.0) and reruns == 1
    ratio, reruns = ask(spread)  # learnt from the unpruned answer: pruned, verified
    assert 0.0 < ratio < 1.0 and reruns == 0


def scaled_matmul() -> sg.Graph:
    """y = sum(c * (A @ ((x * t) * s))): the path from x[j] through c[i] is worth
    |c[i] · A[i, j] · s[j] · t[j]|, multiplied in that order from the output."""
    g = sg.Graph()
    x, t, s, A, c = (g.input(name, shape) for name, shape in
                     (("x", (2,)), ("t", (2,)), ("s", (2,)), ("A", (2, 2)), ("c", (2,))))
    g.output("y", sg.sum(c * (A @ ((x * t) * s))))
    return g


U = 2.0 ** -1074  # the least subnormal
TAUGHT = {"x": np.ones(2), "t": np.ones(2), "s": np.ones(2), "c": np.ones(2), "A": np.array([[1.0, 0.9], [0.95, 0.8]])}
FLOAT_EDGES = {  # the two paths from x[0] leave the matmul at 1 and 0.8 (below ρ = 0.95^4: dropped), then:
    # × 2^-1074: both round to 2^-1074, a tie (a helper's attack found the pruned pass lose one)
    "subnormal": {"x": np.ones(2), "t": np.ones(2), "s": np.full(2, U), "c": np.array([1.0, 0.8]),
                  "A": np.array([[1.0, 1.0], [1.0, 0.25]])},
    # × 2^-1074 × 2^1000: back from the subnormal range, tied at 2^-74
    "subnormal and back": {"x": np.ones(2), "t": np.full(2, 2.0 ** 1000), "s": np.full(2, U), "c": np.array([1.0, 0.8]),
                           "A": np.array([[1.0, 1.0], [1.0, 0.25]])},
    # 1e300 · 1e10 = ∞ is the best; the dropped 1e300 · 1 becomes ∞ too (× 1e10), a tie
    "overflow": {"x": np.ones(2), "t": np.ones(2), "s": np.full(2, 1e10), "c": np.full(2, 1e300),
                 "A": np.array([[1e10, 1.0], [1.0, 1.0]])},
}


@pytest.mark.parametrize("edge", list(FLOAT_EDGES))
def test_a_pass_whose_floats_leave_relative_rounding_runs_again_unpruned(edge, events, ratios):
    graph = scaled_matmul()
    engine = Engine()
    gid = engine.register(graph_from_proto(graph.to_proto()))[0].id
    assert top_paths(engine, gid, TAUGHT, None, 2, wrt=["x"])[1] == [1.0, 0.95]  # the plan learns ρ = 0.95^4
    events.clear()
    ratios.clear()
    got = top_paths(engine, gid, FLOAT_EDGES[edge], None, 2, wrt=["x"])
    assert max(ratios) == pytest.approx(0.95 ** 4)  # it did run pruned first
    assert events.count("top_paths_unpruned_rerun") == 1
    assert got == unpruned(graph, FLOAT_EDGES[edge], None, 2, wrt=["x"])
    assert got[0]["element"] == [0, 0]  # both best paths start at x[0] (tied)
