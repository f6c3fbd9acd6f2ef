"""The max-product (Viterbi) semiring over |∂|."""

from __future__ import annotations

import numpy as np
from semigrad_server.semiring import TropicalSemiring


class MaxProductSemiring(TropicalSemiring):
    """(max, ×, 0, 1, φ = |d|): for each input element, the largest product of |∂| along a
    single path to the output, i.e. the weight of the best path (Viterbi).

    Values are non-negative float64 arrays. 0̄ = 0 is below every value, so an empty axis
    reduces to 0 and every matmul entry is max(0, ...). `matmul` is the server's (max, ×) kernel
    (`semigrad_server.semiring.kernels.tropical_matmul`: numba when installed, else blocked
    NumPy; it never materialises m × k × n at once).
    """

    name = "max_product"
    description = "weight of the best path: max over paths of the product of |local derivative|"
    addition, multiplication, zero, one = "max", "mul", 0.0, 1.0

    magnitude_lift = True

    def lift(self, d):
        return np.abs(np.asarray(d, dtype=np.float64))

    def lift_magnitude(self, p):
        return p
