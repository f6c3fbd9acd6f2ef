"""What is computed, not how it was written: the forward graph is hash-consed before reverse mode,
so recomputed subexpressions cost nothing extra, and path sums, retained gradients and hooks
still mean what they meant on the graph as written."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg
from reference import det_gradient
from semigrad_server.engine import Engine
from semigrad_server.service.convert import graph_from_proto
from workloads import det_by_minors


def det_graph(n: int, memoise: bool) -> sg.Graph:
    g = sg.Graph()
    g.output("det", det_by_minors(None, g.input("A", (n, n)), n, memoise))
    return g


def scalar_program_size(graph: sg.Graph, a: np.ndarray) -> int:
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(graph.to_proto()))
    np.testing.assert_allclose(engine.gradient(cg.id, {"A": a}).gradients["A"], det_gradient(a), rtol=1e-9)
    (compiled,) = [c for _, c in cg.plans.items()]
    return len(compiled.plan.program.instrs)


@pytest.mark.parametrize("n", [3, 4, 5, 6, pytest.param(7, marks=pytest.mark.slow)])
def test_a_recursive_determinant_compiles_to_the_memoised_program(rng, n):
    """n=7 (27,397 nodes as written, 1,210 memoised; issue 12's largest): a few seconds to register."""
    a = rng.normal(size=(n, n))
    recursive, memoised = det_graph(n, False), det_graph(n, True)
    assert len(recursive.to_proto().nodes) > len(memoised.to_proto().nodes)  # written differently
    assert scalar_program_size(recursive, a) == scalar_program_size(memoised, a)


def duplicated_graph():
    """The same subexpression written twice (two node ids), each copy with consumers of its own."""
    g = sg.Graph()
    x = g.input("x", (3,))
    first, second = sg.sin(x * x, name="first"), sg.sin(x * x, name="second")
    g.output("y", sg.sum(first * 2.0 + second * second))
    return g, first, second


@pytest.mark.parametrize("backend", ["tensor", "scalar"])
def test_retained_gradients_of_copies_stay_their_own(client, rng, backend):
    g, first, second = duplicated_graph()
    f = client.register(g)
    x = rng.normal(size=3)
    result = f.gradient({"x": x}, retain=[first.id, second.id], backend=backend)
    s = np.sin(x * x)
    np.testing.assert_allclose(result.retained[first.id], np.full(3, 2.0), rtol=1e-14)
    np.testing.assert_allclose(result.retained[second.id], 2 * s, rtol=1e-14)
    np.testing.assert_allclose(result["x"], (2.0 + 2 * s) * np.cos(x * x) * 2 * x, rtol=1e-13)


def test_a_hook_on_one_copy_sees_only_its_own_contributions(client, rng):
    g, first, second = duplicated_graph()
    f = client.register(g)
    x = rng.normal(size=3)
    seen = {}

    def pre(contributions):
        seen["edges"] = [c.consumer for c in contributions]
        return sum(c.value for c in contributions)

    f.gradient({"x": x}, hooks={second.id: sg.PreHook(pre)})
    (square,) = set(seen["edges"])  # second * second: its two edges (operands 0 and 1), none of first's
    assert len(seen["edges"]) == 2


@pytest.mark.parametrize("semiring", ["counting", "max_product", "log"])
def test_path_sums_count_every_written_path(client, rng, semiring):
    """x*x written twice is four paths to x, merged or not: the same as the graph written once."""
    g, _, _ = duplicated_graph()
    f = client.register(g)
    report = f.crosscheck({"x": rng.normal(size=3)}, semiring=semiring, methods=["reverse", "path_enumeration"])
    assert report.passed, str(report)
