"""The entropy semiring: Shannon entropy of the distribution of paths weighted by Π|∂|."""

from __future__ import annotations

import numpy as np
from semigrad_server.semiring import kernels
from semigrad_server.semiring.base import Semiring


class EntropySemiring(Semiring):
    """For each input element, the entropy H of the path distribution p(path) = w/Z where
    w = Π|∂| along the path and Z = Σ_paths w.

    Carrier (Z, R), with R = Σ_paths -w log w (an expectation semiring):
      (Z1, R1) ⊕ (Z2, R2) = (Z1 + Z2, R1 + R2)
      (Z1, R1) ⊗ (Z2, R2) = (Z1 Z2, Z1 R2 + Z2 R1)
      0̄ = (0, 0), 1̄ = (1, 0), φ(d) = (p, -p log p) with p = |d| and 0 log 0 = 0.
    Then H = log Z + R / Z (0 where Z = 0, i.e. where no path has a non-zero weight).
    read() returns {"entropy": H, "Z": Z, "R": R}; the gradient is H.
    """

    name = "entropy"
    description = "entropy of the path distribution p(path) ∝ product of |local derivative|"
    commutative = True
    idempotent = False
    selective = False
    components = 2
    component_names = ("Z", "R")
    primary = "entropy"

    def zeros(self, shape):
        return np.zeros(shape), np.zeros(shape)

    def ones(self, shape):
        return np.ones(shape), np.zeros(shape)

    def add(self, a, b):
        return np.add(a[0], b[0]), np.add(a[1], b[1])

    def mul(self, a, b):
        (z1, r1), (z2, r2) = a, b
        return np.multiply(z1, z2), z1 * r2 + z2 * r1

    magnitude_lift = True

    def lift(self, d):
        return self.lift_magnitude(np.abs(np.asarray(d, dtype=np.float64)))

    def lift_magnitude(self, p):
        # -p log p laid out as p is: a weight's local derivative is often its transpose
        # (Fortran order), and passes between a C-ordered r and it were strided (a 768 × 3072
        # weight: 80 → 30 ms); one compiled pass where numba is installed.
        return p, kernels.neg_xlogx(p)

    def sum(self, a, axis, keepdims=False):
        axis = tuple(axis)
        return np.sum(a[0], axis=axis, keepdims=keepdims), np.sum(a[1], axis=axis, keepdims=keepdims)

    def matmul(self, a, b):
        (za, ra), (zb, rb) = a, b
        # ⊕_k (Za Zb, Za Rb + Ra Zb) = (Za @ Zb, Za @ Rb + Ra @ Zb).
        z = np.matmul(za, zb)
        if np.shape(za) == np.shape(ra) and np.shape(zb) == np.shape(rb):
            # An R that is a broadcast 0 (that of the seed 1̄, or of 0̄) times a finite Z adds
            # exactly 0: skip that BLAS call.
            left = _broadcast_zero(ra) and np.isfinite(zb).all()
            right = _broadcast_zero(rb) and np.isfinite(za).all()
            if left and right:
                return z, np.zeros(z.shape)
            if left:
                return z, np.matmul(za, rb)
            if right:
                return z, np.matmul(ra, zb)
        r, more = np.matmul(za, rb), np.matmul(ra, zb)
        if r.shape == more.shape:
            r += more  # no third (m, n) array
            return z, r
        return z, r + more

    def read(self, value):
        z, r = (np.asarray(c, dtype=np.float64) for c in value)
        zb, rb = np.broadcast_arrays(z, r)
        h = np.zeros(zb.shape)
        positive = zb > 0
        with np.errstate(invalid="ignore"):  # inf / inf where Z overflowed: NaN (use log_entropy there)
            np.divide(rb, zb, out=h, where=positive)
        h += np.log(zb, where=positive, out=np.zeros(zb.shape))  # log Z + R/Z where Z > 0, else 0
        np.maximum(h, 0.0, out=h)  # H ≥ 0: no -1e-16 from rounding
        return {"entropy": h, "Z": z, "R": r}


def _broadcast_zero(x) -> bool:
    """x is a broadcast 0 (every stride 0, value 0): a cheap test, no pass over the data."""
    return isinstance(x, np.ndarray) and x.size > 0 and not any(x.strides) and x.flat[0] == 0
