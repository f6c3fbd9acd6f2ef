"""The entropy semiring in log space: path entropy without overflow or underflow of Z."""

from __future__ import annotations

import numpy as np
from semigrad_server.semiring.base import MATMUL_BLOCK_ELEMENTS, Semiring

from .log import _UNDERFLOW, logsumexp


class LogEntropySemiring(Semiring):
    """`entropy` with Z kept as its log: H of the path distribution p(path) = w / Z,
    w = Π|∂|, where Z = Σ_paths w over- or underflows float64 (deep networks).

    Carrier (L, Q) with L = log Z and Q = R / Z = Σ_paths (w / Z)(−log w), the mean of −log w
    under the path distribution (so H = L + Q). Then
      (L1, Q1) ⊕ (L2, Q2) = (logaddexp(L1, L2), σ Q1 + (1 − σ) Q2),  σ = exp(L1 − logaddexp(L1, L2))
      (L1, Q1) ⊗ (L2, Q2) = (L1 + L2, Q1 + Q2)
      0̄ = (−inf, 0), 1̄ = (0, 0), φ(d) = (log p, −log p), p = |d| (φ(0) = (−inf, 0) = 0̄).
    Both L and Q are sums of logs along paths (never exponentials of them): nothing overflows
    or underflows while |log w| stays below ~1e308. H = L + Q cancels where H ≪ |L|: its
    absolute error is about 1e-16 · (|L| + |Q|) (see docs/semirings.md).
    read() returns {"entropy": H, "log_Z": L, "Q": Q}; the gradient is H.
    """

    name = "log_entropy"
    description = "entropy of the path distribution, with log Z (no overflow or underflow on deep graphs)"
    commutative = True
    idempotent = False
    selective = False
    components = 2
    component_names = ("log_Z", "Q")
    primary = "entropy"

    def zeros(self, shape):
        return np.full(shape, -np.inf), np.zeros(shape)

    def ones(self, shape):
        return np.zeros(shape), np.zeros(shape)

    def lift(self, d):
        p = np.abs(np.asarray(d, dtype=np.float64))
        with np.errstate(divide="ignore"):
            log_p = np.log(p)
        return log_p, np.where(p > 0, -log_p, 0.0)

    def add(self, a, b):
        (l1, q1), (l2, q2) = a, b
        total = np.logaddexp(l1, l2)
        with np.errstate(invalid="ignore"):
            s1 = np.exp(l1 - total)  # -inf - -inf: NaN, where both are 0̄
            s2 = np.exp(l2 - total)
            q = s1 * q1 + s2 * q2
        return total, np.where(np.isneginf(total), 0.0, q)

    def mul(self, a, b):
        (l1, q1), (l2, q2) = a, b
        l = np.add(l1, l2)
        return l, np.where(np.isneginf(l), 0.0, np.add(q1, q2))

    def sum(self, a, axis, keepdims=False):
        l, q = np.broadcast_arrays(*a)
        axis = tuple(axis)
        total = logsumexp(l, axis, keepdims=True)
        with np.errstate(invalid="ignore"):
            weights = np.exp(l - np.where(np.isneginf(total), 0.0, total))
        out_q = np.sum(weights * q, axis=axis, keepdims=True)
        out_q = np.where(np.isneginf(total), 0.0, out_q)
        if not keepdims:
            total, out_q = np.squeeze(total, axis=axis), np.squeeze(out_q, axis=axis)
        return total, out_q

    def matmul(self, a, b):
        """BLAS on max-shifted exponentials, as the `log` semiring: with A = exp(La − row max)
        and B = exp(Lb − column max), L = log(A @ B) + shifts and Q = ((A ∘ Qa) @ B + A @ (B ∘ Qb))
        / (A @ B): three BLAS products. Entries where A @ B may have underflowed are recomputed
        exactly, one log-sum-exp over k each."""
        (la, qa), (lb, qb) = (np.broadcast_arrays(*a), np.broadcast_arrays(*b))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            am = np.max(la, axis=-1, keepdims=True, initial=-np.inf)
            bm = np.max(lb, axis=-2, keepdims=True, initial=-np.inf)
            am = np.where(np.isfinite(am), am, 0.0)
            bm = np.where(np.isfinite(bm), bm, 0.0)
            ea, eb = np.exp(la - am), np.exp(lb - bm)
            z = np.matmul(ea, eb)
            num = np.matmul(ea * qa, eb) + np.matmul(ea, eb * qb)
            suspect = z < _UNDERFLOW
            if suspect.any():
                suspect &= np.matmul((la > -np.inf).astype(np.float64), (lb > -np.inf).astype(np.float64)) > 0
            q = np.where(z > 0, num / z, 0.0)
            l = np.log(z) + am + bm
        if suspect.any():
            self._exact_entries(la, qa, lb, qb, l, q, suspect)
        return l, q

    def _exact_entries(self, la, qa, lb, qb, l, q, which):
        lead = l.shape[:-2]
        rows = [np.broadcast_to(c, lead + c.shape[-2:]) for c in (la, qa)]
        cols = [np.swapaxes(np.broadcast_to(c, lead + c.shape[-2:]), -1, -2) for c in (lb, qb)]
        index = np.nonzero(which)
        chunk = max(1, MATMUL_BLOCK_ELEMENTS // max(1, la.shape[-1]))
        for start in range(0, len(index[0]), chunk):
            part = tuple(ix[start:start + chunk] for ix in index)
            batch, i, j = part[:-2], part[-2], part[-1]
            terms = self.mul((rows[0][batch + (i,)], rows[1][batch + (i,)]),
                             (cols[0][batch + (j,)], cols[1][batch + (j,)]))  # (entries, k)
            l[part], q[part] = self.sum(terms, axis=(-1,))

    def read(self, value):
        l, q = (np.asarray(c, dtype=np.float64) for c in value)
        lb, qb = np.broadcast_arrays(l, q)
        h = np.where(np.isfinite(lb), lb + qb, 0.0)
        return {"entropy": np.maximum(h, 0.0), "log_Z": l, "Q": q}

    def sample(self, rng, shape):
        """(log Z, Q) of random small path sets: Q within [−max log w, −min log w]."""
        l = rng.normal(size=shape) * 3
        q = -l + np.abs(rng.normal(size=shape))
        empty = rng.random(size=shape) < 0.15
        return np.where(empty, -np.inf, l), np.where(empty, 0.0, q)
