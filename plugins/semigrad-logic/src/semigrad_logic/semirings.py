"""Five small semirings: boolean, counting, maxplus, minplus, bottleneck."""

from __future__ import annotations

import numpy as np
from semigrad_server.semiring import Semiring, TropicalSemiring
from semigrad_server.semiring.real import RealSemiring


def _log_abs(d) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.abs(np.asarray(d, dtype=np.float64)))


class BooleanSemiring(Semiring):
    """(or, and, False, True, φ = d ≠ 0): True where at least one path from the input element
    to the output has only non-zero local partials (structural dependence)."""

    name = "boolean"
    description = "does some path have only non-zero local derivatives (structural dependence)"
    commutative = True
    idempotent = True
    selective = True

    def zeros(self, shape):
        return np.zeros(shape, dtype=bool)

    def ones(self, shape):
        return np.ones(shape, dtype=bool)

    def add(self, a, b):
        return np.logical_or(a, b)

    def mul(self, a, b):
        return np.logical_and(a, b)

    def lift(self, d):
        return np.asarray(d) != 0

    def sum(self, a, axis, keepdims=False):
        return np.any(a, axis=tuple(axis), keepdims=keepdims)

    def matmul(self, a, b):
        # Counts of true (i, k, j) triples; a sum of non-negative floats is > 0 exactly when
        # some term is, so float32 is safe however large k is.
        return np.matmul(np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)) > 0

    def equal(self, a, b, rtol=1e-9, atol=1e-12):
        return np.asarray(a) == np.asarray(b)


class CountingSemiring(RealSemiring):
    """(+, ×, 0, 1, φ = 1[d ≠ 0]): the number of paths from the input element to the output
    along which every local partial is non-zero: the real semiring with an indicator lift.
    float64: exact up to 2^53 paths, after which counts are rounded (and may overflow to inf
    beyond ~1.8e308)."""

    name = "counting"
    description = "number of paths with only non-zero local derivatives (float64, exact up to 2^53)"

    def lift(self, d):
        return (np.asarray(d) != 0).astype(np.float64)


class MaxPlusSemiring(TropicalSemiring):
    """(max, +, -inf, 0, φ = log|d|): the log of the largest product of |∂| along a single
    path (max_product in log space: no underflow on long paths). -inf: no non-zero path."""

    name = "maxplus"
    description = "log of the best path product: max over paths of the sum of log|local derivative|"
    addition, multiplication, zero, one = "max", "add", -np.inf, 0.0

    def lift(self, d):
        return _log_abs(d)


class MinPlusSemiring(TropicalSemiring):
    """(min, +, +inf, 0, φ = log|d| for d ≠ 0, +inf for d = 0): the log of the smallest
    non-zero product of |∂| along a single path (the weakest dependence). +inf: no path
    has only non-zero partials (zero partials drop out, as φ(0) = 0̄ = +inf)."""

    name = "minplus"
    description = "log of the weakest non-zero path product: min over paths of the sum of log|local derivative|"
    addition, multiplication, zero, one = "min", "add", np.inf, 0.0

    def lift(self, d):
        d = np.asarray(d, dtype=np.float64)
        return np.where(d != 0, _log_abs(d), np.inf)


class BottleneckSemiring(TropicalSemiring):
    """(max, min, 0, +inf, φ = |d|): the widest path, i.e. max over paths of the smallest
    |∂| along the path (the capacity of the strongest chain of dependence)."""

    name = "bottleneck"
    description = "widest path: max over paths of the smallest |local derivative| on the path"
    addition, multiplication, zero, one = "max", "min", 0.0, np.inf

    def lift(self, d):
        return np.abs(np.asarray(d, dtype=np.float64))
