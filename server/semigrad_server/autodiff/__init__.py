"""Transformations graph → graph: reverse mode under a semiring."""

from .context import AdjointContext, RealContext, SemiringContext
from .reverse import BackwardGraph, reverse

__all__ = ["AdjointContext", "RealContext", "SemiringContext", "BackwardGraph", "reverse"]
