"""Input values are cast to the declared dtype only when no value changes (issue 12, item 4).

A fraction or an out-of-range number for an int64 input, anything but 0 and 1 for a bool, a
finite number too large for float32, an imaginary part, strings: refused with INVALID_ARGUMENT
naming the input, both dtypes and the first element at fault, before anything is sent. Rounding
into a float dtype is its precision, not a loss, and exact conversions go through unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg


def passthrough(dtype: str) -> sg.Graph:
    """Output "v" is input "v" as the server received it; "y" a float output to differentiate."""
    g = sg.Graph()
    v, x = g.input("v", (3,), dtype), g.input("x", (3,))
    g.output("v", v)
    g.output("y", sg.sum(x * x))
    return g


# declared dtype, value sent, its dtype, index of the first element at fault, that element as shown
REFUSED = [
    ("int64", [1.0, 2.7, 3.0], "float64", [1], "2.7, which would become 2"),
    ("int64", [0.0, 1e30, 0.0], "float64", [1], "1e+30, which would become -9223372036854775808"),
    ("int64", [1.0, 2.0, -1e19], "float64", [2], "-1e+19"),
    ("int64", [np.nan, 1.0, 2.0], "float64", [0], "nan"),
    ("int64", [1.0, np.inf, 2.0], "float64", [1], "inf"),
    ("int64", np.array([1, 2**64 - 1, 3], dtype=np.uint64), "uint64", [1], "18446744073709551615, which would become -1"),
    ("int64", [1, 2**70, 3], "object", [1], "1180591620717411303424"),
    ("int64", ["a", "b", "c"], "strings", [0], "'a'"),
    ("int64", np.array([1.5, 2.5, 3.5], dtype=np.float32), "float32", [0], "1.5, which would become 1"),
    ("bool", [0, 1, 2], "int64", [2], "2, which would become True"),
    ("bool", [0.0, 0.5, 1.0], "float64", [1], "0.5"),
    ("float32", [1.0, 1e300, 0.0], "float64", [1], "1e+300, which would become inf"),
    ("float64", [1 + 0j, 2 + 1j, 0j], "complex128", [1], "(2+1j)"),
    ("float64", ["1.0", "2", "3"], "strings", [0], "'1.0'"),
    ("float64", [1.0, None, 3.0], "NoneType", [1], "None"),
]


@pytest.mark.parametrize("declared,value,source,index,shown", REFUSED,
                         ids=[f"{r[2]}-to-{r[0]}-{i}" for i, r in enumerate(REFUSED)])
def test_a_lossy_cast_is_refused_naming_input_dtypes_and_element(client, declared, value, source, index, shown):
    f = client.register(passthrough(declared))
    with pytest.raises(sg.InvalidArgument) as info:
        f.evaluate({"v": value, "x": np.ones(3)})
    message = info.value.message
    assert "input 'v'" in message and declared in message and source in message, message
    assert f"element {index} is {shown}" in message, message


# declared dtype, value sent, what the server must have received
ACCEPTED = [
    ("int64", [1.0, -2.0, 3.0], np.array([1, -2, 3])),
    ("int64", [2.0**62, -(2.0**63), 0.0], np.array([2**62, -(2**63), 0])),
    ("int64", [True, False, True], np.array([1, 0, 1])),
    ("int64", np.array([7, -8, 9], dtype=np.int32), np.array([7, -8, 9])),
    ("int64", np.array([7, 8, 2**63 - 1], dtype=np.uint64), np.array([7, 8, 2**63 - 1])),
    ("int64", [1, 2**62, 3 + 0j], np.array([1, 2**62, 3])),
    ("bool", [0, 1, 1], np.array([False, True, True])),
    ("bool", [1.0, 0.0, -0.0], np.array([True, False, False])),
    ("float32", [0.1, 1e30, -2.5], np.array([0.1, 1e30, -2.5], dtype=np.float32)),  # rounded: float32's precision
    ("float32", [np.inf, -np.inf, np.nan], np.array([np.inf, -np.inf, np.nan], dtype=np.float32)),
    ("float64", [1, 2**53 + 1, -3], np.array([1.0, 2.0**53, -3.0])),  # rounded: float64's precision
    ("float64", [1 + 0j, 2.5, 0j], np.array([1.0, 2.5, 0.0])),
    ("float64", np.array([0.5, 1, 65504], dtype=np.float16), np.array([0.5, 1.0, 65504.0])),
]


@pytest.mark.parametrize("declared,value,expected", ACCEPTED, ids=[f"{a[0]}-{i}" for i, a in enumerate(ACCEPTED)])
def test_an_exact_cast_goes_through(client, declared, value, expected):
    got = client.register(passthrough(declared)).evaluate({"v": value, "x": np.ones(3)})["v"]
    assert got.dtype == np.dtype(declared)
    np.testing.assert_array_equal(got, expected)


CALLS = {
    "evaluate": lambda f, v: f.evaluate({"v": v, "x": np.ones(3)}),
    "gradient": lambda f, v: f.gradient({"v": v, "x": np.ones(3)}, outputs="y"),
    "gradient_many": lambda f, v: f.gradient_many({"v": v, "x": np.ones((4, 3))}, outputs="y", chunk_size=2),
    "crosscheck": lambda f, v: f.crosscheck({"v": v, "x": np.ones(3)}, wrt="x", outputs="y"),
    "to_dot": lambda f, v: f.to_dot(inputs={"v": v, "x": np.ones(3)}),
}


@pytest.mark.parametrize("call", CALLS)
def test_every_call_taking_inputs_refuses_a_lossy_cast(client, call):
    f = client.register(passthrough("int64"))
    with pytest.raises(sg.InvalidArgument, match=r"input 'v' .* float64 to int64 .* element \[1\] is 2\.7"):
        CALLS[call](f, [1.0, 2.7, 3.0])
    with pytest.raises(sg.InvalidArgument, match=r"input 'v' holds strings, not numbers, where int64"):
        CALLS[call](f, ["1", "2", "3"])


def test_a_seed_too_large_for_its_output_is_refused(client):
    g = sg.Graph()
    x = g.input("x", (3,), "float32")
    g.output("y", sg.sum(x * x))
    f = client.register(g)
    with pytest.raises(sg.InvalidArgument, match=r"seed for output 'y' .* float64 to float32 .* 1e\+300"):
        f.gradient({"x": np.ones(3, np.float32)}, seeds={"y": 1e300})
    np.testing.assert_array_equal(f.gradient({"x": np.ones(3, np.float32)}, seeds={"y": 0.5})["x"], np.ones(3))


# Found by an attacker (issue 12): other numbers a user gives were cast lossily or failed with a
# bare Python error naming nothing.
def sin_graph() -> sg.Graph:
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("s", sg.sum(sg.sin(x, name="h") * x))
    return g


@pytest.mark.parametrize("bad", [["a", "b", "c"], [1j, 0, 0], [None, 0, 0]], ids=["strings", "complex", "None"])
def test_to_dot_refuses_gradients_that_are_not_real_numbers(client, bad):
    f = client.register(sin_graph())
    with pytest.raises(sg.InvalidArgument, match=r"gradient of 'x'"):
        f.to_dot(gradients={"x": bad})


@pytest.mark.parametrize("index,match", [((1.5,), "sequence of integers"), (("1",), "sequence of integers"),
                                         ((2**70,), "out of range")])
def test_element_indices_must_be_integers(client, index, match):
    """1.5 was cut to 1: the path of another element came back."""
    f = client.register(sin_graph())
    x = {"x": np.array([0.1, 0.2, 0.3])}
    with pytest.raises(sg.InvalidArgument, match=rf"best_path start on input 'x': .*{match}"):
        f.gradient(x, semiring="max_product", best_path=[("x", index)])
    with pytest.raises(sg.InvalidArgument, match=rf"highlight_path step at node 'x': .*{match}"):
        f.to_dot(inputs=x, highlight_path=[("x", index)])
    assert f.gradient(x, semiring="max_product", best_path=[("x", (np.int64(1),))]).best_paths[0].start == ("x", (1,))


def test_top_paths_and_semiring_parameters_are_checked_before_sending(client):
    f = client.register(sin_graph())
    x = {"x": np.array([0.1, 0.2, 0.3])}
    with pytest.raises(sg.InvalidArgument, match=r"top_paths is a whole number, got 2.5"):
        f.gradient(x, semiring="kbest", semiring_params={"k": 3}, top_paths=2.5)
    with pytest.raises(sg.InvalidArgument, match=r"top_paths = 2147483648 is out of range"):
        f.gradient(x, semiring="kbest", top_paths=2**31)  # past the message's int32 field
    for k in (2**70, None):
        with pytest.raises(sg.InvalidArgument, match=r"semiring parameter 'k'"):
            f.gradient(x, semiring="kbest", semiring_params={"k": k})


@pytest.mark.parametrize("returned,match", [
    (lambda g: g + 5j, r"complex128 to float64 .* element \[0\] is \(.*\+5j\)"),
    (lambda g: np.array(["a", "b", "c"]), r"holds strings"),
    (lambda g: [10**400, 0, 0], r"element \[0\] is 1000.*\(401 characters\), which does not fit"),
], ids=["imaginary part", "strings", "past float64"])
def test_a_hook_returning_a_value_that_would_change_is_refused(client, returned, match):
    """The imaginary part was dropped with only NumPy's ComplexWarning."""
    f = client.register(sin_graph())
    with pytest.raises(sg.InvalidArgument, match=rf"the value the post hook on node 'h' returned .*{match}"):
        f.gradient({"x": np.array([0.1, 0.2, 0.3])}, hooks={"h": returned})


def test_an_element_too_long_to_show_is_cut(client):
    f = client.register(passthrough("int64"))
    with pytest.raises(sg.InvalidArgument) as info:
        f.evaluate({"v": [1, 10**5000, 3], "x": np.ones(3)})
    assert "element [1] is an integer of about 5000 digits" in info.value.message and len(info.value.message) < 300
