"""DescribeGraph: every node checked against hand-computed expectations, and the backward
graph's nodes shown to compute the gradients (interpreted here with NumPy)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import semigrad as sg
from semigrad import TensorSpec


def small_graph() -> sg.Graph:
    """out = 2 * sum(sin(x) * y / z), s = sin(x); x, y: (2,), z: ()."""
    g = sg.Graph()
    x, y, z = g.input("x", (2,)), g.input("y", (2,)), g.input("z", ())
    c = g.const(2.0, name="c")
    n1 = sg.sin(x, name="n1")
    n2 = sg.mul(n1, y, name="n2")
    n3 = sg.div(n2, z, name="n3")
    n4 = sg.sum(n3, name="n4")
    g.output("out", sg.mul(c, n4, name="n5"))
    g.output("s", n1)
    return g


F64 = TensorSpec((), "float64")
VEC = TensorSpec((2,), "float64")
# id: (op, inputs, consumers, spec, attrs, leaf, requires_grad (wrt x, z), outputs, expression,
#      derivatives as (operand, source, formula))
EXPECTED = {
    "x": ("input", (), ("n1",), VEC, {}, True, True, (), "", ()),
    "y": ("input", (), ("n2",), VEC, {}, True, False, (), "", ()),
    "z": ("input", (), ("n3",), F64, {}, True, True, (), "", ()),
    "c": ("const", (), ("n5",), F64, {"value": "2"}, True, False, (), "", ()),
    "n1": ("sin", ("x",), ("n2",), VEC, {}, False, True, ("s",), "sin(x)", (("x", "x", "cos(x)"),)),
    "n2": ("mul", ("n1", "y"), ("n3",), VEC, {}, False, True, (), "n1*y", (("x", "n1", "y"), ("y", "y", "n1"))),
    "n3": ("div", ("n2", "z"), ("n4",), VEC, {}, False, True, (), "n2/z",
           (("x", "n2", "1/z"), ("y", "z", "-n2/z**2"))),
    "n4": ("sum", ("n3",), ("n5",), F64, {}, False, True, (), "", (("x", "n3", "1 for every summed element"),)),
    "n5": ("mul", ("c", "n4"), (), F64, {}, False, True, ("out",), "c*n4", (("x", "c", "n4"), ("y", "n4", "c"))),
}


@pytest.fixture(scope="module")
def small(client):
    return client.register(small_graph())


def test_every_node_is_described(small):
    d = small.describe(wrt=["x", "z"])
    assert d.graph_id == small.id
    assert list(d.nodes) == list(EXPECTED)  # inputs first, then topological order
    assert d.outputs == {"out": "n5", "s": "n1"}
    assert d.wrt == ("x", "z")
    for ref, (op, inputs, consumers, spec, attrs, leaf, grad, outputs, expression, rules) in EXPECTED.items():
        n = d.nodes[ref]
        assert (n.id, n.op, n.inputs, n.consumers, n.spec, n.attrs) == (ref, op, inputs, consumers, spec, attrs), ref
        assert (n.leaf, n.requires_grad, n.outputs, n.expression) == (leaf, grad, outputs, expression), ref
        assert [(r.position, r.operand, r.source, r.formula) for r in n.derivatives] == \
            [(pos, *rule) for pos, rule in enumerate(rules)], ref


def test_requires_grad_follows_wrt(small):
    only_y = small.describe(wrt="y")
    assert {ref for ref, n in only_y.nodes.items() if n.requires_grad} == {"y", "n2", "n3", "n4", "n5"}
    every_float = small.describe()
    assert every_float.wrt == ("x", "y", "z")
    assert {ref for ref, n in every_float.nodes.items() if not n.requires_grad} == {"c"}


def test_formulas_name_the_same_node_twice():
    from semigrad_server.inspect.describe import node_rules
    from semigrad_server.ir import Node
    from semigrad_server.ops import REGISTRY

    node = Node("sq", "mul", ("a", "a"))
    expression, rules = node_rules(REGISTRY.ops["mul"], node)
    assert expression == "a**2" and [r.formula for r in rules] == ["a", "a"]
    expression, rules = node_rules(REGISTRY.ops["div"], Node("q", "div", ("y", "x")))  # ids swap the operand names
    assert expression == "y/x" and [r.formula for r in rules] == ["1/x", "-y/x**2"]


def evaluate_backward(backward, values: dict) -> dict:
    """Run the described backward nodes with NumPy (enough ops for the small graph)."""
    def attr(text):
        return json.loads(text.lower())

    ops = {
        "const": lambda a: np.float64(attr(a["value"])),
        "broadcast_to": lambda a, v: np.broadcast_to(v, attr(a["shape"])),
        "reshape": lambda a, v: np.reshape(v, attr(a["shape"])),
        "sum": lambda a, v: np.sum(v, axis=tuple(attr(a["axes"])), keepdims=attr(a["keepdims"])),
        "mul": lambda a, u, v: u * v, "div": lambda a, u, v: u / v, "add": lambda a, u, v: u + v,
        "neg": lambda a, v: -v, "square": lambda a, v: v * v, "cos": lambda a, v: np.cos(v),
    }
    values = dict(values)
    for n in backward.nodes:
        values[n.id] = ops[n.op](n.attrs, *(values[r] for r in n.inputs))
        assert np.shape(values[n.id]) == n.spec.shape, n.id
    return values


def test_backward_graph_holds_the_gradients(small, rng):
    x, y, z = rng.normal(size=2), rng.normal(size=2), 1.5
    d = small.describe(wrt=["x", "z"])
    b = d.backward
    assert (b.semiring, b.wrt, b.outputs) == ("real", ("x", "z"), ("out", "s"))
    assert set(b.gradients) == {"x", "z"}
    assert set(b.adjoints) == {"x", "z", "n1", "n2", "n3", "n4", "n5"}
    assert set(b.seeds) == {"n5", "n1"}
    forward = small.evaluate({"x": x, "y": y, "z": z}, nodes=["n1", "n2", "n3", "n4", "n5", "c"])
    values = evaluate_backward(b, {"x": x, "y": y, "z": z, **forward})
    # d(out + sum(s))/dx = 2 cos(x) y / z + cos(x); d/dz = -2 sum(sin(x) y) / z²
    np.testing.assert_allclose(values[b.gradients["x"]], 2 * np.cos(x) * y / z + np.cos(x))
    np.testing.assert_allclose(values[b.gradients["z"]], -2 * np.sum(np.sin(x) * y) / z**2)
    np.testing.assert_allclose(values[b.adjoints["n2"]], 2 / z * np.ones(2))
    only_out = small.describe(wrt="z", outputs="out").backward
    assert only_out.outputs == ("out",) and set(only_out.seeds) == {"n5"}


def test_backward_graph_under_a_semiring(small):
    b = small.describe(semiring="max_product", wrt="x").backward
    assert b.semiring == "max_product" and set(b.gradients) == {"x"}
    ops = {n.id: n.op for n in b.nodes}
    assert ops[b.gradients["x"]] == "sr_mul"  # lift(cos(x)) ⊗ adjoint of n1
    assert {"sr_lift", "sr_add"} <= set(ops.values()) and "add" not in ops.values()


def test_no_backward_graph_without_float_inputs(client):
    g = sg.Graph()
    k = g.input("k", (3,), "int64")
    g.output("twice", k + k)
    d = client.register(g).describe()
    assert d.backward is None and d.wrt == ()
    assert d.nodes["k"].requires_grad is False


def test_bad_requests_name_what_is_wrong(small):
    with pytest.raises(sg.InvalidArgument, match="unknown input 'w'"):
        small.describe(wrt="w")
    with pytest.raises(sg.FailedPrecondition, match="unknown semiring"):
        small.describe(semiring="nope")
    with pytest.raises(sg.NotFound):
        sg.RegisteredGraph(small.client, "g" + "0" * 32, small.graph, [], created=False).describe()
