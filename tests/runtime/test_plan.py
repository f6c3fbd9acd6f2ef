"""The tensor plan's passes: common subexpressions computed once, with bit-identical results."""

from __future__ import annotations

import numpy as np
import semigrad as sg
from semigrad_server.engine import Engine
from semigrad_server.runtime import Plan
from semigrad_server.service.convert import graph_from_proto


def _duplicated_graph() -> sg.Graph:
    """sin(x) and (x @ w) written twice each, as separate nodes."""
    g = sg.Graph()
    x, w = g.input("x", (40, 40)), g.input("w", (40, 40))
    a, b = sg.sin(x), sg.sin(x)
    p, q = x @ w, x @ w
    g.output("y", sg.sum(a * b + sg.tanh(p) * q))
    return g


def _plans(engine, cg):
    return {key[0]: entry.plan if hasattr(entry, "plan") else entry for key, entry in cg.plans.items()}


def test_duplicate_nodes_are_computed_once_with_the_same_bits(rng):
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(_duplicated_graph().to_proto()))
    x, w = rng.normal(size=(40, 40)), rng.normal(size=(40, 40))
    value = engine.evaluate(cg.id, {"x": x, "w": w}, backend="tensor")[0]["y"]
    grads = engine.gradient(cg.id, {"x": x, "w": w}, backend="tensor").gradients
    plans = _plans(engine, cg)
    assert all(isinstance(p, Plan) for p in plans.values())
    evaluated = [s.node_id for s in plans["evaluate"].steps]
    assert sum(i.startswith("sin") for i in evaluated) == 1 and sum(i.startswith("matmul") for i in evaluated) == 1
    # NumPy, op by op as the graph says (duplicates included): the same bits
    np.testing.assert_array_equal(value, np.sum(np.sin(x) * np.sin(x) + np.tanh(x @ w) * (x @ w)))
    # the gradient against its closed form
    p = x @ w
    gp = (1 - np.tanh(p) ** 2) * p + np.tanh(p)
    np.testing.assert_allclose(grads["x"], 2 * np.sin(x) * np.cos(x) + gp @ w.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["w"], x.T @ gp, rtol=1e-12, atol=1e-12)


def test_a_retained_or_hooked_duplicate_still_answers_for_itself(rng):
    g = sg.Graph()
    x = g.input("x", (3,))
    a, b = sg.sin(x), sg.sin(x)
    g.output("y", sg.sum(a * 2.0 + b * 3.0))
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(g.to_proto()))
    xs = rng.normal(size=3)
    result = engine.gradient(cg.id, {"x": xs}, retain=[a.id, b.id], backend="tensor")
    np.testing.assert_allclose(result.retained[a.id], np.full(3, 2.0))
    np.testing.assert_allclose(result.retained[b.id], np.full(3, 3.0))
    np.testing.assert_allclose(result.gradients["x"], 5 * np.cos(xs), rtol=1e-14)
