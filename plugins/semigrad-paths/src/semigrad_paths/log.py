"""The log semiring: log Σ_paths Π|∂|, computed stably in log space."""

from __future__ import annotations

import numpy as np
from semigrad_server.semiring import kernels
from semigrad_server.semiring.base import MATMUL_BLOCK_ELEMENTS, Semiring

# matmul: where the shifted sum of exponentials falls below this, terms may have underflowed
# (become subnormal or 0) and the entry is recomputed exactly with a log-sum-exp over k.
# Above it, the underflowed terms (each < 2.3e-308) change the sum by less than k · 1e-58.
_UNDERFLOW = 1e-250


def logsumexp(a: np.ndarray, axis: tuple[int, ...], keepdims: bool = False) -> np.ndarray:
    """log Σ exp(a) over `axis`, stably: all -inf (or empty) slices give -inf, never nan."""
    a = np.asarray(a, dtype=np.float64)
    axis = tuple(axis)
    m = np.max(a, axis=axis, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(m), m, 0.0)  # -inf slices: exp(-inf - 0) = 0, log 0 = -inf
    with np.errstate(divide="ignore", over="ignore"):
        out = np.log(np.sum(np.exp(a - shift), axis=axis, keepdims=True)) + shift
    return out if keepdims else np.squeeze(out, axis=axis)


class LogSemiring(Semiring):
    """(logaddexp, +, -inf, 0, φ = log|d|): for each input element, log Σ_paths Π|∂|, i.e.
    the log of the ordinary gradient of the network with every local derivative replaced by
    its absolute value. It never overflows or underflows where the real gradient would.

    Values are float64 arrays of logs; φ(0) = log 0 = -inf = 0̄ (without warnings).
    `sum` is a stable log-sum-exp; `matmul` uses BLAS on max-shifted exponentials (one BLAS
    call, and a second one only when some entry is small enough to be suspect) and recomputes
    exactly (blocked log-sum-exp) the entries where that could have underflowed.
    """

    name = "log"
    description = "log of the sum over paths of the product of |local derivative| (log-sum-exp, stable)"
    commutative = True
    idempotent = False
    selective = False

    def zeros(self, shape):
        return np.full(shape, -np.inf)

    def ones(self, shape):
        return np.zeros(shape)

    def add(self, a, b):
        return np.logaddexp(a, b)

    def mul(self, a, b):
        with np.errstate(invalid="ignore"):
            product = np.add(a, b)
        # 0̄ = -inf annihilates: -inf + inf (a zero partial and an infinite one) is -inf, not NaN
        return kernels.annihilate(product, a, b, -np.inf)

    def lift(self, d):
        with np.errstate(divide="ignore"):
            return np.log(np.abs(np.asarray(d, dtype=np.float64)))

    def sum(self, a, axis, keepdims=False):
        return logsumexp(a, axis, keepdims)

    def matmul(self, a, b):
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # Row maxima of a and column maxima of b; -inf rows/columns are left unshifted.
            am = np.max(a, axis=-1, keepdims=True, initial=-np.inf)
            bm = np.max(b, axis=-2, keepdims=True, initial=-np.inf)
            am = np.where(np.isfinite(am), am, 0.0)
            bm = np.where(np.isfinite(bm), bm, 0.0)
            left = np.subtract(a, am)
            right = np.subtract(b, bm)
            s = np.matmul(np.exp(left, out=left), np.exp(right, out=right))  # every term ≤ 1: no overflow
            suspect = s < _UNDERFLOW
            if suspect.any():
                # An entry is exactly -inf iff every k has a[i,k] = -inf or b[k,j] = -inf; only
                # the others can have underflowed (one more BLAS call, only when needed).
                suspect &= np.matmul((a > -np.inf).astype(np.float64), (b > -np.inf).astype(np.float64)) > 0
            out = np.log(s, out=s)
            out += am
            out += bm
        # A NaN entry may come from 0̄ ⊗ ∞ (exp(-inf) · exp(inf) = 0 · inf in BLAS): recomputed
        # exactly, where such products are 0̄
        suspect |= np.isnan(out)
        if np.any(suspect):
            _exact_entries(a, b, out, suspect)
        return out


def _exact_entries(a: np.ndarray, b: np.ndarray, out: np.ndarray, which: np.ndarray) -> None:
    """out[e] = logsumexp_k a[..., i, k] + b[..., k, j] for the entries e where `which` holds."""
    lead = out.shape[:-2]
    k = a.shape[-1]
    rows_of = np.broadcast_to(a, lead + a.shape[-2:])
    cols_of = np.swapaxes(np.broadcast_to(b, lead + b.shape[-2:]), -1, -2)  # (..., n, k)
    index = np.nonzero(which)
    chunk = max(1, MATMUL_BLOCK_ELEMENTS // max(1, k))
    for start in range(0, len(index[0]), chunk):
        part = tuple(ix[start:start + chunk] for ix in index)
        batch, i, j = part[:-2], part[-2], part[-1]
        rows, cols = rows_of[batch + (i,)], cols_of[batch + (j,)]  # (entries, k)
        with np.errstate(invalid="ignore"):
            terms = kernels.annihilate(rows + cols, rows, cols, -np.inf)
        out[part] = logsumexp(terms, axis=(-1,))


class LogCountingSemiring(LogSemiring):
    """`counting` in log space: log of the number of paths whose local partials are all
    non-zero, (logaddexp, +, -inf, 0, φ(d) = 0 for d ≠ 0, -inf for d = 0). Counts grow
    exponentially with depth (1.6e23 and more per element on one BERT-width block): float64
    `counting` is exact only up to 2^53, this stays finite (log up to ~1e308) with a relative
    error of about 1e-16 · (depth + log k) in the log, i.e. the count to ~1e-16 · log(count)
    relative (docs/semirings.md). -inf: no such path."""

    name = "log_counting"
    description = "log of the number of paths with only non-zero local derivatives (no overflow, ~1e-15 relative)"

    def lift(self, d):
        return np.where(np.asarray(d) != 0, 0.0, -np.inf)
