"""A registered graph → SymPy scalar expressions: one symbol per input element, one
expression per element of every value (object arrays shaped like the values' types).

Each op expands itself (`OpDef.expand`) over `SympyElements`: elementwise ops (built-in
and custom) substitute their operands into their SymPy form (`where` a Piecewise,
comparisons relationals); sums become Add, maxima balanced trees of binary maxima; the
structural ops run their own NumPy kernels on the object arrays (they only move elements).
SymPy shares equal subexpressions, so the expressions are DAGs: `tree_size` measures what
differentiating them would walk, and the caller bounds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import sympy as sp

from ..errors import FailedPrecondition
from ..ir import Type

MAX_TERMS = 50_000  # scalar terms an expansion may create (elements of values, products of matmuls, ...)


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
    terms = sum(_terms(cg.registry.get(node), node, cg.types) for node in live) + \
        sum(cg.types[r].size for r in needed if r in cg.inputs)
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
    elements = SympyElements(cg.registry)
    for node in live:
        op = cg.registry.get(node)
        if op.expand is None:
            raise FailedPrecondition(f"the symbolic backend cannot expand op '{op.name}' (node '{node.id}'): it "
                                     f"has no element-level form")
        value = op.expand(elements, [ex.values[r] for r in node.inputs], cg.attrs[node.id],
                          [cg.types[r] for r in node.inputs], cg.types[node.id])
        ex.values[node.id] = _as_sympy(value)
    return ex


def element_name(name: str, index: tuple[int, ...]) -> str:
    """How an input element reads in formulas: A[0, 1], or the name itself for a scalar."""
    return f"{name}[{', '.join(map(str, index))}]" if index else name


def _terms(op, node, types: Mapping[str, Type]) -> int:
    cost = op.scalar_cost([types[r] for r in node.inputs], types[node.id])
    return cost + types[node.id].size if cost != types[node.id].size and not op.moves_elements else cost


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


class SympyElements:
    """Elements as SymPy expressions (see ops.base.Elements). An op applied to numbers only
    runs the op's NumPy function instead, so SymPy never evaluates a function of a number
    (which for huge numbers, say sin(exp(exp(700))), can recurse without end or not finish)."""

    def __init__(self, registry):
        self.registry = registry

    def apply(self, op: str, args: tuple):
        opdef = self.registry.ops[op]
        if all(_is_number(a) for a in args):
            with np.errstate(all="ignore"):
                return _number(np.asarray(opdef.elementwise_fn(*(_plain(a) for a in args))).item())
        return opdef.sympy_apply(*args)

    def reduce(self, op: str, row: list, empty):
        if not row:
            return empty
        if op == "add":
            return sp.Add(*row)
        while len(row) > 1:  # a balanced tree: never an n-ary Max (see ops.sym.maximum)
            row = [self.apply(op, (row[k], row[k + 1])) if k + 1 < len(row) else row[k]
                   for k in range(0, len(row), 2)]
        return row[0]

    def number(self, value):
        return _number(value)

    def semiring_zero(self):
        return sp.Integer(0)

    def semiring_one(self):
        return sp.Integer(1)

    def index(self, element):
        return int(element) if isinstance(element, sp.Integer) else None


def _is_number(value) -> bool:
    return isinstance(value, sp.Basic) and (value.is_Number or value in (sp.true, sp.false))


def _plain(value):
    if value is sp.true or value is sp.false:
        return np.bool_(bool(value))
    return np.float64(float(value))


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
