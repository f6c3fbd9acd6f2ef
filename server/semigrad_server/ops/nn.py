"""Neural-network ops: the fused normalisations (softmax, log_softmax, logsumexp, layer_norm),
convolution (conv1d, conv2d) and pooling (max/avg, 1-D and 2-D), with PyTorch's layouts and
semantics (x: N, C, spatial...; w: O, C/groups, kernel...).

Everything about each op is here: shape rule, NumPy kernel (vectorised; conv and pooling
loop over kernel offsets only, never over elements, so their scratch memory is one shifted
view at a time), adjoint rule written against the semiring context, and element-level
expansion. Their element-level edges, which path sums see (docs/semirings.md, "Fused and
windowed ops"):

* softmax, log_softmax, layer_norm: fused, so each output element has an edge from every
  input element of its row (the row is the softmax axis, or the layer-norm axes flattened),
  with the dense local Jacobian's entry as partial. Under the real semiring the adjoint is
  the usual O(n) formula; under any other it is exactly a semiring matmul of the lifted
  per-row Jacobian with the adjoint.
* logsumexp: one edge from each input element to its row's output, partial softmax(x).
* conv: an edge from x[n, c, h] to out[n, o, i] with partial w[o, c, k] (k the one kernel
  offset with h = i·stride + k·dilation − padding) and one from w[o, c, k] with partial
  x[n, c, h]; padding makes no element and no edge.
* max_pool: one edge per window, partial 1, from the window's maximum (the first, in
  row-major order over the window, on ties: PyTorch's choice); avg_pool: an edge from each
  element of a window, partial 1/kernel elements (padding counted, PyTorch's default).
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, NamedTuple

import numpy as np

from ..errors import GraphError, ResourceExhausted
from ..ir import Type
from .base import AttrSpec, OpDef, Registry, element_array, normalize_axis, reduce_elements
from .structural import reduce_axes


# Kernel offsets one conv or pool may visit: each is one vectorised step of the kernel and a few
# nodes of the backward graph (docs/limits.md). 64×64 windows; global pooling is `mean`.
MAX_WINDOW_OFFSETS = 4096


def _float_operands(node, in_types) -> str:
    for t in in_types:
        if not t.is_float:
            raise GraphError(node.id, f"op '{node.op}' needs float operands, got {t.dtype}")
    return np.result_type(*(np.dtype(t.dtype) for t in in_types)).name


def _dense(ctx) -> bool:
    """Whether the adjoint must be written edge by edge (any semiring but the real one, whose
    context has no `semiring`): the real one may use the cheaper algebraically equal form."""
    return getattr(ctx, "semiring", None) is not None


def _row_max(x, axis):
    """The max subtracted before exp (real part: complex steps keep it fixed). A row holding +inf
    then gives softmax and log_softmax NaN everywhere (inf - inf), as their scalar expansions and
    PyTorch do."""
    return np.max(np.real(x), axis=axis, keepdims=True)


def _stable_max(x, axis):
    """`_row_max`, 0 for rows whose max is ±inf: logsumexp's, so that a row of -inf gives -inf and
    a row holding +inf gives +inf."""
    m = _row_max(x, axis)
    return np.where(np.isfinite(m), m, 0.0)


# ---------------------------------------------------------------- rows (softmax, log_softmax, layer_norm)


def _row_layout(axes: tuple, rank: int) -> tuple[tuple, tuple]:
    """perm moving `axes` last, and its inverse."""
    perm = tuple(i for i in range(rank) if i not in axes) + tuple(axes)
    return perm, tuple(int(i) for i in np.argsort(perm))


def _rows(ctx, ref, axes, rank):
    """ref with `axes` moved last and flattened: shape kept + (n,)."""
    perm, _ = _row_layout(axes, rank)
    shape = ctx.type(ref).shape
    kept = tuple(shape[i] for i in perm[: rank - len(axes)])
    n = math.prod(shape[a] for a in axes)
    if perm != tuple(range(rank)):
        ref = ctx.emit("transpose", [ref], perm=perm)
    if len(axes) != 1:
        ref = ctx.emit("reshape", [ref], shape=kept + (n,))
    return ref


def _unrows(ctx, ref, axes, shape):
    rank = len(shape)
    perm, inverse = _row_layout(axes, rank)
    moved = tuple(shape[i] for i in perm)
    if len(axes) != 1:
        ref = ctx.emit("reshape", [ref], shape=moved)
    if perm != tuple(range(rank)):
        ref = ctx.emit("transpose", [ref], perm=inverse)
    return ref


def _fused_row_adjoint(ctx, kind, y, scale, g, axes, shape):
    """⊕ over i of φ(J[i, j]) ⊗ g[i] within each row, J the `kind` row Jacobian built from the
    rows of y (and of `scale`, layer_norm's σ): one `sr_row_vjp` node, which builds each row's
    lifted n × n Jacobian a block of rows at a time and multiplies it with the adjoint (a
    semiring matmul), so only rows × n values are ever held (docs/limits.md)."""
    rank = len(shape)
    y_rows, g_rows = _rows(ctx, y, axes, rank), _rows(ctx, g, axes, rank)
    if scale is None:
        scale = ctx.emit("reshape", [ctx.const(1.0, ctx.type(y).dtype)], shape=(1,) * rank)
    else:
        scale = ctx.emit("reshape", [_rows(ctx, scale, axes, rank)], shape=ctx.type(y_rows).shape[:-1] + (1,))
    out = ctx.row_vjp(kind, y_rows, scale, g_rows)
    return _unrows(ctx, out, axes, shape)


class RowJacobian(NamedTuple):
    """How `sr_row_vjp` (ops/semiring_ops.py) builds a fused row op's local Jacobian.

    values(y, scale, delta, cols): J (b, n, c), J[:, i, j] = ∂out_i/∂x_j for the c columns j of
    `cols` (a slice), from rows y (b, n), scale (b, 1) and delta = `row_delta(n, dtype, 1/n if
    centred else 0, cols)`, in y's dtype and in the order the real rule rounds it.
    element(el, y, scale, j, i, n, dtype): the same entry J[i, j] as an element."""

    values: Callable
    element: Callable
    centred: bool = False  # delta is δ − 1/n (layer_norm), else δ


def row_delta(n, dtype, shift=0.0, cols=slice(None)):
    """δ_ij − shift for i < n and the columns j of `cols`, an (n, c) array of `dtype` (1 − shift
    where i = j, −shift elsewhere)."""
    diagonal = np.arange(n)[:, None] == np.arange(n)[cols][None, :]
    return np.where(diagonal, np.asarray(1.0 - shift, dtype), np.asarray(-shift, dtype))


def _delta_element(el, j, i, n, dtype, shift=0.0):
    return el.number(float(np.asarray(1.0 - shift if i == j else -shift, dtype)))


def _softmax_j(y, scale, delta, cols=slice(None)):
    """(δ_ij − y_j) · y_i for rows y (b, n)."""
    out = np.subtract(delta, y[:, None, cols])
    return np.multiply(out, y[:, :, None], out=out)


def _softmax_element(el, y, scale, j, i, n, dtype):
    return el.apply("mul", (el.apply("sub", (_delta_element(el, j, i, n, dtype), y[j])), y[i]))


def _log_softmax_j(p, scale, delta, cols=slice(None)):
    """δ_ij − softmax_j for rows of softmax p (b, n)."""
    return np.subtract(delta, p[:, None, cols])


def _log_softmax_element(el, p, scale, j, i, n, dtype):
    return el.apply("sub", (_delta_element(el, j, i, n, dtype), p[j]))


def _layer_norm_j(y, sigma, delta, cols=slice(None)):
    """(δ_ij − 1/n − y_j · (y_i / n)) / σ for rows y (b, n) and σ (b, 1)."""
    n = y.shape[-1]
    out = np.multiply(y[:, None, cols], y[:, :, None] / np.asarray(float(n), y.dtype))
    np.subtract(delta, out, out=out)
    return np.divide(out, sigma[:, :, None], out=out)


def _layer_norm_element(el, y, sigma, j, i, n, dtype):
    scaled = el.apply("div", (y[i], el.number(float(n))))
    numerator = el.apply("sub", (_delta_element(el, j, i, n, dtype, 1.0 / n), el.apply("mul", (y[j], scaled))))
    return el.apply("div", (numerator, sigma))


# The fused row ops' per-row Jacobians, by `sr_row_vjp`'s kind.
ROW_JACOBIANS = {
    "softmax": RowJacobian(_softmax_j, _softmax_element),
    "log_softmax": RowJacobian(_log_softmax_j, _log_softmax_element),
    "layer_norm": RowJacobian(_layer_norm_j, _layer_norm_element, centred=True),
}


def _row_expand(axes_of, build):
    """Expansion of a row op: build(el, row elements) gives the row's output elements."""

    def expand(el, operands, attrs, in_types, out_type):
        x = operands[0]
        rank = x.ndim
        axes = axes_of(attrs, rank)
        perm, inverse = _row_layout(axes, rank)
        moved = x.transpose(perm)
        # rows counted, not inferred with -1: with zero rows NumPy cannot infer it
        rows = moved.reshape(math.prod(moved.shape[: rank - len(axes)]), math.prod(x.shape[a] for a in axes))
        out = [v for row in rows for v in build(el, list(row), attrs)]
        return element_array(out, moved.shape).transpose(inverse)

    return expand


def _axis_attr(attrs, rank):
    return (attrs["axis"] % rank,)


def _axis_infer(node, in_types, attrs):
    (t,) = in_types
    axis = normalize_axis(node, attrs["axis"], t.rank)
    if t.shape[axis] == 0:
        raise GraphError(node.id, f"{node.op} over an empty axis")
    return Type(t.shape, _float_operands(node, in_types))


def _softmax_kernel(attrs, in_types, out_type):
    axis = attrs["axis"] % in_types[0].rank - in_types[0].rank

    def softmax(x):
        e = np.exp(x - _row_max(x, axis))
        return e / np.sum(e, axis=axis, keepdims=True)

    return softmax


def _softmax_row(el, row, attrs):
    m = el.reduce("maximum", row, el.number(-math.inf))
    e = [el.apply("exp", (el.apply("sub", (v, m)),)) for v in row]
    total = el.reduce("add", e, el.number(0.0))
    return [el.apply("div", (v, total)) for v in e]


def _softmax_vjp(ctx, node, g, positions):
    t = ctx.type(node.id)
    axis = normalize_axis(node, ctx.attrs(node)["axis"], t.rank)
    y = node.id
    if not _dense(ctx):  # g·J = y ⊙ (g − Σ y g)
        s = ctx.emit("sum", [ctx.emit("mul", [y, g])], axes=(axis,), keepdims=True)
        return {0: ctx.emit("mul", [y, ctx.emit("sub", [g, s])])}
    return {0: _fused_row_adjoint(ctx, "softmax", y, None, g, (axis,), t.shape)}


def _log_softmax_kernel(attrs, in_types, out_type):
    axis = attrs["axis"] % in_types[0].rank - in_types[0].rank

    def log_softmax(x):
        shifted = x - _row_max(x, axis)
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))

    return log_softmax


def _log_softmax_row(el, row, attrs):
    m = el.reduce("maximum", row, el.number(-math.inf))
    shifted = [el.apply("sub", (v, m)) for v in row]
    total = el.reduce("add", [el.apply("exp", (v,)) for v in shifted], el.number(0.0))
    log_total = el.apply("log", (total,))
    return [el.apply("sub", (v, log_total)) for v in shifted]


def _log_softmax_vjp(ctx, node, g, positions):
    t = ctx.type(node.id)
    axis = normalize_axis(node, ctx.attrs(node)["axis"], t.rank)
    p = ctx.emit("exp", [node.id])  # softmax(x)
    if not _dense(ctx):  # g − softmax · Σ g
        s = ctx.emit("sum", [g], axes=(axis,), keepdims=True)
        return {0: ctx.emit("sub", [g, ctx.emit("mul", [p, s])])}
    return {0: _fused_row_adjoint(ctx, "log_softmax", p, None, g, (axis,), t.shape)}


# ---------------------------------------------------------------- logsumexp


def _lse_infer(node, in_types, attrs):
    (t,) = in_types
    dtype = _float_operands(node, in_types)
    axes = reduce_axes(node, attrs, t.rank)
    if any(t.shape[a] == 0 for a in axes):
        raise GraphError(node.id, "logsumexp over an empty axis")
    if attrs["keepdims"]:
        return Type(tuple(1 if i in axes else d for i, d in enumerate(t.shape)), dtype)
    return Type(tuple(d for i, d in enumerate(t.shape) if i not in axes), dtype)


def _lse_kernel(attrs, in_types, out_type):
    rank = in_types[0].rank
    axes = tuple(a % rank - rank for a in (attrs["axes"] if attrs["axes"] is not None else range(rank)))
    keepdims = attrs["keepdims"]

    def logsumexp(x):
        m = _stable_max(x, axes)
        out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
        return out if keepdims else np.squeeze(out, axis=axes)

    return logsumexp


def _lse_expand(el, operands, attrs, in_types, out_type):
    def combine(row):
        m = el.reduce("maximum", row, el.number(-math.inf))
        # the kernel's _stable_max: 0 for a row whose max is ±inf, so that a row of -inf gives -inf
        # and a row holding +inf gives +inf (as torch.logsumexp), not inf - inf = NaN
        finite = el.apply("lt", (el.apply("abs", (m,)), el.number(math.inf)))
        m = el.apply("where", (finite, m, el.number(0.0)))
        total = el.reduce("add", [el.apply("exp", (el.apply("sub", (v, m)),)) for v in row], el.number(0.0))
        return el.apply("add", (el.apply("log", (total,)), m))

    return reduce_elements(operands[0], attrs["axes"], attrs["keepdims"], combine)


def _lse_vjp(ctx, node, g, positions):
    x = node.inputs[0]
    t = ctx.type(x)
    axes = reduce_axes(node, ctx.attrs(node), t.rank)
    kshape = tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    partial = ctx.emit("exp", [ctx.emit("sub", [x, ctx.emit("reshape", [node.id], shape=kshape)])])  # softmax
    spread = ctx.emit("broadcast_to", [ctx.emit("reshape", [g], shape=kshape)], shape=t.shape)
    return {0: ctx.edge_value(partial, spread)}


# ---------------------------------------------------------------- layer_norm


def _ln_axes(node, attrs, rank):
    norm = tuple(sorted(normalize_axis(node, a, rank) for a in attrs["axes"]))
    if not norm:
        raise GraphError(node.id, "layer_norm needs at least one axis")
    if len(set(norm)) != len(norm):
        raise GraphError(node.id, f"repeated axis in {list(attrs['axes'])}")
    return norm


def _ln_infer(node, in_types, attrs):
    (t,) = in_types
    dtype = _float_operands(node, in_types)
    axes = _ln_axes(node, attrs, t.rank)
    if any(t.shape[a] == 0 for a in axes):
        raise GraphError(node.id, "layer_norm over an empty axis")
    if not (attrs["eps"] >= 0 and math.isfinite(attrs["eps"])):
        raise GraphError(node.id, f"layer_norm's eps must be finite and ≥ 0, got {attrs['eps']}")
    return Type(t.shape, dtype)


def _ln_kernel(attrs, in_types, out_type):
    rank = in_types[0].rank
    axes = tuple(a % rank - rank for a in attrs["axes"])
    eps = float(attrs["eps"])

    def layer_norm(x):
        centred = x - np.mean(x, axis=axes, keepdims=True)
        var = np.mean(centred * centred, axis=axes, keepdims=True)
        return centred / np.sqrt(var + eps)

    return layer_norm


def _ln_row(el, row, attrs):
    n = el.number(float(len(row)))
    mean = el.apply("div", (el.reduce("add", row, el.number(0.0)), n))
    centred = [el.apply("sub", (v, mean)) for v in row]
    var = el.apply("div", (el.reduce("add", [el.apply("mul", (v, v)) for v in centred], el.number(0.0)), n))
    scale = el.apply("sqrt", (el.apply("add", (var, el.number(float(attrs["eps"])))),))
    return [el.apply("div", (v, scale)) for v in centred]


def _ln_vjp(ctx, node, g, positions):
    x, y = node.inputs[0], node.id
    attrs = ctx.attrs(node)
    t = ctx.type(x)
    axes = _ln_axes(node, attrs, t.rank)
    n = math.prod(t.shape[a] for a in axes)

    def mean(ref):
        return ctx.emit("mean", [ref], axes=axes, keepdims=True)

    centred = ctx.emit("sub", [x, mean(x)])
    var = mean(ctx.emit("mul", [centred, centred]))
    sigma = ctx.emit("sqrt", [ctx.emit("add", [var, ctx.const(float(attrs["eps"]), t.dtype)])])
    if not _dense(ctx):  # (g − mean g − y · mean(g y)) / σ
        inner = ctx.emit("sub", [ctx.emit("sub", [g, mean(g)]), ctx.emit("mul", [y, mean(ctx.emit("mul", [g, y]))])])
        return {0: ctx.emit("div", [inner, sigma])}
    # J[i, j] = (δ_ij − 1/n − y_j · (y_i / n)) / σ, built by the kernel in the order the real rule rounds it
    return {0: _fused_row_adjoint(ctx, "layer_norm", y, sigma, g, axes, t.shape)}


def _ln_axes_attr(attrs, rank):
    return tuple(sorted(a % rank for a in attrs["axes"]))


# ---------------------------------------------------------------- windows (conv, pooling)


class Geometry:
    """Where the windows of a conv or pool lie: spatial sizes S, kernel K, stride, padding,
    dilation, output sizes OS (PyTorch's floor rule). Padding is never materialised: each
    kernel offset reads a strided block of the input into a block of the output windows."""

    def __init__(self, spatial, kernel, stride, padding, dilation):
        self.spatial, self.kernel = tuple(spatial), tuple(kernel)
        self.stride, self.padding, self.dilation = tuple(stride), tuple(padding), tuple(dilation)
        self.nd = len(self.spatial)
        self.padded = tuple(s + 2 * p for s, p in zip(self.spatial, self.padding))
        self.out = tuple((sp - d * (k - 1) - 1) // st + 1
                         for sp, k, st, d in zip(self.padded, self.kernel, self.stride, self.dilation))
        self.kernel_size = math.prod(self.kernel)

    def _axis_reads(self, axis: int, k: int):
        """(first window, windows, first input position) of offset k's in-range reads on one axis, or None."""
        s, size, out = self.stride[axis], self.spatial[axis], self.out[axis]
        start = self.padding[axis] - k * self.dilation[axis]  # window i reads i·s − start
        lo = max(0, -(-start // s))
        hi = min(out - 1, (size - 1 + start) // s)
        return (lo, hi - lo + 1, lo * s - start) if lo <= hi else None

    def reads(self, k):
        """Per axis (first window, windows, first input position) for kernel offset k, or None
        when every window reads padding there."""
        parts = tuple(self._axis_reads(a, ki) for a, ki in enumerate(k))
        return None if any(r is None for r in parts) else parts

    def all_offsets(self) -> list:
        return list(np.ndindex(*self.kernel))

    def candidate_count(self) -> int:
        """How many offsets `reading_offsets` tries (an upper bound of how many it returns)."""
        return math.prod(max(0, last - first + 1) for first, last in self._candidates())

    def _candidates(self):
        for a in range(self.nd):
            d, p, s = self.dilation[a], self.padding[a], self.stride[a]
            yield max(0, -(-(p - (self.out[a] - 1) * s) // d)), min(self.kernel[a] - 1, (p + self.spatial[a] - 1) // d)

    def reading_offsets(self) -> list:
        """The offsets that read at least one input element, in row-major order; per axis
        only the candidates k·d in [p − (OS−1)·s, p + S − 1] are tried (for pools, whose
        padding is at most half the kernel, at most 2·S of them), never the whole kernel."""
        axes = [[k for k in range(first, last + 1) if self._axis_reads(a, k) is not None]
                for a, (first, last) in enumerate(self._candidates())]
        return list(itertools.product(*axes))

    def full(self, reads) -> bool:
        return all(count == out for (_, count, _), out in zip(reads, self.out))

    def source_index(self, reads) -> tuple:
        """Basic index (over N, C and the spatial axes) of the input elements an offset reads."""
        return (slice(None), slice(None)) + tuple(slice(src, src + s * (count - 1) + 1, s)
                                                  for (_, count, src), s in zip(reads, self.stride))

    def target_index(self, reads) -> tuple:
        """Basic index (over N, C and the output's spatial axes) of the windows that read them."""
        return (slice(None), slice(None)) + tuple(slice(lo, lo + count) for lo, count, _ in reads)

    def source(self, out_index, k):
        """The unpadded spatial index that window `out_index` reads at offset k, or None (padding)."""
        pos = tuple(i * st + ki * d - p for i, ki, st, d, p in
                    zip(out_index, k, self.stride, self.dilation, self.padding))
        return pos if all(0 <= q < s for q, s in zip(pos, self.spatial)) else None


def _check_offsets(node, count: int) -> None:
    if count > MAX_WINDOW_OFFSETS:
        raise ResourceExhausted(f"node '{node.id}': {node.op} would visit {count} kernel offsets; the limit is "
                                f"{MAX_WINDOW_OFFSETS} (a 64×64 window)")


def _ints_attr(node, attrs, name, nd, default, minimum):
    value = attrs[name]
    if value is None:
        value = default
    value = tuple(int(v) for v in value)
    if len(value) == 1:
        value = value * nd
    if len(value) != nd:
        raise GraphError(node.id, f"{name} must have 1 or {nd} entries, got {list(value)}")
    if any(v < minimum for v in value):
        raise GraphError(node.id, f"{name} entries must be ≥ {minimum}, got {list(value)}")
    return value


def _conv_geometry(node, attrs, in_types, nd) -> Geometry:
    x, w = in_types
    layouts = {"x": "N, C, H, W" if nd == 2 else "N, C, L", "w": "O, C/groups, KH, KW" if nd == 2 else "O, C/groups, K"}
    for what, t in (("x", x), ("w", w)):
        if t.rank != nd + 2:
            raise GraphError(node.id, f"{node.op}'s {what} must have {nd + 2} axes ({layouts[what]}), "
                                      f"got shape {list(t.shape)}")
    groups = int(attrs["groups"])
    if groups < 1:
        raise GraphError(node.id, f"groups must be ≥ 1, got {groups}")
    channels, out_channels = x.shape[1], w.shape[0]
    if channels % groups or out_channels % groups:
        raise GraphError(node.id, f"{groups} groups must divide the input channels ({channels}) and the output "
                                  f"channels ({out_channels})")
    if w.shape[1] != channels // groups:
        raise GraphError(node.id, f"w has {w.shape[1]} input channels per group; x has {channels} channels in "
                                  f"{groups} group(s), so {channels // groups}")
    geo = Geometry(x.shape[2:], w.shape[2:], _ints_attr(node, attrs, "stride", nd, (1,), 1),
                   _ints_attr(node, attrs, "padding", nd, (0,), 0), _ints_attr(node, attrs, "dilation", nd, (1,), 1))
    if any(k < 1 for k in geo.kernel) or any(o < 1 for o in geo.out):
        raise GraphError(node.id, f"kernel {list(geo.kernel)} (dilation {list(geo.dilation)}) does not fit the "
                                  f"padded input {list(geo.padded)}")
    _check_offsets(node, geo.kernel_size)
    return geo


def _conv_infer(nd):
    def infer(node, in_types, attrs):
        dtype = _float_operands(node, in_types)
        geo = _conv_geometry(node, attrs, in_types, nd)
        return Type((in_types[0].shape[0], in_types[1].shape[0]) + geo.out, dtype)

    return infer


def _conv_kernel(nd):
    def make(attrs, in_types, out_type):
        node = _Anonymous(nd)
        geo = _conv_geometry(node, attrs, in_types, nd)
        n, c = in_types[0].shape[:2]
        o = in_types[1].shape[0]
        groups = int(attrs["groups"])
        cg, og, p = c // groups, o // groups, math.prod(geo.out)
        blocks = [(k, reads) for k in geo.all_offsets() if (reads := geo.reads(k)) is not None]

        # With one channel per group a broadcast multiply computes the same products exactly
        # and is far faster than a batched matmul of 1-wide matrices (as matmul's kernel).
        product = np.multiply if cg == 1 else np.matmul

        def conv(x, w):
            lead_x, lead_w = x.shape[: x.ndim - nd - 2], w.shape[: w.ndim - nd - 2]
            lead = np.broadcast_shapes(lead_x, lead_w)
            out = np.zeros(lead + (n, groups, og) + geo.out, dtype=np.result_type(x, w))
            for k, reads in blocks:  # one matmul per kernel offset: out[windows] += w[..., k] @ x[what they read]
                counts = tuple(count for _, count, _ in reads)
                m = math.prod(counts)
                xs = x[(Ellipsis,) + geo.source_index(reads)].reshape(lead_x + (n, groups, cg, m))
                wk = w[(Ellipsis, slice(None), slice(None)) + k].reshape(lead_w + (1, groups, og, cg))
                if product is np.matmul:  # contiguous and unbroadcast, or NumPy's matmul leaves BLAS for a slow loop
                    wk = np.ascontiguousarray(np.broadcast_to(wk, lead + (n, groups, og, cg)))
                    xs = np.ascontiguousarray(np.broadcast_to(xs, lead + (n, groups, cg, m)))
                term = product(wk, xs).reshape(lead + (n, groups, og) + counts)
                out[(Ellipsis,) + geo.target_index(reads)[2:]] += term
            return out.reshape(lead + (n, o) + geo.out)

        return conv

    return make


class _Anonymous:
    """A stand-in node for geometry checks in kernels (their nodes were checked at registration)."""

    def __init__(self, nd):
        self.id, self.op = "?", f"conv{nd}d"


def _conv_expand(nd):
    def expand(el, operands, attrs, in_types, out_type):
        x, w = operands
        geo = _conv_geometry(_Anonymous(nd), attrs, in_types, nd)
        groups = int(attrs["groups"])
        cg, og = x.shape[1] // groups, w.shape[0] // groups
        zero = el.number(0.0)
        values = []
        for n in range(x.shape[0]):
            for o in range(w.shape[0]):
                first = (o // og) * cg
                for out_index in np.ndindex(*geo.out):
                    parts = []
                    for k in geo.all_offsets():  # the kernel's order: a sum over channels per offset, then over offsets
                        pos = geo.source(out_index, k)
                        if pos is not None:
                            parts.append(el.reduce("add", [el.apply("mul", (w[(o, c) + k], x[(n, first + c) + pos]))
                                                           for c in range(cg)], zero))
                    values.append(el.reduce("add", parts, zero))
        return element_array(values, out_type.shape)

    return expand


def _conv_cost(in_types, out_type):
    w = in_types[1]
    return 2 * out_type.size * math.prod(w.shape[1:])


def _window_view(ctx, x, geo, reads, fill=0.0):
    """What offset k reads in every window, shaped like the output (N, C, *OS), `fill` where it
    reads padding (x real)."""
    view = ctx.emit("index", [x], index=geo.source_index(reads))
    if geo.full(reads):
        return view
    t = ctx.type(x)
    view = ctx.emit("scatter_index", [view], index=geo.target_index(reads), shape=t.shape[:2] + geo.out)
    if fill:
        border = np.full(geo.out, fill)
        border[geo.target_index(reads)[2:]] = 0.0
        view = ctx.emit("add", [view, ctx.const(border, t.dtype)])
    return view


def _fold(ctx, parts, geo, in_shape):
    """⊕ of each offset's contribution (shaped like the output windows) at the input elements
    it read (the adjoint of reading one strided block per offset)."""
    total = None
    for reads, part in parts:
        if part is None:
            continue
        if not geo.full(reads):
            part = ctx.emit("index", [part], index=geo.target_index(reads))
        placed = ctx.scatter(part, geo.source_index(reads), tuple(in_shape))
        total = placed if total is None else ctx.add(total, placed)
    return total


def _conv_vjp(nd):
    def vjp(ctx, node, g, positions):
        x, w = node.inputs
        tx, tw = ctx.type(x), ctx.type(w)
        geo = _conv_geometry(node, ctx.attrs(node), [tx, tw], nd)
        groups = int(ctx.attrs(node)["groups"])
        (n, c), o = tx.shape[:2], tw.shape[0]
        cg, og, p, kk = c // groups, o // groups, math.prod(geo.out), geo.kernel_size
        out = {}
        if 1 in positions:  # dw[o, c, k] = ⊕ over n, i of φ(x[n, c, i·s + k·d − p]) ⊗ g[n, o, i]
            nothing = ctx.emit("broadcast_to", [ctx.const(0.0, tx.dtype)], shape=(n, c) + geo.out)
            views = ctx.emit("stack", [nothing if (reads := geo.reads(k)) is None else _window_view(ctx, x, geo, reads)
                                       for k in geo.all_offsets()], axis=0)
            cols = ctx.emit("reshape", [views], shape=(kk, n, groups, cg, p))
            cols = ctx.emit("transpose", [cols], perm=(2, 3, 0, 1, 4))  # G, Cg, K, N, P
            cols = ctx.emit("reshape", [cols], shape=(groups, cg * kk, n * p))
            gm = ctx.emit("transpose", [ctx.emit("reshape", [g], shape=(n, groups, og, p))], perm=(1, 0, 3, 2))
            gm = ctx.emit("reshape", [gm], shape=(groups, n * p, og))
            dw = ctx.matmul(ctx.lift(cols), gm)  # G, Cg·K, Og
            dw = ctx.emit("transpose", [dw], perm=(0, 2, 1))
            out[1] = ctx.emit("reshape", [dw], shape=tw.shape)
        if 0 in positions:  # dx[n, c, h] = ⊕ over o, k of φ(w[o, c, k]) ⊗ g[n, o, i] with h = i·s + k·d − p
            wm = ctx.emit("reshape", [w], shape=(groups, og, cg * kk))
            wm = ctx.lift(ctx.emit("transpose", [wm], perm=(0, 2, 1)))  # G, Cg·K, Og
            if _dense(ctx):  # a plugin's matmul need not broadcast batch axes
                wm = ctx.emit("broadcast_to", [wm], shape=(n, groups, cg * kk, og))
            gm = ctx.emit("reshape", [g], shape=(n, groups, og, p))
            per_offset = ctx.matmul(wm, gm)  # N, G, Cg·K, P
            per_offset = ctx.emit("reshape", [per_offset], shape=(n, c, kk) + geo.out)
            parts = [(reads, ctx.emit("index", [per_offset], index=(slice(None), slice(None), i)))
                     for i, k in enumerate(geo.all_offsets()) if (reads := geo.reads(k)) is not None]
            out[0] = _fold(ctx, parts, geo, tx.shape)
        return out

    return vjp


# ---------------------------------------------------------------- pooling


def _pool_geometry(node, attrs, t, nd) -> Geometry:
    if t.rank != nd + 2:
        raise GraphError(node.id, f"{node.op}'s x must have {nd + 2} axes (N, C, "
                                  f"{'H, W' if nd == 2 else 'L'}), got shape {list(t.shape)}")
    kernel = _ints_attr(node, attrs, "kernel_size", nd, None, 1)
    stride = _ints_attr(node, attrs, "stride", nd, kernel, 1)
    padding = _ints_attr(node, attrs, "padding", nd, (0,), 0)
    if any(2 * q > k for q, k in zip(padding, kernel)):
        raise GraphError(node.id, f"padding {list(padding)} must be at most half the kernel size {list(kernel)}")
    geo = Geometry(t.shape[2:], kernel, stride, padding, (1,) * nd)
    if any(o < 1 for o in geo.out):
        raise GraphError(node.id, f"kernel {list(kernel)} does not fit the padded input {list(geo.padded)}")
    _check_offsets(node, geo.candidate_count())
    return geo


def _pool_infer(nd):
    def infer(node, in_types, attrs):
        dtype = _float_operands(node, in_types)
        geo = _pool_geometry(node, attrs, in_types[0], nd)
        return Type(in_types[0].shape[:2] + geo.out, dtype)

    return infer


def _pool_kernel(nd, kind):
    def make(attrs, in_types, out_type):
        node = _Anonymous(nd)
        geo = _pool_geometry(node, attrs, in_types[0], nd)
        blocks = [geo.reads(k) for k in geo.reading_offsets()]
        fill = -np.inf if kind == "max" else 0.0
        combine = np.maximum if kind == "max" else np.add

        def pool(x):
            out = np.full(x.shape[: x.ndim - nd] + geo.out, fill, dtype=x.dtype)
            for reads in blocks:  # every window's element at one offset, combined in place
                target = out[(Ellipsis,) + geo.target_index(reads)[2:]]
                combine(target, x[(Ellipsis,) + geo.source_index(reads)[2:]], out=target)
            return out if kind == "max" else out / geo.kernel_size

        return pool

    return make


def _pool_expand(nd, kind):
    def expand(el, operands, attrs, in_types, out_type):
        (x,) = operands
        geo = _pool_geometry(_Anonymous(nd), attrs, in_types[0], nd)
        offsets = geo.reading_offsets()
        values = []
        for n, c in np.ndindex(*x.shape[:2]):
            for out_index in np.ndindex(*geo.out):
                row = [x[(n, c) + pos] for pos in (geo.source(out_index, k) for k in offsets) if pos is not None]
                if kind == "max":
                    values.append(el.reduce("maximum", row, el.number(-math.inf)))
                else:
                    values.append(el.apply("div", (el.reduce("add", row, el.number(0.0)),
                                                   el.number(float(geo.kernel_size)))))
        return element_array(values, out_type.shape)

    return expand


def _pool_cost(in_types, out_type):
    """An upper bound (the cost has no attributes): a window is at most the whole spatial input."""
    x = in_types[0]
    return out_type.size * max(1, x.size // max(1, x.shape[0] * x.shape[1]))


def _pool_vjp(nd, kind):
    def vjp(ctx, node, g, positions):
        x = node.inputs[0]
        t = ctx.type(x)
        geo = _pool_geometry(node, ctx.attrs(node), t, nd)
        if kind == "avg":
            share = ctx.edge_const(1.0 / geo.kernel_size, g)
            return {0: _fold(ctx, [(geo.reads(k), share) for k in geo.reading_offsets()], geo, t.shape)}
        # max: partial 1 from the first maximum of each window, 0 from the rest
        one, zero = ctx.const(1.0, t.dtype), ctx.const(0.0, t.dtype)
        yes, no = ctx.const(True, "bool"), ctx.const(False, "bool")
        taken, parts = None, []
        for k in geo.reading_offsets():
            reads = geo.reads(k)
            hit = ctx.emit("eq", [_window_view(ctx, x, geo, reads, -np.inf), node.id])
            chosen = hit if taken is None else ctx.emit("where", [taken, no, hit])
            taken = hit if taken is None else ctx.emit("where", [hit, yes, taken])
            parts.append((reads, ctx.edge_value(ctx.emit("where", [chosen, one, zero]), g)))
        return {0: _fold(ctx, parts, geo, t.shape)}

    return vjp


# ---------------------------------------------------------------- registration


def _pool_attrs(nd):
    return (AttrSpec("kernel_size", "ints", required=True, doc=f"{nd} window size(s), or one for every axis"),
            AttrSpec("stride", "ints", doc="absent: kernel_size"),
            AttrSpec("padding", "ints", default=(0,), doc="per side; at most half the kernel size"))


def register(registry: Registry) -> None:
    add = registry.add
    axis = (AttrSpec("axis", "int", default=-1),)
    add(OpDef("softmax", "nn", ("x",), _axis_infer, _softmax_kernel, vjp=_softmax_vjp, attrs=axis,
              derivatives=(("x", "y_i (δ_ij − y_j) within the row: dense, one edge per pair"),),
              doc="exp(x − max) / Σ exp(x − max) along axis (fused)",
              expand=_row_expand(_axis_attr, _softmax_row), scalar_cost=lambda i, o: 5 * o.size, analytic=True))
    add(OpDef("log_softmax", "nn", ("x",), _axis_infer, _log_softmax_kernel, vjp=_log_softmax_vjp, attrs=axis,
              derivatives=(("x", "δ_ij − softmax_j within the row: dense, one edge per pair"),),
              doc="x − max − log Σ exp(x − max) along axis (fused)",
              expand=_row_expand(_axis_attr, _log_softmax_row), scalar_cost=lambda i, o: 5 * o.size,
              analytic=True))
    add(OpDef("logsumexp", "nn", ("x",), _lse_infer, _lse_kernel, vjp=_lse_vjp,
              attrs=(AttrSpec("axes", "ints", doc="axes to reduce; absent: all"),
                     AttrSpec("keepdims", "bool", default=False)),
              derivatives=(("x", "softmax(x): one edge per element to its row's result"),),
              doc="log Σ exp(x) over axes (max-shifted; fused)", expand=_lse_expand,
              scalar_cost=lambda i, o: 5 * i[0].size, analytic=True))
    add(OpDef("layer_norm", "nn", ("x",), _ln_infer, _ln_kernel, vjp=_ln_vjp,
              attrs=(AttrSpec("axes", "ints", default=(-1,), doc="the normalised axes"),
                     AttrSpec("eps", "float", default=1e-5)),
              derivatives=(("x", "(δ_ij − 1/n − y_i y_j / n) / σ within the row: dense, one edge per pair"),),
              doc="(x − mean) / sqrt(var + eps) over axes, biased variance, no affine part (fused)",
              expand=_row_expand(_ln_axes_attr, _ln_row), scalar_cost=lambda i, o: 6 * o.size, analytic=True))
    per_axis = "one entry for every spatial axis, or one per axis"
    conv_attrs = (AttrSpec("stride", "ints", default=(1,), doc=per_axis),
                  AttrSpec("padding", "ints", default=(0,), doc=f"zeros on both sides; {per_axis}"),
                  AttrSpec("dilation", "ints", default=(1,), doc=per_axis),
                  AttrSpec("groups", "int", default=1, doc="channel groups (divides C and O)"))
    for nd in (1, 2):
        layout = "N, C, L; w: O, C/groups, K" if nd == 1 else "N, C, H, W; w: O, C/groups, KH, KW"
        add(OpDef(f"conv{nd}d", "linalg", ("x", "w"), _conv_infer(nd), _conv_kernel(nd), vjp=_conv_vjp(nd),
                  attrs=conv_attrs,
                  derivatives=(("x", "w[o, c, k] from each window reading x (semiring matmul, then ⊕ per offset)"),
                               ("w", "x[n, c, i·s + k·d − p] (semiring matmul over n and windows)")),
                  doc=f"PyTorch's conv{nd}d without bias (x: {layout})", expand=_conv_expand(nd),
                  scalar_cost=_conv_cost, analytic=True))
        for kind in ("max", "avg"):
            add(OpDef(f"{kind}_pool{nd}d", "reduction", ("x",), _pool_infer(nd), _pool_kernel(nd, kind),
                      vjp=_pool_vjp(nd, kind), attrs=_pool_attrs(nd),
                      derivatives=(("x", "1 from each window's first maximum" if kind == "max"
                                    else "1/kernel elements from each window's elements"),),
                      doc=f"PyTorch's {kind}_pool{nd}d ("
                          + ("padding is −inf" if kind == "max" else "padding counted as zeros") + ")",
                      expand=_pool_expand(nd, kind), scalar_cost=_pool_cost, analytic=kind == "avg"))
