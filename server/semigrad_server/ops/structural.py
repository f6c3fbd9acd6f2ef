"""Structural ops: everything about each one (shape rule, kernel, adjoint) in one place.

Adjoint rules speak the semiring's language through `ctx` (see autodiff.context):
`ctx.edge_const(c, g)` is φ(c) ⊗ g, `ctx.reduce` is a ⊕-reduce, `ctx.matmul` a semiring
matmul, `ctx.scatter` writes into an array of 0̄. With the real semiring they become
ordinary ops, so a backward graph can itself be differentiated.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError
from ..ir import Type
from .base import (AttrSpec, OpDef, Registry, align, broadcast_item_shapes, element_array, input_cost,
                   normalize_axis, reduce_elements)

AXES = (AttrSpec("axes", "ints", doc="axes to reduce; absent: all"), AttrSpec("keepdims", "bool", default=False))


def full_index(index: tuple, rank: int) -> tuple:
    """Index over the item axes only, whatever leading axes the array has."""
    return (Ellipsis,) + tuple(index) + (slice(None),) * (rank - len(index))


# ---------------------------------------------------------------- const


def _const_infer(node, in_types, attrs):
    value = attrs["value"]
    return Type(tuple(value.shape), value.dtype.name)


def _const_kernel(attrs, in_types, out_type):
    value = attrs["value"]
    value.setflags(write=False)
    return lambda: value


def _const_expand(el, operands, attrs, in_types, out_type):
    value = attrs["value"]
    return element_array([el.number(v) for v in value.reshape(-1).tolist()], value.shape)


# ---------------------------------------------------------------- reductions


def reduce_axes(node, attrs, rank):
    """The sorted, normalised `axes` attribute of a reduction (None: every axis)."""
    axes = attrs["axes"]
    if axes is None:
        return tuple(range(rank))
    norm = tuple(sorted(normalize_axis(node, a, rank) for a in axes))
    if len(set(norm)) != len(norm):
        raise GraphError(node.id, f"repeated axis in {list(axes)}")
    return norm


def reduce_infer(node, in_types, attrs):
    (t,) = in_types
    axes = reduce_axes(node, attrs, t.rank)
    if node.op in ("max", "min") and any(t.shape[a] == 0 for a in axes):
        raise GraphError(node.id, f"{node.op} over an empty axis")
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    else:
        shape = tuple(d for i, d in enumerate(t.shape) if i not in axes)
    dtype = "float64" if node.op == "mean" and not in_types[0].is_float else t.dtype
    return Type(shape, dtype)


def _reduce_kernel(fn):
    def make(attrs, in_types, out_type):
        rank = in_types[0].rank
        axes = tuple(a % rank - rank for a in (attrs["axes"] if attrs["axes"] is not None else range(rank)))
        keepdims = attrs["keepdims"]
        return lambda a: fn(a, axis=axes, keepdims=keepdims)

    return make


def _sum_expand(el, operands, attrs, in_types, out_type):
    return reduce_elements(operands[0], attrs["axes"], attrs["keepdims"], lambda row: el.reduce("add", row, el.number(0.0)))


def _mean_expand(el, operands, attrs, in_types, out_type):
    x = operands[0]
    n = x.size // max(1, out_type.size)
    return reduce_elements(x, attrs["axes"], attrs["keepdims"],
                           lambda row: el.apply("div", (el.reduce("add", row, el.number(0.0)), el.number(float(n)))))


def _max_expand(el, operands, attrs, in_types, out_type):
    return reduce_elements(operands[0], attrs["axes"], attrs["keepdims"],
                           lambda row: el.reduce("maximum", row, el.number(-math.inf)))


def _min_expand(el, operands, attrs, in_types, out_type):
    return reduce_elements(operands[0], attrs["axes"], attrs["keepdims"],
                           lambda row: el.reduce("minimum", row, el.number(math.inf)))


def _keepdims_shape(node, ctx):
    t = ctx.type(node.inputs[0])
    axes = reduce_axes(node, ctx.attrs(node), t.rank)
    return tuple(1 if i in axes else d for i, d in enumerate(t.shape)), t


def _expand_adjoint(ctx, node, g):
    """Bring a reduction's adjoint back to the input's shape (a broadcast: each input element has one edge)."""
    kshape, t = _keepdims_shape(node, ctx)
    return ctx.emit("broadcast_to", [ctx.emit("reshape", [g], shape=kshape)], shape=t.shape)


def _sum_vjp(ctx, node, g, positions):
    return {0: ctx.edge_const(1, _expand_adjoint(ctx, node, g))}


def _mean_vjp(ctx, node, g, positions):
    kshape, t = _keepdims_shape(node, ctx)
    n = t.size // max(1, int(np.prod(kshape)))
    return {0: ctx.edge_const(1.0 / n if n else 0.0, _expand_adjoint(ctx, node, g))}


def _max_vjp(ctx, node, g, positions):
    """∂max/∂x_i = 1 where x_i is the max, split evenly between ties (as JAX and PyTorch's amax);
    min likewise."""
    x = node.inputs[0]
    t = ctx.type(x)
    attrs = ctx.attrs(node)
    top = ctx.emit(node.op, [x], axes=attrs["axes"], keepdims=True)
    hit = ctx.emit("eq", [x, top])
    mask = ctx.emit("where", [hit, ctx.const(1, t.dtype), ctx.const(0, t.dtype)])
    count = ctx.emit("sum", [mask], axes=attrs["axes"], keepdims=True)
    partial = ctx.emit("div", [mask, count])
    return {0: ctx.edge_value(partial, _expand_adjoint(ctx, node, g))}


# ---------------------------------------------------------------- shape ops


def _reshape_target(node, t, shape):
    shape = tuple(int(d) for d in shape)
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in shape):
        raise GraphError(node.id, f"bad reshape target {list(shape)}")
    if unknown:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or t.size % known:
            raise GraphError(node.id, f"cannot reshape {list(t.shape)} into {list(shape)}")
        shape = tuple(t.size // known if d == -1 else d for d in shape)
    if math.prod(shape) != t.size:
        raise GraphError(node.id, f"cannot reshape {list(t.shape)} ({t.size} elements) into {list(shape)}")
    return shape


def _reshape_infer(node, in_types, attrs):
    return Type(_reshape_target(node, in_types[0], attrs["shape"]), in_types[0].dtype)


def _reshape_kernel(attrs, in_types, out_type):
    rank, shape = in_types[0].rank, out_type.shape
    return lambda a: a.reshape(a.shape[: a.ndim - rank] + shape)


def _reshape_vjp(ctx, node, g, positions):
    return {0: ctx.edge_const(1, ctx.emit("reshape", [g], shape=ctx.type(node.inputs[0]).shape))}


def _perm(node, attrs, rank):
    perm = attrs["perm"]
    if perm is None:
        return tuple(reversed(range(rank)))
    norm = tuple(normalize_axis(node, p, rank) for p in perm)
    if sorted(norm) != list(range(rank)):
        raise GraphError(node.id, f"perm {list(perm)} is not a permutation of {rank} axes")
    return norm


def _transpose_infer(node, in_types, attrs):
    t = in_types[0]
    return Type(tuple(t.shape[p] for p in _perm(node, attrs, t.rank)), t.dtype)


def _transpose_kernel(attrs, in_types, out_type):
    rank = in_types[0].rank
    perm = tuple(reversed(range(rank))) if attrs["perm"] is None else tuple(p % rank for p in attrs["perm"])

    def transpose(a):
        lead = a.ndim - rank
        if not lead:
            return a.transpose(perm)
        return a.transpose(tuple(range(lead)) + tuple(lead + p for p in perm))

    return transpose


def _transpose_vjp(ctx, node, g, positions):
    perm = _perm(node, ctx.attrs(node), ctx.type(node.inputs[0]).rank)
    return {0: ctx.edge_const(1, ctx.emit("transpose", [g], perm=tuple(int(i) for i in np.argsort(perm))))}


def _broadcast_infer(node, in_types, attrs):
    shape = tuple(int(d) for d in attrs["shape"])
    t = in_types[0]
    try:
        ok = np.broadcast_shapes(t.shape, shape) == shape and len(shape) >= t.rank
    except ValueError:
        ok = False
    if not ok:
        raise GraphError(node.id, f"cannot broadcast {list(t.shape)} to {list(shape)}")
    return Type(shape, t.dtype)


def _broadcast_kernel(attrs, in_types, out_type):
    rank, out_rank, shape = in_types[0].rank, out_type.rank, out_type.shape

    def broadcast(a):
        lead = a.shape[: a.ndim - rank]
        return np.broadcast_to(align(a, rank, out_rank), lead + shape)

    return broadcast


def _broadcast_vjp(ctx, node, g, positions):
    reduced = ctx.unbroadcast(g, ctx.type(node.id).shape, ctx.type(node.inputs[0]).shape)
    return {0: ctx.edge_const(1, reduced)}


# ---------------------------------------------------------------- indexing


def index_infer(node, in_types, attrs):
    t = in_types[0]
    index = attrs["index"]
    if len(index) > t.rank:
        raise GraphError(node.id, f"too many indices ({len(index)}) for shape {list(t.shape)}")
    for item in index:
        if isinstance(item, slice) and item.step == 0:
            raise GraphError(node.id, "slice step cannot be zero")
    if all(type(i) is int for i in index) and all(-d <= i < d for i, d in zip(index, t.shape)):
        return Type(tuple(t.shape[len(index):]), t.dtype)  # integers in range drop their axes (a[i, j])
    try:
        view = np.broadcast_to(np.empty((), dtype=t.dtype), t.shape)[tuple(index)]
    except IndexError as e:
        raise GraphError(node.id, f"index {format_index(index)} out of range for shape {list(t.shape)}: {e}") from None
    return Type(tuple(view.shape), t.dtype)


def _index_kernel(attrs, in_types, out_type):
    key = full_index(attrs["index"], in_types[0].rank)
    return lambda a: a[key]


def _index_vjp(ctx, node, g, positions):
    t = ctx.type(node.inputs[0])
    return {0: ctx.edge_const(1, ctx.scatter(g, ctx.attrs(node)["index"], t.shape))}


def _scatter_infer(node, in_types, attrs):
    shape = tuple(int(d) for d in attrs["shape"])
    target = index_infer(node, [Type(shape, in_types[0].dtype)], attrs)
    if broadcast_item_shapes(node, [target.shape, in_types[0].shape]) != target.shape:
        raise GraphError(node.id, f"cannot scatter {list(in_types[0].shape)} into {list(target.shape)}")
    return Type(shape, in_types[0].dtype)


def _scatter_kernel(attrs, in_types, out_type):
    key = full_index(attrs["index"], out_type.rank)
    rank, shape = in_types[0].rank, out_type.shape

    def scatter(g):
        out = np.zeros(g.shape[: g.ndim - rank] + shape, dtype=g.dtype)
        out[key] = g
        return out

    return scatter


def scatter_expand(fill):
    """Elements of `x` at `index` in an array of `fill(elements)`."""

    def expand(el, operands, attrs, in_types, out_type):
        out = element_array([fill(el)] * out_type.size, out_type.shape)
        out[tuple(attrs["index"])] = operands[0]
        return out

    return expand


def _scatter_vjp(ctx, node, g, positions):
    return {0: ctx.edge_const(1, ctx.emit("index", [g], index=ctx.attrs(node)["index"]))}


def format_index(index) -> str:
    def item(i):
        if isinstance(i, slice):
            return ":".join("" if v is None else str(v) for v in (i.start, i.stop, i.step)).rstrip(":") or ":"
        return str(i)

    return "[" + ", ".join(item(i) for i in index) + "]"


# ---------------------------------------------------------------- concat and stack


def _join_infer(node, in_types, attrs):
    first = in_types[0]
    dtype = np.result_type(*(np.dtype(t.dtype) for t in in_types)).name
    if node.op == "stack":
        axis = normalize_axis(node, attrs["axis"], first.rank + 1)
        for i, t in enumerate(in_types):
            if t.shape != first.shape:
                raise GraphError(node.id, f"stack input {i} has shape {list(t.shape)}, input 0 has {list(first.shape)}")
        return Type(first.shape[:axis] + (len(in_types),) + first.shape[axis:], dtype)
    if first.rank == 0:
        raise GraphError(node.id, "cannot concatenate 0-d values")
    axis = normalize_axis(node, attrs["axis"], first.rank)
    for i, t in enumerate(in_types):
        if t.rank != first.rank or t.shape[:axis] + t.shape[axis + 1:] != first.shape[:axis] + first.shape[axis + 1:]:
            raise GraphError(node.id, f"concat input {i} has shape {list(t.shape)}, which does not match "
                                      f"{list(first.shape)} outside axis {axis}")
    size = sum(t.shape[axis] for t in in_types)
    return Type(first.shape[:axis] + (size,) + first.shape[axis + 1:], dtype)


def _join_kernel(fn):
    def make(attrs, in_types, out_type):
        rank = in_types[0].rank
        axis = attrs["axis"] % (rank + (fn is np.stack)) - (rank + (fn is np.stack))

        def join(*arrays):
            leads = {a.shape[: a.ndim - rank] for a in arrays}
            if len(leads) > 1:
                lead = np.broadcast_shapes(*leads)
                arrays = [np.broadcast_to(a, lead + a.shape[a.ndim - rank:]) for a in arrays]
            return fn(arrays, axis=axis)

        return join

    return make


def _concat_vjp(ctx, node, g, positions):
    rank = ctx.type(node.id).rank
    axis = normalize_axis(node, ctx.attrs(node)["axis"], rank)
    out, start = {}, 0
    for pos, ref in enumerate(node.inputs):
        size = ctx.type(ref).shape[axis]
        if pos in positions:
            index = (slice(None),) * axis + (slice(start, start + size),)
            out[pos] = ctx.edge_const(1, ctx.emit("index", [g], index=index))
        start += size
    return out


def _stack_vjp(ctx, node, g, positions):
    axis = normalize_axis(node, ctx.attrs(node)["axis"], ctx.type(node.id).rank)
    return {pos: ctx.edge_const(1, ctx.emit("index", [g], index=(slice(None),) * axis + (pos,))) for pos in positions}


# ---------------------------------------------------------------- matmul


def matmul_infer(node, in_types, attrs):
    a, b = in_types
    if a.rank == 0 or b.rank == 0:
        raise GraphError(node.id, "matmul operands must have at least one dimension")
    a2 = (1,) + a.shape if a.rank == 1 else a.shape
    b2 = b.shape + (1,) if b.rank == 1 else b.shape
    if a2[-1] != b2[-2]:
        raise GraphError(node.id, f"matmul shapes {list(a.shape)} and {list(b.shape)}: inner dimensions "
                                  f"{a2[-1]} and {b2[-2]} differ")
    batch = broadcast_item_shapes(node, [a2[:-2], b2[:-2]])
    shape = batch + ((a2[-2],) if a.rank > 1 else ()) + ((b2[-1],) if b.rank > 1 else ())
    return Type(shape, np.result_type(np.dtype(a.dtype), np.dtype(b.dtype)).name)


def _matmul_kernel(attrs, in_types, out_type):
    ra, rb = in_types[0].rank, in_types[1].rank
    r2 = max(ra, rb, 2)
    inner = in_types[0].shape[-1]
    # With one term per sum (outer products: the per-sample gradients of a matmul), a
    # broadcast multiply computes the same products exactly and is far faster than a
    # batched matmul of 1-wide matrices.
    product = np.multiply if inner == 1 else np.matmul
    # Not one BLAS product over a batch's rows, though for a weight matrix times a batch of
    # vectors it costs a quarter of NumPy's product per item: BLAS's order of additions depends
    # on how many rows it is given, so an item's bits would depend on how a job was chunked
    # (gradient_many against gradient; tests/ops/test_completeness.py holds them equal).

    def as_matrix(x, rank, vector_axis):
        if rank == 1:
            x = np.expand_dims(x, vector_axis)
        return align(x, max(rank, 2), r2)

    if ra >= 2 and rb >= 2 and ra == rb:
        return product

    def matmul(a, b):
        out = product(as_matrix(a, ra, -2), as_matrix(b, rb, -1))
        if rb == 1:
            out = out[..., 0]
        if ra == 1:
            out = out[..., 0, :] if rb > 1 else out[..., 0]
        return out

    return matmul


def matmul_expand(mul: str, add: str, zero):
    """out[..., i, j] = add over q of mul(a[..., i, q], b[..., q, j]), NumPy's 1-D and batch rules."""

    def expand(el, operands, attrs, in_types, out_type):
        a, b = operands
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        lead = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        items = math.prod(lead)  # (not -1: NumPy cannot infer it beside an empty dimension)
        a3 = np.broadcast_to(a2, lead + a2.shape[-2:]).reshape((items,) + a2.shape[-2:])
        b3 = np.broadcast_to(b2, lead + b2.shape[-2:]).reshape((items,) + b2.shape[-2:])
        m, k, n = a3.shape[1], a3.shape[2], b3.shape[2]
        values = [el.reduce(add, [el.apply(mul, (a3[t, i, q], b3[t, q, j])) for q in range(k)], zero(el))
                  for t in range(a3.shape[0]) for i in range(m) for j in range(n)]
        return element_array(values, out_type.shape)

    return expand


def matmul_cost(in_types, out_type) -> int:
    a = in_types[0]
    return out_type.size * (a.shape[-1] if a.rank else 1)


def _swap_last(ctx, x):
    rank = ctx.type(x).rank
    return ctx.emit("transpose", [x], perm=tuple(range(rank - 2)) + (rank - 1, rank - 2))


def _matmul_vjp(ctx, node, g, positions):
    a, b = node.inputs
    ta, tb, tout = ctx.type(a), ctx.type(b), ctx.type(node.id)
    a2 = ctx.emit("reshape", [a], shape=(1,) + ta.shape) if ta.rank == 1 else a
    b2 = ctx.emit("reshape", [b], shape=tb.shape + (1,)) if tb.rank == 1 else b
    g_shape = tout.shape
    if ta.rank == 1:
        g_shape = g_shape[:-1] + (1, g_shape[-1]) if tb.rank > 1 else g_shape + (1,)
    if tb.rank == 1:
        g_shape = g_shape + (1,)
    g2 = ctx.emit("reshape", [g], shape=g_shape) if g_shape != tout.shape else g
    out = {}
    if 0 in positions:
        lb = ctx.lift(b2)
        if ctx.commutative:
            da = ctx.matmul(g2, _swap_last(ctx, lb))
        else:
            da = _swap_last(ctx, ctx.matmul(lb, _swap_last(ctx, g2)))
        da = ctx.unbroadcast(da, ctx.type(da).shape, ctx.type(a2).shape)
        out[0] = ctx.emit("reshape", [da], shape=ta.shape) if ta.rank == 1 else da
    if 1 in positions:
        db = ctx.matmul(_swap_last(ctx, ctx.lift(a2)), g2)
        db = ctx.unbroadcast(db, ctx.type(db).shape, ctx.type(b2).shape)
        out[1] = ctx.emit("reshape", [db], shape=tb.shape) if tb.rank == 1 else db
    return out


# ---------------------------------------------------------------- registration


def register(registry: Registry) -> None:
    add = registry.add
    add(OpDef("const", "source", (), _const_infer, _const_kernel, vjp=lambda *a: {},
              attrs=(AttrSpec("value", "tensor", required=True),), doc="a constant tensor",
              expand=_const_expand, analytic=True))
    # sum, max and min are their ufuncs' reduce: what np.sum, np.max and np.min call, the same
    # result dtypes and bits, without their Python wrappers (~4 µs of a 64 × 64 column sum's 10)
    for name, fn, rule in (("sum", np.add.reduce, "1 for every summed element"),
                           ("mean", np.mean, "1/n for every averaged element"),
                           ("max", np.maximum.reduce, "1 at the maximum (ties share it evenly), 0 elsewhere"),
                           ("min", np.minimum.reduce, "1 at the minimum (ties share it evenly), 0 elsewhere")):
        add(OpDef(name, "reduction", ("x",), reduce_infer, _reduce_kernel(fn),
                  vjp={"sum": _sum_vjp, "mean": _mean_vjp, "max": _max_vjp, "min": _max_vjp}[name], attrs=AXES,
                  derivatives=(("x", rule),), doc=f"{name} over axes",
                  expand={"sum": _sum_expand, "mean": _mean_expand, "max": _max_expand, "min": _min_expand}[name],
                  scalar_cost=input_cost, analytic=name not in ("max", "min")))
    add(OpDef("reshape", "structural", ("x",), _reshape_infer, _reshape_kernel, vjp=_reshape_vjp,
              attrs=(AttrSpec("shape", "ints", required=True),), derivatives=(("x", "reshape of the adjoint"),),
              doc="same elements, new shape (one -1 allowed)", moves_elements=True, analytic=True))
    add(OpDef("transpose", "structural", ("x",), _transpose_infer, _transpose_kernel, vjp=_transpose_vjp,
              attrs=(AttrSpec("perm", "ints", doc="absent: reversed axes"),),
              derivatives=(("x", "adjoint transposed by the inverse permutation"),), doc="permute axes",
              moves_elements=True, analytic=True))
    add(OpDef("broadcast_to", "structural", ("x",), _broadcast_infer, _broadcast_kernel, vjp=_broadcast_vjp,
              attrs=(AttrSpec("shape", "ints", required=True),),
              derivatives=(("x", "⊕-reduce of the adjoint over the broadcast axes"),),
              doc="NumPy broadcasting to a shape", moves_elements=True, analytic=True))
    add(OpDef("index", "structural", ("x",), index_infer, _index_kernel, vjp=_index_vjp,
              attrs=(AttrSpec("index", "index", required=True),),
              derivatives=(("x", "adjoint scattered into 0̄ at the indexed positions"),),
              doc="basic indexing: ints, slices (negative indices and steps allowed)", moves_elements=True,
              analytic=True))
    add(OpDef("scatter_index", "structural", ("x",), _scatter_infer, _scatter_kernel, vjp=_scatter_vjp,
              attrs=(AttrSpec("index", "index", required=True), AttrSpec("shape", "ints", required=True)),
              derivatives=(("x", "index of the adjoint"),), internal=True,
              doc="zeros of `shape` with x written at `index` (the adjoint of index)", moves_elements=True,
              expand=scatter_expand(lambda el: el.number(0.0)), analytic=True))
    add(OpDef("concat", "structural", ("x",), _join_infer, _join_kernel(np.concatenate), vjp=_concat_vjp,
              variadic=True, attrs=(AttrSpec("axis", "int", default=0),),
              derivatives=(("x", "the adjoint's slice for each input"),), doc="join along an existing axis",
              moves_elements=True, analytic=True))
    add(OpDef("stack", "structural", ("x",), _join_infer, _join_kernel(np.stack), vjp=_stack_vjp,
              variadic=True, attrs=(AttrSpec("axis", "int", default=0),),
              derivatives=(("x", "the adjoint's slice for each input"),), doc="join along a new axis",
              moves_elements=True, analytic=True))
    add(OpDef("matmul", "linalg", ("a", "b"), matmul_infer, _matmul_kernel, vjp=_matmul_vjp,
              derivatives=(("a", "g ⊗ bᵀ (semiring matmul)"), ("b", "aᵀ ⊗ g (semiring matmul)")),
              doc="NumPy matmul: 1-D operands promoted, batch dimensions broadcast",
              expand=matmul_expand("mul", "add", lambda el: el.number(0.0)), scalar_cost=matmul_cost, analytic=True))
