"""Graphs as the persistent store keeps them (ir.serialize / ir.deserialize): a graph read back is
the graph registered, attribute values with their shapes and dtypes included; a 0-d constant
came back 1-d, so a graph loaded by another worker or after a restart answered with an extra axis."""

from __future__ import annotations

import numpy as np
import pytest
from semigrad_server import ir
from semigrad_server.ir import Graph, InputSpec, Node


@pytest.mark.parametrize("value", [np.array(2.5), np.array([2.5]), np.arange(6.0).reshape(2, 3),
                                   np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.array(True),
                                   np.array(7, dtype=np.int32), np.zeros((0, 3))],
                         ids=["0-d", "1-d", "2-d", "fortran", "bool", "int32", "empty"])
def test_a_constant_comes_back_with_its_shape_dtype_and_values(value):
    graph = Graph((InputSpec("x", (), "float64"),),
                  (Node("c", "const", (), {"value": value}), Node("y", "mul", ("x", "c"), {})), (("y", "y"),))
    back = ir.deserialize(ir.serialize(graph)).nodes[0].attrs["value"]
    assert back.shape == value.shape and back.dtype == value.dtype
    np.testing.assert_array_equal(back, value)
    assert ir.content_hash(ir.deserialize(ir.serialize(graph))) == ir.content_hash(graph)


def test_constants_of_different_shapes_make_different_graphs():
    """c = 2.5 and c = [2.5] give x * c different shapes: they must not share a content-hash id
    (registering the second would have answered with the first's graph)."""
    def graph(value):
        return Graph((InputSpec("x", (), "float64"),),
                     (Node("c", "const", (), {"value": value}), Node("y", "mul", ("x", "c"), {})), (("y", "y"),))

    ids = {ir.content_hash(graph(v)) for v in (np.array(2.5), np.array([2.5]), np.array([[2.5]]))}
    assert len(ids) == 3
