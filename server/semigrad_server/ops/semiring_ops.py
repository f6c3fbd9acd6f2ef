"""Ops of backward graphs under a semiring other than the real one, bound to one configured
semiring: lift, ⊗, ⊕, ⊕-reduce, semiring matmul, scatter into 0̄, scatter-⊕ by indices
(gather's adjoint), ⊕-scan (cumsum's adjoint), 1̄.

Their values are semiring values (an array, or a tuple of arrays for tuple carriers); their
types give the item shape only. They have no adjoints: a non-real backward graph is not
differentiated again.
"""

from __future__ import annotations

import numpy as np

from ..ir import Type
from .base import AttrSpec, OpDef, Registry, align, broadcast_item_shapes, element_array, input_cost, reduce_elements
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
        return lambda a, b: s.matmul(m(lambda c: align(c, ra, r), a), m(lambda c: align(c, rb, r), b))

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

    def ones_kernel(attrs, in_types, out_type):
        value = s.ones(out_type.shape)
        return lambda: value

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
