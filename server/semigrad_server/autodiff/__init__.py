"""Transformations graph → graph: reverse mode under a semiring."""

from .context import AdjointContext, RealContext, SemiringContext
from .reverse import GRAD_PREFIX, SEED_PREFIX, BackwardGraph, reverse

__all__ = ["AdjointContext", "RealContext", "SemiringContext", "BackwardGraph", "reverse", "GRAD_PREFIX", "SEED_PREFIX"]
