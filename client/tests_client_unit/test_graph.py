import builtins

import numpy as np
import pytest

import semigrad
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb


def node(graph, handle_or_id):
    node_id = getattr(handle_or_id, "id", handle_or_id)
    return next(n for n in graph.to_proto().nodes if n.id == node_id)


def const_value(graph, handle_or_id):
    n = node(graph, handle_or_id)
    assert n.op == "const"
    return codec.from_tensor(n.attrs["value"].tensor)


def test_small_graph_proto():
    g = semigrad.Graph()
    x = g.input("x", (3,))
    y = g.input("y", [3], dtype="float32")
    g.output("s", semigrad.sum(x * x, axis=0, name="total"))
    g.output("y", y)
    expected = pb.Graph(
        inputs=[pb.GraphInput(name="x", shape=[3], dtype=pb.DTYPE_FLOAT64),
                pb.GraphInput(name="y", shape=[3], dtype=pb.DTYPE_FLOAT32)],
        nodes=[pb.Node(id="mul_0", op="mul", inputs=["x", "x"]),
               pb.Node(id="total", op="sum", inputs=["mul_0"],
                       attrs={"axes": pb.AttrValue(ints=pb.IntList(values=[0]))})],
        outputs=[pb.GraphOutput(name="s", node="total"), pb.GraphOutput(name="y", node="y")],
    )
    assert g.to_proto() == expected


def test_operators_build_expected_ops():
    g = semigrad.Graph()
    x = g.input("x", (2, 3))
    w = g.input("w", (3, 4))
    cases = {
        "add": x + x, "sub": x - x, "mul": x * x, "div": x / x, "pow": x ** x, "neg": -x,
        "abs": builtins.abs(x), "matmul": x @ w, "lt": x < x, "le": x <= x, "gt": x > x,
        "ge": x >= x, "eq": x == x, "ne": x != x, "transpose": x.T, "index": x[1, ::-1],
        "sum": x.sum(), "mean": x.mean(1, keepdims=True), "max": x.max((0, 1)),
        "reshape": x.reshape(3, 2),
    }
    ops = {n.id: n.op for n in g.to_proto().nodes}
    for op, handle in cases.items():
        assert ops[handle.id] == op and handle.id.startswith(op + "_")
    assert (x @ w).shape == (2, 4) and x.T.shape == (3, 2) and x[1, ::-1].shape == (3,)
    assert (x < 1).dtype == "bool" and (x == x).shape == (2, 3)
    assert x.mean(1, keepdims=True).shape == (2, 1) and x.reshape((-1,)).shape == (6,)


def test_reflected_operators_and_const_dtype():
    g = semigrad.Graph()
    x = g.input("x", (2,), "float32")
    n = g.input("n", (2,), "int64")
    for handle in (2 - x, 1 / x, 2 ** x, np.float64(3) * x, x + 1, x * np.array([1.0, 2.0])):
        const_id = next(i for i in node(g, handle).inputs if i != "x")
        assert handle.dtype == "float32"
        assert const_value(g, const_id).dtype == np.float32
    assert list(node(g, 2 - x).inputs)[1] == "x"  # reflected: the number is the left operand
    assert (n * 2).dtype == "int64"
    assert (n + 0.5).dtype is None  # mixed dtypes: the server decides
    assert const_value(g, g.const(2)).dtype == np.int64
    assert const_value(g, g.const(np.array([1, 2], np.int32))).dtype == np.int64
    chosen = semigrad.where(True, x, 0)
    assert chosen.dtype == "float32" and chosen.shape == (2,)
    assert const_value(g, node(g, chosen).inputs[0]).dtype == np.bool_


def test_functions_and_attrs():
    g = semigrad.Graph()
    x = g.input("x", (2, 3))
    def attrs(handle):
        return node(g, handle).attrs

    assert semigrad.concat([x, x], axis=1).shape == (2, 6)
    assert attrs(semigrad.stack([x, x], axis=-1))["axis"].i == -1
    assert list(attrs(semigrad.transpose(x, (1, 0)))["perm"].ints.values) == [1, 0]
    assert "perm" not in attrs(x.T)
    assert list(attrs(semigrad.broadcast_to(x, (4, 2, 3)))["shape"].ints.values) == [4, 2, 3]
    assert attrs(semigrad.sum(x, keepdims=True))["keepdims"].b is True
    assert "axes" not in attrs(semigrad.sum(x))
    for fn in (semigrad.exp, semigrad.sigmoid, semigrad.relu, semigrad.square):
        assert fn(x).shape == (2, 3) and fn(x).dtype == "float64"
    assert semigrad.maximum(x, 0.0).shape == (2, 3)
    assert semigrad.sqrt(g.input("k", (), "int64")).dtype is None


def test_errors_at_build_time():
    g, other = semigrad.Graph(), semigrad.Graph()
    x = g.input("x", (2, 3))
    for key in (..., None, x, (0, True), [0.5]):  # x is float64: not an index
        with pytest.raises(TypeError):
            x[key]
    assert x[[1, 0, 1]].shape == (3, 3) and x[[[0], [1]]].shape == (2, 1, 3)  # integer arrays gather rows, as in NumPy
    with pytest.raises(IndexError, match="index"):
        x[2]
    with pytest.raises(ValueError, match="matmul"):
        x @ x
    with pytest.raises(ValueError):
        x + other.input("y", ())
    with pytest.raises(ValueError):
        g.input("x", ())
    with pytest.raises(ValueError):
        semigrad.neg(x, name="x")
    with pytest.raises(TypeError):
        semigrad.add(1, 2)
    with pytest.raises(TypeError):
        bool(x < 1)
    with pytest.raises(TypeError):
        iter(x)
    with pytest.raises(TypeError):
        x + "a"
    assert (x == None) is False  # noqa: E711 -- foreign types fall back to identity


def test_unique_ids_and_hashing():
    g = semigrad.Graph()
    x = g.input("x", ())
    g.add_node("custom", [x], {"k": 1}, name="mul_1")
    handles = [x * x for _ in range(3)]
    assert [h.id for h in handles] == ["mul_0", "mul_2", "mul_3"]
    assert len({x: 0, handles[0]: 1}) == 2
    with pytest.raises(ValueError):
        g.output("o", semigrad.Graph().input("z", ()))
