"""Ops of backward graphs under a semiring other than the real one, bound to one configured
semiring: lift, ⊗, ⊕, ⊕-reduce, semiring matmul, scatter into 0̄, scatter-⊕ by indices
(gather's adjoint), ⊕-scan (cumsum's adjoint), 1̄.

Their values are semiring values (an array, or a tuple of arrays for tuple carriers); their
types give the item shape only. They have no adjoints: a non-real backward graph is not
differentiated again.
"""

from __future__ import annotations

import numpy as np

from .. import deadline
from ..ir import Type
from ..semiring.zero_rows import matmul_of_rows_not_zero
from .base import AttrSpec, OpDef, Registry, align, broadcast_item_shapes, element_array, input_cost, reduce_elements
from .nn import ROW_JACOBIANS, row_delta
from .indexing import ORIGIN, check_indices, scan_expand, scatter_add_expand, scatter_add_shape, scatter_keys
from .structural import (index_infer, matmul_infer, reduce_infer, full_index, matmul_cost, matmul_expand,
                         scatter_expand)


def _semiring_zero(el):
    return el.semiring_zero()


def _sum_expand(el, operands, attrs, in_types, out_type):
    return reduce_elements(operands[0], attrs["axes"], attrs["keepdims"],
                           lambda row: el.reduce("sr_add", row, el.semiring_zero()))


def _ones_expand(el, operands, attrs, in_types, out_type):
    return element_array([el.semiring_one()] * out_type.size, out_type.shape)


def _value_type(shape) -> Type:
    return Type(tuple(shape), "float64")


def _binary_infer(node, in_types, attrs):
    return _value_type(broadcast_item_shapes(node, [t.shape for t in in_types]))


def _scatter_infer(node, in_types, attrs):
    shape = tuple(attrs["shape"])
    index_infer(node, [Type(shape, "float64")], attrs)  # validates the index against the shape
    return _value_type(shape)


# Elements of the lifted n × n row Jacobians `sr_row_vjp` builds at once (at least one row's):
# its scratch memory, per component (docs/limits.md).
ROW_BLOCK_ELEMENTS = 1 << 20


def _row_vjp_infer(node, in_types, attrs):
    if attrs["kind"] not in ROW_JACOBIANS:
        raise ValueError(f"unknown row Jacobian {attrs['kind']!r}")
    return _value_type(in_types[2].shape)


def _row_vjp_cost(in_types, out_type) -> int:
    """Per output element: n entries of the Jacobian built, lifted, ⊗ and ⊕."""
    return 4 * out_type.size * (out_type.shape[-1] if out_type.rank else 1)


def _row_vjp_expand(el, operands, attrs, in_types, out_type):
    y, scale, g = operands
    lead, n = out_type.shape[:-1], out_type.shape[-1]
    y, g = np.broadcast_to(y, lead + (n,)), np.broadcast_to(g, lead + (n,))
    scale = np.broadcast_to(scale, lead + (1,))
    entry, dtype = ROW_JACOBIANS[attrs["kind"]].element, in_types[0].dtype
    values = []
    for r in np.ndindex(*lead):
        yr, sr, gr = y[r], scale[r][0], g[r]
        for j in range(n):
            terms = [el.apply("sr_mul", (el.apply("sr_lift", (entry(el, yr, sr, j, i, n, dtype),)), gr[i]))
                     for i in range(n)]
            values.append(el.reduce("sr_add", terms, el.semiring_zero()))
    return element_array(values, out_type.shape)


_REGISTRIES: dict[tuple, tuple[Registry, Registry]] = {}  # (id(base), key) -> (base, bound registry)
_MAX_CACHED = 64


def semiring_registry(base: Registry, semiring) -> Registry:
    """`base` plus the semiring ops bound to `semiring` (cached per base registry, e.g. a
    graph's registry with its custom ops, and configured semiring)."""
    key = (id(base), semiring.key)
    cached = _REGISTRIES.get(key)
    if cached is None or cached[0] is not base or cached[1].ops["sr_add"].bound is not semiring:
        if len(_REGISTRIES) >= _MAX_CACHED:
            _REGISTRIES.clear()
        cached = _REGISTRIES[key] = (base, _bind(base, semiring))
    return cached[1]


def _bind(base: Registry, s) -> Registry:
    registry = Registry(dict(base.ops))
    m = s.map

    def aligned(fn):
        def make(attrs, in_types, out_type):
            ranks, out_rank = [t.rank for t in in_types], out_type.rank
            if all(r == out_rank for r in ranks):
                return fn
            return lambda *vals: fn(*(m(lambda c, r=r: align(c, r, out_rank), v) for v, r in zip(vals, ranks)))

        return make

    def sum_kernel(attrs, in_types, out_type):
        rank = in_types[0].rank
        axes = tuple(a % rank - rank for a in attrs["axes"])
        return lambda v: s.sum(v, axis=axes, keepdims=attrs["keepdims"])

    def matmul_kernel(attrs, in_types, out_type):
        ra, rb, r = in_types[0].rank, in_types[1].rank, out_type.rank
        return lambda a, b: matmul_of_rows_not_zero(s, m(lambda c: align(c, ra, r), a), m(lambda c: align(c, rb, r), b))

    def scatter_kernel(attrs, in_types, out_type):
        rank, shape = in_types[0].rank, out_type.shape
        key = full_index(attrs["index"], len(shape))

        def scatter(g):
            lead = s.shape(g)[: len(s.shape(g)) - rank]
            out = s.zeros(lead + shape)
            for target, part in zip(s.components_of(out), s.components_of(g)):
                target[key] = part
            return out

        return scatter

    def scatter_add_kernel(attrs, in_types, out_type):
        u_t, i_t = in_types
        size, a = attrs["size"], attrs["axis"] % out_type.rank

        def scatter_add(g, idx):
            check_indices(idx, size, attrs["origin"])
            lead, keys, total = scatter_keys(s.shape(g), idx, u_t, i_t, a, size)
            flat = m(lambda c: np.broadcast_to(c, lead + u_t.shape).reshape(-1), g)
            return m(lambda c: c.reshape(lead + out_type.shape), s.scatter_add(flat, keys, total))

        return scatter_add

    def cumsum_kernel(attrs, in_types, out_type):
        rank = out_type.rank
        ax, reverse = attrs["axis"] % rank - rank, attrs["reverse"]

        def take(c, start, stop):
            return c[(Ellipsis, slice(start, stop)) + (slice(None),) * (-ax - 1)]

        def flip(c):
            return c[(Ellipsis, slice(None, None, -1)) + (slice(None),) * (-ax - 1)]

        def scan(v):
            """Inclusive ⊕-scan in log₂ n rounds: v[i] ⊕= v[i - d] for d = 1, 2, 4, ..."""
            if reverse:
                v = m(flip, v)
            n, d = s.shape(v)[ax], 1
            while d < n:
                moved = s.add(m(lambda c: take(c, d, n), v), m(lambda c: take(c, 0, n - d), v))
                parts = [np.concatenate([take(c, 0, d), mv], axis=ax)
                         for c, mv in zip(s.components_of(v), s.components_of(moved))]
                v = parts[0] if s.components == 1 else tuple(parts)
                d *= 2
            return m(flip, v) if reverse else v

        return scan

    def row_vjp_kernel(attrs, in_types, out_type):
        jacobian = ROW_JACOBIANS[attrs["kind"]]
        n = out_type.shape[-1]
        # about ROW_BLOCK_ELEMENTS values of lifted Jacobian at once, whatever the carrier (kbest
        # at k = 64 lifted each block into 64 arrays: a 16 KB request grew its worker by 1.1 GB),
        # up to 4 times that for a product of many semirings: its per-block calls, one a
        # member, made narrower blocks slow (14 semirings over a 2,048-wide row: 1.7 -> 12 s)
        elements = max(1, ROW_BLOCK_ELEMENTS // min(4, s.lift_arrays or s.components))
        step = max(1, elements // max(1, n * n))
        # a row wider than the block allows (n² past it) goes by blocks of columns too
        width = n if n * n <= elements else max(1, elements // n)
        shift, dtype = 1.0 / n if jacobian.centred and n else 0.0, in_types[0].dtype
        joined = -1 if s.commutative else -2  # the axis of a part's columns (g as a row, or as a column)

        def row_vjp(y, scale, g):
            """Rows in blocks of `step`, each block's columns in blocks of `width`: each block's
            lifted Jacobian (step, n, width) and its adjoints, a semiring matmul; never more than
            ~ROW_BLOCK_ELEMENTS of Jacobian at once (an 8,192-wide row's was 67 M elements, built
            and multiplied in uninterruptible passes seconds past the deadline). A commutative
            semiring multiplies g as a row into J (the layout J is built in: no transposed copy
            for the kernels), any other φ(Jᵀ) into g as a column (the edge nearer the input
            on the left)."""
            lead = np.broadcast_shapes(np.shape(y)[:-1], np.shape(scale)[:-1], s.shape(g)[:-1])
            rows_y = np.broadcast_to(y, lead + (n,)).reshape(-1, n)
            rows_s = np.broadcast_to(scale, lead + (1,)).reshape(-1, 1)
            rows_g = m(lambda c: np.broadcast_to(c, lead + (n,)).reshape(-1, n), g)
            total = rows_y.shape[0]
            if total == 0 or n == 0:
                return s.zeros(lead + (n,))
            # made per call, once the request's work is checked (made with the kernel, a
            # 20,000-wide row's n × n took 3.2 GB and 3 s before the plan's bound refused the request)
            whole = row_delta(n, dtype, shift) if width == n else None  # else one per block of columns
            parts = []
            for r0 in range(0, total, step):
                block = slice(r0, r0 + step)
                columns = []
                for c0 in range(0, n, width):
                    deadline.check(f"at a {attrs['kind']} adjoint (rows {r0}-{min(total, r0 + step)} of {total})")
                    cols = slice(c0, c0 + width)
                    delta = whole if whole is not None else row_delta(n, dtype, shift, cols)
                    lifted = s.lift(jacobian.values(rows_y[block], rows_s[block], delta, cols))
                    if s.commutative:
                        part = s.matmul(m(lambda c: c[block, None, :], rows_g), lifted)
                    else:
                        part = s.matmul(m(lambda c: np.swapaxes(c, -1, -2), lifted),
                                        m(lambda c: c[block, :, None], rows_g))
                    columns.append(s.components_of(part))
                parts.append([np.concatenate([p[c] for p in columns], axis=joined) if len(columns) > 1
                              else columns[0][c] for c in range(s.components)])
            out = [np.concatenate([p[c] for p in parts]).reshape(lead + (n,)) for c in range(s.components)]
            return out[0] if s.components == 1 else tuple(out)

        return row_vjp

    def ones_kernel(attrs, in_types, out_type):
        # made per call, once the request's work is checked: a k-best carrier's 1̄ is 3k arrays
        return lambda: s.ones(out_type.shape)

    def sum_infer(node, in_types, attrs):
        return _value_type(reduce_infer(node, in_types, attrs).shape)

    ops = [
        OpDef("sr_lift", "semiring", ("d",), lambda n, t, a: _value_type(t[0].shape),
              lambda attrs, in_types, out_type: s.lift, doc="φ: a real local partial into the semiring",
              elementwise_fn=s.lift),
        OpDef("sr_mul", "semiring", ("a", "b"), _binary_infer, aligned(s.mul), doc="a ⊗ b", elementwise_fn=s.mul),
        OpDef("sr_add", "semiring", ("a", "b"), _binary_infer, aligned(s.add), doc="a ⊕ b", elementwise_fn=s.add),
        OpDef("sr_sum", "semiring", ("x",), sum_infer, sum_kernel,
              attrs=(AttrSpec("axes", "ints", required=True), AttrSpec("keepdims", "bool", default=False)),
              doc="⊕-reduce over axes", expand=_sum_expand, scalar_cost=input_cost),
        OpDef("sr_matmul", "semiring", ("a", "b"), lambda n, t, a: _value_type(matmul_infer(n, t, a).shape),
              matmul_kernel, doc="semiring matmul: ⊕ over k of a[i, k] ⊗ b[k, j]",
              expand=matmul_expand("sr_mul", "sr_add", _semiring_zero), scalar_cost=matmul_cost),
        OpDef("sr_scatter", "semiring", ("x",), _scatter_infer, scatter_kernel,
              attrs=(AttrSpec("index", "index", required=True), AttrSpec("shape", "ints", required=True)),
              doc="0̄ of `shape` with x written at `index`", moves_elements=True,
              expand=scatter_expand(_semiring_zero)),
        OpDef("sr_scatter_add", "semiring", ("x", "indices"),
              lambda n, t, a: _value_type(scatter_add_shape(n, t[0], t[1], a)[1]), scatter_add_kernel,
              attrs=(AttrSpec("size", "int", required=True), AttrSpec("axis", "int", default=0), ORIGIN),
              doc="0̄ of the output with x's slices ⊕-added at the indices: the adjoint of gather",
              expand=scatter_add_expand("sr_add", _semiring_zero), scalar_cost=input_cost),
        OpDef("sr_cumsum", "semiring", ("x",), lambda n, t, a: _value_type(t[0].shape), cumsum_kernel,
              attrs=(AttrSpec("axis", "int", required=True), AttrSpec("reverse", "bool", default=False)),
              doc="inclusive ⊕-scan along axis (from the end when reverse): the adjoint of cumsum",
              expand=scan_expand("sr_add", True), scalar_cost=input_cost),
        OpDef("sr_row_vjp", "semiring", ("y", "scale", "g"), _row_vjp_infer, row_vjp_kernel,
              attrs=(AttrSpec("kind", "string", required=True),),
              doc="⊕_i φ(J[i, j]) ⊗ g[i] per row, J the row Jacobian of softmax, log_softmax or layer_norm "
                  "(`kind`) from rows y and scale, built a block of rows at a time",
              expand=_row_vjp_expand, scalar_cost=_row_vjp_cost),
        OpDef("sr_ones", "semiring", (), lambda n, t, a: _value_type(a["shape"]), ones_kernel,
              attrs=(AttrSpec("shape", "ints", required=True),), doc="1̄ of `shape`", expand=_ones_expand),
    ]
    if hasattr(s, "tag"):  # back-pointers (semiring.pointers): adjoints stamped with their element ids
        def tag_kernel(attrs, in_types, out_type):
            offset, each, shape = attrs["offset"], attrs["each"], out_type.shape
            return lambda v: s.tag(v, offset, shape, each)

        ops.append(OpDef("sr_tag", "semiring", ("x",), lambda n, t, a: _value_type(t[0].shape), tag_kernel,
                         attrs=(AttrSpec("offset", "int", required=True), AttrSpec("each", "bool", default=True)),
                         doc="x with its back-pointers set to its own element ids (offset + flat index)"))
    for op in ops:
        op.internal = True
        op.bound = s
        registry.ops[op.name] = op
    return registry
