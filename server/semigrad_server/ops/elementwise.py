"""Elementwise ops, each declared once: a SymPy expression of its operands and a NumPy kernel.

Partial derivatives come from `sympy.diff` at registry load (a row may override one, as
for `pow`, whose SymPy form `x**y*y/x` is NaN at 0). The adjoint rule is the same for all:
contribution to operand k = lift(∂f/∂x_k) ⊗ g, with broadcasting undone by a ⊕-reduce.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import sympy as sp

from ..errors import GraphError
from ..ir import Type
from .base import OpDef, Registry, align, broadcast_item_shapes
from .sym import X, Y, expm1, log1p, maximum, minimum, relu, sigmoid, softplus


def _sigmoid(x):
    return np.exp(-np.logaddexp(0, -x))


def _softplus(x):
    return np.logaddexp(0, x)


def _relu(x):
    return np.maximum(x, 0)


def _heaviside(x):
    return np.heaviside(x, 0.5)


try:  # scipy is optional; its erf is a vectorised C ufunc.
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover - depends on the environment
    _erf = np.vectorize(math.erf, otypes=[np.float64])

# name, SymPy expression, NumPy kernel, partials that override sympy.diff, doc
ELEMENTWISE: list[tuple] = [
    ("add", X + Y, np.add, {}, "x + y"),
    ("sub", X - Y, np.subtract, {}, "x - y"),
    ("mul", X * Y, np.multiply, {}, "x * y"),
    ("div", X / Y, np.true_divide, {}, "x / y"),
    ("neg", -X, np.negative, {}, "-x"),
    ("pow", X**Y, np.power, {X: Y * X ** (Y - 1)}, "x ** y"),
    ("square", X**2, np.square, {}, "x ** 2"),
    ("sqrt", sp.sqrt(X), np.sqrt, {}, "square root"),
    ("exp", sp.exp(X), np.exp, {}, "e ** x"),
    ("log", sp.log(X), np.log, {}, "natural logarithm"),
    ("log1p", log1p(X), np.log1p, {}, "log(1 + x), accurate near 0"),
    ("expm1", expm1(X), np.expm1, {}, "exp(x) - 1, accurate near 0"),
    ("sin", sp.sin(X), np.sin, {}, "sine"),
    ("cos", sp.cos(X), np.cos, {}, "cosine"),
    ("tan", sp.tan(X), np.tan, {}, "tangent"),
    ("tanh", sp.tanh(X), np.tanh, {}, "hyperbolic tangent"),
    ("sigmoid", sigmoid(X), _sigmoid, {}, "1 / (1 + exp(-x)), computed stably"),
    ("softplus", softplus(X), _softplus, {}, "log(1 + exp(x)), computed stably"),
    ("abs", sp.Abs(X), np.abs, {}, "absolute value; derivative sign(x)"),
    ("relu", relu(X), _relu, {}, "max(x, 0); derivative 1/2 at 0"),
    ("maximum", maximum(X, Y), np.maximum, {}, "elementwise max; ties split the derivative 1/2, 1/2"),
    ("minimum", minimum(X, Y), np.minimum, {}, "elementwise min; ties split the derivative 1/2, 1/2"),
    ("erf", sp.erf(X), _erf, {}, "error function"),
    ("sign", sp.sign(X), np.sign, {X: sp.Integer(0)}, "sign of x (derivative 0)"),
    ("heaviside", sp.Heaviside(X), _heaviside, {X: sp.Integer(0)}, "step: 0 below 0, 1/2 at 0, 1 above (derivative 0)"),
]

# SymPy function class -> op name, for turning derivative formulas back into graph nodes.
SYMPY_FUNCTIONS: dict[type, str] = {}


def elementwise_kernel(fn: Callable, in_types, out_type: Type) -> Callable:
    ranks = [t.rank for t in in_types]
    out_rank = out_type.rank
    if all(r == out_rank for r in ranks):
        return fn
    if len(ranks) == 1:
        (r,) = ranks
        return lambda a: fn(align(a, r, out_rank))
    return lambda *args: fn(*(align(a, r, out_rank) for a, r in zip(args, ranks)))


def elementwise_vjp(partials: dict[int, sp.Expr], symbols: tuple[sp.Symbol, ...]):
    def vjp(ctx, node, g, positions):
        env = dict(zip(symbols, node.inputs))
        out = {}
        for pos in positions:
            partial = partials.get(pos)
            if partial is None or partial == 0:
                out[pos] = None
                continue
            contribution = ctx.edge(partial, env, g)
            out[pos] = ctx.unbroadcast(contribution, ctx.type(node.id).shape, ctx.type(node.inputs[pos]).shape)
        return out

    return vjp


def infer_elementwise(fn: Callable):
    def infer(node, in_types, attrs):
        shape = broadcast_item_shapes(node, [t.shape for t in in_types])
        try:
            with np.errstate(all="ignore"):
                probe = fn(*(np.zeros((), dtype=t.dtype) for t in in_types))
        except TypeError:  # NumPy has no kernel for these dtypes (e.g. sub or neg of bools)
            dtypes = ", ".join(t.dtype for t in in_types)
            raise GraphError(node.id, f"op '{node.op}' does not accept operands of dtype {dtypes}") from None
        return Type(shape, np.asarray(probe).dtype.name)

    return infer


def register(registry: Registry) -> None:
    for name, expr, fn, overrides, doc in ELEMENTWISE:
        symbols = tuple(s for s in (X, Y) if s in expr.free_symbols)
        partials = {k: overrides.get(s, sp.diff(expr, s)) for k, s in enumerate(symbols)}
        if not isinstance(expr, (sp.Add, sp.Mul, sp.Pow)):
            SYMPY_FUNCTIONS[expr.func] = name
        registry.add(OpDef(
            name=name,
            kind="elementwise",
            operands=tuple(str(s) for s in symbols),
            infer=infer_elementwise(fn),
            kernel=lambda attrs, in_types, out_type, fn=fn: elementwise_kernel(fn, in_types, out_type),
            vjp=elementwise_vjp(partials, symbols),
            expression=expr,
            derivatives=tuple((str(s), str(partials[k])) for k, s in enumerate(symbols)),
            partials=tuple(partials[k] for k in range(len(symbols))),
            doc=doc,
            internal=name in ("heaviside",),
        ))
