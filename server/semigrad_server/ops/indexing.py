"""Indexing by data: gather (np.take; an embedding lookup is a gather on axis 0) and its dual
scatter_add; the arg-reductions that make indices (argmax, argmin); the running sum cumsum.
Each with shape rule, kernel, adjoint and element-level form in one place.

Indices are int64 values of the graph (inputs or nodes), so they are checked when a request
runs: an index outside [-n, n) of the indexed axis is INVALID_ARGUMENT naming the node (the
plan reports the kernel's IndexError against it). Negative indices count from the end, as in
NumPy's `take` (PyTorch's `x[idx]` allows them too; `torch.gather`/`embedding` do not).
Batch axes: both operands may carry leading batch axes (indices too), broadcast together as
`jax.vmap` would.

Edges at element level (docs/semirings.md): out[..., k, ...] of a gather has one edge, of
partial 1, from x[..., idx[k], ...]; an x element read by several k has one edge to each.
Under a semiring the adjoint is therefore a scatter-⊕ (`ctx.scatter_add`), never a plain sum.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import FailedPrecondition, GraphError, InvalidArgument
from ..ir import Type
from .base import AttrSpec, OpDef, Registry, element_array, input_cost, normalize_axis


# ---------------------------------------------------------------- shapes


def _check_indices_type(node, t: Type) -> None:
    if t.dtype != "int64":
        raise GraphError(node.id, f"op '{node.op}' takes int64 indices, got {t.dtype}")


def _gather_infer(node, in_types, attrs):
    x, idx = in_types
    _check_indices_type(node, idx)
    if x.rank == 0:
        raise GraphError(node.id, "cannot gather from a 0-d value")
    a = normalize_axis(node, attrs["axis"], x.rank)
    return Type(x.shape[:a] + idx.shape + x.shape[a + 1:], x.dtype)


def scatter_add_shape(node, u: Type, idx: Type, attrs) -> tuple[int, tuple]:
    """(axis, item shape) of scatter_add: `u`'s axes axis..axis+q are the indices' shape."""
    _check_indices_type(node, idx)
    size = attrs["size"]
    if size < 0:
        raise GraphError(node.id, f"size must be non-negative, got {size}")
    q = idx.rank
    out_rank = u.rank - q + 1
    if out_rank < 1:
        raise GraphError(node.id, f"updates of shape {list(u.shape)} have fewer axes than the indices "
                                  f"{list(idx.shape)}")
    a = normalize_axis(node, attrs["axis"], out_rank)
    if u.shape[a:a + q] != idx.shape:
        raise GraphError(node.id, f"updates of shape {list(u.shape)} do not hold the indices' shape "
                                  f"{list(idx.shape)} at axis {a}")
    return a, u.shape[:a] + (size,) + u.shape[a + q:]


def _scatter_add_infer(node, in_types, attrs):
    return Type(scatter_add_shape(node, in_types[0], in_types[1], attrs)[1], in_types[0].dtype)


# ---------------------------------------------------------------- kernels


def check_indices(idx: np.ndarray, n: int, origin: str | None = None) -> None:
    """IndexError (the plan reports it as INVALID_ARGUMENT naming the node) past [-n, n)."""
    if idx.size == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo >= -n and hi < n:
        return
    bad = lo if lo < -n else hi
    whose = f"the indices of node '{origin}': " if origin else ""
    raise IndexError(f"{whose}index {bad} is out of range for an axis of size {n} (valid: {-n} to {n - 1}; "
                     f"negative indices count from the end)")


def _lead(a: np.ndarray, rank: int) -> tuple:
    return a.shape[: a.ndim - rank]


def _gather_kernel(attrs, in_types, out_type):
    x_t, i_t = in_types
    a, r, q, n = attrs["axis"] % x_t.rank, x_t.rank, i_t.rank, x_t.shape[attrs["axis"] % x_t.rank]
    m = math.prod(i_t.shape)

    def gather(x, idx):
        check_indices(idx, n, attrs.get("origin"))
        lead_x, lead_i = _lead(x, r), _lead(idx, q)
        if not lead_i:
            return np.take(x, idx, axis=len(lead_x) + a)
        if not lead_x:  # an unbatched table (embeddings): one take, the indices' batch axes moved first
            out = np.take(x, idx, axis=a)
            return np.moveaxis(out, tuple(range(a, a + len(lead_i))), tuple(range(len(lead_i)))) if a else out
        lead = tuple(np.broadcast_shapes(lead_x, lead_i))
        xv = np.broadcast_to(x, lead + x_t.shape)  # a view: an unbatched table is never copied
        iv = np.broadcast_to(idx, lead + i_t.shape).reshape(lead + (1,) * a + (m,) + (1,) * (r - a - 1))
        iv = np.where(iv < 0, iv + n, iv)
        return np.take_along_axis(xv, iv, axis=len(lead) + a).reshape(lead + out_type.shape)

    return gather


def scatter_keys(u_shape: tuple, idx: np.ndarray, u_t: Type, i_t: Type, a: int, size: int):
    """(batch shape, flat target of every element of the broadcast updates): update element
    (b, p, k, s) goes to output element (b, p, idx[b, k], s), flattened."""
    lead = tuple(np.broadcast_shapes(u_shape[: len(u_shape) - u_t.rank], _lead(idx, i_t.rank)))
    nb, p = math.prod(lead), math.prod(u_t.shape[:a])
    m, s = math.prod(i_t.shape), math.prod(u_t.shape[a + i_t.rank:])
    iv = np.broadcast_to(idx, lead + i_t.shape).reshape(nb, 1, m, 1)
    iv = np.where(iv < 0, iv + size, iv)
    keys = ((np.arange(nb).reshape(nb, 1, 1, 1) * p + np.arange(p).reshape(1, p, 1, 1)) * size + iv) * s \
        + np.arange(s).reshape(1, 1, 1, s)
    return lead, np.broadcast_to(keys, (nb, p, m, s)).reshape(-1), nb * p * size * s


def _scatter_add_kernel(attrs, in_types, out_type):
    u_t, i_t = in_types
    size, a = attrs["size"], attrs["axis"] % out_type.rank

    def scatter_add(u, idx):
        check_indices(idx, size, attrs.get("origin"))
        lead, keys, total = scatter_keys(u.shape, idx, u_t, i_t, a, size)
        values = np.broadcast_to(u, lead + u_t.shape).reshape(-1)
        if u.dtype.kind == "f" and u.dtype.itemsize <= 8:
            out = np.bincount(keys, weights=values, minlength=total).astype(u.dtype, copy=False)
        else:  # complex (complex-step derivatives), ints
            out = np.zeros(total, dtype=u.dtype)
            np.add.at(out, keys, values)
        return out.reshape(lead + out_type.shape)

    return scatter_add


# ---------------------------------------------------------------- element level


def known_indices(el, idx: np.ndarray, n: int, op: str) -> np.ndarray:
    """Index elements as ints: known at expansion time (constants), else the op is refused."""
    values = [el.index(e) for e in idx.reshape(-1)]
    if any(v is None for v in values):
        raise FailedPrecondition(f"op '{op}' has an element-level form only for indices known when the graph is "
                                 f"expanded (a constant, or an integer input given as one)")
    out = np.asarray(values, dtype=np.int64).reshape(idx.shape)
    try:
        check_indices(out, n)
    except IndexError as e:
        raise InvalidArgument(f"op '{op}': {e}") from None
    return np.where(out < 0, out + n, out)


def _gather_expand(el, operands, attrs, in_types, out_type):
    x, idx = operands
    a = attrs["axis"] % x.ndim
    return np.take(x, known_indices(el, idx, x.shape[a], "gather"), axis=a)


def scatter_add_expand(add: str, zero):
    """out element j = `add`-reduce of the update elements sent to j (`zero(el)` where none)."""

    def expand(el, operands, attrs, in_types, out_type):
        u, idx = operands
        size, a = attrs["size"], attrs["axis"] % out_type.rank
        iv = known_indices(el, idx, size, "scatter_add")
        _, keys, total = scatter_keys(u.shape, iv, in_types[0], in_types[1], a, size)
        rows = [[] for _ in range(total)]
        for key, value in zip(keys.tolist(), u.reshape(-1)):
            rows[key].append(value)
        return element_array([el.reduce(add, row, zero(el)) for row in rows], out_type.shape)

    return expand


# ---------------------------------------------------------------- adjoints


def _gather_vjp(ctx, node, g, positions):
    x, idx = node.inputs
    t = ctx.type(x)
    a = normalize_axis(node, ctx.attrs(node)["axis"], t.rank)
    origin = ctx.attrs(node)["origin"] or node.id
    return {0: ctx.edge_const(1, ctx.scatter_add(g, idx, a, t.shape[a], origin))}


def _scatter_add_vjp(ctx, node, g, positions):
    u, idx = node.inputs
    attrs = ctx.attrs(node)
    a = attrs["axis"] % ctx.type(node.id).rank
    return {0: ctx.edge_const(1, ctx.emit("gather", [g, idx], axis=a, origin=attrs["origin"] or node.id))}


# ---------------------------------------------------------------- cumsum


def _cumsum_infer(node, in_types, attrs):
    (t,) = in_types
    if t.rank == 0:
        raise GraphError(node.id, "cumsum of a 0-d value")
    if not t.is_float:
        raise GraphError(node.id, f"cumsum takes a float operand, got {t.dtype}")
    normalize_axis(node, attrs["axis"], t.rank)
    return t


def _cumsum_kernel(attrs, in_types, out_type):
    rank = out_type.rank
    axis = attrs["axis"] % rank - rank
    return lambda x: np.cumsum(x, axis=axis)


def scan_expand(add: str, reverse_attr: bool):
    """Running `add` along the axis, in NumPy's order (out[i] = out[i-1] + x[i]); with
    `reverse_attr`, from the end when the node's `reverse` attribute is set."""

    def expand(el, operands, attrs, in_types, out_type):
        x = operands[0]
        axis = attrs["axis"] % x.ndim
        moved = np.moveaxis(x, axis, -1)
        out = np.empty(moved.shape, dtype=object)
        steps = list(range(moved.shape[-1]))
        if reverse_attr and attrs["reverse"]:
            steps.reverse()
        for row in np.ndindex(*moved.shape[:-1]):
            acc = None
            for i in steps:
                acc = moved[row + (i,)] if acc is None else el.apply(add, (acc, moved[row + (i,)]))
                out[row + (i,)] = acc
        return np.moveaxis(out, -1, axis)

    return expand


def _cumsum_vjp(ctx, node, g, positions):
    """x[j] reaches out[i] for every i ≥ j: the adjoint is a reverse ⊕-scan of g."""
    axis = normalize_axis(node, ctx.attrs(node)["axis"], ctx.type(node.id).rank)
    return {0: ctx.edge_const(1, ctx.cumsum(g, axis, reverse=True))}


# ---------------------------------------------------------------- argmax, argmin


def _arg_infer(node, in_types, attrs):
    (t,) = in_types
    if attrs["axis"] is None:
        if t.size == 0:
            raise GraphError(node.id, f"{node.op} of an empty value")
        shape = (1,) * t.rank if attrs["keepdims"] else ()
    else:
        if t.rank == 0:
            raise GraphError(node.id, f"{node.op} over an axis of a 0-d value")
        a = normalize_axis(node, attrs["axis"], t.rank)
        if t.shape[a] == 0:
            raise GraphError(node.id, f"{node.op} over an empty axis")
        shape = tuple(1 if i == a else d for i, d in enumerate(t.shape)) if attrs["keepdims"] else \
            t.shape[:a] + t.shape[a + 1:]
    return Type(shape, "int64")


def _arg_kernel(fn):
    """np.argmax/argmin of the real parts: complex arguments (the complex step) pick the index
    the real values do, so the index stays a constant of the perturbation."""

    def make(attrs, in_types, out_type):
        rank, axis, keepdims = in_types[0].rank, attrs["axis"], attrs["keepdims"]
        if axis is None:  # the index into the flattened item, as NumPy's
            def flat(x):
                lead = x.shape[: x.ndim - rank]
                return fn(np.real(x).reshape(lead + (-1,)), axis=-1).reshape(lead + out_type.shape)

            return flat
        axis = axis % rank - rank
        return lambda x: fn(np.real(x), axis=axis, keepdims=keepdims)

    return make


# ---------------------------------------------------------------- registration

ORIGIN = AttrSpec("origin", "string", doc="set in backward graphs: the node whose indices these are (errors name it)")


def register(registry: Registry) -> None:
    add = registry.add
    add(OpDef("gather", "structural", ("x", "indices"), _gather_infer, _gather_kernel, vjp=_gather_vjp,
              attrs=(AttrSpec("axis", "int", default=0), ORIGIN),
              derivatives=(("x", "scatter-⊕ of the adjoint by the indices (scatter_add)"),),
              doc="np.take(x, indices, axis): int64 indices in [-n, n) (negative count from the end); "
                  "an embedding lookup is a gather on axis 0",
              moves_elements=True, expand=_gather_expand, analytic=True))
    add(OpDef("scatter_add", "structural", ("updates", "indices"), _scatter_add_infer, _scatter_add_kernel,
              vjp=_scatter_add_vjp,
              attrs=(AttrSpec("size", "int", required=True, doc="length of the output's axis"),
                     AttrSpec("axis", "int", default=0), ORIGIN),
              derivatives=(("updates", "gather of the adjoint by the indices"),),
              doc="zeros with updates' slices added at int64 indices along axis (duplicates add up); "
                  "the adjoint of gather",
              expand=scatter_add_expand("add", lambda el: el.number(0.0)), scalar_cost=input_cost,
              analytic=True))
    add(OpDef("cumsum", "structural", ("x",), _cumsum_infer, _cumsum_kernel, vjp=_cumsum_vjp,
              attrs=(AttrSpec("axis", "int", required=True),),
              derivatives=(("x", "1 from x[j] to every out[i], i ≥ j: a reverse ⊕-scan of the adjoint"),),
              doc="running sum along axis (np.cumsum)", expand=scan_expand("add", False), scalar_cost=input_cost,
              analytic=True))
    for name, fn in (("argmax", np.argmax), ("argmin", np.argmin)):
        # No element-level form: the result is an index chosen by the data (scalar programs
        # and SymPy expansions refuse the op by declaration); no gradient edge.
        add(OpDef(name, "reduction", ("x",), _arg_infer, _arg_kernel(fn),
                  vjp=lambda ctx, node, g, positions: dict.fromkeys(positions),
                  attrs=(AttrSpec("axis", "int", doc="absent: the index into the flattened value"),
                         AttrSpec("keepdims", "bool", default=False)),
                  derivatives=(("x", "none: an int64 index, no gradient edge"),),
                  doc=f"np.{name}: int64 index of the first {name[3:]}imum along axis (ties: the smallest index)",
                  analytic=True))
