"""A registered graph described node by node, with each node's derivative rules, and the
backward graph generated for a semiring and a wrt set (PyTorch's grad_fn / next_functions,
for a whole graph at once).

An elementwise node's rules are its op's SymPy partials with the operand symbols replaced by
the ids of the nodes feeding it: for n3 = mul(n1, n2), ∂n3/∂n1 = n2 and ∂n3/∂n2 = n1. Other
ops give their textual rule (e.g. matmul: g ⊗ bᵀ).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import sympy as sp

from ..deadline import interruptibly
from ..autodiff import reverse
from ..autodiff.reverse import semiring_setup
from ..ir import Node, Type, consumers_of
from ..ops.base import OpDef
from .summary import attr_text

INPUT_OP = "input"  # the op shown for graph inputs


@dataclass
class Derivative:
    """∂node/∂(operand at `position`), fed by `source`."""

    position: int
    operand: str  # the op's name for the operand, e.g. "x"
    source: str
    formula: str


@dataclass
class NodeInfo:
    id: str
    op: str  # INPUT_OP for graph inputs
    inputs: tuple[str, ...]
    consumers: tuple[str, ...]  # nodes using this one, each once, in graph order
    type: Type
    attrs: dict[str, str]
    leaf: bool  # no inputs: a graph input or a constant
    requires_grad: bool  # a float value depending on a wrt input
    outputs: tuple[str, ...]  # names of the graph outputs it is
    expression: str = ""  # elementwise ops: the value as a formula of the input ids
    derivatives: list[Derivative] = field(default_factory=list)


@dataclass
class BackwardNode:
    id: str
    op: str
    inputs: tuple[str, ...]
    attrs: dict[str, str]
    type: Type


@dataclass
class BackwardInfo:
    semiring: str
    wrt: list[str]
    outputs: list[str]  # differentiated output names
    nodes: list[BackwardNode]  # the nodes the backward pass added (inputs may be forward nodes)
    gradients: dict[str, str]  # wrt input -> node holding its gradient; absent: no path (0̄)
    adjoints: dict[str, str]  # every node on a path from wrt to the outputs -> its accumulated adjoint
    seeds: dict[str, str]  # differentiated output node -> its seed


@dataclass
class GraphDescription:
    graph_id: str
    nodes: list[NodeInfo]  # inputs in declaration order, then nodes in topological order
    outputs: list[tuple[str, str]]  # (output name, node or input id)
    wrt: list[str]
    backward: BackwardInfo | None  # None: no float input or no float output to differentiate


def describe(engine, graph_id: str, *, semiring: str = "real", semiring_params: Mapping[str, object] | None = None,
             wrt: Sequence[str] = (), outputs: Sequence[str] = ()) -> GraphDescription:
    """Every input and node of the graph, and its backward graph for `semiring`, `wrt` (default
    every float input) and `outputs` (default every float output)."""
    cg = engine.get(graph_id)
    s = engine.semirings.get(semiring or "real", semiring_params)
    return interruptibly("describing the graph", _describe, cg, s, wrt, outputs)


def _describe(cg, s, wrt: Sequence[str], outputs: Sequence[str]) -> GraphDescription:
    float_inputs = [spec.name for spec in cg.graph.inputs if spec.type.is_float]
    wrt = cg.wrt_inputs(wrt) if wrt or float_inputs else []
    names = cg.differentiated_outputs(outputs)
    grads = requiring_grad(cg.order, cg.types, wrt)
    consumers = consumers_of(cg.order)
    output_names: dict[str, list[str]] = {}
    for name, ref in cg.graph.outputs:
        output_names.setdefault(ref, []).append(name)

    def info(ref: str, op: str, inputs: tuple[str, ...], attrs: dict) -> NodeInfo:
        return NodeInfo(ref, op, inputs, tuple(dict.fromkeys(c for c, _ in consumers.get(ref, ()))), cg.types[ref],
                        {k: attr_text(v) for k, v in sorted(attrs.items())}, not inputs, ref in grads,
                        tuple(output_names.get(ref, ())))

    nodes = [info(spec.name, INPUT_OP, (), {}) for spec in cg.graph.inputs]
    for node in cg.order:
        described = info(node.id, node.op, node.inputs, node.attrs)
        described.expression, described.derivatives = node_rules(cg.registry.get(node), node)
        nodes.append(described)
    backward = _backward(cg, s, wrt, names) if wrt and names else None
    return GraphDescription(cg.id, nodes, list(cg.graph.outputs), list(wrt), backward)


def node_rules(op: OpDef, node: Node) -> tuple[str, list[Derivative]]:
    """The node's value as a formula of its input ids (elementwise ops), and ∂node/∂input per operand."""
    operands = [op.operands[min(pos, len(op.operands) - 1)] if op.operands else str(pos)
                for pos in range(len(node.inputs))]
    if op.expression is None or not op.partials:
        texts = dict(op.derivatives)
        return "", [Derivative(pos, name, ref, texts.get(name, "")) for pos, (name, ref)
                    in enumerate(zip(operands, node.inputs))]
    ids = {sp.Symbol(name, real=True): sp.Symbol(ref, real=True) for name, ref in zip(operands, node.inputs)}
    return str(op.expression.xreplace(ids)), [
        Derivative(pos, name, ref, str(partial.xreplace(ids)))
        for pos, (name, ref, partial) in enumerate(zip(operands, node.inputs, op.partials))]


def requiring_grad(order: Sequence[Node], types: Mapping[str, Type], wrt: Sequence[str]) -> set[str]:
    """The wrt inputs and every float node that depends on one (constants do not)."""
    depends = set(wrt)
    for node in order:
        if types[node.id].is_float and node.op != "const" and any(r in depends for r in node.inputs):
            depends.add(node.id)
    return depends


def _backward(cg, s, wrt: list[str], outputs: list[str]) -> BackwardInfo:
    registry, context = semiring_setup(cg.registry, s)
    bg = reverse(cg.graph, cg.order, cg.types, outputs=outputs, wrt=wrt, context=context, registry=registry)
    forward = set(cg.types)
    nodes = [BackwardNode(n.id, n.op, n.inputs, {k: attr_text(v) for k, v in sorted(n.attrs.items())},
                          bg.types[n.id]) for n in bg.graph.nodes if n.id not in forward]
    return BackwardInfo(s.name, wrt, outputs, nodes, {x: g for x, g in bg.gradients.items() if g is not None},
                        dict(bg.adjoints), dict(bg.seeds))
