"""A graph's op definitions → ops, and the per-graph op registry they extend.

Each definition is parsed by the safe parser; partials it does not give come from
`sympy.diff` (derivatives of steps, DiracDelta, are taken as 0, as the built-in sign and
heaviside do). Its NumPy kernel is compiled once per definition and tenant and cached, so every
graph of a tenant using the same definition shares it. The registry of a graph is the built-in one
plus its custom ops (cached per set of definitions and tenant); custom names never shadow built-in
ops. Never across tenants: a registration that found another tenant's definition built (~6 ms
against ~60 ms for a definition nobody had registered) told a tenant that someone else had
registered that exact expression.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

import sympy as sp

from .. import tenancy
from ..errors import InvalidArgument
from ..ir import OpDefinition
from ..ops import REGISTRY, OpDef, Registry
from ..ops.custom import custom_op
from .finite_diff import analytic_expression
from .numeric import lambdify
from .parse import check_identifier, operand_symbols, parse_expression

MAX_OP_DEFS = 64  # custom ops per graph
MAX_DOC_CHARS = 1000
RESERVED_PREFIXES = ("sr_",)  # semiring ops are added to registries under these names
_CACHE_SIZE = 512

_ops: OrderedDict[tuple, OpDef] = OrderedDict()
_registries: OrderedDict[tuple, Registry] = OrderedDict()
_lock = threading.Lock()


def registry_for(op_defs: Sequence[OpDefinition]) -> Registry:
    """The built-in registry extended with these custom ops (the built-in one when there are none)."""
    if not op_defs:
        return REGISTRY
    if len(op_defs) > MAX_OP_DEFS:
        raise InvalidArgument(f"graph defines {len(op_defs)} custom ops; the limit is {MAX_OP_DEFS}")
    names = [d.name for d in op_defs]
    for name in names:
        check_op_name(name)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidArgument(f"custom op '{duplicates[0]}' is defined more than once")
    key = tuple(sorted(_key(d) for d in op_defs))
    with _lock:
        if key in _registries:
            _registries.move_to_end(key)
            return _registries[key]
    registry = Registry(dict(REGISTRY.ops))
    for definition in op_defs:
        registry.add(build_op(definition))
    with _lock:
        _registries[key] = registry
        while len(_registries) > _CACHE_SIZE:
            _registries.popitem(last=False)
    return registry


def custom_ops(registry: Registry) -> list[OpDef]:
    """The ops of `registry` that are not built in (a graph's custom ops)."""
    return [op for name, op in registry.ops.items() if name not in REGISTRY.ops]


def check_op_name(name: str) -> None:
    check_identifier(name, "custom op name")
    if name in REGISTRY.ops:
        raise InvalidArgument(f"custom op '{name}' would shadow the built-in op of that name")
    if name.startswith(RESERVED_PREFIXES):
        raise InvalidArgument(f"custom op '{name}': names starting with {', '.join(RESERVED_PREFIXES)} are reserved")


def build_op(definition: OpDefinition) -> OpDef:
    """The op for one definition: parsed, differentiated and compiled once, then cached."""
    key = _key(definition)
    with _lock:
        if key in _ops:
            _ops.move_to_end(key)
            return _ops[key]
    op = _build(definition)
    with _lock:
        _ops[key] = op
        while len(_ops) > _CACHE_SIZE:
            _ops.popitem(last=False)
    return op


def _build(d: OpDefinition) -> OpDef:
    check_op_name(d.name)
    what = f"custom op '{d.name}'"
    if not d.operands:
        raise InvalidArgument(f"{what} needs at least one operand")
    if len(d.doc) > MAX_DOC_CHARS:
        raise InvalidArgument(f"{what}: doc longer than {MAX_DOC_CHARS} characters")
    try:
        symbols = operand_symbols(d.operands)
    except InvalidArgument as e:
        raise InvalidArgument(f"{what}: {e}") from None
    expression = parse_expression(d.expression, d.operands, f"{what}: expression")
    given = dict(d.derivatives)
    unknown = sorted(set(given) - set(d.operands))
    if unknown:
        raise InvalidArgument(f"{what}: derivative given for '{unknown[0]}', which is not an operand "
                              f"(operands: {', '.join(d.operands)})")
    partials = []
    for name, symbol in zip(d.operands, symbols):
        if name in given:
            partial = parse_expression(given[name], d.operands, f"{what}: derivative for '{name}'")
        else:
            partial = without_dirac(sp.diff(expression, symbol))
        check_translatable(partial, f"{what}: derivative for '{name}'")
        partials.append(partial)
    return custom_op(d.name, symbols, expression, partials, lambdify(symbols, expression), d.doc,
                     analytic=analytic_expression(expression, REGISTRY))


def without_dirac(expr: sp.Expr) -> sp.Expr:
    """Derivatives of steps (sign, heaviside) taken as 0, as the built-in ops' rules do."""
    if not expr.has(sp.DiracDelta):
        return expr
    return expr.replace(lambda e: isinstance(e, sp.DiracDelta), lambda e: sp.S.Zero)


def check_translatable(expr: sp.Expr, what: str) -> None:
    """A partial must be expressible in built-in ops: backward passes are graphs of them."""
    for sub in sp.preorder_traversal(expr):
        if sub.is_Symbol or sub.is_number or isinstance(sub, (sp.Add, sp.Mul, sp.Pow)):
            continue
        if isinstance(sub, sp.Function) and type(sub) in REGISTRY.by_sympy_function():
            continue
        raise InvalidArgument(f"{what}: '{sub}' has no built-in op to compute it in a backward pass")


def _key(d: OpDefinition) -> tuple:
    return tenancy.current(), d.name, tuple(d.operands), d.expression, tuple(sorted(d.derivatives)), d.doc
