"""Executes IR graphs: compiled plans over NumPy kernels, batched over leading dimensions."""

from .plan import Plan

__all__ = ["Plan"]
