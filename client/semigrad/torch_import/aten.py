"""The ATen table: one entry per core ATen op, building the semigrad nodes that compute it.

An entry is ``fn(b, *args, **kwargs)``: ``b`` is the :class:`~.builder.NodeBuilder` of one FX
node (its final node id ``b.name``, fresh ids for helper nodes from ``b.tmp()``, scalars as
consts with ``b.const``), the arguments are the FX node's with every tensor argument already a
:class:`semigrad.Handle`. It returns a Handle, or a tuple for ops with several results (an
element that is :class:`Missing` fails only when a later node reads it; one that is
:class:`Lazy` is built only then). An op or argument the
table cannot express raises :class:`Unsupported`; the importer collects every such failure and
reports them together. Ops of the op contract (gather, softmax, layer_norm, conv2d, ...) map
1:1 onto semigrad's functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .. import functions as F
from .builder import Lazy, Missing, NodeBuilder, Unsupported

TABLE: dict[str, Callable] = {}


def op(*names: str):
    """Register the decorated function for the ATen overloads ``names`` (``"aten.add.Tensor"``)."""

    def register(fn):
        for name in names:
            TABLE[name] = fn
        return fn

    return register


def _is_handle(x) -> bool:
    return hasattr(x, "graph") and hasattr(x, "id")


def _dims(dim, rank: int) -> tuple[int, ...] | None:
    """A torch ``dim`` argument (int, list, None or []) as axes; None means every axis."""
    if dim is None:
        return None
    if isinstance(dim, int):
        return (dim,)
    dim = tuple(int(d) for d in dim)
    return dim or None


def _shape(h) -> tuple[int, ...]:
    return tuple(h.shape)


_FLOATS = ("float64", "float32")


def _promoted(values, result: str | None) -> str | None:
    """torch's type promotion of ``values`` (Handles and Python scalars): the float dtype of a float
    tensor; else, with a Python float, the op's result dtype when it is a float (else float64);
    else int64 when ints meet bools; else the one dtype they share."""
    dtypes = {v.dtype for v in values if _is_handle(v)}
    floats = dtypes & set(_FLOATS)
    if len(floats) > 1:
        raise Unsupported(f"operands of dtypes {sorted(floats)} need a cast between float dtypes, which "
                          "semigrad lacks (export the model in one dtype)")
    if floats:
        return floats.pop()
    if any(isinstance(v, float) for v in values):
        return result if result in _FLOATS else "float64"
    if dtypes == {"int64", "bool"}:
        return "int64"
    return next(iter(dtypes), None)


def _operands(b: NodeBuilder, *values):
    """Tensor arguments promoted to one dtype as torch does (an int or bool tensor meeting a float
    one is cast: :func:`_cast`), Python scalars as consts of that dtype."""
    like = _promoted(values, b.dtype)
    out = []
    for v in values:
        if _is_handle(v):
            out.append(_cast(b, v, like, b.tmp()) if like is not None and v.dtype not in (None, like) else v)
        elif isinstance(v, bool) and like in (None, "bool"):
            out.append(b.const(np.bool_(v)))
        elif like in _FLOATS:
            out.append(b.const(np.asarray(v, dtype=like)))
        elif like == "int64" and float(v) == int(v) and not isinstance(v, float):
            out.append(b.const(np.int64(v)))
        else:
            raise Unsupported(f"a {type(v).__name__} scalar {v!r} with a {like} tensor needs a dtype cast")
    return out


def _cast(b: NodeBuilder, x, dtype: str, name: str):
    """``x`` as ``dtype``, for the casts that are exact without a cast op: bool to a number
    (``where(x, 1, 0)``), a number to bool (``x != 0``), int64 to float64 (``x + 0.0``: NumPy's
    promotion, exact below 2**53 as torch's cast). Casts between float dtypes, and from floats to
    ints, are refused: semigrad has no cast op."""
    if x.dtype == dtype:
        return x
    if x.dtype == "bool":
        one, zero = b.const(np.ones((), dtype)), b.const(np.zeros((), dtype))
        return F.where(x, one, zero, name=name)
    if dtype == "bool":
        return F.ne(x, b.const(np.zeros((), x.dtype)), name=name)
    if x.dtype == "int64" and dtype == "float64":
        return x.graph.add_node("add", [x, b.const(np.zeros((), dtype))], shape=x.shape, dtype=dtype, name=name)
    raise Unsupported(f"a cast from {x.dtype} to {dtype} (semigrad has no cast op; the casts it can express "
                      "are bool to numbers, numbers to bool and int64 to float64)")


# ---------------------------------------------------------------- elementwise

def _unary(name: str, fn):
    @op(name)
    def entry(b, x):
        return fn(x, name=b.name)

    return entry


for _name, _fn in {
    "aten.abs.default": F.abs, "aten.neg.default": F.neg, "aten.exp.default": F.exp,
    "aten.log.default": F.log, "aten.log1p.default": F.log1p, "aten.expm1.default": F.expm1,
    "aten.sqrt.default": F.sqrt, "aten.sin.default": F.sin, "aten.cos.default": F.cos,
    "aten.tan.default": F.tan, "aten.tanh.default": F.tanh, "aten.sigmoid.default": F.sigmoid,
    "aten.relu.default": F.relu, "aten.erf.default": F.erf, "aten.sign.default": F.sign,
    "aten.atan.default": lambda x, name: F.elementwise("atan", x, name=name),
    "aten.asinh.default": lambda x, name: F.elementwise("asinh", x, name=name),
}.items():
    _unary(_name, _fn)


@op("aten.rsqrt.default")
def _rsqrt(b, x):
    return F.div(b.const(np.asarray(1.0, dtype=x.dtype)), F.sqrt(x, name=b.tmp()), name=b.name)


@op("aten.reciprocal.default")
def _reciprocal(b, x):
    return F.div(b.const(np.asarray(1.0, dtype=x.dtype)), x, name=b.name)


@op("aten.gelu.default")
def _gelu(b, x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"gelu approximate={approximate!r}")
    return F.gelu(x, approximate=approximate, name=b.name)


def _binary(names: Sequence[str], fn, scaled: bool = False):
    @op(*names)
    def entry(b, x, y, *, alpha=1):
        x, y = _operands(b, x, y)
        if scaled and alpha != 1:  # add/sub(x, y, alpha=a) is x ± a y
            (a,) = _operands(b, y, alpha)[1:]
            y = F.mul(a, y, name=b.tmp())
        return fn(x, y, name=b.name)

    return entry


_binary(["aten.add.Tensor", "aten.add.Scalar"], F.add, scaled=True)
_binary(["aten.sub.Tensor", "aten.sub.Scalar"], F.sub, scaled=True)
_binary(["aten.mul.Tensor", "aten.mul.Scalar"], F.mul)
_binary(["aten.div.Tensor", "aten.div.Scalar"], F.div)
_binary(["aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", "aten.pow.Scalar"], F.pow)
_binary(["aten.maximum.default"], F.maximum)
_binary(["aten.minimum.default"], F.minimum)
for _cmp in ("eq", "ne", "lt", "le", "gt", "ge"):
    _binary([f"aten.{_cmp}.Tensor", f"aten.{_cmp}.Scalar"], getattr(F, _cmp))


@op("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(b, x, y, *, alpha=1):
    x, y = _operands(b, x, y)
    if alpha != 1:
        (a,) = _operands(b, x, alpha)[1:]
        x = F.mul(a, x, name=b.tmp())
    return F.sub(y, x, name=b.name)


@op("aten.div.Tensor_mode")
def _div_mode(b, x, y, *, rounding_mode=None):
    if rounding_mode is not None:
        raise Unsupported(f"div with rounding_mode={rounding_mode!r}")
    x, y = _operands(b, x, y)
    return F.div(x, y, name=b.name)


@op("aten.where.self")
def _where(b, cond, x, y):
    x, y = _operands(b, x, y)
    return F.where(cond, x, y, name=b.name)


@op("aten.logical_not.default")
def _logical_not(b, x):
    x = _cast(b, x, "bool", b.tmp())
    return F.eq(x, b.const(np.bool_(False)), name=b.name)


@op("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(b, x, min=None, max=None):
    if min is None and max is None:
        raise Unsupported("clamp without bounds")
    if not _is_handle(min) and not _is_handle(max) and x.dtype in _FLOATS:
        return F.clamp(x, min=min, max=max, name=b.name)
    if min is not None:  # tensor bounds, or integers: elementwise maximum and minimum
        x = F.maximum(*_operands(b, x, min), name=b.name if max is None else b.tmp())
    if max is not None:
        x = F.minimum(*_operands(b, x, max), name=b.name)
    return x


@op("aten.hardtanh.default")
def _hardtanh(b, x, min_val=-1.0, max_val=1.0):
    return _clamp(b, x, min_val, max_val)


@op("aten.leaky_relu.default")
def _leaky_relu(b, x, negative_slope=0.01):
    zero = b.const(np.zeros((), x.dtype))
    return F.where(F.gt(x, zero, name=b.tmp()), x,
                   F.mul(x, b.const(np.asarray(negative_slope, x.dtype)), name=b.tmp()), name=b.name)


@op("aten.elu.default")
def _elu(b, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """torch's ELU (and SELU, CELU, which decompose to it): ``scale·x`` above 0, else
    ``scale·alpha·(exp(input_scale·x) - 1)``."""
    def c(v):
        return b.const(np.asarray(v, x.dtype))

    positive = x if scale == 1 else F.mul(x, c(scale), name=b.tmp())
    inner = x if input_scale == 1 else F.mul(x, c(input_scale), name=b.tmp())
    negative = F.mul(F.expm1(inner, name=b.tmp()), c(alpha * scale), name=b.tmp())
    return F.where(F.gt(x, c(0), name=b.tmp()), positive, negative, name=b.name)


@op("aten.exp2.default")
def _exp2(b, x):
    return F.pow(b.const(np.asarray(2.0, x.dtype)), x, name=b.name)


@op("aten.isnan.default")
def _isnan(b, x):
    return F.ne(x, x, name=b.name)


@op("aten.isinf.default")
def _isinf(b, x):
    return F.eq(F.abs(x, name=b.tmp()), b.const(np.asarray(np.inf, x.dtype)), name=b.name)


def _bools(b, *xs):
    for x in xs:
        if _is_handle(x) and x.dtype != "bool":
            raise Unsupported(f"a bitwise or logical op on {x.dtype} (semigrad has them for bools only)")
    return [x if _is_handle(x) else b.const(np.bool_(x)) for x in xs]


@op("aten.logical_and.default", "aten.bitwise_and.Tensor")
def _logical_and(b, x, y):
    x, y = _bools(b, x, y)
    return F.where(x, y, b.const(np.bool_(False)), name=b.name)


@op("aten.logical_or.default", "aten.bitwise_or.Tensor")
def _logical_or(b, x, y):
    x, y = _bools(b, x, y)
    return F.where(x, b.const(np.bool_(True)), y, name=b.name)


@op("aten.logical_xor.default", "aten.bitwise_xor.Tensor")
def _logical_xor(b, x, y):
    x, y = _bools(b, x, y)
    return F.ne(x, y, name=b.name)


@op("aten.bitwise_not.default")
def _bitwise_not(b, x):
    (x,) = _bools(b, x)
    return F.eq(x, b.const(np.bool_(False)), name=b.name)


# ---------------------------------------------------------------- identities and dtype

@op("aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default", "aten.contiguous.default")
def _identity(b, x, **_):
    return x


@op("aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.msg",
    "aten.sym_constrain_range_for_size.default")
def _assertion(b, *args, **kwargs):
    """Checks torch.export adds at trace time (shapes and dtypes are static here): no value."""
    return None


@op("aten._to_copy.default")
def _to_copy(b, x, *, dtype=None, **_):
    return x if b.dtype in (None, x.dtype) else _cast(b, x, b.dtype, b.name)


@op("aten.dropout.default", "aten.native_dropout.default")
def _dropout(b, x, p, train):
    if train:
        raise Unsupported("dropout in training mode (put the module in eval mode)")
    return x


# ---------------------------------------------------------------- shapes

@op("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(b, x, size):
    target = b.shape
    return x if _shape(x) == target else F.reshape(x, target, name=b.name)


@op("aten.unsqueeze.default", "aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def _squeeze(b, x, *dims):
    target = b.shape
    return x if _shape(x) == target else F.reshape(x, target, name=b.name)


@op("aten.permute.default")
def _permute(b, x, dims):
    dims = [d % len(x.shape) for d in dims]
    return x if dims == sorted(dims) else F.transpose(x, dims, name=b.name)


@op("aten.expand.default")
def _expand(b, x, size):
    target = b.shape
    return x if _shape(x) == target else F.broadcast_to(x, target, name=b.name)


@op("aten.select.int")
def _select(b, x, dim, index):
    dim %= len(x.shape)
    return F.index(x, (slice(None),) * dim + (int(index),), name=b.name)


@op("aten.slice.Tensor")
def _slice(b, x, dim=0, start=None, end=None, step=1):
    dim %= len(x.shape)
    n = x.shape[dim]
    start, end, step = slice(start, end, step).indices(n)  # torch clamps out-of-range bounds
    if (start, end, step) == (0, n, 1):
        return x
    return F.index(x, (slice(None),) * dim + (slice(start, end, step),), name=b.name)


@op("aten.cat.default")
def _cat(b, tensors, dim=0):
    tensors = [t for t in tensors if not (len(t.shape) == 1 and t.shape[0] == 0)]  # torch skips empty 1-D
    if len(tensors) == 1:
        return tensors[0]
    return F.concat(tensors, axis=dim, name=b.name)


@op("aten.split_with_sizes.default", "aten.split.Tensor")
def _split(b, x, sizes, dim=0):
    dim %= len(x.shape)
    n = x.shape[dim]
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)]
    out, start = [], 0
    for k, size in enumerate(sizes):
        out.append(F.index(x, (slice(None),) * dim + (slice(start, start + size),), name=b.tmp()))
        start += size
    return tuple(out)


@op("aten.unbind.int")
def _unbind(b, x, dim=0):
    dim %= len(x.shape)
    return tuple(F.index(x, (slice(None),) * dim + (k,), name=b.tmp()) for k in range(x.shape[dim]))


@op("aten.flip.default")
def _flip(b, x, dims):
    key = [slice(None)] * len(x.shape)
    for d in dims:
        key[d % len(x.shape)] = slice(None, None, -1)
    return F.index(x, tuple(key), name=b.name)


@op("aten.constant_pad_nd.default")
def _pad(b, x, pad, value=0.0):
    return _padded(b, x, [(pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)], value, b.name)


def _padded(b, x, pads, value, name):
    """``x`` padded with ``value``: ``pads[i]`` = (before, after) for the i-th axis from the last."""
    rank = len(x.shape)
    for i, (before, after) in enumerate(pads):
        if before < 0 or after < 0:
            raise Unsupported("negative padding")
        axis = rank - 1 - i
        parts = []
        for width in (before, after):
            shape = list(x.shape)
            shape[axis] = width
            parts.append(F.broadcast_to(b.const(np.asarray(value, x.dtype)), shape, name=b.tmp()) if width else None)
        pieces = [p for p in (parts[0], x, parts[1]) if p is not None]
        if len(pieces) > 1:
            last = all(q == (0, 0) for q in pads[i + 1:])
            x = F.concat(pieces, axis=axis, name=name if last else b.tmp())
    return x


@op("aten.repeat.default")
def _repeat(b, x, repeats):
    """``x.repeat(r0, r1, ...)``: x (with leading 1s up to ``len(repeats)`` axes) tiled: each axis
    (s) becomes (r, s) by a broadcast, then r·s by a reshape."""
    shape = (1,) * (len(repeats) - len(x.shape)) + _shape(x)
    interleaved = tuple(d for s in shape for d in (1, s))
    tiled = tuple(d for r, s in zip(repeats, shape) for d in (r, s))
    spread = F.broadcast_to(F.reshape(x, interleaved, name=b.tmp()), tiled, name=b.tmp())
    return F.reshape(spread, tuple(r * s for r, s in zip(repeats, shape)), name=b.name)


@op("aten.index.Tensor")
def _index(b, x, indices):
    """Advanced indexing ``x[..., i, j, ...]`` with int64 index tensors (None: a whole axis), as
    NumPy and torch do it: one index is a gather along its axis; several are broadcast together
    and gather from their axes flattened into one (moved first when not adjacent, as torch does)."""
    indices = list(indices) + [None] * (len(x.shape) - len(indices))
    used = [a for a, i in enumerate(indices) if i is not None]
    for a in used:
        if indices[a].dtype != "int64":
            raise Unsupported(f"indexing with a {indices[a].dtype} tensor (a boolean mask has a shape that "
                              "depends on the data; semigrad's shapes are static)")
    if len(used) == 1:
        return _take(b, x, indices[used[0]], used[0], b.name)
    if used != list(range(used[0], used[-1] + 1)):  # not adjacent: the indexed axes go first
        perm = used + [a for a in range(len(x.shape)) if a not in used]
        x = F.transpose(x, perm, name=b.tmp())
        indices = [indices[a] for a in perm]
        used = list(range(len(used)))
    first, last = used[0], used[-1]
    sizes = _shape(x)[first:last + 1]
    flat = None
    for a, size in zip(used, sizes):
        i = indices[a]
        i = F.where(F.lt(i, b.const(np.int64(0)), name=b.tmp()), F.add(i, b.const(np.int64(size)), name=b.tmp()),
                    i, name=b.tmp())  # negative indices count from the end
        stride = math.prod(sizes[a - first + 1:])
        term = i if stride == 1 else F.mul(i, b.const(np.int64(stride)), name=b.tmp())
        flat = term if flat is None else F.add(flat, term, name=b.tmp())
    merged = F.reshape(x, _shape(x)[:first] + (math.prod(sizes),) + _shape(x)[last + 1:], name=b.tmp())
    return _take(b, merged, flat, first, b.name)


@op("aten.upsample_nearest2d.vec", "aten.upsample_nearest1d.vec", "aten._upsample_nearest_exact2d.vec",
    "aten._upsample_nearest_exact1d.vec")
def _upsample_nearest(b, x, output_size, scale_factors):
    """Nearest-neighbour resizing: a gather per spatial axis at constant source indices, computed
    as torch computes them (in float32: ``floor(o·scale)``, "exact": ``floor((o + ½)·scale)``,
    scale = 1/scale_factor when given, else in/out)."""
    n = 2 if "2d" in b.target else 1
    out = b.shape[-n:]
    for axis in range(n):
        size, o = _shape(x)[-n + axis], out[axis]
        scale = np.float32(1.0 / scale_factors[axis]) if scale_factors else np.float32(size / o)
        position = np.arange(o, dtype=np.float32) + (np.float32(0.5) if "exact" in b.target else np.float32(0))
        source = np.minimum(np.floor(position * scale).astype(np.int64), size - 1)
        last = axis == n - 1
        x = _take(b, x, b.const(source), len(x.shape) - n + axis, b.name if last else b.tmp())
    return x


@op("aten.slice_scatter.default")
def _slice_scatter(b, x, src, dim=0, start=None, end=None, step=1):
    """``x`` with ``x[..., start:end, ...]`` (along ``dim``) replaced by ``src``: a concat of the
    parts of x before and after the slice around src."""
    dim %= len(x.shape)
    n = x.shape[dim]
    start, end, step = slice(start, end, step).indices(n)
    if step != 1:
        raise Unsupported("slice_scatter with a step")
    pieces = [F.index(x, (slice(None),) * dim + (slice(0, start),), name=b.tmp()) if start > 0 else None, src,
              F.index(x, (slice(None),) * dim + (slice(end, n),), name=b.tmp()) if end < n else None]
    pieces = [p for p in pieces if p is not None]
    return pieces[0] if len(pieces) == 1 else F.concat(pieces, axis=dim, name=b.name)


@op("aten.copy.default")
def _copy(b, x, src, non_blocking=False):
    """``x.copy_(src)`` made functional: src (broadcast to x's shape), x's values unread."""
    (src,) = _operands(b, src) if _is_handle(src) else (src,)
    if src.dtype not in (None, x.dtype):
        src = _cast(b, src, x.dtype, b.tmp())
    return src if _shape(src) == _shape(x) else F.broadcast_to(src, _shape(x), name=b.name)


# ---------------------------------------------------------------- constants

@op("aten.full.default")
def _full(b, size, fill_value, **_):
    return _filled(b, fill_value)


@op("aten.empty.memory_format", "aten.empty_like.default")
def _empty(b, *args, **_):
    """An uninitialised tensor (torch's values are whatever memory held): zeros here. Exported
    programs write it (copy, slice_scatter) before reading it."""
    return _filled(b, 0)


@op("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default")
def _full_like(b, x, fill_value=None, **_):
    fill = {"aten.zeros_like.default": 0, "aten.ones_like.default": 1}.get(b.target, fill_value)
    return _filled(b, fill)


@op("aten.scalar_tensor.default")
def _scalar_tensor(b, value, **_):
    return b.const(np.asarray(value, b.dtype), name=b.name)


@op("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def _arange(b, *args, **_):
    return b.const(np.arange(*args).astype(b.dtype), name=b.name)


def _filled(b, fill):
    value = b.const(np.asarray(fill, b.dtype))
    return value if not b.shape else F.broadcast_to(value, b.shape, name=b.name)


# ---------------------------------------------------------------- reductions

@op("aten.sum.dim_IntList", "aten.sum.default")
def _sum(b, x, dim=None, keepdim=False, *, dtype=None):
    # torch sums bools as int64, and casts first when given a dtype
    x = _cast(b, x, b.dtype, b.tmp()) if b.dtype not in (None, x.dtype) else x
    return F.sum(x, _dims(dim, len(x.shape)), keepdim, name=b.name)


@op("aten.mean.dim", "aten.mean.default")
def _mean(b, x, dim=None, keepdim=False, *, dtype=None):
    return F.mean(x, _dims(dim, len(x.shape)), keepdim, name=b.name)


@op("aten.amax.default")
def _amax(b, x, dim=(), keepdim=False):
    return F.max(x, _dims(dim, len(x.shape)), keepdim, name=b.name)


@op("aten.amin.default")
def _amin(b, x, dim=(), keepdim=False):
    return _min(b, x, _dims(dim, len(x.shape)), keepdim, b.name)


def _min(b, x, axes, keepdim, name):
    return F.min(x, axes, keepdim, name=name)


@op("aten.max.dim")
def _max_dim(b, x, dim, keepdim=False):
    return F.max(x, dim, keepdim, name=b.name), Lazy(lambda: F.argmax(x, dim, keepdim, name=b.tmp()))


@op("aten.min.dim")
def _min_dim(b, x, dim, keepdim=False):
    return F.min(x, dim, keepdim, name=b.name), Lazy(lambda: F.argmin(x, dim, keepdim, name=b.tmp()))


@op("aten.argmax.default", "aten.argmin.default")
def _argmax(b, x, dim=None, keepdim=False):
    arg = F.argmax if "argmax" in b.target else F.argmin
    if dim is None and keepdim:  # torch keeps every axis as 1
        return F.reshape(arg(x, None, name=b.tmp()), b.shape, name=b.name)
    return arg(x, dim, keepdim, name=b.name)


@op("aten.cumsum.default")
def _cumsum(b, x, dim, *, dtype=None):
    x = _cast(b, x, b.dtype, b.tmp()) if b.dtype not in (None, x.dtype) else x
    if x.dtype in _FLOATS:
        return F.cumsum(x, dim, name=b.name)
    # integers (a count of tokens so far): semigrad's cumsum is a float scan, so sum the masked
    # prefix, x[..., j, ...] for j <= i, exactly in int64 (n² elements for an axis of n)
    dim %= len(x.shape)
    n = x.shape[dim]
    spread = list(x.shape)
    spread.insert(dim, n)  # axis dim: i (the output's), axis dim + 1: j
    lower = np.tril(np.ones((n, n), bool)).reshape((n, n) + (1,) * (len(x.shape) - dim - 1))
    rows = F.broadcast_to(F.reshape(x, x.shape[:dim] + (1,) + x.shape[dim:], name=b.tmp()), spread, name=b.tmp())
    masked = F.where(b.const(lower), rows, b.const(np.zeros((), x.dtype)), name=b.tmp())
    return F.sum(masked, dim + 1, name=b.name)


@op("aten.any.dim", "aten.any.dims", "aten.any.default")
def _any(b, x, dim=None, keepdim=False):
    flag = x if x.dtype == "bool" else F.ne(x, b.const(np.zeros((), x.dtype)), name=b.tmp())
    ones = F.where(flag, b.const(np.float64(1)), b.const(np.float64(0)), name=b.tmp())
    total = F.sum(ones, _dims(dim, len(x.shape)), keepdim, name=b.tmp())
    return F.gt(total, b.const(np.float64(0)), name=b.name)


@op("aten.var.correction", "aten.var.dim")
def _var(b, x, dim=None, *, correction=None, keepdim=False, unbiased=None):
    axes = _dims(dim, len(x.shape))
    n = math.prod(x.shape) if axes is None else math.prod(x.shape[a] for a in axes)
    c = 1 if correction is None and unbiased is not False else (correction or 0)
    centred = F.sub(x, F.mean(x, axes, True, name=b.tmp()), name=b.tmp())
    total = F.sum(F.mul(centred, centred, name=b.tmp()), axes, keepdim, name=b.tmp())
    return F.div(total, b.const(np.asarray(n - c, x.dtype)), name=b.name)


@op("aten.linalg_vector_norm.default")
def _vector_norm(b, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The p-norm over ``dim``: (Σ|x|^p)^(1/p); 2 as sqrt(Σ x·x), 1 as Σ|x|, ±inf as max/min |x|,
    0 as the count of nonzeros. At an all-zero vector torch's 2-norm gradient is 0, this one's NaN
    (the derivative of sqrt at 0)."""
    if dtype is not None and b.dtype != x.dtype:
        raise Unsupported("vector_norm with a dtype cast")
    axes = _dims(dim, len(x.shape))
    ord = float(ord)
    if ord == 2:
        total = F.sum(F.mul(x, x, name=b.tmp()), axes, keepdim, name=b.tmp())
        return F.sqrt(total, name=b.name)
    if ord == 0:
        nonzero = _cast(b, F.ne(x, b.const(np.zeros((), x.dtype)), name=b.tmp()), x.dtype, b.tmp())
        return F.sum(nonzero, axes, keepdim, name=b.name)
    magnitude = F.abs(x, name=b.tmp())
    if ord == 1:
        return F.sum(magnitude, axes, keepdim, name=b.name)
    if math.isinf(ord):
        return (F.max if ord > 0 else F.min)(magnitude, axes, keepdim, name=b.name)
    powered = F.pow(magnitude, b.const(np.asarray(ord, x.dtype)), name=b.tmp())
    total = F.sum(powered, axes, keepdim, name=b.tmp())
    return F.pow(total, b.const(np.asarray(1.0 / ord, x.dtype)), name=b.name)


@op("aten.topk.default")
def _topk(b, x, k, dim=-1, largest=True, sorted=True):
    """The k largest (smallest) along ``dim``, in order, and their indices: k rounds of argmax
    (argmin), each reading its value with a gather and masking its position out with ∓inf. The
    values' gradient flows through the gathers (to the chosen elements, as torch's); the indices
    have none. Ties go to the smallest index. Costs k passes over the axis."""
    rank = len(x.shape)
    dim %= max(rank, 1)
    if not rank:
        return x, b.const(np.int64(0))
    n = x.shape[dim]
    arg = F.argmax if largest else F.argmin
    fill = b.const(np.asarray(-np.inf if largest else np.inf, x.dtype))
    position = b.const(np.arange(n, dtype=np.int64).reshape((n,) + (1,) * (rank - dim - 1)))
    values, indices, rest = [], [], x
    for j in range(k):
        index = arg(rest, dim, True, name=b.tmp())
        values.append(_take_along(b, x, dim, index, b.tmp()))
        indices.append(index)
        if j < k - 1:
            rest = F.where(F.eq(position, index, name=b.tmp()), fill, rest, name=b.tmp())
    if k == 1:
        return values[0], indices[0]
    return F.concat(values, axis=dim, name=b.name), F.concat(indices, axis=dim, name=b.tmp())


# ---------------------------------------------------------------- matrix products

@op("aten.mm.default", "aten.bmm.default")
def _mm(b, x, y):
    return F.matmul(x, y, name=b.name)


@op("aten.addmm.default", "aten.baddbmm.default")
def _addmm(b, bias, x, y, *, beta=1, alpha=1):
    product = F.matmul(x, y, name=b.tmp())
    if alpha != 1:
        product = F.mul(product, b.const(np.asarray(alpha, product.dtype)), name=b.tmp())
    if beta == 0:
        return product
    if beta != 1:
        bias = F.mul(bias, b.const(np.asarray(beta, bias.dtype)), name=b.tmp())
    return F.add(bias, product, name=b.name)


# ---------------------------------------------------------------- embedding / gather

@op("aten.embedding.default")
def _embedding(b, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        raise Unsupported("embedding with scale_grad_by_freq=True")
    if padding_idx is None or padding_idx < 0:
        return _take(b, weight, indices, 0, b.name)
    # torch's lookup of padding_idx is an ordinary read, but its backward gives that row no
    # gradient (nn.Embedding(padding_idx=0), BERT's): where a token is the padding index, the
    # looked-up row goes through an identity whose derivative is 0 (no path in any semiring)
    looked = _take(b, weight, indices, 0, b.tmp())
    detach = b.graph.op("embedding_padding_row", ["x"], "x", {"x": "0"},
                        doc="the identity with derivative 0: the padding row of an embedding")
    padding = F.eq(indices, b.const(np.asarray(padding_idx, np.int64)), name=b.tmp())
    padding = F.reshape(padding, _shape(indices) + (1,), name=b.tmp())
    return F.where(padding, detach(looked, name=b.tmp()), looked, name=b.name)


@op("aten.index_select.default")
def _index_select(b, x, dim, index):
    if not index.shape:  # torch reads a 0-d index as one index
        index = F.reshape(index, (1,), name=b.tmp())
    return _take(b, x, index, dim, b.name)


@op("aten.gather.default")
def _gather_along(b, x, dim, index, *, sparse_grad=False):
    """``torch.gather`` (``np.take_along_axis``): a take from the flattened ``x`` at
    ``index * stride[dim] + (the flat offset of every other axis)``."""
    return _take_along(b, x, dim, index, b.name)


def _flat_index(b, shape, dim, index):
    """The int64 positions in a flattened tensor of ``shape`` of ``torch.gather``'s and
    ``scatter_add``'s ``index`` along ``dim`` (``index[p]`` at ``dim``, ``p`` at every other axis)."""
    ishape = tuple(index.shape)
    strides = [math.prod(shape[a + 1:]) for a in range(len(shape))]
    grids = np.indices(ishape) if ishape else np.zeros((0,), np.int64)
    base = sum(grids[a] * strides[a] for a in range(len(ishape)) if a != dim) + np.zeros(ishape, np.int64)
    return F.add(F.mul(index, b.const(np.int64(strides[dim])), name=b.tmp()),
                 b.const(base.astype(np.int64)), name=b.tmp())


def _take_along(b, x, dim, index, name):
    dim %= len(x.shape)
    return _take(b, F.reshape(x, (-1,), name=b.tmp()), _flat_index(b, _shape(x), dim, index), 0, name)


@op("aten.scatter_add.default")
def _scatter_add_along(b, x, dim, index, src):
    """``x.scatter_add(dim, index, src)``: ``src[p]`` added to x at ``index[p]`` along ``dim`` and
    ``p`` elsewhere: semigrad's scatter_add into the flattened x at the positions torch.gather
    would read (the two are each other's adjoint)."""
    dim %= len(x.shape)
    ishape = _shape(index)
    if _shape(src) != ishape:  # torch reads only src[:index.shape]
        src = F.index(src, tuple(slice(0, s) for s in ishape), name=b.tmp())
    flat = F.reshape(_flat_index(b, _shape(x), dim, index), (-1,), name=b.tmp())
    added = F.scatter_add(F.reshape(src, (-1,), name=b.tmp()), flat, math.prod(_shape(x)), name=b.tmp())
    return F.add(x, F.reshape(added, _shape(x), name=b.tmp()), name=b.name)


@op("aten.index_put.default")
def _index_put(b, x, indices, values, accumulate=False):
    """``x.index_put(indices, values, accumulate=True)`` (``index_add``, ``x[i] += v``) with one
    index tensor: x plus semigrad's scatter_add of ``values`` at those indices. Without
    accumulate, an assignment whose result depends on which duplicate index wins is refused."""
    if not accumulate:
        raise Unsupported("index_put without accumulate (an indexed assignment x[i] = v; x[i] += v and "
                          "index_add are supported)")
    used = [a for a, i in enumerate(indices) if i is not None]
    if len(used) != 1 or len(indices[used[0]].shape) != 1 or indices[used[0]].dtype != "int64":
        raise Unsupported("index_put with other than one 1-D int64 index tensor")
    axis = used[0]
    index = indices[axis]
    target = _shape(x)[:axis] + _shape(index) + _shape(x)[axis + 1:]
    values = _operands(b, x, values)[1]
    if _shape(values) != target:
        values = F.broadcast_to(values, target, name=b.tmp())
    added = F.scatter_add(values, index, x.shape[axis], axis=axis, name=b.tmp())
    return F.add(x, added, name=b.name)


def _take(b, x, indices, axis, name):
    """``np.take(x, indices, axis)``: the op contract's gather."""
    return F.gather(x, indices, axis=axis, name=name)


# ---------------------------------------------------------------- normalisation

@op("aten._softmax.default")
def _softmax(b, x, dim, half_to_float=False):
    return F.softmax(x, axis=dim, decomposed=b.decomposed, name=b.name)


@op("aten._log_softmax.default")
def _log_softmax(b, x, dim, half_to_float=False):
    return F.log_softmax(x, axis=dim, decomposed=b.decomposed, name=b.name)


@op("aten.logsumexp.default")
def _logsumexp(b, x, dim, keepdim=False):
    return F.logsumexp(x, axis=_dims(dim, len(x.shape)), keepdims=keepdim, decomposed=b.decomposed, name=b.name)


@op("aten.native_layer_norm.default")
def _layer_norm(b, x, normalized_shape, weight, bias, eps):
    axes = tuple(range(-len(normalized_shape), 0))
    y = F.layer_norm(x, axes=axes, eps=eps, decomposed=b.decomposed,
                     name=b.name if weight is None and bias is None else b.tmp())
    if weight is not None:
        y = F.mul(y, weight, name=b.name if bias is None else b.tmp())
    if bias is not None:
        y = F.add(y, bias, name=b.name)
    missing = Missing("the mean and rstd results of native_layer_norm")
    return y, missing, missing


@op("aten.native_group_norm.default")
def _group_norm(b, x, weight, bias, N, C, HxW, group, eps):
    """Group norm: a layer norm over each group's channels and positions (x as (N, G, C/G·HxW)),
    then the per-channel affine part."""
    y = F.layer_norm(F.reshape(x, (N, group, -1), name=b.tmp()), axes=(-1,), eps=eps, decomposed=b.decomposed,
                     name=b.tmp())
    y = F.reshape(y, _shape(x), name=b.name if weight is None and bias is None else b.tmp())
    return _affine(b, y, weight, bias, len(x.shape)), Missing("the mean of group_norm"), Missing("the rstd of group_norm")


@op("aten._native_batch_norm_legit.no_stats")
def _batch_norm_batch_stats(b, x, weight, bias, training, momentum, eps):
    """Batch norm with the batch's own statistics and no running ones (instance norm, which torch
    runs as a batch norm of (1, N·C, ...)): a layer norm over every axis but the channels (1)."""
    axes = (0,) + tuple(range(2, len(x.shape)))
    y = F.layer_norm(x, axes=axes, eps=eps, decomposed=b.decomposed,
                     name=b.name if weight is None and bias is None else b.tmp())
    return _affine(b, y, weight, bias, len(x.shape)), Missing("the mean of batch_norm"), Missing("the rstd of batch_norm")


def _affine(b, y, weight, bias, rank):
    """``y · weight + bias`` per channel (axis 1)."""
    shape = (-1,) + (1,) * (rank - 2)
    if weight is not None:
        y = F.mul(y, F.reshape(weight, shape, name=b.tmp()), name=b.name if bias is None else b.tmp())
    if bias is not None:
        y = F.add(y, F.reshape(bias, shape, name=b.tmp()), name=b.name)
    return y


@op("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(b, x, weight, bias, running_mean, running_var, momentum, eps):
    shape = (-1,) + (1,) * (len(x.shape) - 2)  # per channel (axis 1), broadcast over the rest

    def channel(v):
        return F.reshape(v, shape, name=b.tmp())

    std = F.sqrt(F.add(channel(running_var), b.const(np.asarray(eps, x.dtype)), name=b.tmp()), name=b.tmp())
    y = F.div(F.sub(x, channel(running_mean), name=b.tmp()), std,
              name=b.name if weight is None and bias is None else b.tmp())
    if weight is not None:
        y = F.mul(y, channel(weight), name=b.name if bias is None else b.tmp())
    if bias is not None:
        y = F.add(y, channel(bias), name=b.name)
    missing = Missing("the saved statistics of batch_norm")
    return y, missing, missing


# ---------------------------------------------------------------- convolution and pooling

def _pair(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


@op("aten.convolution.default")
def _convolution(b, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise Unsupported("transposed convolution")
    n = len(w.shape) - 2
    if n not in (1, 2):
        raise Unsupported(f"convolution over {n} spatial dimensions (1 and 2 are supported)")
    conv = F.conv1d if n == 1 else F.conv2d
    y = conv(x, w, stride=tuple(_pair(stride, n)), padding=tuple(_pair(padding, n)),
             dilation=tuple(_pair(dilation, n)), groups=groups, name=b.name if bias is None else b.tmp())
    if bias is None:
        return y
    return F.add(y, F.reshape(bias, (-1,) + (1,) * n, name=b.tmp()), name=b.name)


def _pool_geometry(size, kernel, stride, padding, ceil_mode):
    """torch's pooling windows along one axis of ``size``: the output length, and the padding
    after the input that semigrad's pool (floor mode, symmetric padding) needs to produce it."""
    span = size + 2 * padding - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:  # the last window must start inside
        out -= 1
    return out, max(0, (out - 1) * stride + kernel - span - kernel)


@op("aten.max_pool2d_with_indices.default", "aten.max_pool1d_with_indices.default")
def _max_pool(b, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = 2 if "2d" in b.target else 1
    if _pair(dilation, n) != [1] * n:
        raise Unsupported("max pooling with dilation")
    kernel = _pair(kernel_size, n)
    stride = _pair(stride, n) if stride else kernel
    padding = _pair(padding, n)
    spatial = _shape(x)[-n:]
    extra = [_pool_geometry(*g, ceil_mode)[1] for g in zip(spatial, kernel, stride, padding)]
    if any(extra):  # ceil_mode: windows past the end, -inf there (each still reads an input element)
        x = _padded(b, x, [(0, e) for e in reversed(extra)], -np.inf, b.tmp())
    pool = F.max_pool1d if n == 1 else F.max_pool2d
    values = pool(x, tuple(kernel), stride=tuple(stride), padding=tuple(padding), name=b.name)
    return values, Missing("the indices of max pooling")


@op("aten.adaptive_max_pool2d.default")
def _adaptive_max_pool(b, x, output_size):
    """Adaptive max pooling whose output size divides the input's: the max pool of kernel = stride
    = input // output (unequal windows are refused)."""
    n = 2 if "2d" in b.target else 1
    spatial = _shape(x)[-n:]
    out = [s if o is None else o for s, o in zip(spatial, _pair(output_size, n))]
    if any(o <= 0 or s % o for s, o in zip(spatial, out)):
        raise Unsupported(f"adaptive max pooling of {list(spatial)} to {list(out)} (the output size must divide "
                          "the input size: windows of unequal sizes)")
    kernel = tuple(s // o for s, o in zip(spatial, out))
    pool = F.max_pool1d if n == 1 else F.max_pool2d
    return pool(x, kernel, stride=kernel, padding=(0,) * n, name=b.name), Missing("the indices of max pooling")


@op("aten.avg_pool2d.default", "aten.avg_pool1d.default")
def _avg_pool(b, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    """semigrad's average pool counts padding (count_include_pad=True); torch's other divisors
    (windows clipped to the input, windows past the end in ceil_mode, divisor_override) are that
    average times a constant per output position: kernel area / torch's divisor."""
    n = 2 if "2d" in b.target else 1
    kernel = _pair(kernel_size, n)
    stride = _pair(stride, n) if stride else kernel
    padding = _pair(padding, n)
    pool = F.avg_pool1d if n == 1 else F.avg_pool2d
    spatial = _shape(x)[-n:]
    geometry = [_pool_geometry(*g, ceil_mode) for g in zip(spatial, kernel, stride, padding)]
    extra = [e for _, e in geometry]
    if any(extra):
        x = _padded(b, x, [(0, e) for e in reversed(extra)], 0.0, b.tmp())
    divisor = np.ones((), np.float64)
    for (out, _), size, k, st, p in zip(geometry, spatial, kernel, stride, padding):
        start = np.arange(out) * st - p
        end = np.minimum(start + k, size + p)  # torch: the window stops at the padding's end
        counted = end - start if count_include_pad else np.minimum(end, size) - np.maximum(start, 0)
        divisor = np.multiply.outer(divisor, counted)
    if divisor_override:
        divisor = np.full(divisor.shape, float(divisor_override))
    if np.all(divisor == math.prod(kernel)):
        return pool(x, tuple(kernel), stride=tuple(stride), padding=tuple(padding), name=b.name)
    mean = pool(x, tuple(kernel), stride=tuple(stride), padding=tuple(padding), name=b.tmp())
    return F.mul(mean, b.const((math.prod(kernel) / divisor).astype(x.dtype)), name=b.name)


@op("aten._adaptive_avg_pool2d.default")
def _adaptive_avg_pool(b, x, output_size):
    """Adaptive average pooling. When the output size divides the input's (ResNet's (1, 1) head,
    8×8 to 4×4) PyTorch's windows are the average pool of kernel = stride = input // output;
    otherwise its windows (``floor(o·in/out)`` to ``ceil((o+1)·in/out)``) differ in size and
    overlap, and the pool is a linear map per spatial axis: an einsum with constant averaging
    matrices."""
    n = 2 if "2d" in b.target else 1
    spatial = _shape(x)[-n:]
    out = _pair(output_size, n)
    out = [s if o is None else o for s, o in zip(spatial, out)]
    if all(o > 0 and s % o == 0 for s, o in zip(spatial, out)):
        kernel = tuple(s // o for s, o in zip(spatial, out))
        pool = F.avg_pool1d if n == 1 else F.avg_pool2d
        return pool(x, kernel, stride=kernel, padding=(0,) * n, name=b.name)
    letters = "abcdefgh"[:len(x.shape)]
    matrices, terms, result = [], [letters], letters[:-n]
    for axis, (size, o) in enumerate(zip(spatial, out)):
        weights = np.zeros((o, size), x.dtype)
        for row in range(o):
            start, end = (row * size) // o, -(-((row + 1) * size) // o)
            weights[row, start:end] = 1.0 / (end - start)
        new = "pqrs"[axis]
        matrices.append(b.const(weights))
        terms.append(new + letters[len(x.shape) - n + axis])
        result += new
    return F.einsum(",".join(terms) + "->" + result, x, *matrices, name=b.name)
