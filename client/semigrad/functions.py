"""Graph-building functions, one per semigrad op.

Every function takes Handles and an optional ``name=`` for the node id, and returns the new
node's Handle with its static shape and dtype when they can be inferred. Python numbers and
arrays mixed in become ``const`` nodes; numeric ones take the float dtype of a float Handle
operand (``x32 * 2`` multiplies by a float32 const), bools stay bool.

This module defines ``abs``, ``pow``, ``sum``, ``max`` and ``min``; it must not use those builtins itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from . import codec, shapes
from . import graph as _graph  # graph imports this module too: use its names at call time only

_FLOATS = ("float32", "float64")


# Result dtype rules: operand dtypes -> result dtype, or None when not known client-side.
def _same(*dtypes):
    """All operands agree on a dtype: that is the result's."""
    return dtypes[0] if all(d == dtypes[0] for d in dtypes) else None


def _floating(*dtypes):
    """Float result: known only for float operands of one dtype."""
    dtype = _same(*dtypes)
    return dtype if dtype in _FLOATS else None


def _boolean(*dtypes):
    """Comparisons give bool."""
    return "bool"


def _handles(values: Sequence) -> list:
    """Return ``values`` as Handles of their one graph, turning non-Handles into consts."""
    graphs = {id(v.graph): v.graph for v in values if _is_handle(v)}
    if not graphs:
        raise TypeError("needs at least one graph Handle operand")
    if len(graphs) > 1:
        raise ValueError("operands belong to different graphs")
    (graph,) = graphs.values()
    like = next((v.dtype for v in values if _is_handle(v) and v.dtype in _FLOATS), None)
    return [v if _is_handle(v) else graph.const(_const_value(v, like)) for v in values]


def _is_handle(value) -> bool:
    return isinstance(value, _graph.Handle)


def _const_value(value, like: str | None) -> np.ndarray:
    """``value`` as an array; numbers take the float dtype ``like`` when given (bools stay bool)."""
    array = np.asarray(value)
    return array.astype(like) if like and array.dtype.kind in "iuf" else array


def _node(op: str, operands: list, attrs: dict, infer_shape, dtype: str | None, name: str | None):
    """Add node ``op`` on Handles ``operands``; errors of ``infer_shape()`` name the op."""
    try:
        shape = infer_shape()
    except (ValueError, IndexError) as error:
        raise type(error)(f"{op}: {error}") from None
    return operands[0].graph.add_node(op, operands, attrs, shape=shape, dtype=dtype, name=name)


def _unary(op: str, dtype_rule, doc: str):
    def function(x, *, name: str | None = None):
        (x,) = _handles([x])
        return _node(op, [x], {}, partial(shapes.broadcast, x.shape), dtype_rule(x.dtype), name)

    function.__name__ = function.__qualname__ = op
    function.__doc__ = f"Elementwise ``{doc}``."
    return function


def _binary(op: str, dtype_rule, doc: str):
    def function(x, y, *, name: str | None = None):
        x, y = _handles([x, y])
        infer = partial(shapes.broadcast, x.shape, y.shape)
        return _node(op, [x, y], {}, infer, dtype_rule(x.dtype, y.dtype), name)

    function.__name__ = function.__qualname__ = op
    function.__doc__ = f"Elementwise ``{doc}`` with NumPy broadcasting."
    return function


# The elementwise ops: one line each (op name, result dtype rule, meaning).
neg = _unary("neg", _same, "-x")
square = _unary("square", _same, "x**2")
sqrt = _unary("sqrt", _floating, "sqrt(x)")
exp = _unary("exp", _floating, "exp(x)")
log = _unary("log", _floating, "log(x)")
log1p = _unary("log1p", _floating, "log(1 + x)")
expm1 = _unary("expm1", _floating, "exp(x) - 1")
sin = _unary("sin", _floating, "sin(x)")
cos = _unary("cos", _floating, "cos(x)")
tan = _unary("tan", _floating, "tan(x)")
tanh = _unary("tanh", _floating, "tanh(x)")
sigmoid = _unary("sigmoid", _floating, "1 / (1 + exp(-x))")
softplus = _unary("softplus", _floating, "log(1 + exp(x))")
abs = _unary("abs", _same, "|x|")
relu = _unary("relu", _same, "max(x, 0)")
erf = _unary("erf", _floating, "erf(x)")
sign = _unary("sign", _same, "sign(x)")
add = _binary("add", _same, "x + y")
sub = _binary("sub", _same, "x - y")
mul = _binary("mul", _same, "x * y")
div = _binary("div", _floating, "x / y")
pow = _binary("pow", _same, "x ** y")
maximum = _binary("maximum", _same, "max(x, y)")
minimum = _binary("minimum", _same, "min(x, y)")
lt = _binary("lt", _boolean, "x < y")
le = _binary("le", _boolean, "x <= y")
gt = _binary("gt", _boolean, "x > y")
ge = _binary("ge", _boolean, "x >= y")
eq = _binary("eq", _boolean, "x == y")
ne = _binary("ne", _boolean, "x != y")



def gelu(x, approximate: str = "none", *, name: str | None = None):
    """GELU as PyTorch's ``gelu``: ``x Φ(x)`` (op "gelu", erf form), or with
    ``approximate="tanh"`` ``x (1 + tanh(√(2/π) (x + 0.044715 x³))) / 2`` (op "gelu_tanh")."""
    ops = {"none": "gelu", "tanh": "gelu_tanh"}
    if approximate not in ops:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    (x,) = _handles([x])
    return _node(ops[approximate], [x], {}, partial(shapes.broadcast, x.shape), _floating(x.dtype), name)


def clamp(x, min: float | None = None, max: float | None = None, *, name: str | None = None):
    """``torch.clamp``: ``min(max(x, min), max)`` with constant bounds (attributes; give one or
    both). The gradient is 1 where ``min <= x <= max`` (bounds included, as in PyTorch), else 0."""
    if min is None and max is None:
        raise ValueError("clamp: give min, max or both")
    (x,) = _handles([x])
    attrs = {k: float(v) for k, v in (("min", min), ("max", max)) if v is not None}
    return _node("clamp", [x], attrs, partial(shapes.broadcast, x.shape), x.dtype, name)


def elementwise(op: str, *operands, name: str | None = None):
    """Any elementwise op the server lists (``Client.list_ops()``), by name, on broadcast
    operands: ``elementwise("asinh", x)`` is ``asinh(x)``. The server checks op and arity."""
    operands = _handles(list(operands))
    infer = partial(shapes.broadcast, *(x.shape for x in operands))
    return _node(op, operands, {}, infer, None, name)


def where(cond, a, b, *, name: str | None = None):
    """Elementwise ``a if cond else b`` (``cond`` must be bool; no gradient flows through it)."""
    cond, a, b = _handles([cond, a, b])
    infer = partial(shapes.broadcast, cond.shape, a.shape, b.shape)
    return _node("where", [cond, a, b], {}, infer, _same(a.dtype, b.dtype), name)


def matmul(a, b, *, name: str | None = None):
    """Matrix product with numpy.matmul semantics (1-D operands, broadcast batch dims)."""
    a, b = _handles([a, b])
    infer = partial(shapes.matmul, a.shape, b.shape)
    return _node("matmul", [a, b], {}, infer, _same(a.dtype, b.dtype), name)


def einsum(subscripts: str, *operands, name: str | None = None):
    """``numpy.einsum(subscripts, *operands)`` over explicit letters: ``"bij,bjk->bik"``,
    ``"ij->ji"``, ``"i,i->"``; without ``->`` the output is the letters used once, sorted.
    Not supported: ``...`` and a letter repeated within one term. (Batched matmul is
    :func:`matmul`.)"""
    operands = _handles(list(operands))
    infer = partial(shapes.einsum, subscripts, [x.shape for x in operands])
    return _node("einsum", operands, {"subscripts": str(subscripts)}, infer,
                 _floating(*(x.dtype for x in operands)), name)


def _reduction(op: str, x, axis, keepdims: bool, dtype: str | None, name: str | None):
    axes = None if axis is None else _ints(axis)
    attrs = {} if axes is None else {"axes": axes}
    if keepdims:
        attrs["keepdims"] = True
    return _node(op, [x], attrs, partial(shapes.reduce, x.shape, axes, keepdims), dtype, name)


def sum(x, axis=None, keepdims: bool = False, *, name: str | None = None):
    """Sum over ``axis`` (int, tuple of ints, or None for all axes)."""
    (x,) = _handles([x])
    return _reduction("sum", x, axis, keepdims, None if x.dtype == "bool" else x.dtype, name)


def mean(x, axis=None, keepdims: bool = False, *, name: str | None = None):
    """Mean over ``axis`` (int, tuple of ints, or None for all axes)."""
    (x,) = _handles([x])
    return _reduction("mean", x, axis, keepdims, _floating(x.dtype), name)


def max(x, axis=None, keepdims: bool = False, *, name: str | None = None):
    """Maximum over ``axis`` (int, tuple of ints, or None for all axes)."""
    (x,) = _handles([x])
    return _reduction("max", x, axis, keepdims, x.dtype, name)


def min(x, axis=None, keepdims: bool = False, *, name: str | None = None):
    """Minimum over ``axis`` (int, tuple of ints, or None for all axes); the gradient goes to
    the minimum, split evenly between ties (as ``max``)."""
    (x,) = _handles([x])
    return _reduction("min", x, axis, keepdims, x.dtype, name)


def cumsum(x, axis: int, *, name: str | None = None):
    """Running sum along ``axis`` (``numpy.cumsum``, ``torch.cumsum``)."""
    (x,) = _handles([x])
    return _node("cumsum", [x], {"axis": int(axis)}, partial(shapes.cumsum, x.shape, int(axis)), x.dtype, name)


def _arg(op: str, x, axis, keepdims: bool, name):
    (x,) = _handles([x])
    attrs = {} if axis is None else {"axis": int(axis)}
    if keepdims:
        attrs["keepdims"] = True
    axes = None if axis is None else (int(axis),)
    return _node(op, [x], attrs, partial(shapes.reduce, x.shape, axes, keepdims), "int64", name)


def argmax(x, axis: int | None = None, keepdims: bool = False, *, name: str | None = None):
    """int64 index of the first maximum along ``axis`` (None: into the flattened value), as
    ``numpy.argmax``. No gradient flows through it; use it as ``gather``'s indices."""
    return _arg("argmax", x, axis, keepdims, name)


def argmin(x, axis: int | None = None, keepdims: bool = False, *, name: str | None = None):
    """int64 index of the first minimum along ``axis`` (None: into the flattened value)."""
    return _arg("argmin", x, axis, keepdims, name)


def dropout(x, p: float = 0.5, training: bool = False):
    """Dropout in evaluation mode: ``x`` itself (no node), as ``torch.nn.functional.dropout``
    with ``training=False``. Training mode is random, which a graph (a pure function of its
    inputs) cannot be: ``training=True`` raises ValueError."""
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if training:
        raise ValueError("dropout: training=True is random and semigrad graphs are deterministic; use "
                         "training=False (evaluation: the identity), or multiply by a mask input you draw yourself")
    return x


def reshape(x, shape, *, name: str | None = None):
    """Reshape to ``shape`` (an int or a sequence of ints; one -1 allowed)."""
    (x,) = _handles([x])
    shape = _ints(shape)
    infer = partial(shapes.reshape, x.shape, shape)
    return _node("reshape", [x], {"shape": shape}, infer, x.dtype, name)


def transpose(x, perm=None, *, name: str | None = None):
    """Permute axes by ``perm`` (None reverses them)."""
    (x,) = _handles([x])
    perm = None if perm is None else _ints(perm)
    attrs = {} if perm is None else {"perm": perm}
    return _node("transpose", [x], attrs, partial(shapes.transpose, x.shape, perm), x.dtype, name)


def broadcast_to(x, shape, *, name: str | None = None):
    """Broadcast to ``shape`` with NumPy rules."""
    (x,) = _handles([x])
    shape = _ints(shape)
    infer = partial(shapes.broadcast_to, x.shape, shape)
    return _node("broadcast_to", [x], {"shape": shape}, infer, x.dtype, name)


def index(x, key, *, name: str | None = None):
    """Basic indexing ``x[key]``: ints and slices only (anything else raises TypeError)."""
    (x,) = _handles([x])
    attrs = {"index": codec.index_list(key)}
    return _node("index", [x], attrs, partial(shapes.index, x.shape, key), x.dtype, name)


def concat(xs: Sequence, axis: int = 0, *, name: str | None = None):
    """Concatenate ``xs`` along an existing ``axis``."""
    xs = _handles(list(xs))
    infer = partial(shapes.concat, [x.shape for x in xs], axis)
    return _node("concat", xs, {"axis": int(axis)}, infer, _same(*(x.dtype for x in xs)), name)


def stack(xs: Sequence, axis: int = 0, *, name: str | None = None):
    """Stack equally shaped ``xs`` along a new ``axis``."""
    xs = _handles(list(xs))
    infer = partial(shapes.stack, [x.shape for x in xs], axis)
    return _node("stack", xs, {"axis": int(axis)}, infer, _same(*(x.dtype for x in xs)), name)


# ---------------------------------------------------------------- indexing by data


def _indices(indices, graph):
    """An int64 Handle, or ints (any integer array-like) as an int64 const of ``graph``."""
    if _is_handle(indices):
        if indices.dtype not in (None, "int64"):
            raise TypeError(f"indices must be int64, got a {indices.dtype} Handle")
        return indices
    array = np.asarray(indices)
    if array.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got {array.dtype}")
    return graph.const(array.astype(np.int64))


def gather(x, indices, axis: int = 0, *, name: str | None = None):
    """``np.take(x, indices, axis)``: the result has shape ``x.shape[:axis] + indices.shape +
    x.shape[axis+1:]``. ``indices``: an int64 Handle (input or node) or ints; each must lie in
    [-n, n) for the axis length n (negative ones count from the end), else the request fails
    with INVALID_ARGUMENT naming the node. An embedding lookup is ``gather(table, tokens)``."""
    (x,) = _handles([x])
    indices = _indices(indices, x.graph)
    infer = partial(shapes.gather, x.shape, indices.shape, axis)
    return _node("gather", [x, indices], {"axis": int(axis)}, infer, x.dtype, name)


def scatter_add(updates, indices, size: int, axis: int = 0, *, name: str | None = None):
    """Zeros with ``size`` slots along ``axis``, ``updates``' slices added at ``indices``
    (duplicates add up): the dual of :func:`gather`, whose gradient it is. ``updates`` has the
    indices' shape at axes ``axis .. axis + indices.ndim``."""
    (updates,) = _handles([updates])
    indices = _indices(indices, updates.graph)
    infer = partial(shapes.scatter_add, updates.shape, indices.shape, int(size), axis)
    return _node("scatter_add", [updates, indices], {"size": int(size), "axis": int(axis)}, infer,
                 updates.dtype, name)


def _ints(value) -> tuple[int, ...]:
    """An int or a sequence of ints as a tuple of ints."""
    if isinstance(value, (int, np.integer)):
        return (int(value),)
    return tuple(int(v) for v in value)


# ---------------------------------------------------------------- neural-network ops
# Fused ops have dense per-row edges; `decomposed=True` builds the same value from primitive
# nodes instead, whose paths differ (docs/semirings.md, "Fused and windowed ops").


def softmax(x, axis: int = -1, *, decomposed: bool = False, name: str | None = None):
    """``exp(x) / sum(exp(x))`` along ``axis`` (max-shifted). ``decomposed=True``: built from
    max, sub, exp, sum and div nodes (same values and gradients, other paths)."""
    (x,) = _handles([x])
    if decomposed:
        e = exp(sub(x, max(x, axis, keepdims=True)))
        return div(e, sum(e, axis, keepdims=True), name=name)
    return _node("softmax", [x], {"axis": int(axis)}, partial(shapes.along_axis, x.shape, int(axis)),
                 _floating(x.dtype), name)


def log_softmax(x, axis: int = -1, *, decomposed: bool = False, name: str | None = None):
    """``x - logsumexp(x)`` along ``axis`` (max-shifted). ``decomposed=True``: built from max,
    sub, exp, sum and log nodes."""
    (x,) = _handles([x])
    if decomposed:
        shifted = sub(x, max(x, axis, keepdims=True))
        return sub(shifted, log(sum(exp(shifted), axis, keepdims=True)), name=name)
    return _node("log_softmax", [x], {"axis": int(axis)}, partial(shapes.along_axis, x.shape, int(axis)),
                 _floating(x.dtype), name)


def logsumexp(x, axis=None, keepdims: bool = False, *, decomposed: bool = False, name: str | None = None):
    """``log(sum(exp(x)))`` over ``axis`` (int, tuple of ints, or None: every axis, as
    :func:`sum` and SciPy's and JAX's ``logsumexp`` by default), max-shifted.
    ``decomposed=True``: built from max, sub, exp, sum, log and add nodes."""
    (x,) = _handles([x])
    axes = None if axis is None else _ints(axis)
    if decomposed:
        total = sum(exp(sub(x, max(x, axes, keepdims=True))), axes, keepdims=keepdims)
        return add(log(total), max(x, axes, keepdims=keepdims), name=name)
    attrs = {} if axes is None else {"axes": axes}
    if keepdims:
        attrs["keepdims"] = True
    return _node("logsumexp", [x], attrs, partial(shapes.reduce, x.shape, axes, keepdims), _floating(x.dtype), name)


def layer_norm(x, axes=(-1,), eps: float = 1e-5, *, decomposed: bool = False, name: str | None = None):
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` (biased variance, as PyTorch); the affine
    weight and bias are a separate mul and add. ``decomposed=True``: built from mean, sub, mul,
    add and sqrt nodes."""
    (x,) = _handles([x])
    axes = _ints(axes)
    if decomposed:
        centred = sub(x, mean(x, axes, keepdims=True))
        var = mean(mul(centred, centred), axes, keepdims=True)
        return div(centred, sqrt(add(var, float(eps))), name=name)
    return _node("layer_norm", [x], {"axes": axes, "eps": float(eps)}, partial(shapes.normalized, x.shape, axes),
                 _floating(x.dtype), name)


def _tuple(value, nd: int, what: str) -> tuple[int, ...]:
    """An int or a sequence of ``nd`` ints (PyTorch's int-or-pair arguments) as ``nd`` ints."""
    values = _ints(value)
    if len(values) == 1:
        values = values * nd
    if len(values) != nd:
        raise ValueError(f"{what} must be an int or {nd} ints, got {value!r}")
    return values


def _conv(nd: int, x, w, stride, padding, dilation, groups: int, name: str | None):
    x, w = _handles([x, w])
    attrs = {"stride": _tuple(stride, nd, "stride"), "padding": _tuple(padding, nd, "padding"),
             "dilation": _tuple(dilation, nd, "dilation"), "groups": int(groups)}
    infer = partial(shapes.conv, x.shape, w.shape, attrs["stride"], attrs["padding"], attrs["dilation"], int(groups))
    return _node(f"conv{nd}d", [x, w], attrs, infer, _floating(x.dtype, w.dtype), name)


def conv1d(x, w, stride=1, padding=0, dilation=1, groups: int = 1, *, name: str | None = None):
    """PyTorch's ``conv1d`` without bias: x (N, C, L), w (O, C/groups, K)."""
    return _conv(1, x, w, stride, padding, dilation, groups, name)


def conv2d(x, w, stride=1, padding=0, dilation=1, groups: int = 1, *, name: str | None = None):
    """PyTorch's ``conv2d`` without bias: x (N, C, H, W), w (O, C/groups, KH, KW); stride,
    padding and dilation an int or a pair."""
    return _conv(2, x, w, stride, padding, dilation, groups, name)


def _pool(op: str, nd: int, x, kernel_size, stride, padding, name: str | None):
    (x,) = _handles([x])
    kernel = _tuple(kernel_size, nd, "kernel_size")
    attrs = {"kernel_size": kernel, "stride": kernel if stride is None else _tuple(stride, nd, "stride"),
             "padding": _tuple(padding, nd, "padding")}
    infer = partial(shapes.pool, x.shape, kernel, attrs["stride"], attrs["padding"])
    return _node(op, [x], attrs, infer, _floating(x.dtype), name)


def max_pool1d(x, kernel_size, stride=None, padding=0, *, name: str | None = None):
    """PyTorch's ``max_pool1d`` (x: N, C, L; stride defaults to kernel_size; padding is -inf)."""
    return _pool("max_pool1d", 1, x, kernel_size, stride, padding, name)


def max_pool2d(x, kernel_size, stride=None, padding=0, *, name: str | None = None):
    """PyTorch's ``max_pool2d`` (x: N, C, H, W; stride defaults to kernel_size; padding is -inf)."""
    return _pool("max_pool2d", 2, x, kernel_size, stride, padding, name)


def avg_pool1d(x, kernel_size, stride=None, padding=0, *, name: str | None = None):
    """PyTorch's ``avg_pool1d`` (padding counted as zeros: count_include_pad=True)."""
    return _pool("avg_pool1d", 1, x, kernel_size, stride, padding, name)


def avg_pool2d(x, kernel_size, stride=None, padding=0, *, name: str | None = None):
    """PyTorch's ``avg_pool2d`` (padding counted as zeros: count_include_pad=True)."""
    return _pool("avg_pool2d", 2, x, kernel_size, stride, padding, name)
