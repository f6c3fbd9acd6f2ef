"""Node types against NumPy's own rules. An elementwise node: its operands' broadcast shape, and
the dtype NumPy computes for its operands' dtypes (probed once per dtype pattern and op, then
remembered: every node is judged the same, the first of its pattern or not). An index node: the
shape NumPy's basic indexing gives (integers in range take a short path), or the refusal."""

from __future__ import annotations

import numpy as np
import pytest
from semigrad_server.errors import GraphError
from semigrad_server.ir import Node, Type
from semigrad_server.ops import node_type

CASES = [  # op, operand dtypes: what NumPy itself gives for 0-d operands (None: no kernel)
    ("add", ("float64", "float64")),
    ("add", ("float32", "float32")),
    ("add", ("float32", "float64")),
    ("add", ("int64", "float64")),
    ("add", ("bool", "bool")),
    ("sub", ("bool", "bool")),
    ("neg", ("bool",)),
    ("mul", ("int64", "int64")),
    ("sqrt", ("bool",)),
    ("lt", ("float64", "int64")),
]


def numpy_dtype(op: str, dtypes: tuple[str, ...]) -> str | None:
    fn = {"add": np.add, "sub": np.subtract, "neg": np.negative, "mul": np.multiply, "sqrt": np.sqrt,
          "lt": np.less}[op]
    try:
        with np.errstate(all="ignore"):
            return np.asarray(fn(*(np.ones((), dtype=d) for d in dtypes))).dtype.name
    except TypeError:
        return None


@pytest.mark.parametrize("op,dtypes", CASES)
def test_each_node_of_a_pattern_gets_numpys_dtype_or_the_refusal(op, dtypes):
    want = numpy_dtype(op, dtypes)
    inputs = [Type((3,), d) for d in dtypes]
    for k in range(3):  # the first node of the pattern probes, the later ones remember
        node = Node(f"n{k}", op, tuple(f"x{i}" for i in range(len(dtypes))))
        if want in ("float64", "float32", "int64", "bool"):
            assert node_type(node, inputs)[2] == Type((3,), want)
        else:  # no kernel (sub of bools), or a dtype the service does not carry (sqrt(bool): float16)
            with pytest.raises(GraphError, match=f"node 'n{k}'.*{op}.*dtype"):
                node_type(node, inputs)


@pytest.mark.parametrize("shapes,want", [
    (((2, 3), (2, 3)), (2, 3)),
    (((2, 3), (3,)), (2, 3)),
    (((1, 3), (2, 1)), (2, 3)),
    (((), (4,)), (4,)),
    (((2, 3), (3, 2)), None),
])
def test_operand_shapes_broadcast_as_numpys(shapes, want):
    node = Node("n", "add", ("a", "b"))
    inputs = [Type(s, "float64") for s in shapes]
    assert want == (np.broadcast_shapes(*shapes) if want is not None else None)  # the reference agrees
    if want is None:
        with pytest.raises(GraphError, match="node 'n'.*do not broadcast"):
            node_type(node, inputs)
    else:
        assert node_type(node, inputs)[2].shape == want


@pytest.mark.parametrize("shape,index", [
    ((3, 4), (0, 0)), ((3, 4), (2, 3)), ((3, 4), (-1, -4)), ((3, 4), (1,)), ((3, 4), ()),
    ((3, 4), (3, 0)), ((3, 4), (0, -5)), ((3, 4), (0, 4)), ((3,), (0, 0)),
    ((3, 4), (slice(1, None), 2)), ((3, 4), (1, slice(None, None, -1))), ((2, 3, 4), (1, slice(0, 2), -1)),
])
def test_index_shapes_are_numpys(shape, index):
    node = Node("n", "index", ("x",), {"index": index})
    try:
        want = np.empty(shape)[index].shape
    except IndexError:
        want = None
    if want is None:
        with pytest.raises(GraphError, match="node 'n'"):
            node_type(node, [Type(shape, "float64")])
    else:
        assert node_type(node, [Type(shape, "float64")])[2] == Type(want, "float64")
