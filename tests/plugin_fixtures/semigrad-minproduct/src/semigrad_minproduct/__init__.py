"""semigrad semiring plugin `minproduct`: min over paths of Π |local derivative|, over the
paths whose local derivatives are all non-zero (the weakest dependence that still exists)."""

import numpy as np
from semigrad_server.semiring import TropicalSemiring


class MinProductSemiring(TropicalSemiring):
    """(min, ×, +inf, 1, φ(d) = |d| for d ≠ 0 and +inf for d = 0).

    A zero partial lifts to 0̄ = +inf, which ⊕ (min) ignores and ⊗ keeps: a path through a
    zero edge drops out. The result is +inf where no path has only non-zero partials.
    It is exp(minplus), computed without logs.
    """

    name = "minproduct"
    description = "weakest non-zero path: min over paths of the product of |local derivative|"
    addition, multiplication, zero, one = "min", "mul", np.inf, 1.0

    def lift(self, d):
        d = np.abs(np.asarray(d, dtype=np.float64))
        return np.where(d != 0, d, np.inf)
