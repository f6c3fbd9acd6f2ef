"""The signed max-product semiring: the most positive and the most negative path product."""

from __future__ import annotations

import numpy as np
from semigrad_server.semiring import Semiring, kernels
from semigrad_server.semiring.base import MATMUL_BLOCK_ELEMENTS


class SignedMaxProductSemiring(Semiring):
    """For each input element, the largest and the smallest *signed* path product Π∂ (as Du
    et al., "Generalizing Backpropagation for Gradient-Based Interpretability", use them):
    `max` is the most positive path's product, `min` the most negative one's.

    Carrier (hi, lo): the largest and smallest element of a set of path products.
      (h1, l1) ⊕ (h2, l2) = (max(h1, h2), min(l1, l2))                   (union of the sets)
      (h1, l1) ⊗ (h2, l2) = (max, min) of {h1 h2, h1 l2, l1 h2, l1 l2}   (products of the sets)
    The second line is exact: x·y is linear in each factor, so over two sets its extremes are
    reached at the sets' extremes. 0̄ is the empty set, written (-inf, +inf) (hi < lo: no
    path); an empty operand makes ⊗ empty (explicitly: -inf · +inf would not). 1̄ = (1, 1),
    φ(d) = (d, d) for d ≠ 0 and φ(0) = 0̄, so zero edges drop out. ⊕ is idempotent but not
    selective (it mixes the hi of one operand with the lo of the other), so best paths are
    not offered.

    read() returns {"max": hi, "min": lo}; the gradient is "max". An element with no path
    whose partials are all non-zero reads max = -inf, min = +inf (the extremes of an empty set).
    `matmul` takes the server's (max, ×) and (min, ×) kernels (numba when installed): no
    m × k × n products are built.
    """

    name = "signed_max_product"
    description = "most positive and most negative path product (signed; Du et al. 2023)"
    commutative = True
    idempotent = True
    selective = False
    components = 2
    component_names = ("max", "min")
    primary = "max"

    def zeros(self, shape):
        return np.full(shape, -np.inf), np.full(shape, np.inf)

    def ones(self, shape):
        return np.ones(shape), np.ones(shape)

    def lift(self, d):
        d = np.asarray(d, dtype=np.float64)
        nonzero = d != 0
        return np.where(nonzero, d, -np.inf), np.where(nonzero, d, np.inf)

    def add(self, a, b):
        return np.maximum(a[0], b[0]), np.minimum(a[1], b[1])

    def mul(self, a, b):
        (h1, l1), (h2, l2) = a, b
        with np.errstate(invalid="ignore", over="ignore"):
            p = (np.multiply(h1, h2), np.multiply(h1, l2), np.multiply(l1, h2), np.multiply(l1, l2))
            hi = np.maximum(np.maximum(p[0], p[1]), np.maximum(p[2], p[3]))
            lo = np.minimum(np.minimum(p[0], p[1]), np.minimum(p[2], p[3]))
        empty = _empty(a) | _empty(b)
        if empty.any():
            hi, lo = np.where(empty, -np.inf, hi), np.where(empty, np.inf, lo)
        return hi, lo

    def sum(self, a, axis, keepdims=False):
        axis = tuple(axis)
        return (np.max(a[0], axis=axis, keepdims=keepdims, initial=-np.inf),
                np.min(a[1], axis=axis, keepdims=keepdims, initial=np.inf))

    def matmul(self, a, b):
        """hi[i, j] = max over k of the four products of a[i, k]'s and b[k, j]'s extremes (k
        where neither is empty), lo likewise with min. With empty entries read as (0, 0), one
        (max, ×) and one (min, ×) kernel call over the four pairs laid along k give hi and lo
        wherever hi > 0 and lo < 0 (a 0 from an empty entry cannot win there). Elsewhere every
        real product has one sign, so the missing extreme is ∓ the smallest |product|: one
        (min, ×) call on the smallest magnitudes, empty entries +inf. Entries with no k where
        both are non-empty are 0̄ (one BLAS call on the masks)."""
        (ah, al), (bh, bl) = (np.broadcast_arrays(*a), np.broadcast_arrays(*b))
        ea, eb = _empty(a), _empty(b)
        za = lambda x: np.where(ea, 0.0, x)  # noqa: E731
        zb = lambda x: np.where(eb, 0.0, x)  # noqa: E731
        left = np.concatenate([za(ah), za(ah), za(al), za(al)], axis=-1)
        right = np.concatenate([zb(bh), zb(bl), zb(bh), zb(bl)], axis=-2)
        hi = kernels.tropical_matmul(left, right, add="max", mul="mul", zero=-np.inf)
        lo = kernels.tropical_matmul(left, right, add="min", mul="mul", zero=np.inf)
        fix_hi, fix_lo = ~(hi > 0), ~(lo < 0)
        if fix_hi.any() or fix_lo.any():
            with np.errstate(invalid="ignore"):
                mag_a = np.where(ea, np.inf, np.minimum(np.abs(ah), np.abs(al)))
                mag_b = np.where(eb, np.inf, np.minimum(np.abs(bh), np.abs(bl)))
            small = kernels.tropical_matmul(mag_a, mag_b, add="min", mul="mul", zero=np.inf)
            hi = np.where(fix_hi, -small, hi)
            lo = np.where(fix_lo, small, lo)
            # inf · 0 (an empty entry against a product that underflowed to 0) is NaN: those
            # entries are recomputed from ⊕ and ⊗ themselves.
            if np.isnan(small).any():
                self._exact_entries(a, b, hi, lo, np.isnan(small))
        some = np.matmul((~ea).astype(np.float32), (~eb).astype(np.float32)) > 0
        hi = np.where(some, hi, -np.inf)
        lo = np.where(some, lo, np.inf)
        return hi, lo

    def _exact_entries(self, a, b, hi, lo, which):
        lead = hi.shape[:-2]
        ah, al = (np.broadcast_to(c, lead + np.shape(c)[-2:]) for c in np.broadcast_arrays(*a))
        bh, bl = (np.broadcast_to(c, lead + np.shape(c)[-2:]) for c in np.broadcast_arrays(*b))
        index = np.nonzero(which)
        chunk = max(1, MATMUL_BLOCK_ELEMENTS // max(1, ah.shape[-1]))
        for start in range(0, len(index[0]), chunk):
            part = tuple(ix[start:start + chunk] for ix in index)
            batch, i, j = part[:-2], part[-2], part[-1]
            rows = (ah[batch + (i,)], al[batch + (i,)])  # (entries, k)
            cols = (np.swapaxes(bh, -1, -2)[batch + (j,)], np.swapaxes(bl, -1, -2)[batch + (j,)])
            h, lw = self.sum(self.mul(rows, cols), axis=(-1,))
            hi[part], lo[part] = h, lw

    def read(self, value):
        hi, lo = (np.asarray(c, dtype=np.float64) for c in value)
        return {"max": hi, "min": lo}

    def sample(self, rng, shape):
        """Sets of one or more products (hi ≥ lo, of any signs) and some empty ones."""
        x, y = rng.normal(size=shape), rng.normal(size=shape)
        empty = rng.random(size=shape) < 0.2
        single = rng.random(size=shape) < 0.3
        hi, lo = np.maximum(x, y), np.where(single, np.maximum(x, y), np.minimum(x, y))
        return np.where(empty, -np.inf, hi), np.where(empty, np.inf, lo)


def _empty(value) -> np.ndarray:
    """Where a value is 0̄, the empty set (hi < lo)."""
    return np.less(value[0], value[1])
