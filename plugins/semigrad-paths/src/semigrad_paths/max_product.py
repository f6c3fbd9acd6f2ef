"""The max-product (Viterbi) semiring over |∂|."""

from __future__ import annotations

import numpy as np
from semigrad_server.semiring import kernels
from semigrad_server.semiring.base import Semiring


class MaxProductSemiring(Semiring):
    """(max, ×, 0, 1, φ = |d|): for each input element, the largest product of |∂| along a
    single path to the output, i.e. the weight of the best path (Viterbi).

    Values are non-negative float64 arrays. `matmul` is the server's (max, ×) kernel
    (`semigrad_server.semiring.kernels.tropical_matmul`: numba when installed, else blocked
    NumPy; it never materialises m × k × n at once).
    """

    name = "max_product"
    description = "weight of the best path: max over paths of the product of |local derivative|"
    commutative = True
    idempotent = True
    selective = True

    def zeros(self, shape):
        return np.zeros(shape)

    def ones(self, shape):
        return np.ones(shape)

    def add(self, a, b):
        return np.maximum(a, b)

    def mul(self, a, b):
        return np.multiply(a, b)

    def lift(self, d):
        return np.abs(np.asarray(d, dtype=np.float64))

    def sum(self, a, axis, keepdims=False):
        # initial=0 (= 0̄, below every value) makes an empty axis reduce to 0̄ instead of raising.
        return np.max(a, axis=tuple(axis), keepdims=keepdims, initial=0.0)

    def matmul(self, a, b):
        # zero=0̄=0: an empty contraction gives 0, and every entry is max(0, ...) like `sum`.
        return kernels.tropical_matmul(a, b, add="max", mul="mul", zero=0.0)
