"""NumPy's dispatch protocols on graph Handles: ``np.sin(h)``, ``np.sum(h, axis=0)``,
``np.where(c, h, 0)``, ``np.concatenate([h, g])``... build graph nodes (see :func:`semigrad.trace`).

One table row per NumPy function: ``UFUNCS`` maps a ufunc's name to a semigrad op (NumPy's and
SciPy's ufuncs alike, e.g. ``scipy.special.expit``), ``FUNCTIONS`` maps a NumPy function to a
builder taking NumPy's arguments. A row may name a semigrad function this version lacks (the ops
other branches add, e.g. ``einsum``): it works once the function exists and says so until then.
Anything else raises TypeError naming the NumPy function, never a silent NumPy fallback.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from . import functions as F

# ufunc name -> semigrad op (a function of `functions`, or a server op reached by F.elementwise).
UFUNCS: dict[str, str] = {
    "add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "true_divide": "div", "power": "pow",
    "negative": "neg", "square": "square", "sqrt": "sqrt", "exp": "exp", "log": "log", "log1p": "log1p",
    "expm1": "expm1", "sin": "sin", "cos": "cos", "tan": "tan", "tanh": "tanh", "absolute": "abs", "fabs": "abs",
    "sign": "sign", "maximum": "maximum", "minimum": "minimum", "arctan": "atan", "arcsinh": "asinh",
    "less": "lt", "less_equal": "le", "greater": "gt", "greater_equal": "ge", "equal": "eq", "not_equal": "ne",
    "matmul": "matmul", "expit": "sigmoid", "erf": "erf",  # the last two: scipy.special's ufuncs
}
IDENTITY_UFUNCS = frozenset({"positive"})


def _optional(function_name: str, build: Callable) -> Callable:
    """A row for a semigrad function that may not exist in this version."""

    def row(*args, **kwargs):
        function = getattr(F, function_name, None)
        if function is None:
            raise TypeError(f"needs semigrad.{function_name}, which this version of semigrad lacks")
        return build(function, *args, **kwargs)

    return row


def _reduction(name: str):
    def build(a, axis=None, dtype=None, out=None, keepdims=False, **rest):
        _no_extras(rest, out)
        if dtype is not None:
            raise TypeError("dtype= is not supported (the result has the operand's dtype)")
        return getattr(F, name)(a, axis, bool(keepdims))

    return build


def _max_like(name: str):
    def build(a, axis=None, out=None, keepdims=False, **rest):
        _no_extras(rest, out)
        function = getattr(F, name, None)
        if function is None:
            raise TypeError(f"needs semigrad.{name}, which this version of semigrad lacks")
        return function(a, axis, bool(keepdims))

    return build


def _no_extras(rest: dict, out=None) -> None:
    """NumPy passes on only the arguments the caller gave: refuse those we cannot honour."""
    if out is not None:
        raise TypeError("out= is not supported: results are new graph nodes")
    given = sorted(k for k, v in rest.items() if not (k == "where" and v is True))
    if given:
        raise TypeError(f"argument(s) {', '.join(given)} are not supported")


def _where(condition, x=None, y=None):
    if x is None or y is None:
        raise TypeError("only the three-argument form where(condition, x, y) is supported")
    return F.where(condition, x, y)


def _concatenate(arrays, axis=0, out=None, **rest):
    _no_extras(rest, out)
    if axis is None:
        return F.concat([F.reshape(a, (-1,)) for a in arrays], 0)
    return F.concat(list(arrays), axis)


def _stack(arrays, axis=0, out=None, **rest):
    _no_extras(rest, out)
    return F.stack(list(arrays), axis)


def _reshape(a, *args, **kwargs):
    shape = kwargs.pop("newshape", None) or kwargs.pop("shape", None) or (args[0] if args else None)
    if kwargs.get("order", "C") != "C":
        raise TypeError("only order='C' reshapes are supported")
    if shape is None:
        raise TypeError("reshape needs a shape")
    return F.reshape(a, shape)


def _transpose(a, axes=None):
    return F.transpose(a, axes)


def _swapaxes(a, axis1, axis2):
    rank = len(_shape(a))
    perm = list(range(rank))
    perm[axis1], perm[axis2] = perm[axis2], perm[axis1]
    return F.transpose(a, perm)


def _squeeze(a, axis=None):
    shape = _shape(a)
    if axis is None:
        axes = {k for k, d in enumerate(shape) if d == 1}
    else:
        axes = {ax % len(shape) for ax in ([axis] if isinstance(axis, int) else axis)}
    for ax in axes:
        if shape[ax] != 1:
            raise ValueError(f"cannot squeeze axis {ax} of length {shape[ax]}")
    return F.reshape(a, tuple(d for k, d in enumerate(shape) if k not in axes))


def _expand_dims(a, axis):
    shape = list(_shape(a))
    for ax in sorted(a % (len(shape) + 1) for a in ([axis] if isinstance(axis, int) else axis)):
        shape.insert(ax, 1)
    return F.reshape(a, tuple(shape))


def _dot(a, b, out=None):
    _no_extras({}, out)
    ranks = [len(_shape(v)) for v in (a, b)]
    if any(r == 0 for r in ranks):
        return F.mul(a, b)
    if any(r > 2 for r in ranks):
        raise TypeError("numpy.dot of operands of rank > 2 is not supported: use numpy.matmul or numpy.einsum")
    return F.matmul(a, b)


def _clip(a, a_min=None, a_max=None, out=None, **rest):
    _no_extras(rest, out)
    scalar = all(v is None or isinstance(v, (int, float, np.number)) for v in (a_min, a_max))
    if scalar and hasattr(F, "clamp"):
        return F.clamp(a, min=None if a_min is None else float(a_min), max=None if a_max is None else float(a_max))
    result = a
    if a_max is not None:
        result = F.minimum(result, a_max)
    if a_min is not None:
        result = F.maximum(result, a_min)
    return result


def _take(function, a, indices, axis=None, out=None, mode=None):
    _no_extras({}, out)
    if mode not in (None, "raise"):
        raise TypeError("only mode='raise' is supported")
    if axis is None:
        a, axis = F.reshape(a, (-1,)), 0
    return function(a, indices, axis)


def _shape(a) -> tuple[int, ...]:
    shape = getattr(a, "shape", None)
    if shape is None:
        if hasattr(a, "graph"):
            raise TypeError(f"the shape of {a!r} is not known client-side")
        return np.shape(a)
    return tuple(shape)


# NumPy function -> builder taking NumPy's arguments (the Handles and arrays among them as given).
FUNCTIONS: dict[Callable, Callable] = {
    np.sum: _reduction("sum"),
    np.mean: _reduction("mean"),
    np.max: _max_like("max"),
    np.amax: _max_like("max"),
    np.min: _max_like("min"),
    np.amin: _max_like("min"),
    np.where: _where,
    np.concatenate: _concatenate,
    np.stack: _stack,
    np.reshape: _reshape,
    np.transpose: _transpose,
    np.swapaxes: _swapaxes,
    np.squeeze: _squeeze,
    np.expand_dims: _expand_dims,
    np.broadcast_to: lambda array, shape, subok=False: F.broadcast_to(array, shape),
    np.dot: _dot,
    np.clip: _clip,
    np.shape: _shape,
    np.ndim: lambda a: len(_shape(a)),
    np.size: lambda a, axis=None: math.prod(_shape(a)) if axis is None else _shape(a)[axis],
    np.einsum: _optional("einsum", lambda f, subscripts, *operands, **kw: f(subscripts, *operands)),
    np.take: _optional("gather", _take),
    np.cumsum: _optional("cumsum", lambda f, a, axis=None, dtype=None, out=None: f(
        F.reshape(a, (-1,)) if axis is None else a, 0 if axis is None else axis)),
    np.argmax: _optional("argmax", lambda f, a, axis=None, out=None, keepdims=False: f(
        F.reshape(a, (-1,)) if axis is None else a, 0 if axis is None else axis)),
    np.argmin: _optional("argmin", lambda f, a, axis=None, out=None, keepdims=False: f(
        F.reshape(a, (-1,)) if axis is None else a, 0 if axis is None else axis)),
}


def _full_name(function) -> str:
    """numpy.sum, numpy.linalg.det...: NumPy sets __module__ to the public module."""
    return f"{getattr(function, '__module__', None) or 'numpy'}.{getattr(function, '__name__', repr(function))}"


def _unsupported(what: str, why: str = "") -> TypeError:
    return TypeError(f"{what} is not supported on semigrad graph values{': ' + why if why else ''} "
                     f"(supported: the ufuncs {', '.join(sorted(UFUNCS))}; and numpy."
                     f"{', numpy.'.join(sorted(f.__name__ for f in FUNCTIONS))})")


def array_ufunc(ufunc, method: str, inputs: tuple, kwargs: dict):
    """Handle.__array_ufunc__."""
    name = getattr(ufunc, "__name__", repr(ufunc))
    label = f"{'numpy' if type(ufunc) is np.ufunc and hasattr(np, name) else 'ufunc'}.{name}"
    if method != "__call__":
        raise _unsupported(f"{label}.{method}", "only calling a ufunc builds a node")
    out = kwargs.pop("out", None)
    if out is not None and any(o is not None for o in out):
        raise TypeError(f"{label}: out= is not supported: results are new graph nodes")
    if kwargs.pop("where", True) is not True or any(v is not None for k, v in kwargs.items()
                                                     if k not in ("casting", "order", "subok")):
        raise TypeError(f"{label}: arguments {', '.join(sorted(kwargs))} are not supported")
    if name in IDENTITY_UFUNCS:
        return inputs[0]
    op = UFUNCS.get(name)
    if op is None:
        raise _unsupported(label)
    function = getattr(F, op, None)
    return function(*inputs) if function is not None else F.elementwise(op, *inputs)


def array_function(func, args: tuple, kwargs: dict):
    """Handle.__array_function__."""
    build = FUNCTIONS.get(func)
    if build is None:
        raise _unsupported(_full_name(func))
    try:
        return build(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{_full_name(func)}: {e}") from None
