"""Symbolic gradients: the graph expanded into SymPy, each output element differentiated
with `sympy.diff` by each input element, then evaluated through NumPy (with common
subexpressions eliminated) or returned as formulas.

Bounded: the expansion's size (see expand.MAX_TERMS), the size of the trees `diff` walks
(MAX_DIFF_WORK in all, MAX_ELEMENT_TREE per call: `diff` does not share work between
repeated subexpressions, so tree size, not DAG size, is its cost), a wall-clock budget
checked between derivatives, and simplification only for small formulas within its own
time budget.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import sympy as sp

from ..errors import DeadlineExceeded, FailedPrecondition
from .custom import without_dirac
from .expand import Expansion, expand, tree_size
from .numeric import lambdify

MAX_DIFF_WORK = 200_000  # Σ over output elements of (tree size × input elements it depends on): 10-100 µs each
MAX_ELEMENT_TREE = 50_000  # tree size of one output element: bounds one (uninterruptible) sympy.diff call
MAX_SECONDS = 60.0  # differentiating and compiling
SIMPLIFY_MAX_OPS = 40  # formulas simplified only up to this many operations ...
SIMPLIFY_SECONDS = 3.0  # ... and while the simplification budget lasts
MAX_SIMPLE_EXPONENT = 8  # and only without powers past this (SymPy would expand them)


@dataclass
class SymbolicJacobian:
    expansion: Expansion
    outputs: dict[str, np.ndarray]  # output name -> object array of its expressions
    blocks: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)  # (output, input) -> out + in shape


def symbolic_jacobian(cg, outputs: Sequence[str], wrt: Sequence[str], constants: Mapping[str, np.ndarray] | None = None,
                      deadline: float | None = None) -> SymbolicJacobian:
    """d output / d input for every (output, wrt input) pair, as SymPy expressions."""
    with sympy_failures("the symbolic gradient"):
        return _symbolic_jacobian(cg, outputs, wrt, constants, deadline)


@contextmanager
def sympy_failures(what: str):
    """SymPy giving up (deep recursion, numbers too large for its evaluation) is a refusal, not a crash."""
    try:
        yield
    except (RecursionError, OverflowError, MemoryError) as e:
        raise FailedPrecondition(f"{what} could not be computed: SymPy failed with {type(e).__name__} "
                                 f"(cross-check without the 'symbolic' method)") from None


def _symbolic_jacobian(cg, outputs, wrt, constants, deadline) -> SymbolicJacobian:
    bound = time.monotonic() + MAX_SECONDS
    deadline = bound if deadline is None else min(deadline, bound)
    refs = {name: cg.graph.output_map[name] for name in outputs}
    ex = expand(cg, list(refs.values()), constants)
    values = {name: ex.values[ref] for name, ref in refs.items()}
    wanted = {s for x in wrt for s in ex.symbols.get(x, np.empty(0, dtype=object)).flat}
    work, sizes, free = 0, {}, {}
    for array in values.values():
        for e in array.flat:
            n = len(free_symbols(e, free) & wanted)
            size = tree_size([e], MAX_DIFF_WORK, sizes) if n else 0
            work += n * size
            if work > MAX_DIFF_WORK or size > MAX_ELEMENT_TREE:
                raise FailedPrecondition(
                    f"the symbolic gradient is too large to compute: differentiating the expanded outputs would walk "
                    f"more than {MAX_DIFF_WORK} expression nodes (cross-check without the 'symbolic' method, or use "
                    f"a smaller graph)")
    jac = SymbolicJacobian(ex, values)
    for name, array in values.items():
        for x in wrt:
            symbols = ex.symbols.get(x)
            block = np.empty(array.shape + cg.types[x].shape, dtype=object)
            block.fill(sp.S.Zero)
            if symbols is not None:
                for j in np.ndindex(*array.shape):
                    e = array[j]
                    depends = free_symbols(e, free)
                    for i in np.ndindex(*symbols.shape):
                        if symbols[i] in depends:
                            block[j + i] = without_dirac(sp.diff(e, symbols[i]))
                    if time.monotonic() > deadline:
                        raise DeadlineExceeded("symbolic differentiation ran out of time "
                                               f"(budget {MAX_SECONDS:g} s or the request's deadline)")
            jac.blocks[name, x] = block
    return jac


def free_symbols(e: sp.Basic, memo: dict) -> frozenset:
    """e.free_symbols over the DAG (SymPy's own walks shared subexpressions again and again)."""
    stack = [(e, False)]
    while stack:
        node, expanded = stack.pop()
        if node in memo:
            continue
        if node.is_Symbol:
            memo[node] = frozenset((node,))
        elif not node.args:
            memo[node] = frozenset()
        elif expanded:
            memo[node] = frozenset().union(*(memo[a] for a in node.args))
        else:
            stack.append((node, True))
            stack.extend((a, False) for a in node.args if a not in memo)
    return memo[e]


def evaluate(jac: SymbolicJacobian, point: Mapping[str, np.ndarray]) -> dict[tuple[str, str], np.ndarray]:
    """The Jacobian blocks at `point` (input name -> per-item value), via NumPy with CSE."""
    symbols = list(jac.expansion.elements)
    args = [np.asarray(point[name])[index] for name, index in jac.expansion.elements.values()]
    keys = list(jac.blocks)
    flat = [e for key in keys for e in jac.blocks[key].flat]
    if not flat:
        return {key: np.zeros(jac.blocks[key].shape) for key in keys}
    with sympy_failures("the symbolic gradient"), np.errstate(all="ignore"):
        values = lambdify(symbols, flat, cse=True)(*args)
    out, k = {}, 0
    for key in keys:
        block = jac.blocks[key]
        out[key] = np.array([_real(v) for v in values[k:k + block.size]], dtype=np.float64).reshape(block.shape)
        k += block.size
    return out


def _real(value) -> float:
    value = complex(np.asarray(value).item()) if np.iscomplexobj(value) else float(np.asarray(value).item())
    if isinstance(value, complex):
        return value.real if value.imag == 0 else float("nan")
    return value


def simplified(exprs: list[sp.Expr], budget: float = SIMPLIFY_SECONDS) -> tuple[list[sp.Expr], str]:
    """`sympy.simplify` of the small formulas, while the time budget lasts; a note on what was left."""
    stop = time.monotonic() + budget
    out, skipped_size, skipped_time = [], 0, 0
    cache: dict[sp.Expr, sp.Expr] = {}
    for e in exprs:
        if e in cache:
            out.append(cache[e])
            continue
        if not _cheap(e):
            skipped_size += 1
            out.append(e)
            continue
        if time.monotonic() > stop:
            skipped_time += 1
            out.append(e)
            continue
        s = sp.simplify(e)
        better = sp.count_ops(s) < sp.count_ops(e) and _powers(s) <= _powers(e)
        cache[e] = s if better else e
        out.append(cache[e])
    notes = []
    if skipped_size:
        notes.append(f"{skipped_size} formula(s) too large to simplify")
    if skipped_time:
        notes.append(f"{skipped_time} formula(s) left as differentiated: the {budget:g} s simplification budget ran out")
    return out, "; ".join(notes)


def _powers(e: sp.Expr) -> int:
    """Powers with a non-constant exponent: simplify likes log(a**b), which overflows where b*log(a) does not."""
    return sum(1 for p in e.atoms(sp.Pow) if not p.exp.is_number)


def _cheap(e: sp.Expr) -> bool:
    if not isinstance(e, sp.Expr) or e.is_Atom:
        return False
    if tree_size([e], SIMPLIFY_MAX_OPS * 3) > SIMPLIFY_MAX_OPS * 3:
        return False
    for p in e.atoms(sp.Pow):
        if p.exp.is_Number and abs(p.exp) > MAX_SIMPLE_EXPONENT:
            return False
    return sp.count_ops(e) <= SIMPLIFY_MAX_OPS
