"""A registered graph as the server describes it (DescribeGraph), as plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from .specs import TensorSpec
from .v1 import semigrad_pb2 as pb


@dataclass(frozen=True)
class NodeDerivative:
    """∂node/∂operand: ``source`` feeds operand ``operand`` (at ``position``); ``formula`` is the
    op's rule with the operands replaced by the ids feeding them (elementwise ops), e.g. ``"n2"``
    for ∂mul(n1, n2)/∂n1, or the rule in words (structural ops)."""

    position: int
    operand: str
    source: str
    formula: str


@dataclass(frozen=True)
class NodeDescription:
    """A node or input. ``inputs`` are its next functions (PyTorch's ``grad_fn.next_functions``),
    ``consumers`` the nodes using it; ``leaf``: no inputs (a graph input or a constant);
    ``requires_grad``: a float value depending on a ``wrt`` input; ``outputs``: the output names
    it is; ``expression``: its value as a formula of its inputs (elementwise ops)."""

    id: str
    op: str
    inputs: tuple[str, ...]
    consumers: tuple[str, ...]
    spec: TensorSpec
    attrs: dict[str, str]
    leaf: bool
    requires_grad: bool
    outputs: tuple[str, ...]
    expression: str
    derivatives: tuple[NodeDerivative, ...]

    @classmethod
    def from_proto(cls, m: pb.NodeInfo) -> NodeDescription:
        return cls(m.id, m.op, tuple(m.inputs), tuple(m.consumers), TensorSpec.from_proto(m), dict(m.attrs), m.leaf,
                   m.requires_grad, tuple(m.outputs), m.expression,
                   tuple(NodeDerivative(d.position, d.operand, d.source, d.formula) for d in m.derivatives))


@dataclass(frozen=True)
class BackwardNode:
    """A node the backward pass added; its inputs may be backward nodes, forward nodes or inputs."""

    id: str
    op: str
    inputs: tuple[str, ...]
    attrs: dict[str, str]
    spec: TensorSpec


@dataclass(frozen=True)
class BackwardGraph:
    """The backward graph for ``semiring`` and ``wrt``: ``gradients`` maps each wrt input to the
    node holding its gradient (inputs with no path to an output are absent), ``adjoints`` every
    node on a path to the node holding its accumulated adjoint, ``seeds`` each differentiated
    output node to its seed."""

    semiring: str
    wrt: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[BackwardNode, ...]
    gradients: dict[str, str]
    adjoints: dict[str, str]
    seeds: dict[str, str]

    @classmethod
    def from_proto(cls, m: pb.BackwardGraphInfo) -> BackwardGraph:
        return cls(m.semiring, tuple(m.wrt), tuple(m.outputs),
                   tuple(BackwardNode(n.id, n.op, tuple(n.inputs), dict(n.attrs), TensorSpec.from_proto(n))
                         for n in m.nodes),
                   dict(m.gradients), dict(m.adjoints), dict(m.seeds))


@dataclass(frozen=True)
class GraphDescription:
    """``nodes`` by id (inputs first, then nodes in topological order), ``outputs`` as
    ``{output name: node id}``, the ``wrt`` inputs, and the ``backward`` graph (None when
    nothing can be differentiated)."""

    graph_id: str
    nodes: dict[str, NodeDescription]
    outputs: dict[str, str]
    wrt: tuple[str, ...]
    backward: BackwardGraph | None

    @classmethod
    def from_proto(cls, m: pb.DescribeGraphResponse) -> GraphDescription:
        return cls(m.graph_id, {n.id: NodeDescription.from_proto(n) for n in m.nodes},
                   {o.name: o.node for o in m.outputs}, tuple(m.wrt),
                   BackwardGraph.from_proto(m.backward) if m.HasField("backward") else None)
