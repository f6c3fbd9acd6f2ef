"""Every registered op on every backend: it runs there and agrees with the tensor engine and
finite differences (first and second order), or that backend refuses it by declaration, with
FAILED_PRECONDITION naming op and backend. The op test table (test_op_gradients.CASES) drives
it: adding an op is its row in ops/ plus its row there.

Backends: tensor (the reference), scalar (straight-line code over floats and over batch rows),
jit (numba), symbolic (SymPy), complex step, reverse over reverse (second order), fusion.
"""

from __future__ import annotations

import importlib.util
import itertools

import grpc
import numpy as np
import pytest
import semigrad as sg
import sympy as sp
from semigrad_server.autodiff import reverse
from semigrad_server.engine import compile_graph
from semigrad_server.ir import Graph
from semigrad_server.limits import Limits
from semigrad_server.ops import REGISTRY
from semigrad_server.runtime import Plan, jit
from semigrad_server.service.convert import graph_from_proto
from test_op_gradients import CASES, build

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
ULPS = dict(rtol=4e-15, atol=4e-15)
CLOSE = dict(rtol=1e-12, atol=1e-12)
IDS = [c[0] for c in CASES]


def ops_of(case) -> list:
    """The ops a case's forward graph and its real backward graph use, in order of appearance."""
    cg = compile_graph(graph_from_proto(build(case).to_proto()), Limits())
    floats = [s.name for s in cg.graph.inputs if s.type.is_float]
    bg = reverse(cg.graph, cg.order, cg.types, outputs=["out"], wrt=floats, seeded=["out"])
    ops = bg.context.builder.ops
    return list({ops[node.id].name: ops[node.id] for node in bg.graph.nodes}.values())


def inputs_for(case, rng, batch=()):
    _, _, _, shapes, samplers = case
    return {f"x{i}": sampler(rng, (batch if i == 0 else ()) + shape)
            for i, (shape, sampler) in enumerate(zip(shapes, samplers))}


def assert_same(got: dict, want: dict, **tolerance):
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], **(tolerance or ULPS), err_msg=name)


def refused(excinfo, op: str, backend: str) -> None:
    assert excinfo.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"'{op}'" in excinfo.value.message and backend in excinfo.value.message


# ---------------------------------------------------------------- the table covers the registry


def test_every_op_of_the_registry_is_in_the_op_table():
    """Every registered op appears in some case's forward or backward graph (internal ops such
    as scatter_index and heaviside come from other ops' gradients)."""
    covered = {op.name for case in CASES for op in ops_of(case)}
    assert {op.name for op in REGISTRY} - covered == set()


@pytest.mark.parametrize("op", [op for op in REGISTRY if op.kind in ("elementwise", "comparison")],
                         ids=lambda op: op.name)
def test_elementwise_facts_agree_with_the_kernel(op, rng):
    """An elementwise op's float form (single points, numba) computes what its NumPy kernel does,
    and an op declared fusible can be written in generated code. (Points inside every op's domain:
    outside it Python's math raises and the scalar backend reruns the point with NumPy.)"""
    assert op.elementwise_fn is not None and op.sympy_apply is not None and op.expand is not None
    if op.fusible:
        assert op.infix is not None or op.float_fn is not None
    if op.float_fn is None:
        return
    args = [rng.uniform(0.05, 0.95, size=20) * rng.choice([-1, 1], size=20) for _ in op.operands]
    args[-1] = np.abs(args[-1])  # pow's exponent may be negative only for positive bases
    args[0] = args[0] > 0 if op.name == "where" else np.abs(args[0]) if op.name in ("sqrt", "log", "pow") else args[0]
    want = op.elementwise_fn(*args)
    got = [op.float_fn(*(a[k].item() for a in args)) for k in range(20)]
    np.testing.assert_allclose(np.asarray(got, dtype=want.dtype), want, rtol=1e-15, atol=0, equal_nan=True)  # libm and NumPy: an ulp apart
    # IEEE edge values: where the float form answers at all (Python's math raises instead of
    # returning inf or NaN, and the scalar backend then reruns the point with NumPy), it must
    # answer what the kernel does.
    edges = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e308, -1e-310]
    for point in itertools.product(edges, repeat=len(op.operands)):
        if op.name == "where":
            point = (bool(point[0]),) + point[1:]
        with np.errstate(all="ignore"):
            expected = op.elementwise_fn(*(np.asarray(v) for v in point))
        try:
            value = op.float_fn(*point)
        except (ArithmeticError, ValueError):
            continue
        value = np.asarray(value, dtype=expected.dtype)
        if expected.dtype.kind == "f" and np.isfinite(expected):  # libm and NumPy: an ulp apart
            np.testing.assert_allclose(value, expected, rtol=1e-15, atol=0, err_msg=f"{op.name}{point}")
        else:  # nan, ±inf and bools exactly
            assert np.array_equal(value, expected, equal_nan=True), (op.name, point, value, expected)


@pytest.mark.parametrize("op", [op for op in REGISTRY if op.analytic and op.elementwise_fn is not None],
                         ids=lambda op: op.name)
def test_ops_declared_analytic_take_complex_arguments(op, rng):
    """Complex-step derivatives rely on it: Im f(x + ih)/h equals the derivative rule."""
    x = [rng.uniform(0.5, 1.5, size=5) for _ in op.operands]
    h = 1e-20
    for k in range(len(x)):
        z = [a.astype(complex) + (1j * h if j == k else 0) for j, a in enumerate(x)]
        derivative = np.imag(op.elementwise_fn(*z)) / h
        symbols = sorted(op.expression.free_symbols, key=lambda s: op.operands.index(str(s)))
        want = sp.lambdify(symbols, op.partials[k], "numpy")(*x)
        np.testing.assert_allclose(derivative, np.broadcast_to(want, derivative.shape), rtol=1e-12)


def test_a_missing_backend_fact_is_a_declared_refusal():
    """Without its float form an op cannot be in numba code: the JIT says so by name, never a KeyError."""
    sin = REGISTRY.ops["sin"]
    bare = type(sin)(**{**{f: getattr(sin, f) for f in sin.__dataclass_fields__}, "float_fn": None})
    if not jit.AVAILABLE:
        pytest.skip("numba is not installed (pip install 'semigrad[jit]')")
    assert "'sin'" in jit.refusal([bare])
    assert jit.refusal([sin]) is None


# ---------------------------------------------------------------- each backend runs each op, or refuses it


def _first_missing(ops, fact) -> str | None:
    return next((op.name for op in ops if not fact(op)), None)


def has_expansion(op) -> bool:
    return op.expand is not None


def has_float_form(op) -> bool:
    return op.elementwise_fn is None or op.infix is not None or op.float_fn is not None


def integer_values(case) -> list[str]:
    """The case's int64 inputs and nodes (indices, argmax results)."""
    cg = compile_graph(graph_from_proto(build(case).to_proto()), Limits())
    return [ref for ref, t in cg.types.items() if t.dtype == "int64"]


def data_chosen_indices(case) -> set[str]:
    """Ops that make int64 values from float data (argmax): they have no element-level form, as
    which element they pick depends on the data; scalar programs and SymPy refuse them."""
    cg = compile_graph(graph_from_proto(build(case).to_proto()), Limits())
    return {REGISTRY.get(n).name for n in cg.order if cg.types[n.id].dtype == "int64" and REGISTRY.get(n).expand is None}


def assert_refuses_integer_values(f, case, rng, backend: str) -> None:
    """Scalar programs and numba code hold floats and bools only: a graph with an int64 value
    (gather's indices) is refused by declaration, naming backend and value; auto runs it."""
    inputs = inputs_for(case, rng, (3,))
    with pytest.raises(sg.SemigradError) as excinfo:
        f.gradient(inputs, backend=backend)
    assert excinfo.value.code == grpc.StatusCode.FAILED_PRECONDITION
    message = excinfo.value.message
    assert backend in message and "int64" in message, message
    assert any(f"'{ref}'" in message for ref in integer_values(case)), message
    assert_same(f.gradient(inputs), f.gradient(inputs, backend="tensor"), rtol=0, atol=0)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_scalar_backend(client, rng, case):
    """Built-in ops all have element-level expansions: a missing one fails here."""
    exempt = data_chosen_indices(case)
    assert _first_missing([op for op in ops_of(case) if op.name not in exempt], has_expansion) is None
    f = client.register(build(case))
    if integer_values(case):
        return assert_refuses_integer_values(f, case, rng, "scalar")
    for batch in ((), (3,)):
        inputs = inputs_for(case, rng, batch)
        assert_same(f.evaluate(inputs, backend="scalar"), f.evaluate(inputs, backend="tensor"))
        seeds = {"out": rng.normal(size=f.evaluate(inputs)["out"].shape)}
        assert_same(f.gradient(inputs, seeds=seeds, backend="scalar"),
                    f.gradient(inputs, seeds=seeds, backend="tensor"))


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install 'semigrad[jit]')")
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jit_backend(client, rng, case, monkeypatch):
    """Built-in elementwise ops all have a float form or an infix: a missing one fails here.
    (One layout per program: an op's code is the same in each, and every layout is checked
    against the tensor engine in tests/runtime/test_backends.py; compiling all three for each of
    88 cases was the suite's largest cost. One program per case too: the gradient with the
    outputs computes the forward values a gradient alone may not need, where an evaluate
    program beside it cost a second compile, 80 s of the suite.)"""
    monkeypatch.setattr(jit, "LAYOUTS", ("rows",))
    assert _first_missing(ops_of(case), has_float_form) is None
    f = client.register(build(case))
    if integer_values(case):
        return assert_refuses_integer_values(f, case, rng, "jit")
    for batch in ((), (7,)):
        inputs = inputs_for(case, rng, batch)
        grads, outputs = f.gradient(inputs, backend="jit", return_outputs=True)
        assert_same(outputs, f.evaluate(inputs, backend="tensor"), **CLOSE)
        assert_same(grads, f.gradient(inputs, backend="tensor"), **CLOSE)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install 'semigrad[jit]')")
def test_an_op_without_a_float_form_is_refused_by_the_jit_by_name(client, rng):
    """A custom op has a NumPy function but no numba form: the scalar backend runs it, the JIT
    refuses it by declaration (FAILED_PRECONDITION naming op and backend), auto falls back."""
    g = sg.Graph()
    x = g.input("x", (3,))
    softclip = g.op("softclip", ["x"], "log(1 + exp(x)) - log(1 + exp(x - 1))")
    g.output("out", sg.sum(softclip(x) * x))
    f = client.register(g)
    inputs = {"x": rng.normal(size=(300, 3))}
    want = f.gradient(inputs, backend="tensor")
    assert_same(f.gradient(inputs, backend="scalar"), want, **CLOSE)
    assert_same(f.gradient(inputs), want, **CLOSE)
    with pytest.raises(sg.SemigradError) as excinfo:
        f.gradient(inputs, backend="jit")
    refused(excinfo, "softclip", "jit")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_symbolic_and_complex_step_backends(client, rng, case):
    """SymPy's derivatives and the complex step agree with reverse mode; the complex step runs
    exactly when every op of the graph is declared analytic."""
    f = client.register(build(case))
    point = inputs_for(case, rng)
    report = f.crosscheck(point, methods=["reverse", "symbolic", "complex_step"], atol=1e-9, rtol=1e-9)
    refusals = data_chosen_indices(case)  # refused by declaration, naming the op
    if refusals:
        detail = report.method("symbolic").detail
        assert not report.method("symbolic").ran and any(f"'{op}'" in detail for op in refusals), detail
    else:
        assert report.method("symbolic").ran, report.method("symbolic").detail
    analytic = all(REGISTRY.get(n).analytic for n in compile_graph(
        graph_from_proto(build(case).to_proto()), Limits()).order)
    assert report.method("complex_step").ran == analytic, report.method("complex_step").detail
    assert report.passed, str(report)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_reverse_over_reverse_gives_second_derivatives(rng, case):
    """The backward graph is a graph of ops with adjoints: differentiating it again gives
    Hessian-vector products, checked against central differences of the gradient."""
    cg = compile_graph(graph_from_proto(build(case).to_proto()), Limits())
    xs = [s.name for s in cg.graph.inputs if s.type.is_float]
    bg = reverse(cg.graph, cg.order, cg.types, outputs=["out"], wrt=xs, seeded=["out"])
    grads = [(f"d{x}", bg.gradients[x]) for x in xs if bg.gradients[x] is not None]
    if not grads:  # no path from any input (sign, comparisons): no second derivative either
        return
    first = compile_graph(Graph(bg.graph.inputs, bg.graph.nodes, tuple(grads)), Limits())
    grad_plan = Plan(first.graph, first.order, first.types, grads, attrs=first.attrs)
    names = [name for name, _ in grads]
    bg2 = reverse(first.graph, first.order, first.types, outputs=names, wrt=xs, seeded=names)
    hvp = Plan(bg2.graph, bg2.graph.nodes, bg2.types, [(x, bg2.gradients[x]) for x in xs
                                                       if bg2.gradients[x] is not None])

    point = inputs_for(case, rng)
    seed = {bg.seed_inputs["out"]: rng.normal(size=cg.types[cg.graph.output_map["out"]].shape)}
    v = {n: rng.normal(size=first.types[ref].shape) for n, ref in grads}
    got = hvp.run({**point, **seed, **{bg2.seed_inputs[n]: v[n] for n in names if n in bg2.seed_inputs}})
    for x in xs:
        h = 1e-5 * np.maximum(1.0, np.abs(point[x]))
        want = np.zeros(point[x].shape)
        for index in np.ndindex(*point[x].shape):
            step = np.zeros(point[x].shape)
            step[index] = h[index]
            up = grad_plan.run({**point, x: point[x] + step, **seed})
            down = grad_plan.run({**point, x: point[x] - step, **seed})
            want[index] = sum(np.sum((up[n] - down[n]) * v[n]) for n in names) / (2 * h[index])
        np.testing.assert_allclose(got.get(x, np.zeros(point[x].shape)), want, rtol=1e-5, atol=1e-6, err_msg=x)


def _semirings() -> list[str]:
    """Every installed semiring plugin but the real one (the entry points, as the server finds them)."""
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group="semigrad.semirings")} - {"real"})


@pytest.mark.parametrize("semiring", _semirings())
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_semiring(client, rng, case, semiring):
    """Each op's adjoint under every installed semiring: the backward pass's path sums equal
    brute-force enumeration of the graph's paths."""
    f = client.register(build(case))
    report = f.crosscheck(inputs_for(case, rng), semiring=semiring, methods=["reverse", "path_enumeration"])
    assert report.method("path_enumeration").ran, report.method("path_enumeration").detail
    assert report.passed, str(report)


@pytest.fixture(scope="module", params=["inline", "shared_memory", "in_process"])
def transport_client(request, server_address):
    if request.param == "in_process":
        with sg.Client() as c:
            yield c
        return
    with sg.Client(server_address, shared_memory=request.param == "shared_memory") as c:
        yield c


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_transport(client, transport_client, rng, case):
    """Unary and streamed calls, inline and through shared memory, give the tensor engine's bits."""
    inputs = inputs_for(case, rng, (5,))
    want = client.register(build(case)).gradient(inputs, backend="tensor")
    f = transport_client.register(build(case))
    for got in (f.gradient(inputs, backend="tensor", return_outputs=True)[0],
                f.gradient_many(inputs, chunk_size=2, backend="tensor", return_outputs=True)):
        assert_same(got, want, rtol=0, atol=0)
        assert_same(got.outputs, f.evaluate(inputs, backend="tensor"), rtol=0, atol=0)
