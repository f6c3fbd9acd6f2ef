"""Elementwise ops, each declared once, in one row: its SymPy expression, its NumPy kernel,
its form over Python floats, and the facts backends read.

Partial derivatives come from `sympy.diff` at registry load (a row may override one, as
for `pow`, whose SymPy form `x**y*y/x` is NaN at 0). The adjoint rule is the same for all:
contribution to operand k = lift(∂f/∂x_k) ⊗ g, with broadcasting undone by a ⊕-reduce.
Comparisons (bool results, no gradient) and `where` are elementwise too, with their own
adjoint rules.

Kernels that are not NumPy functions are written with `numpy.` and named after their op:
printed stand-alone code (symbolic.numeric) uses their source as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy
import numpy as np
import sympy as sp

from ..errors import GraphError
from ..ir import DTYPES, Type
from . import sym
from .base import AttrSpec, OpDef, Registry, align, broadcast_item_shapes, element_array
from .sym import X, Y
from .tanh import SOURCE as TANH_SOURCE
from .tanh import tanh, tanh_float

C, A, B = sp.symbols("cond a b", real=True)


# ---------------------------------------------------------------- kernels that NumPy lacks


def sigmoid(x):
    return numpy.exp(-numpy.logaddexp(0.0, -x))


def softplus(x):
    return numpy.logaddexp(0.0, x)


def relu(x):
    return numpy.maximum(x, 0)


def heaviside(x):
    return numpy.heaviside(x, 0.5)


def softsign(x):
    return x / (1.0 + numpy.abs(x))


try:  # scipy is optional; its erf is a vectorised C ufunc.
    from scipy.special import erf as _erf_kernel
except ImportError:  # pragma: no cover - depends on the environment
    _erf_kernel = np.vectorize(math.erf, otypes=[np.float64])
ERF_SOURCE = "erf = numpy.vectorize(math.erf, otypes=[numpy.float64])\n"


def gelu(x):
    return 0.5 * x * (1.0 + _erf_kernel(x * 0.7071067811865476))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + numpy.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))


# ---------------------------------------------------------------- the same over Python floats


def _f_sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _f_softplus(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x))) if x == x else x


def _f_relu(x):
    return x if not x <= 0 else 0.0


def _f_softsign(x):
    return x / (1.0 + abs(x))


def _f_sign(x):
    return x if x != x else (1.0 if x > 0 else (-1.0 if x < 0 else 0.0))


def _f_heaviside(x):
    return x if x != x else (1.0 if x > 0 else (0.0 if x < 0 else 0.5))


def _f_gelu(x):
    return 0.5 * x * (1.0 + math.erf(x * 0.7071067811865476))


def _f_gelu_tanh(x):
    return 0.5 * x * (1.0 + math.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))


def _f_maximum(a, b):
    return a if a >= b or a != a else b


def _f_minimum(a, b):
    return a if a <= b or a != a else b


def _f_where(c, a, b):
    return a if c else b


@dataclass(frozen=True)
class Row:
    """One elementwise op. `float_fn`: over Python floats (None: generated code calls `fn`)."""

    name: str
    expression: object
    fn: Callable
    doc: str
    float_fn: Callable | None = None
    infix: str | None = None
    partials: dict = field(default_factory=dict)  # operand symbol -> partial overriding sympy.diff
    commutative: bool = False
    unit: tuple | None = None
    fusible: bool = False
    analytic: bool = False
    internal: bool = False
    source: str | None = None  # stand-alone definition, when `fn` is neither NumPy's nor plain source


ELEMENTWISE: list[Row] = [
    Row("add", X + Y, np.add, "x + y", infix="{0} + {1}", commutative=True, unit=("both", 0.0), fusible=True,
        analytic=True),
    Row("sub", X - Y, np.subtract, "x - y", infix="{0} - {1}", unit=("right", 0.0), fusible=True, analytic=True),
    Row("mul", X * Y, np.multiply, "x * y", infix="{0} * {1}", commutative=True, unit=("both", 1.0), fusible=True,
        analytic=True),
    Row("div", X / Y, np.true_divide, "x / y", infix="{0} / {1}", unit=("right", 1.0), fusible=True, analytic=True),
    Row("neg", -X, np.negative, "-x", infix="-{0}", fusible=True, analytic=True),
    Row("pow", X**Y, np.power, "x ** y", float_fn=math.pow, partials={X: Y * X ** (Y - 1)}, analytic=True),
    Row("square", X**2, np.square, "x ** 2", infix="{0} * {0}", fusible=True, analytic=True),
    Row("sqrt", sp.sqrt(X), np.sqrt, "square root", float_fn=math.sqrt, analytic=True),
    Row("exp", sp.exp(X), np.exp, "e ** x", float_fn=math.exp, analytic=True),
    Row("log", sp.log(X), np.log, "natural logarithm", float_fn=math.log, analytic=True),
    Row("log1p", sym.log1p(X), np.log1p, "log(1 + x), accurate near 0", float_fn=math.log1p, analytic=True),
    Row("expm1", sym.expm1(X), np.expm1, "exp(x) - 1, accurate near 0", float_fn=math.expm1, analytic=True),
    Row("sin", sp.sin(X), np.sin, "sine", float_fn=math.sin, analytic=True),
    Row("cos", sp.cos(X), np.cos, "cosine", float_fn=math.cos, analytic=True),
    Row("tan", sp.tan(X), np.tan, "tangent", float_fn=math.tan, analytic=True),
    Row("tanh", sp.tanh(X), tanh, "hyperbolic tangent (ops/tanh.py: ≤ 0.74 ulp, SIMD with numba)", float_fn=tanh_float,
        analytic=True, source=TANH_SOURCE),
    Row("asinh", sp.asinh(X), np.arcsinh, "inverse hyperbolic sine", float_fn=math.asinh, analytic=True),
    Row("atan", sp.atan(X), np.arctan, "inverse tangent", float_fn=math.atan, analytic=True),
    Row("softsign", X / (1 + sp.Abs(X)), softsign, "x / (1 + |x|)", float_fn=_f_softsign),
    Row("sigmoid", sym.sigmoid(X), sigmoid, "1 / (1 + exp(-x)), computed stably", float_fn=_f_sigmoid),
    Row("softplus", sym.softplus(X), softplus, "log(1 + exp(x)), computed stably", float_fn=_f_softplus),
    Row("abs", sp.Abs(X), np.abs, "absolute value; derivative sign(x)", float_fn=abs, fusible=True),
    Row("relu", sym.relu(X), relu, "max(x, 0); derivative 1/2 at 0", float_fn=_f_relu, fusible=True),
    Row("maximum", sym.maximum(X, Y), np.maximum, "elementwise max; ties split the derivative 1/2, 1/2",
        float_fn=_f_maximum, commutative=True, fusible=True),
    Row("minimum", sym.minimum(X, Y), np.minimum, "elementwise min; ties split the derivative 1/2, 1/2",
        float_fn=_f_minimum, commutative=True, fusible=True),
    Row("erf", sp.erf(X), _erf_kernel, "error function", float_fn=math.erf, source=ERF_SOURCE),
    # GELU as PyTorch computes it (one edge, partial gelu'(x)): x Φ(x), and the tanh approximation.
    Row("gelu", X / 2 * (1 + sp.erf(X / sp.sqrt(2))), gelu, "x Φ(x) = x (1 + erf(x / √2)) / 2 (torch's GELU)",
        float_fn=_f_gelu),
    Row("gelu_tanh", X / 2 * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (X + sp.Rational(44715, 1000000) * X**3))), gelu_tanh,
        "x (1 + tanh(√(2/π) (x + 0.044715 x³))) / 2 (torch's GELU, approximate='tanh')", float_fn=_f_gelu_tanh,
        analytic=True),
    Row("sign", sp.sign(X), np.sign, "sign of x (derivative 0)", float_fn=_f_sign, partials={X: sp.Integer(0)},
        fusible=True),
    Row("heaviside", sp.Heaviside(X), heaviside, "step: 0 below 0, 1/2 at 0, 1 above (derivative 0)",
        float_fn=_f_heaviside, partials={X: sp.Integer(0)}, fusible=True, internal=True),
]

# name, relation, NumPy function, infix; bool results, no gradient.
COMPARISONS = [
    ("lt", sp.Lt, np.less, "{0} < {1}"), ("le", sp.Le, np.less_equal, "{0} <= {1}"),
    ("gt", sp.Gt, np.greater, "{0} > {1}"), ("ge", sp.Ge, np.greater_equal, "{0} >= {1}"),
    ("eq", sp.Eq, np.equal, "{0} == {1}"), ("ne", sp.Ne, np.not_equal, "{0} != {1}"),
]


def elementwise_kernel(fn: Callable, in_types, out_type: Type) -> Callable:
    ranks = [t.rank for t in in_types]
    out_rank = out_type.rank
    if all(r == out_rank for r in ranks):
        return fn
    if len(ranks) == 1:
        (r,) = ranks
        return lambda a: fn(align(a, r, out_rank))
    if len(ranks) == 2:  # most of them (a bias add): without the generic form's generator
        r0, r1 = ranks
        return lambda a, b: fn(align(a, r0, out_rank), align(b, r1, out_rank))
    return lambda *args: fn(*[align(a, r, out_rank) for a, r in zip(args, ranks)])


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
    # the result dtype by operand dtypes (None: NumPy has no kernel for them), probed once: the
    # probe (0-d arrays, an errstate, a ufunc call) was most of registering a large elementwise
    # graph (a recursive det n=7: 13,698 elementwise nodes, four operand dtype patterns at most)
    result_dtypes: dict[tuple[str, ...], str | None] = {}

    def result_dtype(dtypes: tuple[str, ...]) -> str | None:
        if dtypes not in result_dtypes:
            try:
                with np.errstate(all="ignore"):
                    result_dtypes[dtypes] = np.asarray(fn(*(np.zeros((), dtype=d) for d in dtypes))).dtype.name
            except TypeError:  # NumPy has no kernel for these dtypes (e.g. sub or neg of bools)
                result_dtypes[dtypes] = None
        return result_dtypes[dtypes]

    def infer(node, in_types, attrs):
        shape = broadcast_item_shapes(node, [t.shape for t in in_types])
        dtype = result_dtype(tuple(t.dtype for t in in_types))
        if dtype is None:
            dtypes = ", ".join(t.dtype for t in in_types)
            raise GraphError(node.id, f"op '{node.op}' does not accept operands of dtype {dtypes}")
        if dtype not in DTYPES:  # sqrt(bool) is float16 in NumPy, pow(bool, bool) int8: refused, not promoted
            dtypes = ", ".join(t.dtype for t in in_types)
            raise GraphError(node.id, f"op '{node.op}' does not accept operands of dtype {dtypes} (NumPy would "
                                      f"compute {dtype}, which semigrad does not carry); give it float operands, "
                                      f"e.g. where(flag, 1.0, 0.0) for a bool")
        return Type(shape, dtype)

    return infer


def kernel_of(fn: Callable):
    return lambda attrs, in_types, out_type: elementwise_kernel(fn, in_types, out_type)


def _comparison_infer(node, in_types, attrs):
    return Type(broadcast_item_shapes(node, [t.shape for t in in_types]), "bool")


def _where_infer(node, in_types, attrs):
    if in_types[0].dtype != "bool":
        raise GraphError(node.id, f"where's condition must be bool, got {in_types[0].dtype}")
    dtype = np.result_type(np.dtype(in_types[1].dtype), np.dtype(in_types[2].dtype)).name
    return Type(broadcast_item_shapes(node, [t.shape for t in in_types]), dtype)


def _where_vjp(ctx, node, g, positions):
    cond = node.inputs[0]
    dtype = ctx.type(node.id).dtype
    one, zero = ctx.const(1, dtype), ctx.const(0, dtype)
    out = {}
    for pos in positions:
        if pos == 0:
            out[pos] = None
            continue
        partial = ctx.emit("where", [cond, one, zero] if pos == 1 else [cond, zero, one])
        out[pos] = ctx.unbroadcast(ctx.edge_value(partial, g), ctx.type(node.id).shape, ctx.type(node.inputs[pos]).shape)
    return out


def _clamp_infer(node, in_types, attrs):
    (t,) = in_types
    if attrs["min"] is None and attrs["max"] is None:
        raise GraphError(node.id, "clamp needs a 'min' or a 'max' attribute (or both)")
    for bound in ("min", "max"):
        if attrs[bound] is not None and math.isnan(attrs[bound]):
            raise GraphError(node.id, f"clamp's {bound} is NaN")
    if not t.is_float:
        raise GraphError(node.id, f"clamp takes a float operand, got {t.dtype}")
    return t


def _clamp_kernel(attrs, in_types, out_type):
    lo, hi = attrs["min"], attrs["max"]
    if hi is None:
        return lambda x: np.maximum(x, lo)
    if lo is None:
        return lambda x: np.minimum(x, hi)
    return lambda x: np.minimum(np.maximum(x, lo), hi)  # torch's order: min > max gives max everywhere


def _clamp_expand(el, operands, attrs, in_types, out_type):
    lo, hi = attrs["min"], attrs["max"]

    def one(x):
        if lo is not None:
            x = el.apply("maximum", (x, el.number(float(lo))))
        return x if hi is None else el.apply("minimum", (x, el.number(float(hi))))

    return element_array([one(x) for x in operands[0].reshape(-1)], out_type.shape)


def _clamp_vjp(ctx, node, g, positions):
    """∂ = 1 where min ≤ x ≤ max (PyTorch's rule: a bound itself passes the gradient), else 0."""
    x = node.inputs[0]
    attrs, dtype = ctx.attrs(node), ctx.type(node.id).dtype
    one, zero = ctx.const(1, dtype), ctx.const(0, dtype)
    partial = one
    for bound, compare in (("min", "ge"), ("max", "le")):
        if attrs[bound] is not None:
            inside = ctx.emit(compare, [x, ctx.const(attrs[bound], dtype)])
            partial = ctx.emit("where", [inside, partial, zero])
    return {0: ctx.edge_value(partial, g)}


def as_condition(value):
    """A SymPy condition from an element: relations stay, numbers and symbols compare with 0."""
    return value if isinstance(value, sp.logic.boolalg.Boolean) else sp.Ne(value, 0)


def register(registry: Registry) -> None:
    for row in ELEMENTWISE:
        expr = row.expression
        symbols = tuple(s for s in (X, Y) if s in expr.free_symbols)
        partials = {k: row.partials.get(s, sp.diff(expr, s)) for k, s in enumerate(symbols)}
        registry.add(OpDef(
            name=row.name,
            kind="elementwise",
            operands=tuple(str(s) for s in symbols),
            infer=infer_elementwise(row.fn),
            kernel=kernel_of(row.fn),
            vjp=elementwise_vjp(partials, symbols),
            expression=expr,
            derivatives=tuple((str(s), str(partials[k])) for k, s in enumerate(symbols)),
            partials=tuple(partials[k] for k in range(len(symbols))),
            doc=row.doc,
            internal=row.internal,
            elementwise_fn=row.fn,
            float_fn=row.float_fn,
            infix=row.infix,
            commutative=row.commutative,
            unit=row.unit,
            fusible=row.fusible,
            analytic=row.analytic,
            source=row.source,
        ))
    for name, relation, fn, infix in COMPARISONS:
        registry.add(OpDef(
            name, "comparison", ("x", "y"), _comparison_infer, kernel_of(fn),
            vjp=lambda ctx, node, g, positions: dict.fromkeys(positions),
            derivatives=(("x", "0 (no gradient through comparisons)"), ("y", "0")),
            doc=f"elementwise {fn.__name__}, a bool result",
            elementwise_fn=fn, float_fn=None, infix=infix, commutative=name in ("eq", "ne"), fusible=True,
            sympy_apply=relation))
    registry.add(OpDef(
        "where", "elementwise", ("cond", "a", "b"), _where_infer, kernel_of(np.where), vjp=_where_vjp,
        derivatives=(("cond", "0 (no gradient through the condition)"), ("a", "where(cond, 1, 0)"),
                     ("b", "where(cond, 0, 1)")),
        doc="a where cond else b",
        elementwise_fn=np.where, float_fn=_f_where, fusible=True,
        sympy_apply=lambda c, a, b: sp.Piecewise((a, as_condition(c)), (b, True))))
    registry.add(OpDef(
        "clamp", "pointwise", ("x",), _clamp_infer, _clamp_kernel, vjp=_clamp_vjp,
        attrs=(AttrSpec("min", "float", doc="lower bound; absent: none"),
               AttrSpec("max", "float", doc="upper bound; absent: none")),
        derivatives=(("x", "1 where min <= x <= max (bounds included, as PyTorch), else 0"),),
        doc="min(max(x, min), max) with attribute bounds (torch.clamp)", expand=_clamp_expand))
