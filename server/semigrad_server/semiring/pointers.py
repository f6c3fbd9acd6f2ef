"""Back-pointers for a selective semiring: its values carried with the winner of every ⊕.

`PointerSemiring(base)` wraps a selective semiring (⊕ returns one of its operands). A value is
the base value plus two float64 arrays of the same shape:

* `ptr`: which contribution won the ⊕ that made this element — an element id the backward
  pass stamps on every adjoint before it flows into its node's adjoint rule (`tag`), so the
  winner of a node's accumulated adjoint is the id of the consumer element its best path
  steps to next (0: an output's seed; -1: none, for constants and lifted partials);
* `partial`: the real product of the local partials lifted since the last stamp: the
  partial of the winning edge.

Every ⊕ (add, ⊕-reduce, matmul, scatter-⊕, ⊕-scan) keeps the winner's pointer and partial.
Ties keep the documented tie-break: the operand whose value ⊕ returns, and among equal
values the smaller pointer (element ids grow with graph order, then element index). ⊗
multiplies values and partials and keeps the one pointer a product of an adjoint and lifted
partials has (the larger: a lifted partial has none, -1).

Because every op's semiring adjoint is written against ⊕, ⊗ and the semiring's kernels,
running it under this semiring makes it report its winners itself: no op needs a second rule.
"""

from __future__ import annotations

import numpy as np

from ..deadline import check
from . import pruning
from .kernels import everywhere
from .pointer_kernels import NONE, kbest_pointer_matmul, pointer_matmul, stacked_view, top_candidates, top_of_two
from .base import Semiring
from .tropical import TropicalSemiring

OUTPUT = 0.0  # pointer of an output's seed: the path ends there


class PointerSemiring(Semiring):
    """`base` (selective, one array per value) with back-pointers: (value, ptr, partial)."""

    selective = True
    idempotent = True
    components = 3
    lift_arrays = 1  # the base's lift of d (its pointer a view, its partial d itself)
    component_names = ("value", "ptr", "partial")
    primary = "value"

    def __init__(self, base: Semiring):
        if not base.selective:
            raise ValueError(f"back-pointers need a selective semiring; '{base.name}' is not")
        if base.components != 1:
            raise ValueError(f"back-pointers need a semiring with one array per value; '{base.name}' has "
                             f"{base.components}")
        self.base = base
        self.name = base.name
        self.commutative = base.commutative
        self.description = f"{base.name} with back-pointers"
        # (max or min) ⊕ on plain arrays: winners found by comparison, without calling add.
        self._order = base.addition if isinstance(base, TropicalSemiring) else None

    @property
    def key(self) -> str:
        return f"pointers({self.base.key})"

    # ------------------------------------------------------------ the carrier
    def zeros(self, shape):
        return self.base.zeros(shape), np.full(shape, NONE), np.zeros(shape)

    def ones(self, shape):
        return self.base.ones(shape), np.full(shape, NONE), np.ones(shape)

    def lift(self, d):
        d = np.asarray(d, dtype=np.float64)
        return self.base.lift(d), np.broadcast_to(np.float64(NONE), d.shape), d  # (read-only: never written into)

    def mul(self, a, b):
        return self.base.mul(a[0], b[0]), np.maximum(a[1], b[1]), a[2] * b[2]

    def _a_wins(self, a, b) -> np.ndarray:
        """Where a ⊕ b is a: a's value strictly better, or equal values and a's pointer no larger."""
        va, vb = a[0], b[0]
        if self._order == "max":
            better, same = va > vb, va == vb
        elif self._order == "min":
            better, same = va < vb, va == vb
        else:
            total = self.base.add(va, vb)
            is_a = np.asarray(self.base.equal(total, va, rtol=0, atol=0))
            same = is_a & np.asarray(self.base.equal(total, vb, rtol=0, atol=0))
            better = is_a & ~same
        return better | (same & (a[1] <= b[1]))

    def add(self, a, b):
        take = self._a_wins(a, b)
        return tuple(np.where(take, x, y) for x, y in zip(a, b))

    def sum(self, a, axis, keepdims=False):
        ndim = np.ndim(a[0])
        for ax in sorted(axis, reverse=True):
            a = self._reduce_keep(a, ax % ndim)
        if not keepdims:
            a = tuple(np.squeeze(c, axis=tuple(axis)) for c in a)
        return a

    def _reduce_keep(self, a, ax: int):
        """⊕ over one (non-negative) axis, kept with length 1: the winner's three arrays."""
        shape = np.shape(a[0])
        if shape[ax] == 0:
            return self.zeros(shape[:ax] + (1,) + shape[ax + 1:])
        v, ptr = np.broadcast_arrays(a[0], a[1])
        best = self.base.sum(v, axis=(ax - v.ndim,), keepdims=True)
        if self._order is not None:
            hit = v == best
        else:
            hit = np.asarray(self.base.equal(v, best, rtol=0, atol=0))
        lowest = np.where(hit, ptr, np.inf).min(axis=ax, keepdims=True)
        first = np.argmax(hit & (ptr == lowest), axis=ax)[(slice(None),) * ax + (None,)]
        return tuple(np.take_along_axis(np.broadcast_to(c, shape), first, axis=ax) for c in a)

    def matmul(self, a, b):
        if self._order is not None:
            out = pointer_matmul(a, b, self.base.addition, self.base.multiplication, self.base.zero)
            if out is not None:
                return out
        return super().matmul(a, b)

    def equal(self, a, b, rtol=1e-9, atol=1e-12):
        return (np.asarray(self.base.equal(a[0], b[0], rtol=rtol, atol=atol))
                & (np.asarray(a[1]) == np.asarray(b[1]))
                & (np.isclose(a[2], b[2], rtol=rtol, atol=atol) | (np.asarray(a[2]) == np.asarray(b[2]))))

    def read(self, value):
        return self.base.read(value[0])

    def value_of(self, value):
        """The base semiring's value."""
        return value[0]

    # ------------------------------------------------------------ stamping adjoints
    def tag(self, value, offset: int, item_shape: tuple, each: bool = True):
        """`value` with its pointers replaced by its own element ids (offset + flat index of the
        element within its node; every element `offset` when not `each`) and partials by 1."""
        v = np.asarray(value[0])
        if each:
            size = int(np.prod(item_shape, dtype=np.int64))
            ids = (offset + np.arange(size, dtype=np.float64)).reshape(item_shape)
            ptr = np.broadcast_to(ids, v.shape) if v.shape[v.ndim - len(item_shape):] == tuple(item_shape) \
                else np.broadcast_to(ids, np.broadcast_shapes(v.shape, ids.shape))
        else:
            ptr = np.full(v.shape, float(offset))
        v = np.broadcast_to(v, ptr.shape)
        return v, ptr, np.broadcast_to(np.float64(1.0), ptr.shape)


class KBestPointerSemiring(Semiring):
    """The k best path values of a max- or min-ordered semiring (a `TropicalSemiring`:
    max_product, maxplus, minplus, bottleneck), each with its back-pointer and edge partial:
    the k-best semiring's carrier (for max_product its values are kbest's) with pointers.

    A value is 3k arrays: the k values, best first (0̄ where there are fewer paths), their k
    pointers and their k partials. A pointer is `id · k + rank`: the element the path steps
    to next and which of that element's k paths it continues (id 0: an output's seed). Ties
    between equal values go to the smaller pointer, as in `PointerSemiring`.
    """

    selective = False
    idempotent = False

    def __init__(self, base: Semiring, k: int):
        if not isinstance(base, TropicalSemiring):
            raise ValueError(f"the k best paths need a max- or min-ordered semiring (max_product, maxplus, "
                             f"minplus, bottleneck); '{base.name}' is not one")
        self.base, self.k = base, int(k)
        self.name = base.name
        self.commutative = base.commutative
        self.components = 3 * self.k
        self.lift_arrays = 1  # the base's lift of d: the other ranks and every pointer are views
        self.component_names = tuple(f"{part}{r}" for part in ("value", "ptr", "partial") for r in range(self.k))
        self.primary = "value"
        self.description = f"the {self.k} best paths of {base.name} with back-pointers"
        self._sign = 1.0 if base.addition == "max" else -1.0  # sort key: -sign · value, then pointer
        self.prunable = pruning.prunable(base)  # its matmuls may drop what no top path needs (pruning.py)

    @property
    def key(self) -> str:
        return f"kbest-pointers({self.base.key}, k={self.k})"

    # ------------------------------------------------------------ packing
    def _stack(self, value):
        # A k-best op makes several passes over 3k arrays, each a plan step: the deadline is
        # checked between them (at top_paths = 64 over 60,000 elements a step took 0.66 s).
        k = self.k
        parts = np.broadcast_arrays(*value)
        out = []
        for r in range(3):
            check("in a k-best step")
            group = parts[r * k:(r + 1) * k]
            whole = stacked_view(group)
            out.append(np.stack(group, -1) if whole is None else whole)
        return tuple(out)

    def _unstack(self, v, p, q):
        return tuple(v[..., r] for r in range(self.k)) + tuple(p[..., r] for r in range(self.k)) + \
            tuple(q[..., r] for r in range(self.k))

    def _top(self, v, p, q):
        """The k best of the candidates on the last axis: by value (⊕'s order), then pointer."""
        check("in a k-best step")
        out = top_candidates(v, p, q, self.k, self._sign)
        if out is not None:
            return out
        order = np.lexsort((p, -self._sign * v), axis=-1)[..., :self.k]
        return tuple(np.take_along_axis(x, order, axis=-1) for x in (v, p, q))

    # ------------------------------------------------------------ the carrier
    def _single(self, v, p, q):
        """A value whose best entry is (v, p, q) and the others 0̄."""
        shape = np.shape(v)
        rest = range(self.k - 1)  # distinct arrays: kernels such as a scatter write into them
        return ((v,) + tuple(self.base.zeros(shape) for _ in rest) + (p,) + tuple(np.full(shape, NONE) for _ in rest)
                + (q,) + tuple(np.zeros(shape) for _ in rest))

    def zeros(self, shape):
        return self._single(self.base.zeros(shape), np.full(shape, NONE), np.zeros(shape))

    def ones(self, shape):
        return self._single(self.base.ones(shape), np.full(shape, NONE), np.ones(shape))

    def lift(self, d):
        d = np.asarray(d, dtype=np.float64)
        v, shape = self.base.lift(d), d.shape
        rest = self.k - 1  # read-only views: nothing writes into a lifted value (scatters write into zeros())
        return ((v,) + (np.broadcast_to(np.float64(self.base.zero), shape),) * rest
                + (np.broadcast_to(np.float64(NONE), shape),) * self.k
                + (d,) + (np.broadcast_to(np.float64(0.0), shape),) * rest)

    def _only_first(self, value) -> bool:
        zero = self.base.zero
        return all(everywhere(c, zero) for c in value[1:self.k])

    def mul(self, a, b):
        if self._only_first(a) or self._only_first(b):
            first, other = (a, b) if self._only_first(a) else (b, a)
            va, pa, qa = first[0], first[self.k], first[2 * self.k]
            v, p, q = self._stack(other)
            v = self.base.mul(np.asarray(va)[..., None], v) if first is a else self.base.mul(v, np.asarray(va)[..., None])
            check("in a k-best step")  # (each pass over 2,400 x 64 x 64 ranks: ~40 ms)
            p = np.maximum(np.asarray(pa)[..., None], p)
            check("in a k-best step")
            q = np.asarray(qa)[..., None] * q
            return self._unstack(*self._top(*np.broadcast_arrays(v, p, q)))
        va, pa, qa = self._stack(a)
        vb, pb, qb = self._stack(b)
        v = self.base.mul(va[..., :, None], vb[..., None, :])
        check("in a k-best step")
        p = np.maximum(pa[..., :, None], pb[..., None, :])
        check("in a k-best step")
        q = qa[..., :, None] * qb[..., None, :]
        shape = v.shape[:-2] + (self.k * self.k,)
        return self._unstack(*self._top(v.reshape(shape), p.reshape(shape), q.reshape(shape)))

    def add(self, a, b):
        # the two values' ranks merged by `top_of_two` as `_stack` gives them, not joined first
        groups = np.broadcast_arrays(*self._stack(a), *self._stack(b))
        out = top_of_two(groups[:3], groups[3:], self._sign)
        if out is None:
            out = self._top(*(np.concatenate([x, y], -1) for x, y in zip(groups[:3], groups[3:])))
        return self._unstack(*out)

    def sum(self, a, axis, keepdims=False):
        v, p, q = self._stack(a)
        nd = v.ndim - 1
        axes = sorted({ax % nd for ax in axis}) if nd else []
        rest = [ax for ax in range(nd) if ax not in axes]
        shape = tuple(v.shape[ax] for ax in rest)
        if any(v.shape[ax] == 0 for ax in axes):
            out = self.zeros(shape)
        else:
            flat = [np.transpose(x, rest + axes + [nd]).reshape(shape + (-1,)) for x in (v, p, q)]
            out = self._unstack(*self._top(*flat))
        if keepdims:
            out = tuple(np.expand_dims(c, tuple(axes)) for c in out)
        return out

    def matmul(self, a, b):
        out = kbest_pointer_matmul(a, b, self.k, self.base.addition, self.base.multiplication, self.base.zero,
                                   pruning.ratio() if self.prunable else 0.0)
        return super().matmul(a, b) if out is None else out

    def equal(self, a, b, rtol=1e-9, atol=1e-12):
        parts = [np.isclose(x, y, rtol=rtol, atol=atol) | (np.asarray(x) == np.asarray(y)) for x, y in zip(a, b)]
        return np.logical_and.reduce(parts)

    def read(self, value):
        return self.base.read(value[0])

    def value_of(self, value):
        return value[0]

    def tag(self, value, offset: int, item_shape: tuple, each: bool = True):
        """Pointers `(offset + flat index) · k + rank` (every element `offset` when not `each`),
        partials 1, values kept."""
        k = self.k
        v = np.broadcast_arrays(*value[:k])
        shape = v[0].shape
        if each:
            size = int(np.prod(item_shape, dtype=np.int64))
            ids = (offset + np.arange(size, dtype=np.float64)).reshape(item_shape)
            shape = np.broadcast_shapes(shape, ids.shape)
            v = [np.broadcast_to(c, shape) for c in v]
            ptrs = tuple(np.broadcast_to(ids * k + r, shape) for r in range(k))
        else:
            ptrs = tuple(np.full(shape, float(offset * k + r)) for r in range(k))
        return tuple(v) + ptrs + (np.broadcast_to(np.float64(1.0), shape),) * k
