"""Checks a semiring's axioms and declared properties on random samples."""

from __future__ import annotations

import numpy as np

from .base import Semiring

SAMPLES = 64


def check_axioms(s: Semiring, seed: int = 0, samples: int = SAMPLES) -> list[str]:
    """Return the violated laws (empty when all hold on the samples)."""
    return [law for law, holds in law_results(s, seed, samples).items() if not holds]


def law_results(s: Semiring, seed: int = 0, samples: int = SAMPLES) -> dict[str, bool]:
    """Every law checked for this semiring's declared properties, and whether it holds."""
    rng = np.random.default_rng(seed)
    a, b, c = (s.sample(rng, (samples,)) for _ in range(3))
    zero, one = s.zeros((samples,)), s.ones((samples,))
    laws = {
        "⊕ is associative": (s.add(s.add(a, b), c), s.add(a, s.add(b, c))),
        "⊕ is commutative": (s.add(a, b), s.add(b, a)),
        "⊗ is associative": (s.mul(s.mul(a, b), c), s.mul(a, s.mul(b, c))),
        "⊗ distributes over ⊕ on the left": (s.mul(a, s.add(b, c)), s.add(s.mul(a, b), s.mul(a, c))),
        "⊗ distributes over ⊕ on the right": (s.mul(s.add(a, b), c), s.add(s.mul(a, c), s.mul(b, c))),
        "0̄ is the identity of ⊕": (s.add(zero, a), a),
        "1̄ is the identity of ⊗ (left)": (s.mul(one, a), a),
        "1̄ is the identity of ⊗ (right)": (s.mul(a, one), a),
        "0̄ annihilates (left)": (s.mul(zero, a), zero),
        "0̄ annihilates (right)": (s.mul(a, zero), zero),
        "φ(0) = 0̄": (s.lift(np.zeros(samples)), zero),
    }
    if s.magnitude_lift:  # a product of semirings lifts by lift_magnitude(|d|): it must be φ(d)
        d = rng.standard_normal(samples) * 10.0 ** rng.integers(-3, 4, samples)
        laws["φ(d) = lift_magnitude(|d|) (declared)"] = (s.lift(d), s.lift_magnitude(np.abs(d)))
    if s.commutative:
        laws["⊗ is commutative (declared)"] = (s.mul(a, b), s.mul(b, a))
    if s.idempotent:
        laws["⊕ is idempotent (declared)"] = (s.add(a, a), a)
    results = {law: bool(np.all(s.equal(left, right))) for law, (left, right) in laws.items()}
    if s.selective:
        total = s.add(a, b)
        results["⊕ is selective (declared)"] = bool(np.all(s.equal(total, a) | s.equal(total, b)))
    results.update(_check_reductions(s, rng))
    return results


def _check_reductions(s: Semiring, rng: np.random.Generator) -> dict[str, bool]:
    """sum and matmul (possibly overridden) must agree with add and mul."""
    x = s.sample(rng, (3, 5))
    folded = s.map(lambda c: c[:, 0], x)
    for j in range(1, 5):
        folded = s.add(folded, s.map(lambda c: c[:, j], x))
    sum_ok = bool(np.all(s.equal(s.sum(x, axis=(-1,)), folded)))
    y = s.sample(rng, (5, 2))
    expected = None
    for k in range(5):
        term = s.mul(s.map(lambda c: c[:, k, None], x), s.map(lambda c: c[None, k, :], y))
        expected = term if expected is None else s.add(expected, term)
    return {"sum agrees with repeated ⊕": sum_ok,
            "matmul agrees with ⊕ of ⊗": bool(np.all(s.equal(s.matmul(x, y), expected)))}
