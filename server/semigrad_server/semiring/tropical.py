"""Semirings whose ⊕ is max or min (part of the plugin API, version 1).

A `TropicalSemiring` is declared by four class attributes: `addition` (⊕: "max" or "min"),
`multiplication` (⊗: "mul", "add", "max" or "min"), `zero` (0̄) and `one` (1̄), plus its own
`lift`. Values are float64 arrays; ⊕-reduce and matmul start from 0̄, so an empty axis or
contraction gives 0̄, and the matmul is `kernels.tropical_matmul`. Such a semiring is
idempotent and selective (⊕ returns one of its operands), so best paths exist.
"""

from __future__ import annotations

import numpy as np

from . import kernels
from .base import Semiring


class TropicalSemiring(Semiring):
    """Base class of (max or min, ×/+/max/min) semirings on float64 arrays; subclasses set
    `addition`, `multiplication`, `zero` and `one` and implement `lift`."""

    idempotent = True
    selective = True
    addition: str = "max"  # ⊕, one of kernels.ADDS
    multiplication: str = "mul"  # ⊗, one of kernels.MULS
    zero: float = 0.0  # 0̄: the identity of ⊕
    one: float = 1.0  # 1̄: the identity of ⊗

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.addition not in kernels.ADDS:
            raise TypeError(f"{cls.__name__}.addition must be one of {kernels.ADDS}, not {cls.addition!r}")
        if cls.multiplication not in kernels.MULS:
            raise TypeError(f"{cls.__name__}.multiplication must be one of {kernels.MULS}, "
                            f"not {cls.multiplication!r}")

    def zeros(self, shape):
        return np.full(shape, self.zero)

    def ones(self, shape):
        return np.full(shape, self.one)

    def add(self, a, b):
        return kernels.UFUNCS[self.addition](a, b)

    def mul(self, a, b):
        with np.errstate(invalid="ignore"):
            product = kernels.UFUNCS[self.multiplication](a, b)
        return kernels.annihilate(product, a, b, self.zero)

    def sum(self, a, axis, keepdims=False):
        return kernels.UFUNCS[self.addition].reduce(a, axis=tuple(axis), keepdims=keepdims, initial=self.zero)

    def matmul(self, a, b):
        return kernels.tropical_matmul(a, b, add=self.addition, mul=self.multiplication, zero=self.zero)
