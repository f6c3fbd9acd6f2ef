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


class LogSignedMaxProductSemiring(Semiring):
    """`signed_max_product` in log space: the most positive and the most negative path
    product Π∂, each kept as a sign and log|Π∂|, so that deep networks (12 layers of small
    partials) neither underflow nor overflow.

    An extreme v ≠ 0 is the pair (s, t) = (sign v, sign v · log|v|); the pairs are ordered as
    the values are: by s first, then by t (lexicographically). A value holds two extremes,
    four arrays (hi_sign, hi_t, lo_sign, lo_t). ⊕ is the lexicographic max of the his and min
    of the los; ⊗ takes the extremes of the four products (s1 s2, log|v1| + log|v2|) of the
    operands' extremes. 0̄, the empty set, is hi = (−1, −inf) (below every value) and
    lo = (+1, +inf) (above every value); ⊗ with it is 0̄; φ(d) = (sign d, sign d · log|d|)
    twice for d ≠ 0, φ(0) = 0̄.

    The matmul scales: each row of a by exp(−its largest log|v|) and each column of b likewise
    (positive factors, which keep every extreme where it is), runs `signed_max_product`'s
    kernel matmul on the scaled float64 values, and adds the shifts back to the logs. Entries
    whose scaled extreme is below 1e-250 in magnitude (where an underflowed factor could have
    taken part) are recomputed exactly from ⊕ and ⊗.

    read() returns "log_abs_max" and "sign_max" (the most positive path product is
    sign_max · exp(log_abs_max)), "log_abs_min" and "sign_min", and "max" and "min" as float64
    (which may underflow, as in `signed_max_product`); the gradient is "log_abs_max". An
    element reached by no path with non-zero partials reads log_abs_max = log_abs_min = +inf,
    sign_max = −1, sign_min = +1 (max = −inf, min = +inf).
    """

    name = "log_signed_max_product"
    description = "signed_max_product in log space: sign and log|product| of the most positive and most negative path"
    commutative = True
    idempotent = True
    selective = False
    components = 4
    component_names = ("hi_sign", "hi_t", "lo_sign", "lo_t")
    primary = "log_abs_max"

    def zeros(self, shape):
        return np.full(shape, -1.0), np.full(shape, -np.inf), np.full(shape, 1.0), np.full(shape, np.inf)

    def ones(self, shape):
        return np.ones(shape), np.zeros(shape), np.ones(shape), np.zeros(shape)

    def lift(self, d):
        d = np.asarray(d, dtype=np.float64)
        nonzero = d != 0
        s = np.where(d < 0, -1.0, 1.0)
        with np.errstate(divide="ignore"):
            t = s * np.log(np.abs(d))
        return (np.where(nonzero, s, -1.0), np.where(nonzero, t, -np.inf),
                np.where(nonzero, s, 1.0), np.where(nonzero, t, np.inf))

    def add(self, a, b):
        hs, ht = _lex(a[0], a[1], b[0], b[1], larger=True)
        ls, lt = _lex(a[2], a[3], b[2], b[3], larger=False)
        return hs, ht, ls, lt

    def mul(self, a, b):
        his, los = (a[0], a[1]), (a[2], a[3])
        hjs, ljs = (b[0], b[1]), (b[2], b[3])
        candidates = [_times(x, y) for x in (his, los) for y in (hjs, ljs)]
        hs, ht = candidates[0]
        ls, lt = candidates[0]
        for cs, ct in candidates[1:]:
            hs, ht = _lex(hs, ht, cs, ct, larger=True)
            ls, lt = _lex(ls, lt, cs, ct, larger=False)
        empty = _lex_empty(a) | _lex_empty(b)
        if np.any(empty):
            zero = self.zeros(np.shape(empty))
            return tuple(np.where(empty, z, v) for z, v in zip(zero, (hs, ht, ls, lt)))
        return hs, ht, ls, lt

    def sum(self, a, axis, keepdims=False):
        hs, ht, ls, lt = np.broadcast_arrays(*a)
        axis = tuple(axis)
        top = np.max(hs, axis=axis, keepdims=True, initial=-1.0)
        top_t = np.max(np.where(hs == top, ht, -np.inf), axis=axis, keepdims=True, initial=-np.inf)
        bottom = np.min(ls, axis=axis, keepdims=True, initial=1.0)
        bottom_t = np.min(np.where(ls == bottom, lt, np.inf), axis=axis, keepdims=True, initial=np.inf)
        out = (top, top_t, bottom, bottom_t)
        return out if keepdims else tuple(np.squeeze(c, axis=axis) for c in out)

    def matmul(self, a, b):
        a, b = np.broadcast_arrays(*a), np.broadcast_arrays(*b)
        scaled_a, shift_a = _scaled(a, axis=-1)
        scaled_b, shift_b = _scaled(b, axis=-2)
        hi, lo = SignedMaxProductSemiring().matmul(scaled_a, scaled_b)
        shift = shift_a + shift_b  # (..., m, 1) + (..., 1, n)
        out, suspect = [], np.zeros(np.shape(hi), dtype=bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            for v, empty_value in ((hi, (-1.0, -np.inf)), (lo, (1.0, np.inf))):
                finite = np.isfinite(v)
                suspect |= finite & ~(np.abs(v) >= 1e-250)
                sign = np.where(finite, np.where(v < 0, -1.0, 1.0), empty_value[0])
                out += [sign, np.where(finite, sign * (np.log(np.abs(v)) + shift), empty_value[1])]
        if suspect.any():
            self._exact_entries(a, b, out, suspect)
        return tuple(out)

    def _exact_entries(self, a, b, out, which):
        lead = out[0].shape[:-2]
        rows = [np.broadcast_to(c, lead + c.shape[-2:]) for c in a]
        cols = [np.swapaxes(np.broadcast_to(c, lead + c.shape[-2:]), -1, -2) for c in b]
        index = np.nonzero(which)
        chunk = max(1, MATMUL_BLOCK_ELEMENTS // max(1, 4 * a[0].shape[-1]))
        for start in range(0, len(index[0]), chunk):
            part = tuple(ix[start:start + chunk] for ix in index)
            batch, i, j = part[:-2], part[-2], part[-1]
            terms = self.mul(tuple(r[batch + (i,)] for r in rows), tuple(c[batch + (j,)] for c in cols))
            for target, value in zip(out, self.sum(terms, axis=(-1,))):
                target[part] = value

    def read(self, value):
        hs, ht, ls, lt = (np.asarray(c, dtype=np.float64) for c in np.broadcast_arrays(*value))
        log_hi, log_lo = hs * ht, ls * lt  # log|v| = s · t (+inf for the empty set's ±inf)
        with np.errstate(over="ignore"):
            return {"log_abs_max": log_hi, "sign_max": hs, "log_abs_min": log_lo, "sign_min": ls,
                    "max": hs * np.exp(log_hi), "min": ls * np.exp(log_lo)}

    def sample(self, rng, shape):
        """Path sets of one or two products of either sign, and some empty ones."""
        x, y = rng.normal(size=shape), rng.normal(size=shape)
        single = rng.random(size=shape) < 0.3
        hi, lo = np.maximum(x, y), np.where(single, np.maximum(x, y), np.minimum(x, y))
        h, lw = self.lift(hi), self.lift(lo)
        value = (h[0], h[1], lw[2], lw[3])
        empty = rng.random(size=shape) < 0.2
        return tuple(np.where(empty, z, v) for z, v in zip(self.zeros(shape), value))


def _scaled(value, axis: int):
    """A log-signed value as signed_max_product's (hi, lo) floats, each row (axis=-1) or
    column (axis=-2) divided by exp of its largest finite log|v|; and that log, keepdims."""
    hs, ht, ls, lt = value
    empty = _lex_empty(value)
    log_hi, log_lo = np.where(empty, -np.inf, hs * ht), np.where(empty, -np.inf, ls * lt)
    top = np.max(np.maximum(log_hi, log_lo), axis=axis, keepdims=True, initial=-np.inf)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(under="ignore", invalid="ignore"):
        hi = np.where(empty, -np.inf, hs * np.exp(log_hi - top))
        lo = np.where(empty, np.inf, ls * np.exp(log_lo - top))
    return (hi, lo), top


def _times(x, y):
    """The pair of a product: signs multiply, logs add (t = s · log|v|)."""
    (s1, t1), (s2, t2) = x, y
    s = s1 * s2
    return s, s * (s1 * t1 + s2 * t2)


def _lex(s1, t1, s2, t2, larger: bool):
    """The larger (or smaller) of (s1, t1) and (s2, t2), ordered by s, then t."""
    first = (s1 > s2) | ((s1 == s2) & (t1 >= t2)) if larger else (s1 < s2) | ((s1 == s2) & (t1 <= t2))
    return np.where(first, s1, s2), np.where(first, t1, t2)


def _lex_empty(value) -> np.ndarray:
    """Where a value is 0̄: its hi below its lo."""
    hs, ht, ls, lt = value
    return (hs < ls) | ((hs == ls) & (ht < lt))
