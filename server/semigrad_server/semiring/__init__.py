"""Semirings for the backward pass: the plugin API (with `kernels`, the matmuls BLAS cannot
do), the real semiring, discovery, axiom checks."""

from . import kernels
from .base import API_VERSION, Semiring, Value
from .checker import check_axioms

__all__ = ["API_VERSION", "Semiring", "Value", "check_axioms", "kernels"]
