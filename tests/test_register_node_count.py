"""A graph over max_nodes is refused from its node count, before its nodes are read.

Found by the attack of issue 12: the README's recursive determinant for n = 8 has 219,199
nodes; RegisterGraph converted every node of the message (4.6 s of a core here) before counting
them, so the refusal came after 8-14 s, and an in-process call with a 2 s deadline ended 2.7 s
late. The count is now checked on the message itself: a graph over the cap is RESOURCE_EXHAUSTED
even when a node of it could not be read (which reading it first would report as INVALID_ARGUMENT)."""

import pytest

import semigrad as sg
from semigrad.v1 import semigrad_pb2 as pb
from semigrad_server.limits import Limits

CAP = 50


def _chain(nodes: int) -> pb.Graph:
    """A graph of exactly `nodes` nodes: x, then sin applied nodes times."""
    g = sg.Graph()
    x = g.input("x", (2,))
    y = x
    for _ in range(nodes):
        y = sg.sin(y)
    g.output("y", y)
    message = g.to_proto()
    assert len(message.nodes) == nodes
    return message


def _with_unreadable_node(message: pb.Graph) -> pb.Graph:
    """The same graph with one node whose attribute has no value (INVALID_ARGUMENT when read)."""
    broken = pb.Graph()
    broken.CopyFrom(message)
    broken.nodes[0].attrs["axes"].CopyFrom(pb.AttrValue())
    return broken


@pytest.fixture(scope="module")
def client():
    with sg.Client(limits=Limits(max_nodes=CAP)) as c:
        yield c


def test_at_the_cap_is_registered(client):
    graph = client.register(_chain(CAP))
    assert graph.evaluate({"x": [0.0, 0.0]})["y"].tolist() == [0.0, 0.0]


def test_over_the_cap_is_refused_by_count(client):
    with pytest.raises(sg.ResourceExhausted, match=f"graph has {CAP + 1} nodes; the limit is {CAP}"):
        client.register(_chain(CAP + 1))


def test_over_the_cap_is_refused_before_reading_nodes(client):
    with pytest.raises(sg.InvalidArgument, match="has no value"):  # within the cap: read, and refused
        client.register(_with_unreadable_node(_chain(CAP)))
    with pytest.raises(sg.ResourceExhausted, match=f"graph has {CAP + 1} nodes"):
        client.register(_with_unreadable_node(_chain(CAP + 1)))
