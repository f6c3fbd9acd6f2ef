"""What an op is: operands, attributes, shape rule, kernel factory, adjoint rule.

Kernels receive arrays whose trailing axes have the node's declared types and whose
leading axes (batch dimensions) are arbitrary; a kernel factory gets the static types
and returns a function of the arrays alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import GraphError
from ..ir import DTYPES, Node, Type

ATTR_KINDS = ("int", "ints", "float", "string", "bool", "tensor", "index")


@dataclass(frozen=True)
class AttrSpec:
    name: str
    kind: str
    required: bool = False
    default: object = None
    doc: str = ""


@dataclass
class OpDef:
    name: str
    kind: str  # elementwise | comparison | structural | reduction | linalg | source
    operands: tuple[str, ...]
    infer: Callable[[Node, Sequence[Type], Mapping], Type]
    kernel: Callable[[Mapping, Sequence[Type], Type], Callable]
    # vjp(ctx, node, g, positions) -> {position: contribution id or None}; None: not differentiable.
    vjp: Callable | None = None
    attrs: tuple[AttrSpec, ...] = ()
    variadic: bool = False
    expression: object = None  # SymPy expression of the operands (elementwise ops)
    derivatives: tuple[tuple[str, str], ...] = ()  # (operand, formula text)
    partials: tuple = ()  # SymPy partial derivative per operand, over the expression's symbols (elementwise ops)
    doc: str = ""
    internal: bool = False  # used in generated backward graphs; listed but rarely written by hand
    bound: object = None  # the configured semiring a semiring op computes in

    @property
    def arity(self) -> int:
        return -1 if self.variadic else len(self.operands)

    def check_node(self, node: Node, in_types: Sequence[Type]) -> dict:
        """Validate arity and attributes; return attrs with defaults filled in."""
        if self.variadic:
            if len(node.inputs) < 1:
                raise GraphError(node.id, f"op '{self.name}' needs at least one input")
        elif len(node.inputs) != len(self.operands):
            raise GraphError(
                node.id,
                f"op '{self.name}' takes {len(self.operands)} input(s) ({', '.join(self.operands) or 'none'}), "
                f"got {len(node.inputs)}")
        specs = {a.name: a for a in self.attrs}
        for key in node.attrs:
            if key not in specs:
                known = ", ".join(specs) or "none"
                raise GraphError(node.id, f"op '{self.name}' has no attribute '{key}' (attributes: {known})")
        attrs = {}
        for spec in self.attrs:
            if spec.name in node.attrs:
                attrs[spec.name] = _check_attr(node, spec, node.attrs[spec.name])
            elif spec.required:
                raise GraphError(node.id, f"op '{self.name}' needs attribute '{spec.name}' ({spec.kind})")
            else:
                attrs[spec.name] = spec.default
        return attrs


def _check_attr(node: Node, spec: AttrSpec, value: object) -> object:
    ok = {
        "int": lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool),
        "ints": lambda v: isinstance(v, tuple) and all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in v),
        "float": lambda v: isinstance(v, (float, int)) and not isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "tensor": lambda v: isinstance(v, np.ndarray) and v.dtype in DTYPES.values(),
        "index": lambda v: isinstance(v, tuple) and all(isinstance(i, (int, slice)) for i in v),
    }[spec.kind]
    if not ok(value):
        raise GraphError(node.id, f"attribute '{spec.name}' must be of kind '{spec.kind}', got {type(value).__name__}")
    return value


def normalize_axis(node: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise GraphError(node.id, f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def align(a: np.ndarray, rank: int, out_rank: int) -> np.ndarray:
    """Insert unit axes between a's leading (batch) axes and its `rank` item axes."""
    lead = a.ndim - rank
    if lead == 0 or rank == out_rank:
        return a
    return a.reshape(a.shape[:lead] + (1,) * (out_rank - rank) + a.shape[lead:])


def broadcast_item_shapes(node: Node, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise GraphError(node.id, f"operand shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast") from None


@dataclass
class Registry:
    ops: dict[str, OpDef] = field(default_factory=dict)

    def add(self, op: OpDef) -> OpDef:
        if op.name in self.ops:
            raise ValueError(f"op '{op.name}' registered twice")
        self.ops[op.name] = op
        return op

    def get(self, node: Node) -> OpDef:
        try:
            return self.ops[node.op]
        except KeyError:
            raise GraphError(node.id, f"unknown op '{node.op}'") from None

    def __iter__(self):
        return iter(self.ops.values())
