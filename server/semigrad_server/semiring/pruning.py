"""Pruning the k-best pass of `top_paths` by a bound that the answer verifies.

Under max_product (⊕ = max, ⊗ = ×, values ≥ 0), take a path through element e whose partial
path from the output reaches e with value a. Its value is at most a · c(e), where c(e) is e's
best way on to an input. The best path through e is a_0(e) · c(e), where a_0 is e's best
adjoint, and it is no better than P, the best path of the graph. So the path is worth at most
a · P / a_0(e).

A path worth at least ρ · P therefore never reaches an element e with a < ρ · a_0(e). The
k-best matmul, the costliest step of the pass, drops such candidates
(`_jit_kernels._prune_bound`: a_0 of its entry is its best head). Then:
* the pass keeps every path worth at least ρ · P;
* its k best are the k best of the graph whenever the k-th of them is worth at least ρ · P
  (`verified`), and the floats that argument rests on are rounded relatively: no element's best
  is infinite, nor so small that ρ times it is subnormal (`rounded_relatively`; a helper's
  attack found paths through exp(-745) = 2^-1074 that rounding made equal, and overflow to ∞).
Dropping a candidate below an element's threshold only removes the tail of that element's
ranked list, so kept ranks, and the pointers that name them, are the same as unpruned.

ρ is learnt per compiled plan (`Guess`). The first request runs unpruned. Each answer then sets
the next ρ to (k-th best ÷ best)^SLACK: the gap between the k best may grow SLACK-fold before a
guess fails. A request whose answer does not verify runs again, unpruned, within the same
deadline. That costs one extra pass, and the guess is learnt afresh from the unpruned answer.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

import numpy as np

from ..deadline import check

SLACK = 4  # the next guess: (k-th ÷ best) ** SLACK
MARGIN = 1e-9  # thresholds lowered by this much: a path's product is rounded differently on each side of e

_RATIO: ContextVar[float] = ContextVar("semigrad_top_paths_ratio", default=0.0)


def prunable(base) -> bool:
    """Whether the bound holds for this base semiring: ⊕ max, ⊗ ×, values never negative."""
    return (getattr(base, "addition", None) == "max" and getattr(base, "multiplication", None) == "mul"
            and bool(getattr(base, "magnitude_lift", False)))


def ratio() -> float:
    """The ρ of the pass running now (0: unpruned), as the matmul kernels take it."""
    return _RATIO.get()


@contextlib.contextmanager
def pruned(rho: float):
    """Run a k-best pass that keeps every path worth at least ρ × the best one."""
    token = _RATIO.set(rho * (1.0 - MARGIN) if rho > 0.0 else 0.0)
    try:
        yield
    finally:
        _RATIO.reset(token)


def verified(values: np.ndarray, count: int, rho: float) -> bool:
    """Whether the `count` best paths a pass pruned at ρ found (their values, best first) are
    the graph's: there are `count` of them and the last is worth at least ρ × the first (all
    finite: past ∞ the bound says nothing)."""
    if rho <= 0.0:
        return True
    return len(values) == count and bool(np.isfinite(values[0])) and bool(values[-1] >= rho * values[0])


def rounded_relatively(best_values, rho: float) -> bool:
    """Whether a pass pruned at ρ computed every value that matters with relative rounding:
    each element's best (`best_values`: every node's best adjoint, an array a node) is 0 or
    finite with ρ × it a normal number. A path worth ρ × the best one is worth about ρ × the
    best of each element it passes, so then none of its products was subnormal, where
    rounding steps are absolute (2^-1074) and can make a dropped path equal a kept one, nor
    infinite (the bound's arithmetic). Otherwise the answer is not taken."""
    floor = 2.0 * np.finfo(np.float64).tiny / rho
    for v in best_values:
        check("checking a pruned pass")
        v = np.asarray(v)
        if not np.isfinite(v).all() or bool(((v > 0.0) & (v < floor)).any()):
            return False
    return True


class Guess:
    """The ρ to try on a plan's next top_paths request (0 until one has been answered)."""

    def __init__(self):
        self.rho = 0.0

    def learn(self, values: np.ndarray, count: int) -> None:
        """Learn from an answer's path values, best first."""
        finite = len(values) == count and count > 0 and np.isfinite(values[0]) and values[0] > 0
        self.rho = float((values[-1] / values[0]) ** SLACK) if finite else 0.0
