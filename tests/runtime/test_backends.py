"""Every execution backend agrees with the reference tensor engine: bit-for-bit or within a
few ulps (the scalar forms sum in a different order than NumPy's pairwise reductions). Each op
on each backend: tests/ops/test_completeness.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import semigrad as sg
from reference import det_by_minors, det_gradient, det_graph

ULPS = dict(rtol=4e-15, atol=4e-15)
HAVE_NUMBA = importlib.util.find_spec("numba") is not None


def assert_same(got: dict, want: dict, **tolerance):
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], **(tolerance or ULPS), err_msg=name)


def ieee_graph():
    g = sg.Graph()
    x = g.input("x", (4,))
    g.output("y", sg.log(x) + 1 / x + sg.sqrt(x) + sg.exp(x * 800) + sg.maximum(x, x * 0))
    return g


IEEE_POINTS = np.array([-1.0, 0.0, np.inf, np.nan])


@pytest.mark.parametrize("backend", ["scalar", "jit"])
def test_non_finite_values_propagate_identically(client, backend):
    if backend == "jit" and not HAVE_NUMBA:
        pytest.skip("numba is not installed (pip install 'semigrad[jit]')")
    f = client.register(ieee_graph())
    for x in (IEEE_POINTS, np.stack([IEEE_POINTS, IEEE_POINTS[::-1]])):  # one point: floats fall back to NumPy
        want_value, want_grad = f.evaluate({"x": x}, backend="tensor"), f.gradient({"x": x}, backend="tensor")
        np.testing.assert_array_equal(f.evaluate({"x": x}, backend=backend)["y"], want_value["y"])
        np.testing.assert_array_equal(f.gradient({"x": x}, backend=backend)["x"], want_grad["x"])


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install 'semigrad[jit]')")
@pytest.mark.parametrize("n", [2, 3, 4])
def test_jit_backend_det_by_minors(client, rng, n):
    f = client.register(det_graph(n))
    a = rng.normal(size=(300, n, n))
    grads = f.gradient({"A": a}, backend="jit")["A"]
    np.testing.assert_allclose(grads, det_gradient(a), rtol=1e-9, atol=1e-11)
    assert_same(f.gradient({"A": a}, backend="jit"), f.gradient({"A": a}, backend="tensor"), rtol=1e-13, atol=1e-13)
    assert_same(f.gradient({"A": a[0]}, backend="jit"), f.gradient({"A": a[0]}, backend="tensor"),
                rtol=1e-13, atol=1e-13)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install 'semigrad[jit]')")
def test_jit_backend_with_unbatched_and_bool_inputs(client, rng):
    g = sg.Graph()
    x, w = g.input("x", (3,)), g.input("w", (3,))
    g.output("y", sg.sum(sg.where(x > w, sg.tanh(x * w), sg.square(x - w))))
    f = client.register(g)
    inputs = {"x": rng.normal(size=(500, 3)), "w": rng.normal(size=3)}
    assert_same(f.gradient(inputs, backend="jit"), f.gradient(inputs, backend="tensor"), rtol=1e-13, atol=1e-13)


def test_forcing_an_impossible_backend_is_a_failed_precondition(client):
    g = sg.Graph()
    x = g.input("x", (300, 300))
    g.output("y", sg.sum(x @ x))  # 27 million scalar products: no scalar program
    f = client.register(g)
    with pytest.raises(sg.FailedPrecondition, match="scalar backend"):
        f.gradient({"x": np.ones((300, 300))}, backend="scalar")


def test_jit_is_refused_for_plugin_semirings(client):
    g = sg.Graph()
    x = g.input("x", (2,))
    g.output("y", sg.sum(sg.sin(x) * x))
    f = client.register(g)
    with pytest.raises(sg.FailedPrecondition, match="jit backend"):
        f.gradient({"x": np.ones((400, 2))}, semiring="max_product", backend="jit")


def test_unknown_backend_is_invalid(client):
    g = sg.Graph()
    g.output("y", sg.sin(g.input("x", (2,))))
    with pytest.raises(sg.InvalidArgument, match="unknown backend 'gpu'"):
        client.register(g).gradient({"x": np.ones(2)}, backend="gpu")


def test_a_forced_backend_is_not_served_from_another_backends_plan(rng):
    from semigrad_server.engine import Engine
    from semigrad_server.engine.gradient_plans import GradientPlanKey
    from semigrad_server.runtime import Plan
    from semigrad_server.runtime.compiled import ScalarExecutable
    from semigrad_server.service.convert import graph_from_proto

    g = sg.Graph()
    x, w = g.input("x", (8,)), g.input("w", (8, 8))
    g.output("y", sg.sum(sg.tanh(x @ w)))  # wide: `auto` runs the tensor plan
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(g.to_proto()))
    inputs = {"x": rng.normal(size=(4, 8)), "w": rng.normal(size=(8, 8))}
    auto = engine.gradient(cg.id, inputs).gradients
    scalar = engine.gradient(cg.id, inputs, backend="scalar").gradients
    kinds = {key.compile_kind: type(value.plan) for key, value in cg.plans.items() if isinstance(key, GradientPlanKey)}
    assert kinds == {"auto": Plan, "scalar": ScalarExecutable}
    assert_same(scalar, auto, rtol=1e-13, atol=1e-13)


def _chain_graph() -> sg.Graph:
    """A long dependency chain (explicit Euler steps of a logistic ODE): the shape of program
    the column layout exists for."""
    g = sg.Graph()
    p = g.input("p", (2,))
    y = p[0] * 0 + 0.1
    for _ in range(20):
        y = y + 0.1 * p[1] * y * (1 - y / p[0])
    g.output("y", y)
    return g


def _where_graph() -> sg.Graph:
    g = sg.Graph()
    x, w = g.input("x", (3,)), g.input("w", (3,))
    g.output("y", sg.sum(sg.where(x > w, sg.tanh(x * w), sg.square(x - w))))
    return g


LAYOUT_CASES = {
    "det3": (det_graph(3), lambda rng: {"A": rng.normal(size=(257, 3, 3))}),  # 4 tiles of 64 and 1 item
    "det3-part-tile": (det_graph(3), lambda rng: {"A": rng.normal(size=(5, 3, 3))}),
    "chain": (_chain_graph(), lambda rng: {"p": rng.uniform(1, 2, size=(300, 2))}),
    "unbatched-input": (_where_graph(), lambda rng: {"x": rng.normal(size=(301, 3)), "w": rng.normal(size=3)}),
}


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install 'semigrad[jit]')")
@pytest.mark.parametrize("layout", ["rows", "tiles", "columns"])
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=list(LAYOUT_CASES))
def test_both_jit_layouts_agree_with_the_tensor_engine(rng, case, layout):
    """The layout the JIT picks is a timing decision; each must give the tensor plan's results."""
    from semigrad_server.engine import Engine
    from semigrad_server.engine.gradient_plans import GradientPlanKey
    from semigrad_server.runtime.jit import Kernel, readonly
    from semigrad_server.service.convert import graph_from_proto

    graph, sample = LAYOUT_CASES[case]
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(graph.to_proto()))
    inputs = sample(rng)
    want = engine.gradient(cg.id, inputs, backend="tensor").gradients
    engine.gradient(cg.id, inputs, backend="scalar")
    program = next(v.plan for k, v in cg.plans.items()
                   if isinstance(k, GradientPlanKey) and k.compile_kind == "scalar").program
    specs = {s.name: s for s in graph.to_proto().inputs}
    n = max(inputs[name].shape[0] for name, _, _ in program.inputs if inputs[name].ndim > len(specs[name].shape))
    batched = tuple(inputs[name].ndim > len(specs[name].shape) for name, _, _ in program.inputs)
    arrays = [readonly(np.ascontiguousarray(inputs[name]).reshape(n if b else 1, ids.size))
              for (name, _, ids), b in zip(program.inputs, batched)]
    outs = Kernel(program, batched, layout).run(arrays, n)
    got = {key.name: out.reshape((n,) + shape) for (key, shape, _), out in zip(program.outputs, outs)}
    assert_same(got, want, rtol=1e-13, atol=1e-13)


def _engine_with(graph):
    from semigrad_server.engine import Engine
    from semigrad_server.service.convert import graph_from_proto

    engine = Engine()
    return engine, engine.register(graph_from_proto(graph.to_proto()))[0]


def test_a_repeated_request_is_still_checked_when_its_inputs_change(rng):
    """Validated requests are remembered by input signature: another shape or dtype is checked anew."""
    from semigrad_server.errors import InvalidArgument

    engine, cg = _engine_with(det_graph(3))
    a = rng.normal(size=(3, 3))
    for semiring in ("real", "", "real"):  # "" is how gRPC says "real"
        got = engine.gradient(cg.id, {"A": a}, semiring=semiring).gradients["A"]
        np.testing.assert_allclose(got, det_gradient(a), rtol=1e-12)
    assert len(cg.remembered) == 1  # remembered once, whichever way "real" was spelled
    with pytest.raises(InvalidArgument, match="input 'A' has shape \\[3, 4\\]"):
        engine.gradient(cg.id, {"A": rng.normal(size=(3, 4))})
    with pytest.raises(InvalidArgument, match="input 'A' has dtype float32"):
        engine.gradient(cg.id, {"A": a.astype(np.float32)})
    with pytest.raises(InvalidArgument, match="unknown input 'B'"):
        engine.gradient(cg.id, {"A": a, "B": a})
    batch = rng.normal(size=(5, 3, 3))
    np.testing.assert_allclose(engine.gradient(cg.id, {"A": batch}).gradients["A"], det_gradient(batch), rtol=1e-12)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install 'semigrad[jit]')")
def test_a_hot_single_point_graph_runs_compiled_with_the_same_results(rng):
    import threading

    from semigrad_server.runtime.compiled import HOT_SINGLE_CALLS

    engine, cg = _engine_with(det_graph(4))
    a = rng.normal(size=(4, 4))
    for _ in range(HOT_SINGLE_CALLS + 1):
        engine.gradient(cg.id, {"A": a})
    for thread in threading.enumerate():
        if thread.name == "semigrad-jit":
            thread.join()
    engine.gradient(cg.id, {"A": a})
    executable = cg.plans.values()[0].plan  # the one plan: the gradient's
    assert executable._single_kernel is not None
    for a in [rng.normal(size=(4, 4)), rng.normal(size=(4, 4)).T]:  # C-ordered and a transposed view
        got = engine.gradient(cg.id, {"A": a}).gradients["A"]
        np.testing.assert_allclose(got, det_gradient(a), rtol=1e-11, atol=1e-12)
        assert_same({"A": got}, engine.gradient(cg.id, {"A": a}, backend="tensor").gradients, rtol=1e-13, atol=1e-13)
        assert a.flags.writeable  # the caller's array is left as it was


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install 'semigrad[jit]')")
@pytest.mark.parametrize("spelling", ["auto", ""])  # "" is gRPC's default for the backend field
def test_a_remembered_request_still_runs_the_compiled_kernel(monkeypatch, rng, spelling):
    import threading

    from semigrad_server.runtime import jit

    engine, cg = _engine_with(det_graph(3))
    batch = rng.normal(size=(300, 3, 3))
    engine.gradient(cg.id, {"A": batch}, backend=spelling)
    for thread in threading.enumerate():
        if thread.name == "semigrad-jit":
            thread.join()
    runs = []
    original = jit.Kernel.run
    monkeypatch.setattr(jit.Kernel, "run", lambda self, arrays, n: runs.append(n) or original(self, arrays, n))
    for _ in range(2):
        got = engine.gradient(cg.id, {"A": batch}, backend=spelling).gradients["A"]
        np.testing.assert_allclose(got, det_gradient(batch), rtol=1e-10, atol=1e-12)
    assert runs == [300, 300]


def test_remembered_requests_do_not_outlive_their_evicted_plans(rng):
    from semigrad_server.engine import Engine
    from semigrad_server.limits import Limits
    from semigrad_server.service.convert import graph_from_proto

    g = sg.Graph()
    x, y = g.input("x", (3,)), g.input("y", (3,))
    g.output("z", sg.sum(sg.sin(x) * y))
    engine = Engine(Limits(max_plans_per_graph=1))
    cg, _ = engine.register(graph_from_proto(g.to_proto()))
    inputs = {"x": rng.normal(size=3), "y": rng.normal(size=3)}
    for wrt in (["x"], ["y"], ["x"]):
        got = engine.gradient(cg.id, inputs, wrt=wrt).gradients[wrt[0]]
        want = np.cos(inputs["x"]) * inputs["y"] if wrt == ["x"] else np.sin(inputs["x"])
        np.testing.assert_allclose(got, want, rtol=1e-14)
        assert len(cg.plans) == 1
        assert all(c.compiled in cg.plans.values() for c in cg.remembered.values())


def segmented_graph():
    """Comparisons early, their bools read after a det-by-minors' worth of instructions: with small
    segments, floats and bools both cross function boundaries (through scratch)."""
    g = sg.Graph()
    a, x = g.input("A", (4, 4)), g.input("x", (3,))
    early = x > 0.25
    d = det_by_minors(None, a, 4)
    g.output("y", sg.sum(sg.where(early, x * d, sg.square(x - d))) + d * sg.sum(sg.where(early, 1.0, 0.0)))
    return g


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install 'semigrad[jit]')")
@pytest.mark.parametrize("segment", [40, 100_000], ids=["segmented", "whole"])
@pytest.mark.parametrize("batch", [(), (300,)], ids=["single", "batched"])
def test_jit_programs_cut_into_segments_give_the_same_bits(rng, monkeypatch, segment, batch):
    """Both sides of SEGMENT_INSTRUCTIONS: a program larger than a segment compiles as several
    functions, and computes exactly what the whole function and the tensor engine compute."""
    from semigrad_server.engine import Engine
    from semigrad_server.runtime import jit
    from semigrad_server.service.convert import graph_from_proto

    monkeypatch.setattr(jit, "SEGMENT_INSTRUCTIONS", segment)
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(segmented_graph().to_proto()))
    inputs = {"A": rng.normal(size=batch + (4, 4)), "x": rng.normal(size=batch + (3,))}
    got = engine.gradient(cg.id, inputs, backend="jit").gradients
    want = engine.gradient(cg.id, inputs, backend="tensor").gradients
    assert_same(got, want, rtol=1e-13, atol=1e-13)
    (compiled,) = [c for _, c in cg.plans.items() if getattr(c.plan, "jit", None) is not None]
    (kernel,) = compiled.plan.jit.kernels()
    assert len(compiled.plan.program.instrs) > 40  # the segmented case really is cut
    assert (kernel.layout == "segments") == (segment == 40)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install 'semigrad[jit]')")
def test_a_program_over_the_jit_cap_is_refused_by_name_and_auto_falls_back(rng, monkeypatch):
    from semigrad_server.engine import Engine
    from semigrad_server.errors import FailedPrecondition
    from semigrad_server.runtime import jit
    from semigrad_server.service.convert import graph_from_proto

    monkeypatch.setattr(jit, "MAX_INSTRUCTIONS", 40)
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(segmented_graph().to_proto()))
    inputs = {"A": rng.normal(size=(300, 4, 4)), "x": rng.normal(size=(300, 3))}
    with pytest.raises(FailedPrecondition, match=r"jit backend.*instructions; the JIT's limit is 40"):
        engine.gradient(cg.id, inputs, backend="jit")
    assert_same(engine.gradient(cg.id, inputs).gradients, engine.gradient(cg.id, inputs, backend="tensor").gradients)


def _python_helper(x):
    return x / (1.0 + abs(x))


def _not_numba_code(x):  # calls a plain Python function: numba cannot type it
    return x * _python_helper(x)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install 'semigrad[jit]')")
def test_an_op_whose_float_form_numba_cannot_compile_is_refused_not_internal(rng, monkeypatch):
    """A row's float form that is not numba code: backend="jit" is FAILED_PRECONDITION, auto keeps
    answering on NumPy (the failed compile is remembered, not retried)."""
    import dataclasses

    from semigrad_server.engine import Engine
    from semigrad_server.errors import FailedPrecondition
    from semigrad_server.ops import REGISTRY
    from semigrad_server.runtime import jit
    from semigrad_server.service.convert import graph_from_proto

    from semigrad_server.ops.elementwise import kernel_of

    def odd_square(x):
        return x * (x / (1.0 + np.abs(x)))

    odd = dataclasses.replace(REGISTRY.ops["square"], name="odd_square", infix=None, float_fn=_not_numba_code,
                              elementwise_fn=odd_square, kernel=kernel_of(odd_square), expand=None, fusible=False)
    monkeypatch.setitem(REGISTRY.ops, "odd_square", odd)
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("y", sg.sum(sg.elementwise("odd_square", x)))
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(g.to_proto()))
    inputs = {"x": rng.normal(size=(300, 3))}
    with pytest.raises(FailedPrecondition, match="jit backend cannot compile"):
        engine.evaluate(cg.id, inputs, backend="jit")
    want = engine.evaluate(cg.id, inputs, backend="tensor")
    for _ in range(3):
        np.testing.assert_array_equal(engine.evaluate(cg.id, inputs)[0]["y"], want[0]["y"])
    with jit.BACKGROUND_COMPILES:  # any background compile has finished
        pass
