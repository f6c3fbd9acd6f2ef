"""Expands a small graph into a straight-line program over scalars (as CasADi's SX does).

Every element of every value becomes a scalar variable. Structural ops (index, reshape,
transpose, broadcast, concat, stack, scatter) only rename variables; reductions and matmul
become chains of scalar ops; elementwise ops map element by element. While emitting, the
program is hash-consed (common subexpressions are shared), constants are folded with the
reference kernels, and IEEE-exact identities are applied (x·1, x/1, x±0, --x, a semiring's
0̄ ⊕ x and 1̄ ⊗ x). Nothing is reassociated. Dead instructions are dropped at the end.

Programs are run by `codegen`, over Python floats (one point) or over NumPy arrays whose
axis is the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..ir import Graph, Node, Type
from ..ops import OpDef, Registry

# Past this many scalar variables the tensor plan is used instead.
MAX_SCALARS = 60_000
# `auto` scalarises only graphs whose compute nodes are small on average (det-by-minors:
# ~1 element); wide graphs (64-wide matmuls) run faster as tensor plans on BLAS.
MAX_AUTO_ELEMENTS_PER_NODE = 16

SCALAR_DTYPES = {"float64", "bool"}


class NotScalarizable(Exception):
    """The graph (or an op in it) has no scalar form; use the tensor plan."""


@dataclass
class ScalarProgram:
    consts: dict[int, object] = field(default_factory=dict)  # var -> value (float, bool, or a semiring value)
    instrs: list[tuple[int, str, tuple[int, ...]]] = field(default_factory=list)  # (var, op, args)
    inputs: list[tuple[str, tuple[int, ...], np.ndarray]] = field(default_factory=list)  # name, shape, var ids
    outputs: list[tuple[str, tuple[int, ...], np.ndarray]] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)
    # per output: whether it is a semiring value (a tuple carrier's outputs come back as tuples)
    # rather than a forward value
    semiring_outputs: list[bool] = field(default_factory=list)
    input_dtypes: list[str] = field(default_factory=list)
    semiring_vars: set[int] = field(default_factory=set)  # vars holding semiring values
    ops: dict[str, OpDef] = field(default_factory=dict)  # the elementwise ops the instructions use, by name
    n_vars: int = 0


class Scalarizer:
    """Builds a scalar program; as the `Elements` of ops' expansions, an element is a variable id."""

    def __init__(self, registry: Registry, semiring=None):
        self.p = ScalarProgram()
        self.registry = registry
        self.semiring = semiring
        self._memo: dict[tuple, int] = {}
        self._definition: dict[int, tuple] = {}
        self._const_ids: dict[tuple, int] = {}
        if semiring is not None:
            self.sr_zero = self._semiring_const(semiring.zeros(()))
            self.sr_one = self._semiring_const(semiring.ones(()))

    # ------------------------------------------------------------ variables
    def new_variable(self) -> int:
        self.p.n_vars += 1
        if self.p.n_vars > MAX_SCALARS:
            raise NotScalarizable(f"more than {MAX_SCALARS} scalars")
        return self.p.n_vars - 1

    def const(self, value) -> int:
        value = np.asarray(value)
        if value.dtype.name not in SCALAR_DTYPES:
            raise NotScalarizable(f"dtype {value.dtype.name}")
        scalar = bool(value) if value.dtype == np.bool_ else float(value)
        key = (value.dtype.name, value.tobytes())
        if key not in self._const_ids:
            var = self.new_variable()
            self._const_ids[key] = var
            self.p.consts[var] = scalar
        return self._const_ids[key]

    def _semiring_const(self, value) -> int:
        var = self.new_variable()
        self.p.consts[var] = value
        self.p.semiring_vars.add(var)
        return var

    def _is(self, var: int, number: float) -> bool:
        value = self.p.consts.get(var)
        return var not in self.p.semiring_vars and isinstance(value, float) and value == number \
            and (number != 0 or not np.signbit(value))

    # ------------------------------------------------------------ Elements
    def apply(self, op: str, args: tuple) -> int:
        return self.emit(op, tuple(int(a) for a in args))

    def reduce(self, op: str, row: list, empty) -> int:
        if not row:
            return empty
        acc = int(row[0])
        for v in row[1:]:
            acc = self.emit(op, (acc, int(v)))
        return acc

    def number(self, value: float) -> int:
        return self.const(value)

    def semiring_zero(self) -> int:
        return self.sr_zero if self.semiring is not None else self.const(0.0)

    def semiring_one(self) -> int:
        return self.sr_one if self.semiring is not None else self.const(1.0)

    def index(self, element) -> None:
        return None  # integer values never enter scalar programs (their dtypes are float64 and bool)

    # ------------------------------------------------------------ emission with folding
    def emit(self, op: str, args: tuple[int, ...]) -> int:
        opdef = self.p.ops.get(op)
        if opdef is None:
            opdef = self.p.ops[op] = self.registry.ops[op]
        folded = self._fold(op, opdef, args)
        if folded is not None:
            return folded
        if opdef.commutative:
            args = tuple(sorted(args))
        key = (op, args)
        if key in self._memo:
            return self._memo[key]
        var = self.new_variable()
        self.p.instrs.append((var, op, args))
        if opdef.bound is not None:
            self.p.semiring_vars.add(var)
        self._memo[key] = var
        self._definition[var] = key
        return var

    def _fold(self, op: str, opdef: OpDef, args: tuple[int, ...]):
        if opdef.bound is not None:
            return self._fold_semiring(op, args)
        if all(a in self.p.consts for a in args):
            with np.errstate(all="ignore"):
                return self.const(opdef.elementwise_fn(*(np.float64(self.p.consts[a]) if isinstance(
                    self.p.consts[a], float) else np.bool_(self.p.consts[a]) for a in args)))
        if opdef.unit is not None:
            sides, unit = opdef.unit
            if sides == "both" and self._is(args[0], unit):
                return args[1]
            if self._is(args[-1], unit):
                return args[0]
        if op == "neg":
            inner = self._definition.get(args[0])
            if inner is not None and inner[0] == "neg":
                return inner[1][0]
        return self._fold_negation(op, args)

    def _negated(self, var: int):
        """x when `var` is -x, else None."""
        definition = self._definition.get(var)
        return definition[1][0] if definition is not None and definition[0] == "neg" else None

    def _fold_negation(self, op: str, args: tuple[int, ...]):
        """Moves negations outwards until an add or sub absorbs them: reverse mode multiplies
        adjoints by -1 (the partials of sub and neg). Each rewrite is exact in IEEE arithmetic:
        x + (-y) is x - y, and (-x)·y is -(x·y) because rounding is symmetric."""
        if op in ("add", "sub", "mul", "div"):
            a, b = args
            na, nb = self._negated(a), self._negated(b)
            if op == "add" and nb is not None:
                return self.emit("sub", (a, nb))
            if op == "add" and na is not None:
                return self.emit("sub", (b, na))
            if op == "sub" and nb is not None:
                return self.emit("add", (a, nb))
            if op in ("mul", "div"):
                if na is not None and nb is not None:
                    return self.emit(op, (na, nb))
                if self._is(a, -1.0) and op == "mul":
                    return self.emit("neg", (b,))
                if self._is(b, -1.0):
                    return self.emit("neg", (a,))
                if na is not None:
                    return self.emit("neg", (self.emit(op, (na, b)),))
                if nb is not None:
                    return self.emit("neg", (self.emit(op, (a, nb)),))
        return None

    def _fold_semiring(self, op: str, args):
        if op == "sr_add":
            if args[0] == self.sr_zero:
                return args[1]
            if args[1] == self.sr_zero:
                return args[0]
        if op == "sr_mul":
            if args[0] == self.sr_one:
                return args[1]
            if args[1] == self.sr_one:
                return args[0]
            if self.sr_zero in args:
                return self.sr_zero
        if op == "sr_lift" and args[0] in self.p.consts:
            lifted = self.semiring.lift(np.float64(self.p.consts[args[0]]))
            for known in (self.sr_zero, self.sr_one):
                if np.all(self.semiring.equal(lifted, self.p.consts[known], rtol=0, atol=0)):
                    return known
            return self._semiring_const(lifted)
        return None


def scalarize(graph: Graph, nodes: Sequence[Node], types: Mapping[str, Type], outputs: Sequence[tuple[str, str]],
              registry: Registry, attrs: Mapping[str, dict], semiring=None,
              semiring_values: frozenset = frozenset(), only_if_narrow: bool = False) -> ScalarProgram:
    """The scalar program computing `outputs`; raises NotScalarizable when there is none
    (or, with `only_if_narrow`, when the graph's compute nodes are wide: see MAX_AUTO_ELEMENTS_PER_NODE)."""
    needed = {ref for _, ref in outputs}
    live = []
    for node in reversed(list(nodes)):
        if node.id in needed:
            live.append(node)
            needed.update(node.inputs)
    live.reverse()
    ops = {node.id: registry.get(node) for node in live}
    costs = [ops[n.id].scalar_cost([types[r] for r in n.inputs], types[n.id]) for n in live]
    work = sum(costs)
    if work > MAX_SCALARS:
        raise NotScalarizable(f"about {work} scalar operations")
    compute_nodes = sum(1 for c in costs if c) or 1
    if only_if_narrow and work > MAX_AUTO_ELEMENTS_PER_NODE * compute_nodes:
        raise NotScalarizable(f"wide graph: about {work // compute_nodes} scalar operations per node")

    sc = Scalarizer(registry, semiring)
    ids: dict[str, np.ndarray] = {}
    for spec in graph.inputs:
        if spec.name not in needed:
            continue
        if spec.dtype not in SCALAR_DTYPES:
            raise NotScalarizable(f"input '{spec.name}' has dtype {spec.dtype} (scalar programs hold "
                                  f"{' and '.join(sorted(SCALAR_DTYPES))} values only)")
        ids[spec.name] = np.array([sc.new_variable() for _ in range(spec.type.size)], dtype=object).reshape(spec.shape)
        sc.p.inputs.append((spec.name, spec.shape, ids[spec.name].astype(np.int64)))
        sc.p.input_dtypes.append(spec.dtype)
    for node in live:
        op, out_type = ops[node.id], types[node.id]
        if out_type.dtype not in SCALAR_DTYPES and op.bound is None:
            raise NotScalarizable(f"dtype {out_type.dtype} at node '{node.id}'")
        if op.expand is None:
            raise NotScalarizable(f"op '{op.name}' (node '{node.id}') has no element-level form")
        ids[node.id] = op.expand(sc, [ids[r] for r in node.inputs], attrs[node.id],
                                 [types[r] for r in node.inputs], out_type)
    for ref in {ref for _, ref in outputs}:
        ids[ref] = np.asarray(ids[ref], dtype=np.int64)
    sc.p.outputs = [(name, types[ref].shape, ids[ref]) for name, ref in outputs]
    sc.p.output_dtypes = [types[ref].dtype for _, ref in outputs]
    sc.p.semiring_outputs = [ref in semiring_values for _, ref in outputs]
    _drop_dead(sc.p)
    return sc.p


def _drop_dead(p: ScalarProgram) -> None:
    live = set()
    for _, _, ids in p.outputs:
        live.update(int(v) for v in ids.reshape(-1))
    kept = []
    for var, op, args in reversed(p.instrs):
        if var in live:
            kept.append((var, op, args))
            live.update(args)
    kept.reverse()
    p.instrs = kept
    p.consts = {v: c for v, c in p.consts.items() if v in live}
