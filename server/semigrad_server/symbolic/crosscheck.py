"""CrossCheck: several ways to the same derivative, compared, with disagreements localised.

Real semiring, at one point, for every (output, wrt input) Jacobian block:
  reverse            the server's reverse mode (one-hot seeds: the full Jacobian)
  symbolic           the graph expanded into SymPy and differentiated (gradient.py)
  complex_step       Im f(x + ih) / h, when every op is analytic (finite_diff.py)
  finite_difference  central differences, optionally with Richardson extrapolation
Another semiring: per (output, input) the path sums of the backward pass under that
semiring, against brute-force path enumeration (paths.py).

Each method is compared with every later one in that order (the later is the reference:
an element passes when |a - b| <= atol + rtol·|b|). When a comparison fails (or when asked)
every node's local rule is checked against finite differences of that node alone
(localise.py), and the nodes whose rule disagrees are named.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..deadline import check, interruptibly
from ..errors import FailedPrecondition, InvalidArgument, quoted
from ..runtime import Plan
from .compare import ATOL, RTOL, within, worst
from .finite_diff import DEFAULT_STEP, central_jacobian, complex_step_jacobian
from .gradient import evaluate as evaluate_symbolic
from .gradient import symbolic_jacobian
from .localise import NodeCheck, check_nodes
from .paths import path_sums

REAL_METHODS = ("reverse", "symbolic", "complex_step", "finite_difference")
SEMIRING_METHODS = ("reverse", "path_enumeration")
ORDER = {m: k for k, m in enumerate(REAL_METHODS + ("path_enumeration",))}
MAX_JACOBIAN_ELEMENTS = 1_000_000

Key = tuple[str, str]  # (output, input)


@dataclass(frozen=True)
class ComplexStepKey:
    """The plan cache key of the forward plan the complex step runs (complex inputs)."""

    outputs: tuple[str, ...]


@dataclass
class MethodResult:
    method: str
    ran: bool = False
    detail: str = ""
    seconds: float = 0.0
    blocks: dict[Key, np.ndarray] = field(default_factory=dict)
    components: dict[Key, dict[str, np.ndarray]] = field(default_factory=dict)  # semirings: every read() array


@dataclass
class BlockComparison:
    output: str
    input: str
    abs_error: np.ndarray
    rel_error: np.ndarray
    max_abs_error: float
    max_rel_error: float
    worst: tuple[int, ...]
    worst_value: float
    worst_reference: float
    passed: bool


@dataclass
class Comparison:
    method: str
    reference: str
    passed: bool
    max_abs_error: float
    max_rel_error: float
    blocks: list[BlockComparison]


@dataclass
class CrossCheckReport:
    graph_id: str
    passed: bool
    semiring: str
    atol: float
    rtol: float
    methods: list[MethodResult]
    comparisons: list[Comparison]
    localized: bool = False
    node_checks: list[NodeCheck] = field(default_factory=list)
    suspects: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        from .report import format_report

        return format_report(self)


def crosscheck(engine, graph_id: str, inputs: Mapping[str, np.ndarray], *, wrt: Sequence[str] = (),
               outputs: Sequence[str] = (), methods: Sequence[str] = (), atol: float | None = None,
               rtol: float | None = None, step: float | None = None, richardson: bool = False,
               semiring: str = "", semiring_params: Mapping[str, object] | None = None, localize: bool = False,
               deadline: float | None = None) -> CrossCheckReport:
    cg = engine.get(graph_id)
    s = engine.semirings.get(semiring or "real", semiring_params)
    point = _point(cg, inputs)
    outputs = select_outputs(cg, outputs)
    wrt = cg.wrt_inputs(wrt)
    atol = _tolerance("atol", ATOL if atol is None else atol)
    rtol = _tolerance("rtol", RTOL if rtol is None else rtol)
    step = DEFAULT_STEP if step is None else float(step)
    if not 0 < step < 1:
        raise InvalidArgument(f"step must be between 0 and 1 (a relative step), got {step}")
    real = s.name == "real"
    chosen = _methods(methods, real)
    if real:
        size = sum(cg.types[cg.graph.output_map[o]].size * cg.types[x].size for o in outputs for x in wrt)
        if size > MAX_JACOBIAN_ELEMENTS:
            raise FailedPrecondition(f"the cross-check compares full Jacobians: {size} elements here, the limit is "
                                     f"{MAX_JACOBIAN_ELEMENTS} (choose fewer wrt inputs or outputs)")
    runners = {
        "reverse": lambda: _reverse(engine, cg, point, wrt, outputs, deadline) if real
        else _semiring_reverse(engine, cg, point, wrt, outputs, s, semiring_params, deadline),
        "symbolic": lambda: interruptibly("cross-checking: the symbolic gradient", _symbolic, cg, point, wrt,
                                          outputs, deadline),
        "complex_step": lambda: interruptibly("cross-checking: complex steps", _complex_step, cg, point, wrt,
                                              outputs),
        "finite_difference": lambda: _finite_difference(engine, cg, point, wrt, outputs, step, richardson, deadline),
        "path_enumeration": lambda: _path_enumeration(engine, cg, point, wrt, outputs, s),
    }
    results = []
    for method in chosen:
        check(f"cross-checking, before the method '{method}'")
        start = time.perf_counter()
        result = runners[method]()
        result.seconds = time.perf_counter() - start
        results.append(result)
    ran = [r for r in results if r.ran]
    if len(ran) < 2:
        why = "; ".join(f"{r.method}: {r.detail}" for r in results if not r.ran)
        raise FailedPrecondition(f"a cross-check needs two methods that can run here ({why})")
    comparisons = [_compare(a, b, atol, rtol) for k, a in enumerate(ran) for b in ran[k + 1:]]
    passed = all(c.passed for c in comparisons)
    report = CrossCheckReport(cg.id, passed, s.key, atol, rtol, results, comparisons)
    if localize or not passed:
        report.localized = True
        report.node_checks = check_nodes(engine, cg, point, wrt, outputs, atol, rtol, step)
        report.suspects = list(dict.fromkeys(c.node for c in report.node_checks if c.checked and not c.passed))
    return report


# ---------------------------------------------------------------- request checks


def _point(cg, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    batch = cg.batch(inputs)
    for name, a in batch.arrays.items():
        if a.shape != cg.types[name].shape:
            raise InvalidArgument(f"a cross-check runs at one point: input '{name}' has shape {list(a.shape)}; send it "
                                  f"with its declared shape {list(cg.types[name].shape)} (no batch dimensions)")
    return dict(batch.arrays)


def select_outputs(cg, outputs: Sequence[str]) -> list[str]:
    """The named outputs (all float), or by default every float output."""
    floats = cg.differentiated_outputs(outputs)
    if not floats:
        raise InvalidArgument("the graph has no float outputs to differentiate")
    return floats


def _tolerance(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"{name} must be a finite number >= 0, got {value}")
    return value


def _methods(methods: Sequence[str], real: bool) -> list[str]:
    allowed = REAL_METHODS if real else SEMIRING_METHODS
    for m in methods:
        if m not in allowed:
            other = SEMIRING_METHODS if real else REAL_METHODS
            hint = " (that method is for the other kind of semiring)" if m in other else ""
            raise InvalidArgument(f"unknown cross-check method {quoted(m)}{hint}; with this semiring: {', '.join(allowed)}")
    if methods and len(set(methods)) < 2:
        raise InvalidArgument(f"a cross-check compares at least two methods; got only {', '.join(set(methods))}")
    return sorted(set(methods), key=ORDER.__getitem__) if methods else list(allowed)


# ---------------------------------------------------------------- methods


def _reverse(engine, cg, point, wrt, outputs, deadline) -> MethodResult:
    result = MethodResult("reverse", True, "reverse mode with one-hot seeds (one row of the Jacobian per seed)")
    for o in outputs:
        t = cg.types[cg.graph.output_map[o]]
        seed = np.eye(t.size).reshape((t.size,) + t.shape)
        grads = engine.gradient(cg.id, point, wrt=wrt, seeds={o: seed}, outputs=[o], deadline=deadline).gradients
        for x in wrt:
            shape = cg.types[x].shape
            result.blocks[o, x] = np.broadcast_to(grads[x], (t.size,) + shape).reshape(t.shape + shape).astype(np.float64)
    return result


def _semiring_reverse(engine, cg, point, wrt, outputs, s, params, deadline) -> MethodResult:
    result = MethodResult("reverse", True, f"backward pass under '{s.key}', seeded with 1̄")
    for o in outputs:
        r = engine.gradient(cg.id, point, wrt=wrt, outputs=[o], semiring=s.name, semiring_params=params,
                            return_components=True, deadline=deadline)
        for x in wrt:
            result.blocks[o, x] = np.asarray(r.gradients[x], dtype=np.float64)
            result.components[o, x] = {k: np.asarray(v, dtype=np.float64) for k, v in r.components[x].items()}
    return result


def _symbolic(cg, point, wrt, outputs, deadline) -> MethodResult:
    for node in cg.order:  # declared without an element-level form (argmax: an index the data picks)
        if cg.registry.get(node).expand is None:
            return MethodResult("symbolic", False, f"not run: op '{node.op}' (node '{node.id}') has no "
                                                   f"element-level form")
    constants = {name: value for name, value in point.items() if not cg.types[name].is_float}
    jac = symbolic_jacobian(cg, outputs, wrt, constants, deadline)
    n = sum(b.size for b in jac.blocks.values())
    return MethodResult("symbolic", True, f"SymPy: {n} partial derivatives, evaluated with CSE",
                        blocks=evaluate_symbolic(jac, point))


def _finite_difference(engine, cg, point, wrt, outputs, step, richardson, deadline) -> MethodResult:
    out_types = {o: cg.types[cg.graph.output_map[o]] for o in outputs}

    def evaluate(inputs):
        return engine.evaluate(cg.id, inputs, outputs=outputs, deadline=deadline)[0]

    blocks = central_jacobian(evaluate, point, wrt, out_types, step, richardson)
    how = "Richardson extrapolation of central differences (h, h/2)" if richardson else "central differences"
    return MethodResult("finite_difference", True, f"{how}, h = {step:g}·max(1, |x|)", blocks=blocks)


def _complex_step(cg, point, wrt, outputs) -> MethodResult:
    for node in cg.order:
        if cg.registry.get(node).analytic:
            continue
        return MethodResult("complex_step", False, f"not run: op '{node.op}' (node '{node.id}') is not analytic")
    out_types = {o: cg.types[cg.graph.output_map[o]] for o in outputs}
    plan = cg.plans.get(ComplexStepKey(tuple(outputs)), lambda: Plan(
        cg.graph, cg.order, cg.types, [(o, cg.graph.output_map[o]) for o in outputs], registry=cg.registry,
        attrs=cg.attrs))
    blocks = complex_step_jacobian(plan.run, point, wrt, out_types)
    return MethodResult("complex_step", True, "Im f(x + ih)/h, h = 1e-20", blocks=blocks)


def _path_enumeration(engine, cg, point, wrt, outputs, s) -> MethodResult:
    sums = path_sums(engine, cg, point, wrt, outputs, s)
    result = MethodResult("path_enumeration", True, "every path listed; ⊕ of ⊗-products of φ(local partials)")
    for key, read in sums.items():
        result.blocks[key] = np.asarray(read[s.primary], dtype=np.float64)
        result.components[key] = {k: np.asarray(v, dtype=np.float64) for k, v in read.items()}
    return result


# ---------------------------------------------------------------- comparison


def _compare(a: MethodResult, b: MethodResult, atol: float, rtol: float) -> Comparison:
    blocks = []
    for key, value in a.blocks.items():
        reference = b.blocks[key]
        if a.components and b.components:
            ok, abs_err, rel_err = _within_components(a.components[key], b.components[key], value.shape, atol, rtol)
        else:
            ok, abs_err, rel_err = within(value, reference, atol, rtol)
        k = worst(ok, abs_err, reference, atol, rtol)
        index = tuple(int(i) for i in np.unravel_index(k, value.shape)) if k >= 0 else ()
        blocks.append(BlockComparison(
            key[0], key[1], abs_err, rel_err, float(np.max(abs_err, initial=0.0)), float(np.max(rel_err, initial=0.0)),
            index, float(value[index]) if k >= 0 else 0.0, float(reference[index]) if k >= 0 else 0.0,
            bool(np.all(ok))))
    return Comparison(a.method, b.method, all(c.passed for c in blocks),
                      max((c.max_abs_error for c in blocks), default=0.0),
                      max((c.max_rel_error for c in blocks), default=0.0), blocks)


def _within_components(a: dict, b: dict, shape: tuple, atol: float, rtol: float):
    """Every component a semiring reads out, compared; per element the worst of them."""
    ok = np.ones(shape, dtype=bool)
    abs_err, rel_err = np.zeros(shape), np.zeros(shape)
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            return np.zeros(shape, dtype=bool), np.full(shape, np.inf), np.full(shape, np.inf)
        c_ok, c_abs, c_rel = within(a[name], b[name], atol, rtol)
        extra = tuple(range(len(shape), c_ok.ndim))  # e.g. kbest's stacked k values
        ok &= np.all(c_ok, axis=extra) if extra else c_ok
        abs_err = np.maximum(abs_err, np.max(c_abs, axis=extra) if extra else c_abs)
        rel_err = np.maximum(rel_err, np.max(c_rel, axis=extra) if extra else c_rel)
    return ok, abs_err, rel_err
