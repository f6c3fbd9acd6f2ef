"""The op registry: one place per op (shape rule, NumPy kernel, derivative rule)."""

from __future__ import annotations

from typing import Sequence

from ..ir import Graph, Node, Type
from . import elementwise, indexing, linalg, nn, structural
from .base import AttrSpec, OpDef, Registry

REGISTRY = Registry()
elementwise.register(REGISTRY)
structural.register(REGISTRY)
nn.register(REGISTRY)
indexing.register(REGISTRY)
linalg.register(REGISTRY)
REGISTRY.check()


def node_type(node: Node, in_types: Sequence[Type], registry: Registry = REGISTRY) -> tuple[OpDef, dict, Type]:
    """Check a node against its op and infer its type; errors name the node."""
    op = registry.get(node)
    attrs = op.check_node(node, in_types)
    return op, attrs, op.infer(node, in_types, attrs)


def infer_types(graph: Graph, order: Sequence[Node], registry: Registry = REGISTRY) -> dict[str, Type]:
    types = {spec.name: spec.type for spec in graph.inputs}
    for node in order:
        types[node.id] = node_type(node, [types[r] for r in node.inputs], registry)[2]
    return types


__all__ = ["REGISTRY", "Registry", "OpDef", "AttrSpec", "infer_types", "node_type"]
