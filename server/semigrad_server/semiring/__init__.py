"""Semirings for the backward pass: the plugin API (with `kernels`, the matmuls BLAS cannot
do, and `TropicalSemiring`, the base of max/min semirings), the real semiring, discovery,
axiom checks."""

from . import kernels
from .base import API_VERSION, Semiring, Value
from .checker import check_axioms
from .tropical import TropicalSemiring

__all__ = ["API_VERSION", "Semiring", "TropicalSemiring", "Value", "check_axioms", "kernels"]
