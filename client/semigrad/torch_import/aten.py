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


def _operands(b: NodeBuilder, *values):
    """Tensor arguments as they are, Python scalars as consts of the float/int dtype they meet."""
    dtypes = {v.dtype for v in values if _is_handle(v)}
    if len(dtypes) > 1:
        raise Unsupported(f"operands of dtypes {sorted(map(str, dtypes))} need a dtype cast, which semigrad lacks")
    like = next((v.dtype for v in values if _is_handle(v)), None)
    out = []
    for v in values:
        if _is_handle(v):
            out.append(v)
            continue
        if isinstance(v, bool):
            out.append(b.const(np.bool_(v)))
        elif like in ("float64", "float32"):
            out.append(b.const(np.asarray(v, dtype=like)))
        elif like == "int64" and float(v) == int(v) and not isinstance(v, float):
            out.append(b.const(np.int64(v)))
        else:
            raise Unsupported(f"a {type(v).__name__} scalar {v!r} with a {like} tensor needs a dtype cast")
    return out


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
    if x.dtype != "bool":
        x = F.ne(x, b.const(np.zeros((), x.dtype)), name=b.tmp())
    return F.eq(x, b.const(np.bool_(False)), name=b.name)


@op("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(b, x, min=None, max=None):
    if min is None and max is None:
        raise Unsupported("clamp without bounds")
    if not _is_handle(min) and not _is_handle(max):
        return F.clamp(x, min=min, max=max, name=b.name)
    if min is not None:  # tensor bounds: elementwise maximum and minimum
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
    if b.dtype not in (None, x.dtype):
        raise Unsupported(f"a cast from {x.dtype} to {b.dtype} (semigrad has no cast op)")
    return x


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


# ---------------------------------------------------------------- constants

@op("aten.full.default")
def _full(b, size, fill_value, **_):
    return _filled(b, fill_value)


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
    if dtype is not None and b.dtype != x.dtype:
        raise Unsupported("sum with a dtype cast")
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
    return F.cumsum(x, dim, name=b.name)


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
    shape = tuple(index.shape)
    dim %= len(x.shape)
    strides = [int(np.prod(x.shape[a + 1:])) for a in range(len(x.shape))]
    grids = np.indices(shape) if shape else np.zeros((0,), np.int64)
    base = sum(grids[a] * strides[a] for a in range(len(shape)) if a != dim) + np.zeros(shape, np.int64)
    flat_index = F.add(F.mul(index, b.const(np.int64(strides[dim])), name=b.tmp()),
                       b.const(base.astype(np.int64)), name=b.tmp())
    return _take(b, F.reshape(x, (-1,), name=b.tmp()), flat_index, 0, b.name)


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


@op("aten.max_pool2d_with_indices.default", "aten.max_pool1d_with_indices.default")
def _max_pool(b, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = 2 if "2d" in b.target else 1
    if ceil_mode or _pair(dilation, n) != [1] * n:
        raise Unsupported("max pooling with ceil_mode=True or dilation")
    kernel = _pair(kernel_size, n)
    stride = _pair(stride, n) if stride else kernel
    pool = F.max_pool1d if n == 1 else F.max_pool2d
    values = pool(x, tuple(kernel), stride=tuple(stride), padding=tuple(_pair(padding, n)), name=b.name)
    return values, Missing("the indices of max pooling")


@op("aten.avg_pool2d.default", "aten.avg_pool1d.default")
def _avg_pool(b, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    n = 2 if "2d" in b.target else 1
    if ceil_mode or not count_include_pad or divisor_override is not None:
        raise Unsupported("average pooling with ceil_mode, count_include_pad=False or divisor_override")
    kernel = _pair(kernel_size, n)
    stride = _pair(stride, n) if stride else kernel
    padding = _pair(padding, n)
    pool = F.avg_pool1d if n == 1 else F.avg_pool2d
    return pool(x, tuple(kernel), stride=tuple(stride), padding=tuple(padding), name=b.name)


@op("aten._adaptive_avg_pool2d.default")
def _adaptive_avg_pool(b, x, output_size):
    """Adaptive average pooling whose output size divides the input's (ResNet's (1, 1) head, 8×8 to
    4×4): PyTorch's windows are then the average pool of kernel = stride = input // output."""
    spatial = _shape(x)[-2:]
    out = _pair(output_size, 2)
    if any(o is None for o in out):
        out = [s if o is None else o for s, o in zip(spatial, out)]
    if any(o <= 0 or s % o for s, o in zip(spatial, out)):
        raise Unsupported(f"adaptive average pooling of {list(spatial)} to {list(out)} (the output size must "
                          "divide the input size: windows of unequal sizes)")
    kernel = tuple(s // o for s, o in zip(spatial, out))
    return F.avg_pool2d(x, kernel, stride=kernel, padding=(0, 0), name=b.name)
