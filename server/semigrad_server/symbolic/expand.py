"""A registered graph → SymPy scalar expressions: one symbol per input element, one
expression per element of every value (object arrays shaped like the values' types).

Elementwise ops (built-in and custom) substitute their operands into their SymPy
expression; `where` becomes a Piecewise, comparisons relationals; sums, means, maxima and
matmuls become sums (Add), Max and products of elements; the structural ops run their own
NumPy kernels on the object arrays (they only move elements). SymPy shares equal
subexpressions, so the expressions are DAGs: `tree_size` measures what differentiating them
would walk, and the caller bounds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import sympy as sp

from ..errors import FailedPrecondition
from ..ir import Type
from ..ops.sym import maximum

MAX_TERMS = 50_000  # scalar terms an expansion may create (elements of values, products of matmuls, ...)
STRUCTURAL = frozenset({"reshape", "transpose", "broadcast_to", "index", "concat", "stack", "scatter_index"})
RELATIONS = {"lt": sp.Lt, "le": sp.Le, "gt": sp.Gt, "ge": sp.Ge, "eq": sp.Eq, "ne": sp.Ne}


@dataclass
class Expansion:
    symbols: dict[str, np.ndarray] = field(default_factory=dict)  # input -> object array of its element symbols
    values: dict[str, np.ndarray] = field(default_factory=dict)  # input or node id -> object array of expressions
    elements: dict[sp.Symbol, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # symbol -> (input, index)


def expand(cg, refs: Sequence[str], constants: Mapping[str, np.ndarray] | None = None,
           max_terms: int = MAX_TERMS) -> Expansion:
    """Expressions for the values `refs` (node or input ids) of compiled graph `cg`. Inputs
    in `constants` are replaced by their (per-item) values instead of symbols."""
    constants = constants or {}
    needed = set(refs)
    live = []
    for node in reversed(cg.order):
        if node.id in needed:
            live.append(node)
            needed.update(node.inputs)
    live.reverse()
    terms = sum(_terms(node, cg.types) for node in live) + sum(cg.types[r].size for r in needed if r in cg.inputs)
    if terms > max_terms:
        raise FailedPrecondition(f"the symbolic expansion of this graph needs about {terms} scalar terms; the "
                                 f"limit is {max_terms} (cross-check without the 'symbolic' method, or use a "
                                 f"smaller graph)")
    ex = Expansion()
    for spec in cg.graph.inputs:
        if spec.name not in needed:
            continue
        if spec.name in constants:
            ex.values[spec.name] = _numbers(np.asarray(constants[spec.name]))
            continue
        symbols = np.empty(spec.shape, dtype=object)
        for index in np.ndindex(*spec.shape):
            # Plain identifiers (SymPy would rebuild every expression to rename others for NumPy);
            # formulas show element_name() instead. Zero-padded, so terms sort in element order.
            name = f"_s{len(ex.elements):07d}"
            symbol = sp.Symbol(name, integer=True) if spec.dtype == "int64" else sp.Symbol(name, real=True)
            symbols[index] = symbol
            ex.elements[symbol] = (spec.name, index)
        ex.symbols[spec.name] = symbols
        ex.values[spec.name] = symbols
    for node in live:
        op = cg.registry.get(node)
        operands = [ex.values[r] for r in node.inputs]
        ex.values[node.id] = _node(op, node, operands, [cg.types[r] for r in node.inputs], cg.types[node.id],
                                   cg.attrs[node.id])
    return ex


def element_name(name: str, index: tuple[int, ...]) -> str:
    """How an input element reads in formulas: A[0, 1], or the name itself for a scalar."""
    return f"{name}[{', '.join(map(str, index))}]" if index else name


def _terms(node, types: Mapping[str, Type]) -> int:
    if node.op in STRUCTURAL:
        return 0
    if node.op == "matmul":
        a = types[node.inputs[0]]
        return types[node.id].size * max(1, a.shape[-1] if a.rank else 1)
    if node.op in ("sum", "mean", "max"):
        return types[node.inputs[0]].size + types[node.id].size
    return types[node.id].size


def _number(value) -> sp.Expr:
    if isinstance(value, (bool, np.bool_)):
        return sp.true if value else sp.false
    if isinstance(value, (int, np.integer)):
        return sp.Integer(int(value))
    value = float(value)
    if math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return sp.Integer(int(value))
    return sp.Float(value)


def _numbers(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    for index in np.ndindex(*array.shape):
        out[index] = _number(array[index])
    return out


def _as_sympy(array: np.ndarray) -> np.ndarray:
    """Elements that are plain Python numbers (e.g. zeros a kernel created) as SymPy numbers."""
    out = np.asarray(array, dtype=object)
    if all(isinstance(v, sp.Basic) for v in out.flat):
        return out
    out = out.copy()
    for index in np.ndindex(*out.shape):
        if not isinstance(out[index], sp.Basic):
            out[index] = _number(out[index])
    return out


def _map(fn, operands: list[np.ndarray], shape: tuple, numeric=None, dtypes=()) -> np.ndarray:
    """fn per element; elements whose operands are all numbers go to `numeric` (the op's NumPy
    kernel) instead, so SymPy never evaluates a function of a number (which for huge numbers,
    say sin(exp(exp(700))), can recurse without end or not finish)."""
    out = np.empty(shape, dtype=object)
    aligned = [np.broadcast_to(a, shape) for a in operands]
    for index in np.ndindex(*shape):
        args = [a[index] for a in aligned]
        if numeric is not None and all(_is_number(a) for a in args):
            with np.errstate(all="ignore"):
                out[index] = _number(np.asarray(numeric(*(np.asarray(_plain(a), dtype=d) for a, d in
                                                          zip(args, dtypes)))).item())
        else:
            out[index] = fn(*args)
    return out


def _is_number(value) -> bool:
    return isinstance(value, sp.Basic) and (value.is_Number or value in (sp.true, sp.false))


def _plain(value):
    if value is sp.true or value is sp.false:
        return bool(value)
    return int(value) if value.is_Integer else float(value)


def _boolean(value):
    return value if isinstance(value, sp.logic.boolalg.Boolean) else sp.Ne(value, 0)


def _reduce(x: np.ndarray, axes, keepdims: bool, combine) -> np.ndarray:
    rank = x.ndim
    axes = tuple(range(rank)) if axes is None else tuple(sorted(a % rank for a in axes))
    kept = [i for i in range(rank) if i not in axes]
    moved = x.transpose(kept + list(axes))
    out_shape = tuple(x.shape[i] for i in kept)
    rows = moved.reshape(int(np.prod(out_shape, dtype=np.int64)), -1)
    out = np.empty(rows.shape[0], dtype=object)
    for k, row in enumerate(rows):
        out[k] = combine(list(row))
    out = out.reshape(out_shape)
    if keepdims:
        out = out.reshape(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return out


def _tree_max(row: list) -> sp.Expr:
    """max of a row as a balanced tree of binary maxima (never an n-ary Max: see ops.sym.maximum)."""
    if not row:
        return sp.S.NegativeInfinity
    while len(row) > 1:
        row = [maximum(row[k], row[k + 1]) if k + 1 < len(row) else row[k] for k in range(0, len(row), 2)]
    return row[0]


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    lead = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a3 = np.broadcast_to(a2, lead + a2.shape[-2:])
    b3 = np.broadcast_to(b2, lead + b2.shape[-2:])
    m, k, n = a3.shape[-2], a3.shape[-1], b3.shape[-1]
    out = np.empty(lead + (m, n), dtype=object)
    for index in np.ndindex(*lead):
        for i in range(m):
            for j in range(n):
                out[index + (i, j)] = sp.Add(*[a3[index + (i, q)] * b3[index + (q, j)] for q in range(k)])
    if b.ndim == 1:
        out = out[..., 0]
    if a.ndim == 1:
        out = out[..., 0, :] if b.ndim > 1 else out[..., 0]
    return out


def _node(op, node, operands, in_types, out_type: Type, attrs: dict) -> np.ndarray:
    name = node.op
    if name == "const":
        return _numbers(np.asarray(attrs["value"]))
    if op.kind in ("elementwise", "comparison"):
        numeric = op.kernel(attrs, [Type((), t.dtype) for t in in_types], Type((), out_type.dtype))
        dtypes = [t.dtype for t in in_types]
    if name == "where":
        return _map(lambda c, a, b: sp.Piecewise((a, _boolean(c)), (b, True)), operands, out_type.shape,
                    numeric, dtypes)
    if name in RELATIONS:
        relation = RELATIONS[name]
        return _map(lambda a, b: relation(a, b), operands, out_type.shape, numeric, dtypes)
    if op.kind == "elementwise" and op.expression is not None:
        symbols = tuple(sp.Symbol(s, real=True) for s in op.operands)
        expression = op.expression
        return _map(lambda *args: expression.xreplace(dict(zip(symbols, args))), operands, out_type.shape,
                    numeric, dtypes)
    if name == "sum":
        return _reduce(operands[0], attrs["axes"], attrs["keepdims"], lambda row: sp.Add(*row))
    if name == "mean":
        return _reduce(operands[0], attrs["axes"], attrs["keepdims"],
                       lambda row: sp.Add(*row) / len(row) if row else sp.nan)
    if name == "max":
        return _reduce(operands[0], attrs["axes"], attrs["keepdims"], _tree_max)
    if name == "matmul":
        return _matmul(*operands)
    if name in STRUCTURAL:
        kernel = op.kernel(attrs, in_types, out_type)
        return _as_sympy(np.asarray(kernel(*operands), dtype=object).reshape(out_type.shape))
    raise FailedPrecondition(f"node '{node.id}': op '{name}' has no symbolic form")


def tree_size(exprs, limit: int, memo: dict | None = None) -> int:
    """Nodes of the expressions written out as trees (shared subexpressions counted each time
    they occur), computed over the DAG (`memo` may be shared between calls); stops counting
    past `limit`."""
    memo = {} if memo is None else memo

    def size(e: sp.Basic) -> int:
        stack = [(e, False)]
        while stack:
            node, expanded = stack.pop()
            if node in memo:
                continue
            if not node.args:
                memo[node] = 1
            elif expanded:
                memo[node] = min(limit + 1, 1 + sum(memo[a] for a in node.args))
            else:
                stack.append((node, True))
                stack.extend((a, False) for a in node.args if a not in memo)
        return memo[e]

    total = 0
    for e in exprs:
        total += size(e)
        if total > limit:
            return limit + 1
    return total
