"""Plain Python descriptions of tensor types and ops, decoded from semigrad.v1 messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from . import codec
from .v1 import semigrad_pb2 as pb


class TensorSpec(NamedTuple):
    """Per-item shape and dtype name of a graph input or node; unpacks as ``(shape, dtype)``."""

    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def from_proto(cls, message: pb.GraphInput | pb.NodeType) -> TensorSpec:
        """Decode a GraphInput or NodeType (an unspecified dtype means float64)."""
        if message.dtype == pb.DTYPE_UNSPECIFIED:
            return cls(tuple(message.shape), "float64")
        return cls(tuple(message.shape), codec.dtype_from_proto(message.dtype))


@dataclass(frozen=True)
class AttrSpec:
    """An op attribute; ``kind``: "int", "ints", "float", "string", "bool", "tensor", "index"."""

    name: str
    kind: str
    required: bool
    doc: str


@dataclass(frozen=True)
class DerivativeRule:
    """The derivative of an op with respect to one operand, e.g. ``("x", "cos(x)")``."""

    operand: str
    formula: str


@dataclass(frozen=True)
class OpInfo:
    """An op the server supports (mirrors semigrad.v1.OpInfo; ``arity`` -1 means variadic)."""

    name: str
    arity: int
    operands: tuple[str, ...]
    attrs: tuple[AttrSpec, ...]
    kind: str
    expression: str
    derivatives: tuple[DerivativeRule, ...]
    doc: str

    @classmethod
    def from_proto(cls, message: pb.OpInfo) -> OpInfo:
        """Decode a semigrad.v1.OpInfo message."""
        return cls(
            name=message.name,
            arity=message.arity,
            operands=tuple(message.operands),
            attrs=tuple(AttrSpec(a.name, a.kind, a.required, a.doc) for a in message.attrs),
            kind=message.kind,
            expression=message.expression,
            derivatives=tuple(DerivativeRule(d.operand, d.formula) for d in message.derivatives),
            doc=message.doc,
        )


@dataclass(frozen=True)
class SemiringInfo:
    """A semiring the server found (mirrors semigrad.v1.SemiringInfo); ``status`` "ok" or "failed"."""

    name: str
    distribution: str
    version: str
    entry_point: str
    status: str
    error: str
    description: str
    commutative: bool
    idempotent: bool
    selective: bool
    components: int
    component_names: tuple[str, ...]
    primary: str
    parameters: dict

    @classmethod
    def from_proto(cls, m: pb.SemiringInfo) -> SemiringInfo:
        return cls(m.name, m.distribution, m.version, m.entry_point, m.status, m.error, m.description,
                   m.commutative, m.idempotent, m.selective, m.components, tuple(m.component_names), m.primary,
                   dict(m.parameters))


class PathStep(NamedTuple):
    """An element of a node on a path, and the real partial of the edge that reached it;
    unpacks as ``(node, index, partial)``."""

    node: str
    index: tuple[int, ...]
    partial: float


@dataclass(frozen=True)
class BestPath:
    """The best path from an input element (``start``: input name, full index) to ``output``."""

    start: tuple[str, tuple[int, ...]]
    output: str
    steps: tuple[PathStep, ...]
    value: dict
