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
from ..ops import Registry
from ..ops.elementwise import ELEMENTWISE
from ..ops.structural import COMPARISONS, full_index

# Past this many scalar variables the tensor plan is used instead.
MAX_SCALARS = 40_000
# `auto` scalarises only graphs whose compute nodes are small on average (det-by-minors:
# ~1 element); wide graphs (64-wide matmuls) run faster as tensor plans on BLAS.
MAX_AUTO_ELEMENTS_PER_NODE = 16

ELEMENTWISE_FNS = {name: fn for name, _, fn, _, _ in ELEMENTWISE}
ELEMENTWISE_FNS.update(COMPARISONS)
ELEMENTWISE_FNS["where"] = np.where
COMMUTATIVE = {"add", "mul", "maximum", "minimum", "eq", "ne"}
SCALAR_DTYPES = {"float64", "bool"}
STRUCTURAL_OPS = {"index", "reshape", "transpose", "broadcast_to", "concat", "stack", "scatter_index", "sr_scatter",
                  "sr_ones", "const"}


class NotScalarizable(Exception):
    """The graph (or an op in it) has no scalar form; use the tensor plan."""


@dataclass
class ScalarProgram:
    consts: dict[int, object] = field(default_factory=dict)  # var -> value (float, bool, or a semiring value)
    instrs: list[tuple[int, str, tuple[int, ...]]] = field(default_factory=list)  # (var, op, args)
    inputs: list[tuple[str, tuple[int, ...], np.ndarray]] = field(default_factory=list)  # name, shape, var ids
    outputs: list[tuple[str, tuple[int, ...], np.ndarray]] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)
    input_dtypes: list[str] = field(default_factory=list)
    semiring_vars: set[int] = field(default_factory=set)  # vars holding semiring values
    n_vars: int = 0


class Scalarizer:
    def __init__(self, semiring=None):
        self.p = ScalarProgram()
        self.semiring = semiring
        self._memo: dict[tuple, int] = {}
        self._definition: dict[int, tuple] = {}
        self._const_ids: dict[tuple, int] = {}
        if semiring is not None:
            self.sr_zero = self._semiring_const(semiring.zeros(()))
            self.sr_one = self._semiring_const(semiring.ones(()))

    # ------------------------------------------------------------ variables
    def _new(self) -> int:
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
            var = self._new()
            self._const_ids[key] = var
            self.p.consts[var] = scalar
        return self._const_ids[key]

    def _semiring_const(self, value) -> int:
        var = self._new()
        self.p.consts[var] = value
        self.p.semiring_vars.add(var)
        return var

    def _is(self, var: int, number: float) -> bool:
        value = self.p.consts.get(var)
        return var not in self.p.semiring_vars and isinstance(value, float) and value == number \
            and (number != 0 or not np.signbit(value))

    # ------------------------------------------------------------ emission with folding
    def emit(self, op: str, args: tuple[int, ...]) -> int:
        folded = self._fold(op, args)
        if folded is not None:
            return folded
        if op in COMMUTATIVE:
            args = tuple(sorted(args))
        key = (op, args)
        if key in self._memo:
            return self._memo[key]
        var = self._new()
        self.p.instrs.append((var, op, args))
        if op.startswith("sr_"):
            self.p.semiring_vars.add(var)
        self._memo[key] = var
        self._definition[var] = key
        return var

    def _fold(self, op: str, args: tuple[int, ...]):
        if op.startswith("sr_"):
            return self._fold_semiring(op, args)
        if all(a in self.p.consts for a in args) and op in ELEMENTWISE_FNS:
            with np.errstate(all="ignore"):
                return self.const(ELEMENTWISE_FNS[op](*(np.float64(self.p.consts[a]) if isinstance(
                    self.p.consts[a], float) else np.bool_(self.p.consts[a]) for a in args)))
        if op == "mul":
            if self._is(args[0], 1.0):
                return args[1]
            if self._is(args[1], 1.0):
                return args[0]
        if op == "div" and self._is(args[1], 1.0):
            return args[0]
        if op == "add":
            if self._is(args[0], 0.0):
                return args[1]
            if self._is(args[1], 0.0):
                return args[0]
        if op == "sub" and self._is(args[1], 0.0):
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
              registry: Registry, attrs: Mapping[str, dict], semiring=None, only_if_narrow: bool = False
              ) -> ScalarProgram:
    """The scalar program computing `outputs`; raises NotScalarizable when there is none
    (or, with `only_if_narrow`, when the graph's compute nodes are wide: see MAX_AUTO_ELEMENTS_PER_NODE)."""
    needed = {ref for _, ref in outputs}
    live = []
    for node in reversed(list(nodes)):
        if node.id in needed:
            live.append(node)
            needed.update(node.inputs)
    live.reverse()
    work = sum(_scalar_work(n, types) for n in live)
    if work > MAX_SCALARS:
        raise NotScalarizable(f"about {work} scalar operations")
    compute_nodes = sum(1 for n in live if n.op not in STRUCTURAL_OPS) or 1
    if only_if_narrow and work > MAX_AUTO_ELEMENTS_PER_NODE * compute_nodes:
        raise NotScalarizable(f"wide graph: about {work // compute_nodes} scalar operations per node")

    sc = Scalarizer(semiring)
    ids: dict[str, np.ndarray] = {}
    for spec in graph.inputs:
        if spec.name not in needed:
            continue
        if spec.dtype not in SCALAR_DTYPES:
            raise NotScalarizable(f"input dtype {spec.dtype}")
        ids[spec.name] = np.array([sc._new() for _ in range(spec.type.size)], dtype=np.int64).reshape(spec.shape)
        sc.p.inputs.append((spec.name, spec.shape, ids[spec.name]))
        sc.p.input_dtypes.append(spec.dtype)
    for node in live:
        ids[node.id] = _node(sc, node, [ids[r] for r in node.inputs], [types[r] for r in node.inputs],
                             types[node.id], attrs[node.id])
    sc.p.outputs = [(name, types[ref].shape, ids[ref]) for name, ref in outputs]
    sc.p.output_dtypes = [types[ref].dtype for _, ref in outputs]
    _drop_dead(sc.p)
    return sc.p


def _scalar_work(node: Node, types: Mapping[str, Type]) -> int:
    """Scalar operations a node expands into (structural ops only rename variables)."""
    if node.op in STRUCTURAL_OPS:
        return 0
    if node.op in ("matmul", "sr_matmul"):
        a, b = (types[r] for r in node.inputs)
        return types[node.id].size * (a.shape[-1] if a.rank else 1)
    if node.op in ("sum", "mean", "max", "sr_sum"):
        return types[node.inputs[0]].size
    return types[node.id].size


def _map(sc: Scalarizer, op: str, operands: list[np.ndarray], out_shape) -> np.ndarray:
    aligned = [np.broadcast_to(a, out_shape).reshape(-1) for a in operands]
    return np.array([sc.emit(op, tuple(int(a[k]) for a in aligned)) for k in range(int(np.prod(out_shape)))],
                    dtype=np.int64).reshape(out_shape)


def _chain(sc: Scalarizer, op: str, rows: np.ndarray, empty: int) -> list[int]:
    out = []
    for row in rows:
        if len(row) == 0:
            out.append(empty)
            continue
        acc = int(row[0])
        for v in row[1:]:
            acc = sc.emit(op, (acc, int(v)))
        out.append(acc)
    return out


def _reduce(sc: Scalarizer, x: np.ndarray, axes, keepdims: bool, op: str, empty: int) -> np.ndarray:
    rank = x.ndim
    axes = tuple(range(rank)) if axes is None else tuple(sorted(a % rank for a in axes))
    kept = [i for i in range(rank) if i not in axes]
    moved = x.transpose(kept + list(axes))
    out_shape = tuple(x.shape[i] for i in kept)
    flat = _chain(sc, op, moved.reshape(int(np.prod(out_shape)), -1), empty)
    result = np.array(flat, dtype=np.int64).reshape(out_shape)
    if keepdims:
        result = result.reshape(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return result


def _matmul(sc: Scalarizer, a: np.ndarray, b: np.ndarray, mul: str, add: str, empty: int) -> np.ndarray:
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    lead = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a3 = np.broadcast_to(a2, lead + a2.shape[-2:]).reshape((-1,) + a2.shape[-2:])
    b3 = np.broadcast_to(b2, lead + b2.shape[-2:]).reshape((-1,) + b2.shape[-2:])
    m, k, n = a3.shape[1], a3.shape[2], b3.shape[2]
    out = np.empty((a3.shape[0], m, n), dtype=np.int64)
    for t in range(a3.shape[0]):
        for i in range(m):
            for j in range(n):
                terms = [sc.emit(mul, (int(a3[t, i, q]), int(b3[t, q, j]))) for q in range(k)]
                out[t, i, j] = _chain(sc, add, np.array([terms], dtype=np.int64), empty)[0]
    out = out.reshape(lead + (m, n))
    if b.ndim == 1:
        out = out[..., 0]
    if a.ndim == 1:
        out = out[..., 0, :] if b.ndim > 1 else out[..., 0]
    return out


def _node(sc: Scalarizer, node: Node, operands, in_types, out_type: Type, attrs: dict) -> np.ndarray:
    op = node.op
    if out_type.dtype not in SCALAR_DTYPES and not op.startswith("sr_"):
        raise NotScalarizable(f"dtype {out_type.dtype} at node '{node.id}'")
    if op == "const":
        value = attrs["value"]
        return np.array([sc.const(v) for v in value.reshape(-1)], dtype=np.int64).reshape(value.shape)
    if op in ELEMENTWISE_FNS:
        return _map(sc, op, operands, out_type.shape)
    x = operands[0] if operands else None
    if op == "index":
        return x[tuple(attrs["index"])]
    if op == "reshape":
        return x.reshape(out_type.shape)
    if op == "transpose":
        perm = attrs["perm"]
        return x.transpose(None if perm is None else tuple(p % x.ndim for p in perm))
    if op == "broadcast_to":
        return np.broadcast_to(x.reshape((1,) * (out_type.rank - x.ndim) + x.shape), out_type.shape)
    if op == "concat":
        return np.concatenate(operands, axis=attrs["axis"])
    if op == "stack":
        return np.stack(operands, axis=attrs["axis"])
    if op in ("scatter_index", "sr_scatter"):
        fill = sc.const(0.0) if op == "scatter_index" else sc.sr_zero
        out = np.full(out_type.shape, fill, dtype=np.int64)
        out[full_index(attrs["index"], out_type.rank)[1:]] = x
        return out
    if op == "sum":
        return _reduce(sc, x, attrs["axes"], attrs["keepdims"], "add", sc.const(0.0))
    if op == "max":
        return _reduce(sc, x, attrs["axes"], attrs["keepdims"], "maximum", -1)
    if op == "mean":
        total = _reduce(sc, x, attrs["axes"], attrs["keepdims"], "add", sc.const(0.0))
        n = x.size // max(1, total.size)
        return _map(sc, "div", [total, np.array(sc.const(float(n)))], total.shape)
    if op == "matmul":
        return _matmul(sc, x, operands[1], "mul", "add", sc.const(0.0))
    if op == "sr_lift":
        return _map(sc, "sr_lift", [x], out_type.shape)
    if op in ("sr_mul", "sr_add"):
        return _map(sc, op, operands, out_type.shape)
    if op == "sr_sum":
        return _reduce(sc, x, attrs["axes"], attrs["keepdims"], "sr_add", sc.sr_zero)
    if op == "sr_matmul":
        return _matmul(sc, x, operands[1], "sr_mul", "sr_add", sc.sr_zero)
    if op == "sr_ones":
        return np.full(out_type.shape, sc.sr_one, dtype=np.int64)
    raise NotScalarizable(f"op '{op}' at node '{node.id}'")


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
