"""Plugins that load but must be refused by the server's loader."""

from __future__ import annotations

import numpy as np
from semigrad_server.semiring import Semiring


class NotASemiring:
    """Has the methods, but does not subclass semigrad_server.semiring.Semiring."""

    name = "not_a_semiring"

    def add(self, a, b):
        return np.add(a, b)

    def mul(self, a, b):
        return np.multiply(a, b)


class _Reals(Semiring):
    description = "test fixture"

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


class LopsidedSemiring(_Reals):
    """a ⊕ b = a + 2b: not commutative, not associative; the axiom self-check refuses it."""

    name = "broken_axioms"

    def add(self, a, b):
        return np.add(a, 2 * np.asarray(b))


class MisnamedSemiring(_Reals):
    """The real semiring, but it calls itself something else than its entry point."""

    name = "not_misnamed"
