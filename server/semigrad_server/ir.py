"""The graph IR: inputs, nodes, outputs; structural validation; canonical form and content hash.

A value's *type* is its per-item shape and dtype. At run time an array may carry extra
leading dimensions (batch dimensions, and the carrier of a tuple-valued semiring is a
tuple of arrays): every op works on the trailing axes given by its type.
"""

from __future__ import annotations

import base64
import hashlib
import math
import heapq
import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from .errors import GraphError, InvalidArgument

DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
FLOAT_DTYPES = frozenset({"float64", "float32"})
# Dimensions of any value, batch dimensions included: NumPy broadcasts at most 32 (its arrays
# hold 64, but np.broadcast and the ufuncs' broadcasting stop at 32).
MAX_RANK = 32
# Bytes any array may span, counting only its non-empty dimensions: NumPy refuses larger shapes
# ("array is too big") even when a zero dimension leaves nothing to store, e.g. [0, 2**62, 4].
MAX_ARRAY_BYTES = 2**63 - 1


def unholdable(shape: Iterable[int]) -> bool:
    """Whether this is an empty shape no NumPy array (of 8-byte items) can have ([0, 2**62, 4]).
    A non-empty shape that large is over the server's element limits, which say so first."""
    shape = tuple(shape)
    return 0 in shape and math.prod(d for d in shape if d) * 8 > MAX_ARRAY_BYTES

Shape = tuple[int, ...]
# An index item is an int or a slice; an index is a tuple of items (basic indexing only).
Index = tuple


@dataclass(frozen=True)
class Type:
    shape: Shape
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact: an int64 product would wrap past 2**63

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: Shape
    dtype: str = "float64"

    @property
    def type(self) -> Type:
        return Type(self.shape, self.dtype)


@dataclass(frozen=True)
class Node:
    id: str
    op: str
    inputs: tuple[str, ...] = ()
    # Attribute values: int, float, str, bool, tuple of ints, np.ndarray, or an Index.
    attrs: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class OpDefinition:
    """A user-defined elementwise op carried by a graph: an expression of its operands in the
    safe expression language (see symbolic.parse), optionally with a derivative expression
    per operand (the others come from sympy.diff). Nodes use it by name."""

    name: str
    operands: tuple[str, ...]
    expression: str
    derivatives: tuple[tuple[str, str], ...] = ()  # (operand, expression), sorted by operand
    doc: str = ""


@dataclass(frozen=True)
class Graph:
    inputs: tuple[InputSpec, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[tuple[str, str], ...]  # (output name, node or input id)
    op_defs: tuple[OpDefinition, ...] = ()

    def node_map(self) -> dict[str, Node]:
        return {n.id: n for n in self.nodes}

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def output_map(self) -> dict[str, str]:
        return dict(self.outputs)


def validate_structure(graph: Graph) -> list[Node]:
    """Check ids, references and acyclicity; return the nodes in topological order."""
    seen: set[str] = set()
    for spec in graph.inputs:
        _check_id(spec.name, "input")
        if spec.name in seen:
            raise InvalidArgument(f"input '{spec.name}': duplicate input name")
        if spec.dtype not in DTYPES:
            raise InvalidArgument(
                f"input '{spec.name}': unsupported dtype '{spec.dtype}' (supported: {', '.join(DTYPES)})")
        if any(d < 0 for d in spec.shape):
            raise InvalidArgument(f"input '{spec.name}': negative dimension in shape {list(spec.shape)}")
        if len(spec.shape) > MAX_RANK:
            raise InvalidArgument(f"input '{spec.name}': shape of rank {len(spec.shape)}; values have at most "
                                  f"{MAX_RANK} dimensions, batch dimensions included")
        if unholdable(spec.shape):
            raise InvalidArgument(f"input '{spec.name}': shape {list(spec.shape)} is larger than any array can be")
        seen.add(spec.name)
    for node in graph.nodes:
        _check_id(node.id, "node")
        if node.id in seen:
            kind = "an input" if node.id in graph.input_names else "another node"
            raise GraphError(node.id, f"duplicate id (already used by {kind})")
        seen.add(node.id)
    for node in graph.nodes:
        for ref in node.inputs:
            if ref not in seen:
                raise GraphError(node.id, f"refers to unknown node or input '{ref}'")
    if not graph.outputs:
        raise InvalidArgument("graph has no outputs")
    names: set[str] = set()
    for name, ref in graph.outputs:
        _check_id(name, "output")
        if name in names:
            raise InvalidArgument(f"output '{name}': duplicate output name")
        names.add(name)
        if ref not in seen:
            raise InvalidArgument(f"output '{name}': refers to unknown node or input '{ref}'")
    return topological_order(graph)


def topological_order(graph: Graph) -> list[Node]:
    """Kahn's algorithm; ties go to the earlier node, so an ordered graph keeps its order."""
    nodes = graph.node_map()
    position = {n.id: i for i, n in enumerate(graph.nodes)}
    indegree = {n.id: sum(1 for r in n.inputs if r in nodes) for n in graph.nodes}
    consumers: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    for n in graph.nodes:
        for r in n.inputs:
            if r in nodes:
                consumers[r].append(n.id)
    ready = [(position[nid], nid) for nid, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        _, nid = heapq.heappop(ready)
        order.append(nodes[nid])
        for c in consumers[nid]:
            indegree[c] -= 1
            if indegree[c] == 0:
                heapq.heappush(ready, (position[c], c))
    if len(order) != len(nodes):
        stuck = sorted(nid for nid, d in indegree.items() if d > 0)
        raise GraphError(stuck[0], f"is part of a cycle (nodes on or after cycles: {', '.join(stuck[:10])})")
    return order


def _check_id(value: str, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} with an empty name or id")
    if len(value) > 256:
        raise InvalidArgument(f"{what} '{value[:40]}...': name longer than 256 characters")


# ---------------------------------------------------------------------------
# Canonical form and content hash


def canonical_attr(value: object) -> object:
    if isinstance(value, np.ndarray):
        arr = np.asarray(value, order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
        return {"tensor": [str(arr.dtype), list(arr.shape), hashlib.sha256(arr.astype(arr.dtype.newbyteorder("<")).tobytes()).hexdigest()]}
    if isinstance(value, slice):
        return {"slice": [value.start, value.stop, value.step]}
    if isinstance(value, (tuple, list)):
        return [canonical_attr(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return {"b": bool(value)}
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return {"f": float(value).hex()}
    return value


def canonical_form(graph: Graph) -> str:
    """A JSON text that is equal for graphs equal up to the order of inputs, nodes, outputs and op definitions."""
    doc = {
        "inputs": sorted([i.name, list(i.shape), i.dtype] for i in graph.inputs),
        "nodes": sorted(
            [n.id, n.op, list(n.inputs), {k: canonical_attr(v) for k, v in sorted(n.attrs.items())}]
            for n in graph.nodes
        ),
        "outputs": sorted([name, ref] for name, ref in graph.outputs),
    }
    if graph.op_defs:  # absent when empty, so graphs without custom ops keep their ids
        doc["op_defs"] = sorted([d.name, list(d.operands), d.expression, sorted(map(list, d.derivatives)), d.doc]
                                for d in graph.op_defs)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def content_hash(graph: Graph) -> str:
    return "g" + hashlib.sha256(canonical_form(graph).encode()).hexdigest()[:32]


def consumers_of(nodes: Iterable[Node]) -> dict[str, list[tuple[str, int]]]:
    """id -> list of (consumer node id, operand position)."""
    result: dict[str, list[tuple[str, int]]] = {}
    for n in nodes:
        for pos, ref in enumerate(n.inputs):
            result.setdefault(ref, []).append((n.id, pos))
    return result


# ---------------------------------------------------------------------------
# Serialisation (for stores): plain JSON with tagged attribute values, nothing executable.


def _encode_attr(value: object) -> object:
    if isinstance(value, np.ndarray):
        arr = np.asarray(value, order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
        return {"tensor": [arr.dtype.name, list(arr.shape), base64.b64encode(arr.astype(arr.dtype.newbyteorder("<")).tobytes()).decode()]}
    if isinstance(value, tuple) and any(isinstance(v, slice) for v in value):
        return {"index": [[v.start, v.stop, v.step] if isinstance(v, slice) else v for v in value]}
    if isinstance(value, tuple):
        return {"ints": list(value)}
    return {"v": value}


def _decode_attr(doc: dict) -> object:
    (kind, value), = doc.items()
    if kind == "tensor":
        dtype, shape, data = value
        return np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape)
    if kind == "index":
        return tuple(slice(*v) if isinstance(v, list) else v for v in value)
    if kind == "ints":
        return tuple(value)
    return value


def serialize(graph: Graph) -> bytes:
    return json.dumps({
        "inputs": [[i.name, list(i.shape), i.dtype] for i in graph.inputs],
        "nodes": [[n.id, n.op, list(n.inputs), {k: _encode_attr(v) for k, v in n.attrs.items()}] for n in graph.nodes],
        "outputs": [list(o) for o in graph.outputs],
        "op_defs": [[d.name, list(d.operands), d.expression, [list(p) for p in d.derivatives], d.doc]
                    for d in graph.op_defs],
    }, separators=(",", ":")).encode()


def deserialize(data: bytes) -> Graph:
    doc = json.loads(data)
    return Graph(tuple(InputSpec(name, tuple(shape), dtype) for name, shape, dtype in doc["inputs"]),
                 tuple(Node(i, op, tuple(ins), {k: _decode_attr(v) for k, v in attrs.items()})
                       for i, op, ins, attrs in doc["nodes"]),
                 tuple((name, ref) for name, ref in doc["outputs"]),
                 tuple(OpDefinition(name, tuple(operands), expression, tuple(tuple(p) for p in derivatives), d)
                       for name, operands, expression, derivatives, d in doc.get("op_defs", ())))
