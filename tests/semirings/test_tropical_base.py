"""The TropicalSemiring base class of the plugin API: what it derives from its four declared
attributes obeys the axioms and agrees with the generic Semiring defaults built from its own
⊕ and ⊗, for every (⊕, ⊗) pair of the kernels that forms a semiring; a bad declaration fails
when the class is defined."""

from __future__ import annotations

import numpy as np
import pytest
from semigrad_server.semiring import Semiring, TropicalSemiring, check_axioms

# (⊕, ⊗) -> (0̄, 1̄), on lifted values |d| (log|d| when ⊗ is +), with φ(0) = 0̄.
IDENTITIES = {
    ("max", "mul"): (0.0, 1.0), ("min", "mul"): (np.inf, 1.0),
    ("max", "add"): (-np.inf, 0.0), ("min", "add"): (np.inf, 0.0),
    ("max", "min"): (0.0, np.inf), ("min", "max"): (np.inf, 0.0),
}


def lift_abs(self, d):
    """φ(d) = |d| (log|d| when ⊗ is +), and 0̄ for d = 0."""
    d = np.abs(np.asarray(d, dtype=np.float64))
    with np.errstate(divide="ignore"):
        value = np.log(d) if self.multiplication == "add" else d
    return np.where(d != 0, value, self.zero)


def declare(addition: str, multiplication: str) -> type[TropicalSemiring]:
    zero, one = IDENTITIES.get((addition, multiplication), (0.0, 1.0))
    return type("Declared", (TropicalSemiring,), {
        "name": f"{addition}_{multiplication}", "addition": addition, "multiplication": multiplication,
        "zero": zero, "one": one, "lift": lift_abs})


PAIRS = sorted(IDENTITIES)
PAIR_IDS = [f"{a},{m}" for a, m in PAIRS]


@pytest.mark.parametrize("addition,multiplication", PAIRS, ids=PAIR_IDS)
def test_every_declared_pair_obeys_the_axioms(addition, multiplication):
    s = declare(addition, multiplication)()
    assert (s.commutative, s.idempotent, s.selective) == (True, True, True)
    assert check_axioms(s, samples=256) == []


@pytest.mark.parametrize("addition,multiplication", PAIRS, ids=PAIR_IDS)
def test_sum_and_matmul_agree_with_the_generic_defaults(addition, multiplication, rng):
    s = declare(addition, multiplication)()
    x = s.lift(rng.normal(size=(2, 5, 7)) * rng.choice([0.0, 1.0, 1.0], size=(2, 5, 7)))
    for axis in ((-1,), (-2,), (-2, -1)):
        for keepdims in (False, True):
            np.testing.assert_array_equal(s.sum(x, axis, keepdims), Semiring.sum(s, x, axis, keepdims))
    np.testing.assert_array_equal(s.sum(np.zeros((3, 0)), (-1,)), np.full(3, s.zero))  # empty axis: 0̄

    a, b = s.lift(rng.normal(size=(2, 4, 6))), s.lift(rng.normal(size=(6, 3)))
    np.testing.assert_array_equal(s.matmul(a, b), Semiring.matmul(s, a, b))
    np.testing.assert_array_equal(s.matmul(np.zeros((2, 0)), np.zeros((0, 3))), np.full((2, 3), s.zero))
    for value in (s.zeros((2, 3)), s.ones((2, 3))):
        assert value.dtype == np.float64 and value.shape == (2, 3)


@pytest.mark.parametrize("addition,multiplication,message", [
    ("sum", "mul", "addition must be one of"),
    ("max", "div", "multiplication must be one of"),
])
def test_an_unsupported_operation_fails_when_the_class_is_defined(addition, multiplication, message):
    with pytest.raises(TypeError, match=message):
        declare(addition, multiplication)
