"""The real semiring (+, ×, 0, 1, φ = id): ordinary reverse-mode differentiation."""

from __future__ import annotations

import numpy as np

from .base import Semiring


class RealSemiring(Semiring):
    name = "real"
    description = "ordinary gradients: sum over paths of the product of local derivatives"
    commutative = True

    def zeros(self, shape):
        return np.zeros(shape)

    def ones(self, shape):
        return np.ones(shape)

    def add(self, a, b):
        return np.add(a, b)

    def mul(self, a, b):
        return np.multiply(a, b)

    def lift(self, d):
        return np.asarray(d, dtype=np.float64)

    def sum(self, a, axis, keepdims=False):
        return np.sum(a, axis=axis, keepdims=keepdims)

    def matmul(self, a, b):
        return np.matmul(a, b)
