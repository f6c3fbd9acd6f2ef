"""Generated inputs of every kind against declared dtypes (issue 12, item 4): the client casts a
value to the input's dtype only when no element changes, and otherwise refuses the call with
INVALID_ARGUMENT naming the input, both dtypes and the first element at fault.

The reference decides element by element in exact arithmetic (Python ints and Fractions),
without NumPy's casts: an int64 takes integers in [-2^63, 2^63), a bool 0 and 1, a float any
real number that stays finite in it (rounding is the dtype's precision, not a loss), and no
dtype takes an imaginary part, a string or None. Values that pass must arrive as those numbers.
"""

from __future__ import annotations

import math
import os
import re
from fractions import Fraction

import numpy as np
import pytest
import semigrad as sg
from hypothesis import given, note, settings, strategies as st
from hypothesis.extra import numpy as hnp

DECLARED = ("int64", "bool", "float32", "float64")
SOURCE_DTYPES = ("bool", "int8", "int32", "int64", "uint8", "uint64", "float16", "float32", "float64", "complex128")
SHAPE = (2, 3)
INT64 = (-(2**63), 2**63)

# Numbers a cast decides on: edges of the integer ranges, halves, huge and tiny magnitudes.
EDGES = [0, 1, -1, 2, 0.5, -0.5, 2.7, 1e30, -1e30, 2.0**63, -(2.0**63), 2.0**53 + 2, 1e300, 3.5e38, 5e-324,
         float("nan"), float("inf"), -float("inf"), -0.0]
PY_INTS = [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**70, -(2**70), 10**400]


def element_values(dtype: np.dtype):
    if dtype.kind == "b":
        return st.booleans()
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return st.one_of(st.integers(info.min, info.max), st.sampled_from([info.min, info.max, 0, 1, 2]))
    floats = st.one_of(st.floats(width=dtype.itemsize * 8 if dtype.kind == "f" else 64, allow_subnormal=True),
                       st.integers(-5, 5).map(float),
                       st.sampled_from([e for e in EDGES if dtype.kind != "f" or _fits(e, dtype)]))
    if dtype.kind == "c":
        return st.builds(complex, floats, st.one_of(st.just(0.0), st.just(-0.0), floats))
    return floats


def _fits(x, dtype) -> bool:
    with np.errstate(over="ignore"):
        return not math.isfinite(x) or math.isfinite(float(np.asarray(x, dtype)))


@st.composite
def values(draw):
    """What a user might pass for a (2, 3) input: an array of some dtype, a nested list of
    Python numbers (ints past int64 included), strings, or None among numbers."""
    kind = draw(st.sampled_from(["array"] * 6 + ["python ints", "strings", "with None"]))
    if kind == "array":
        dtype = np.dtype(draw(st.sampled_from(SOURCE_DTYPES)))
        return draw(hnp.arrays(dtype, SHAPE, elements=element_values(dtype)))
    flat = draw(st.lists(st.one_of(st.integers(-3, 3), st.sampled_from(PY_INTS)), min_size=6, max_size=6))
    if kind == "strings":
        flat = [str(v) for v in flat]
    elif kind == "with None":
        flat[draw(st.integers(0, 5))] = None
    return [flat[:3], flat[3:]]


def exact(v):
    """An element as an exact number (int, Fraction, or a non-finite float), or what it is."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, complex):
        return v if v.imag != 0 else exact(v.real)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        return Fraction(v) if math.isfinite(v) else v
    return v


def kept(v, declared: str) -> bool:
    """Whether the declared dtype holds element `v` (reference, exact arithmetic)."""
    v = exact(v)
    if isinstance(v, (str, complex)) or v is None:
        return False
    if declared == "int64":
        return not isinstance(v, float) and v.denominator == 1 and INT64[0] <= v < INT64[1]
    if declared == "bool":
        return not isinstance(v, float) and v in (0, 1)
    if isinstance(v, float):  # nan and ±inf: every float dtype holds them
        return True
    largest = Fraction(float(np.finfo(declared).max))
    half_ulp = Fraction(2) ** (int(np.finfo(declared).maxexp) - int(np.finfo(declared).nmant) - 2)
    return abs(v) < largest + half_ulp  # rounds to a finite number (round half to even: the max's)


def elements(value) -> list:
    a = value if isinstance(value, np.ndarray) else np.array(value, dtype=object)
    return [a[i] for i in np.ndindex(*SHAPE)]


def passthrough(declared: str) -> sg.Graph:
    g = sg.Graph()
    v, x = g.input("v", SHAPE, declared), g.input("x", (1,))
    g.output("v", v)
    g.output("y", sg.sum(x * x))
    return g


@pytest.fixture(scope="module")
def graphs(server_address):
    with sg.Client(server_address) as client:
        yield {d: client.register(passthrough(d)) for d in DECLARED}


FUZZ = bool(os.environ.get("SEMIGRAD_FUZZ"))


@settings(max_examples=2000 if FUZZ else 150)
@given(declared=st.sampled_from(DECLARED), value=values())
def test_a_cast_is_made_only_when_no_element_changes(graphs, declared, value):
    items = elements(value)
    lost = [i for i, v in enumerate(items) if not kept(v, declared)]
    note(f"declared {declared}, elements {items}, lost at {lost}")
    if lost:
        with pytest.raises(sg.InvalidArgument) as refused:
            graphs[declared].evaluate({"v": value, "x": np.ones(1)})
        message = refused.value.message
        assert "input 'v'" in message and declared in message, message
        first = [int(i) for i in np.unravel_index(lost[0], SHAPE)]
        named = re.search(r"element (\[[0-9, ]+\])", message)
        assert named is None or named.group(1) == str(first), message  # strings and None: the kind is named
        assert named is not None or re.search(r"strings|NoneType|None", message), message
        return
    got = graphs[declared].evaluate({"v": value, "x": np.ones(1)})["v"]
    assert got.dtype == np.dtype(declared) and got.shape == SHAPE
    for v, g in zip(items, got.ravel().tolist()):
        want = exact(v)
        if isinstance(want, float):  # nan, ±inf
            assert g == want or (math.isnan(want) and math.isnan(g)), (v, g)
        elif declared in ("int64", "bool"):
            assert g == want, (v, g)
        else:  # rounded to the nearest float of the dtype
            ulp = Fraction(float(np.spacing(np.asarray(float(abs(g)), declared))))
            assert abs(Fraction(g) - want) <= ulp / 2 + Fraction(float(np.finfo(declared).smallest_subnormal)), (v, g)
