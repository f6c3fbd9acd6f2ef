"""Builds graphs node by node, with hash-consing: emitting a node equal to one already
present (same op, inputs and attributes) returns the existing id. That is common-
subexpression elimination at construction time, across forward and backward: the
partial of exp is the forward exp node itself.
"""

from __future__ import annotations

import json
from typing import Iterable

import numpy as np

from ..ir import Graph, InputSpec, Node, Type, canonical_attr
from ..ops import REGISTRY, OpDef, Registry, node_type


class GraphBuilder:
    def __init__(self, graph: Graph, order: Iterable[Node], types: dict[str, Type], registry: Registry = REGISTRY):
        self.registry = registry
        self.inputs: list[InputSpec] = list(graph.inputs)
        self.nodes: list[Node] = []
        self.types: dict[str, Type] = dict(types)
        self.ops: dict[str, OpDef] = {}
        self.attrs: dict[str, dict] = {}
        self._by_key: dict[tuple, str] = {}
        self._taken = set(types) | {n.id for n in graph.nodes}
        self._counter = 0
        for node in order:
            self._append(node)

    def _append(self, node: Node) -> None:
        op, attrs, out_type = node_type(node, [self.types[r] for r in node.inputs], self.registry)
        self.nodes.append(node)
        self.types[node.id] = out_type
        self.ops[node.id] = op
        self.attrs[node.id] = attrs
        self._by_key.setdefault(self._key(node.op, node.inputs, node.attrs), node.id)

    @staticmethod
    def _key(op: str, inputs, attrs) -> tuple:
        return op, tuple(inputs), json.dumps({k: canonical_attr(v) for k, v in sorted(attrs.items())})

    def add_input(self, name: str, type_: Type) -> str:
        self.inputs.append(InputSpec(name, type_.shape, type_.dtype))
        self.types[name] = type_
        self._taken.add(name)
        return name

    def fresh_input(self, what: str, type_: Type) -> str:
        """A new graph input under an id no node or input has; returns the id."""
        return self.add_input(self._fresh_id(what), type_)

    def emit(self, op: str, inputs: Iterable[str], **attrs) -> str:
        inputs = tuple(inputs)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        key = self._key(op, inputs, attrs)
        existing = self._by_key.get(key)
        if existing is not None:
            return existing
        node = Node(self._fresh_id(op), op, inputs, attrs)
        self._append(node)
        return node.id

    def const(self, value, dtype: str) -> str:
        return self.emit("const", (), value=np.asarray(value, dtype=dtype))

    def _fresh_id(self, op: str) -> str:
        while True:
            self._counter += 1
            candidate = f"∂{self._counter}:{op}"
            if candidate not in self._taken:
                self._taken.add(candidate)
                return candidate

    def graph(self, outputs: Iterable[tuple[str, str]]) -> Graph:
        return Graph(tuple(self.inputs), tuple(self.nodes), tuple(outputs))
