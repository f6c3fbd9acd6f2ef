"""The tensor plan's passes: common subexpressions computed once (bit-identical results), and
elementwise groups fused into one step (compiled once hot)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import semigrad as sg
from semigrad_server.engine import Engine
from semigrad_server.ops import REGISTRY
from semigrad_server.runtime import Plan, fusion
from semigrad_server.service.convert import graph_from_proto
from test_op_gradients import CASES


def _duplicated_graph() -> sg.Graph:
    """sin(x) and (x @ w) written twice each, as separate nodes."""
    g = sg.Graph()
    x, w = g.input("x", (40, 40)), g.input("w", (40, 40))
    a, b = sg.sin(x), sg.sin(x)
    p, q = x @ w, x @ w
    g.output("y", sg.sum(a * b + sg.tanh(p) * q))
    return g


def _plans(engine, cg):
    """{"evaluate" | "gradient": the executable} of the graph's cached plans."""
    from semigrad_server.engine.engine import EvaluatePlanKey

    return {"evaluate" if isinstance(key, EvaluatePlanKey) else "gradient": getattr(entry, "plan", entry)
            for key, entry in cg.plans.items()}


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


# every case made of ops that fuse, plus two whose transcendental op stays a NumPy step of its own
ELEMENTWISE_CASES = [c for c in CASES if (c[0].split("-")[0] in REGISTRY.ops and REGISTRY.ops[c[0].split("-")[0]].fusible)
                     or c[0] in ("comparison-zero-gradient", "tanh", "exp")]


def _join_compiles():
    for thread in threading.enumerate():
        if thread.name == "semigrad-jit":
            thread.join()


@pytest.mark.skipif(not fusion.AVAILABLE, reason="numba is not installed (pip install 'semigrad[jit]')")
@pytest.mark.parametrize("case", ELEMENTWISE_CASES, ids=[c[0] for c in ELEMENTWISE_CASES])
def test_fused_elementwise_groups_compute_what_their_nodes_compute(monkeypatch, rng, case):
    """Value and gradient of fn(x...)·1.5 + 0.25, batched: node by node (NumPy) and as one
    compiled ufunc per group, the same IEEE operations, agree to the last bit."""
    name, fn, _, shapes, samplers = case
    g = sg.Graph()
    handles = [g.input(f"x{i}", shape) for i, shape in enumerate(shapes)]
    g.output("out", fn(*handles) * 1.5 + 0.25)
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(g.to_proto()))
    inputs = {f"x{i}": sampler(rng, (6,) + shape if i == 0 else shape)
              for i, (shape, sampler) in enumerate(zip(shapes, samplers))}
    monkeypatch.setattr(fusion, "HOT_ELEMENTS", 0)
    numpy_value = engine.evaluate(cg.id, inputs, backend="tensor")[0]["out"]
    numpy_grads = engine.gradient(cg.id, inputs, backend="tensor").gradients
    _join_compiles()
    fused = [s.kernel for p in _plans(engine, cg).values() for s in p.steps if isinstance(s.kernel, fusion.FusedKernel)]
    assert fused and all(k.ufunc is not None for k in fused)
    np.testing.assert_array_equal(engine.evaluate(cg.id, inputs, backend="tensor")[0]["out"], numpy_value)
    got = engine.gradient(cg.id, inputs, backend="tensor").gradients
    for x in numpy_grads:
        np.testing.assert_array_equal(got[x], numpy_grads[x], err_msg=x)


@pytest.mark.skipif(not fusion.AVAILABLE, reason="numba is not installed (pip install 'semigrad[jit]')")
def test_a_small_group_compiles_after_hot_calls(monkeypatch):
    """Elements (HOT_ELEMENTS) or calls (HOT_CALLS), whichever comes first: a 4-element group is
    not compiled after HOT_CALLS - 1 calls, and is after one more (as NumPy's own ufunc, not
    numba's DUFunc and its per-call checks in Python), with the same bits."""
    monkeypatch.setattr(fusion, "HOT_CALLS", 5)
    g = sg.Graph()
    x = g.input("x", (4,))
    g.output("y", (x * x - 1.0) * 3.0)
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(g.to_proto()))
    point = {"x": np.array([0.5, -1.5, 2.0, 3.0])}
    expected = (point["x"] ** 2 - 1.0) * 3.0
    for _ in range(4):
        np.testing.assert_array_equal(engine.evaluate(cg.id, point, backend="tensor")[0]["y"], expected)
    _join_compiles()
    fused = [s.kernel for p in _plans(engine, cg).values() for s in p.steps if isinstance(s.kernel, fusion.FusedKernel)]
    assert len(fused) == 1 and fused[0].ufunc is None
    engine.evaluate(cg.id, point, backend="tensor")
    _join_compiles()
    assert type(fused[0].ufunc) is np.ufunc
    np.testing.assert_array_equal(engine.evaluate(cg.id, point, backend="tensor")[0]["y"], expected)


def test_fusion_keeps_outputs_and_shared_values_out_of_groups():
    """An inner value with two uses, or one asked for as an output, is computed on its own."""
    g = sg.Graph()
    x = g.input("x", (4,))
    shared = x * 3.0  # two uses
    g.output("a", sg.abs(shared - 1.0) + shared)
    inner = x - 2.0
    g.output("b", inner)
    g.output("c", sg.relu(inner) * 2.0)
    graph = graph_from_proto(g.to_proto())
    order = list(graph.nodes)
    from semigrad_server.ops import REGISTRY
    from semigrad_server.engine import compile_graph
    from semigrad_server.limits import Limits

    cg = compile_graph(graph, Limits())
    ops = {n.id: REGISTRY.get(n) for n in order}
    groups = fusion.fusion_groups(cg.order, ops, cg.types, kept={graph.output_map[o] for o in "abc"})
    members = {n.id for group in groups.values() for n in group.members if n.id != group.root}
    assert shared.id not in members and inner.id not in members
    a = groups[graph.output_map["a"]]  # |shared - 1| + shared: one group reading shared
    assert shared.id in a.leaves and len(a.members) == 3


def _count_reuses(monkeypatch) -> list:
    from semigrad_server.runtime import plan as plan_module

    reused = []
    original = plan_module._dead_buffer

    def counting(args, step):
        out = original(args, step)
        reused.append(bool(out))
        return out

    monkeypatch.setattr(plan_module, "_dead_buffer", counting)
    return reused


def test_a_dead_operand_buffer_takes_the_result(monkeypatch, rng):
    g = sg.Graph()
    x = g.input("x", (300, 300))
    g.output("y", sg.sum(sg.cos(sg.sin(x))))
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(g.to_proto()))
    xs = rng.normal(size=(300, 300))
    before = xs.copy()
    reused = _count_reuses(monkeypatch)
    value = engine.evaluate(cg.id, {"x": xs}, backend="tensor")[0]["y"]
    assert reused == [False, True]  # sin may not write into the caller's x; cos writes into sin's buffer
    np.testing.assert_array_equal(value, np.sum(np.cos(np.sin(before))))
    np.testing.assert_array_equal(xs, before)


def test_a_buffer_seen_through_a_view_is_not_reused(monkeypatch, rng):
    """sin(x) dies at cos, but its transpose (a view of the same memory) is still to be read."""
    g = sg.Graph()
    x = g.input("x", (300, 300))
    t = sg.sin(x)
    view = t.T
    g.output("y", sg.sum(sg.cos(t) * view))
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(g.to_proto()))
    xs = rng.normal(size=(300, 300))
    reused = _count_reuses(monkeypatch)
    value = engine.evaluate(cg.id, {"x": xs}, backend="tensor")[0]["y"]
    assert reused and not reused[0]
    np.testing.assert_array_equal(value, np.sum(np.cos(np.sin(xs)) * np.sin(xs).T))


def test_only_ops_declared_elementwise_write_into_a_given_array():
    """Whether a step may write into an output region or a dying operand's buffer is read from
    its op's declared kind: np.matmul (a matmul of matrices) and np.multiply (a matmul with an
    inner dimension of 1) are ufuncs too, but a matmul's result is no broadcast of its operands."""
    from semigrad_server.ops import REGISTRY

    g = sg.Graph()
    x, w, v, u = g.input("x", (300, 300)), g.input("w", (300, 300)), g.input("v", (300, 1)), g.input("u", (1, 300))
    g.output("y", sg.sum(sg.tanh(x) @ w + sg.exp(v @ u)))
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(g.to_proto()))
    engine.evaluate(cg.id, {"x": np.ones((300, 300)), "w": np.ones((300, 300)), "v": np.ones((300, 1)),
                            "u": np.ones((1, 300))}, backend="tensor")
    ops = {n.id: n.op for n in cg.graph.nodes}
    steps = {ops[s.node_id]: s for s in _plans(engine, cg)["evaluate"].steps}
    assert {op for op, s in steps.items() if s.into is not None} == {"tanh", "exp", "add"}
    assert all(REGISTRY.ops[op].kind == "elementwise" for op, s in steps.items() if s.into is not None or s.reuse)
    matmuls = [s for s in _plans(engine, cg)["evaluate"].steps if ops[s.node_id] == "matmul"]
    assert len(matmuls) == 2 and all(s.into is None and s.reuse == () for s in matmuls)
