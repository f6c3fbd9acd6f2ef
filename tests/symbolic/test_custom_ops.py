"""Custom ops: defined by an expression (and optionally derivatives), they behave like a
built-in elementwise op: values, gradients, broadcasting, batches, float32, every semiring,
describing, content hashing; names never shadow built-ins."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg
from reference import finite_difference_gradient
from semigrad_server.ir import OpDefinition
from semigrad_server.symbolic.custom import build_op, registry_for


def softclip_np(x):
    return np.log1p(np.exp(x)) - np.log1p(np.exp(x - 1))


# id, operands, expression, grads, NumPy reference, operand shapes
CASES = [
    ("softclip", ["x"], "log(1 + exp(x)) - log(1 + exp(x - 1))", None, softclip_np, [(3,)]),
    ("xsiny-broadcast", ["x", "y"], "x * sin(y)", None, lambda x, y: x * np.sin(y), [(3, 1), (4,)]),
    ("given-grads", ["x", "y"], "x * sin(y)", {"x": "sin(y)", "y": "x * cos(y)"}, lambda x, y: x * np.sin(y),
     [(2, 3), (2, 3)]),
    ("one-grad-given", ["a", "b"], "a**2 / (1 + b**2)", {"a": "2*a / (1 + b**2)"},
     lambda a, b: a**2 / (1 + b**2), [(4,), ()]),
    ("functions", ["u"], "sigmoid(u) * tanh(u) + softplus(u) - erf(u) / 3", None,
     lambda u: 1 / (1 + np.exp(-u)) * np.tanh(u) + np.log1p(np.exp(u)) - np.vectorize(__import__("math").erf)(u) / 3,
     [(5,)]),
    ("piecewise", ["x", "y"], "maximum(x, y) + relu(x) * abs(y)", None,
     lambda x, y: np.maximum(x, y) + np.maximum(x, 0) * np.abs(y), [(4,), (4,)]),
    ("sign-derivative-zero", ["x"], "sign(x) * x", None, lambda x: np.sign(x) * x, [(3,)]),
    ("constant-partial", ["x", "y"], "3 * x + 0 * y", None, lambda x, y: 3 * x + 0 * y, [(2,), (2,)]),
]


def build(case):
    _, operands, expression, grads, _, shapes = case
    g = sg.Graph()
    handles = [g.input(f"in{k}", s) for k, s in enumerate(shapes)]
    op = g.op("custom", operands, expression, grads=grads)
    g.output("out", op(*handles))
    return g


def sample(rng, shape):
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.3, 2.0, size=shape)


@pytest.mark.parametrize("batch", [(), (2,)], ids=["single", "batched"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients(client, rng, case, batch):
    _, _, _, _, reference, shapes = case
    f = client.register(build(case))
    inputs = {f"in{k}": sample(rng, (batch if k == 0 else ()) + s) for k, s in enumerate(shapes)}
    out = f.evaluate(inputs)["out"]
    first, *rest = inputs.values()
    expected = np.stack([reference(item, *rest) for item in first]) if batch else reference(first, *rest)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    seed = rng.normal(size=out.shape)
    grads = f.gradient(inputs, seeds={"out": seed})
    shape_of = {f"in{k}": s for k, s in enumerate(shapes)}
    for name in inputs:
        assert grads[name].shape == batch + shape_of[name]
        expected = finite_difference_gradient(lambda a: f.evaluate(a), inputs, shape_of, {"out": seed}, name)
        np.testing.assert_allclose(grads[name], expected, rtol=1e-6, atol=1e-7, err_msg=name)


def test_float32(client, rng):
    g = sg.Graph()
    x = g.input("x", (3,), "float32")
    g.output("out", g.op("cube", ["x"], "x**3")(x))
    f = client.register(g)
    assert f.output_specs["out"].dtype == "float32"
    value = rng.normal(size=3).astype(np.float32)
    assert f.evaluate({"x": value})["out"].dtype == np.float32
    np.testing.assert_allclose(f.gradient({"x": value})["x"], 3 * value.astype(np.float64) ** 2, rtol=1e-6)


def test_expr_is_a_one_off_custom_op(client, rng):
    g = sg.Graph()
    a, b = g.input("a", (3,)), g.input("b", (3,))
    g.output("out", g.expr("x * sin(y)", x=a, y=b).sum())
    f = client.register(g)
    values = {"a": rng.normal(size=3), "b": rng.normal(size=3)}
    np.testing.assert_allclose(f.evaluate(values)["out"], np.sum(values["a"] * np.sin(values["b"])))
    grads = f.gradient(values)
    np.testing.assert_allclose(grads["a"], np.sin(values["b"]))
    np.testing.assert_allclose(grads["b"], values["a"] * np.cos(values["b"]))
    (info,) = f.custom_ops.values()
    assert info.expression == "x*sin(y)" and info.operands == ("x", "y")


def test_numbers_mix_with_handles(client):
    g = sg.Graph()
    x = g.input("x", (2,))
    op = g.op("affine", ["x", "a", "b"], "a * x + b")
    g.output("out", op(x, 2.0, b=1.0))
    f = client.register(g)
    np.testing.assert_allclose(f.evaluate({"x": [1.0, 2.0]})["out"], [3.0, 5.0])


def test_describe(client):
    g = sg.Graph()
    x = g.input("x", (2,))
    g.output("out", g.op("softclip", ["x"], "log(1 + exp(x)) - log(1 + exp(x - 1))", doc="a soft clip")(x))
    f = client.register(g)
    info = f.custom_ops["softclip"]
    assert info.kind == "elementwise" and info.arity == 1 and info.doc == "a soft clip"
    assert info.expression == "log(exp(x) + 1) - log(exp(x - 1) + 1)"
    (rule,) = info.derivatives
    assert rule.operand == "x" and "exp(x)/(exp(x) + 1)" in rule.formula
    again = client.get_graph(f.id)  # the definition comes back with the graph
    assert again.custom_ops == f.custom_ops
    assert [d.name for d in again.graph.op_defs] == ["softclip"]
    assert "softclip" not in {op.name for op in client.list_ops()}  # custom ops belong to their graph


def _graph(expression="x * x", name="sq", grads=None):
    g = sg.Graph()
    x = g.input("x", (2,))
    g.output("out", g.op(name, ["x"], expression, grads=grads)(x))
    return g


def test_content_hash_includes_the_definitions(client):
    ids = {client.register(_graph(e, grads=d)).id for e, d in
           [("x * x", None), ("x**2", None), ("x * x", {"x": "2*x"}), ("x * x", {"x": "2*x + 0"})]}
    assert len(ids) == 4
    assert client.register(_graph()).id == client.register(_graph()).id

    def two_ops(p_first: bool, p: str, q: str) -> sg.Graph:
        g = sg.Graph()
        x = g.input("x", ())
        if p_first:
            op_p, op_q = g.op("p", ["x"], p), g.op("q", ["x"], q)
        else:
            op_q, op_p = g.op("q", ["x"], q), g.op("p", ["x"], p)
        g.output("out", op_p(x, name="P") * op_q(x, name="Q"))
        return g

    same = {client.register(two_ops(first, "x + 1", "x + 0")).id for first in (True, False)}
    assert len(same) == 1  # the order of the definitions does not matter
    assert client.register(two_ops(True, "x + 0", "x + 1")).id not in same


@pytest.mark.parametrize("name", ["sin", "add", "matmul", "sum", "const", "where", "sr_add", "sr_custom", "heaviside",
                                  "lt", "scatter_index"])
def test_names_never_shadow_builtins(client, name):
    with pytest.raises(sg.InvalidArgument, match=name):
        client.register(_graph(name=name))


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.operands.append("x"), "repeat"),
    (lambda d: d.operands.__setitem__(0, "1x"), "identifier"),
    (lambda d: d.operands.__setitem__(0, "exp"), "function"),
    (lambda d: d.derivatives.__setitem__("z", "1"), "not an operand"),
    (lambda d: setattr(d, "name", "bad name"), "identifier"),
    (lambda d: setattr(d, "name", ""), "identifier"),
    (lambda d: d.ClearField("operands"), "at least one operand"),
    (lambda d: setattr(d, "expression", "x.real"), "attribute"),
])
def test_bad_definitions_are_invalid_arguments(client, mutate, match):
    message = _graph().to_proto()
    mutate(message.op_defs[0])
    with pytest.raises(sg.InvalidArgument, match=match):
        client.register(message)


def test_duplicate_definitions_and_bad_uses(client):
    message = _graph().to_proto()
    message.op_defs.append(message.op_defs[0])
    with pytest.raises(sg.InvalidArgument, match="more than once"):
        client.register(message)
    message = _graph().to_proto()
    message.nodes[0].inputs.append("x")
    with pytest.raises(sg.InvalidArgument, match="takes 1 input"):
        client.register(message)
    g = sg.Graph()
    n = g.input("n", (2,), "int64")
    g.output("out", g.op("sq", ["x"], "x * x")(n))
    with pytest.raises(sg.InvalidArgument, match="float operands"):
        client.register(g)
    g = sg.Graph()
    a, b = g.input("a", (2,)), g.input("b", (3,))
    g.op("m", ["x", "y"], "x * y")
    g.output("out", g.add_node("m", [a, b]))
    with pytest.raises(sg.InvalidArgument, match="do not broadcast"):
        client.register(g)


def test_client_side_definition_errors():
    g = sg.Graph()
    op = g.op("f", ["x", "y"], "x * y", grads=[None, "x"])
    assert dict(op.definition.derivatives) == {"y": "x"}
    with pytest.raises(ValueError, match="already defined"):
        g.op("f", ["x"], "x")
    with pytest.raises(ValueError, match="not an operand"):
        g.op("h", ["x"], "x", grads={"z": "1"})
    with pytest.raises(TypeError, match="missing operand"):
        op(g.input("a", ()))
    with pytest.raises(TypeError, match="no operand"):
        op(x=1.0, y=2.0, z=3.0)


def test_definitions_are_built_once_and_cached():
    d = OpDefinition("twice", ("x",), "2*x")
    assert build_op(d) is build_op(OpDefinition("twice", ("x",), "2*x"))
    assert registry_for((d,)) is registry_for((OpDefinition("twice", ("x",), "2*x"),))
    assert registry_for((d,)).ops["twice"] is build_op(d)
    assert registry_for(()).ops.keys() == registry_for((d,)).ops.keys() - {"twice"}


def _pair(custom: bool):
    """x ⊙ y with a custom op standing for mul, or the built-in mul, inside a small network."""
    g = sg.Graph()
    x, w = g.input("x", (3,)), g.input("w", (3, 2))
    h = g.op("times", ["a", "b"], "a * b")(x, x) if custom else x * x
    g.output("out", sg.sum(sg.tanh(h @ w)))
    return g


def test_every_semiring_sees_a_custom_op_as_its_built_in_twin(client, rng):
    """Path sums need the same local partials per edge: `times(x, x)` is two edges, like x * x."""
    f_custom, f_builtin = client.register(_pair(True)), client.register(_pair(False))
    values = {"x": rng.normal(size=3), "w": rng.normal(size=(3, 2))}
    names = [s.name for s in client.list_semirings() if s.status == "ok"]
    assert len(names) > 1
    for name in names:
        a = f_custom.gradient(values, semiring=name, return_components=True)
        b = f_builtin.gradient(values, semiring=name, return_components=True)
        for x in values:
            for part in b.components[x]:
                np.testing.assert_allclose(a.components[x][part], b.components[x][part], rtol=1e-12, atol=1e-12,
                                           err_msg=f"{name}: {x}/{part}")


def test_definitions_survive_serialisation():
    """Persistent stores keep graphs serialised: the definitions (and so the id) come back."""
    from semigrad_server import ir
    from semigrad_server.service.convert import graph_from_proto

    graph = graph_from_proto(_graph("x * sin(x)", grads={"x": "sin(x) + x * cos(x)"}).to_proto())
    again = ir.deserialize(ir.serialize(graph))
    assert again.op_defs == graph.op_defs
    assert ir.content_hash(again) == ir.content_hash(graph)


def test_describe_graph_shows_a_custom_nodes_rules(client):
    g = sg.Graph()
    x = g.input("x", (2,))
    g.output("out", g.op("softclip", ["x"], "log(1 + exp(x)) - log(1 + exp(x - 1))", grads={"x": "sigmoid(x)"})(
        x, name="clip"))
    description = client.register(g).describe(semiring="log")
    text = repr(description)
    assert "clip" in text and "sigmoid(x)" in text
