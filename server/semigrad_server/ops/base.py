"""What an op is: operands, attributes, shape rule, kernel factory, adjoint rule, and every
fact a backend needs to run it (see docs/architecture.md).

Kernels receive arrays whose trailing axes have the node's declared types and whose
leading axes (batch dimensions) are arbitrary; a kernel factory gets the static types
and returns a function of the arrays alone.

Backends that work element by element (scalar programs, SymPy expansion) call an op's
`expand` with their own `Elements`: the op says how its output elements are built from its
operands' elements, the backend says what an element is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from ..errors import GraphError, quoted
from ..ir import DTYPES, MAX_RANK, Node, Type

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
    # elementwise | pointwise (elementwise with attributes, e.g. clamp: not fused, no elementwise_fn)
    # | comparison | structural | reduction | linalg | source
    kind: str
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
    # ---- facts the backends read; no backend keeps a table of op names
    elementwise_fn: Callable | None = None  # elementwise ops: the NumPy function of the operands' elements
    float_fn: Callable | None = None  # the same over Python floats and bools (single points, numba); None: none
    infix: str | None = None  # generated code writes the op as this template ("{0} + {1}") instead of a call
    commutative: bool = False  # operands may be swapped (common subexpressions found either way round)
    unit: tuple[str, float] | None = None  # ("both" | "right", u): x op u == x exactly (IEEE), so it folds away
    fusible: bool = False  # cheap enough to run inside one fused loop (arithmetic, comparisons, selections)
    analytic: bool = False  # the kernel is analytic and takes complex arrays (complex-step derivatives)
    moves_elements: bool = False  # output elements are copies of operand elements (or 0): a structural op
    expand: Callable | None = None  # expand(elements, operands, attrs, in_types, out_type): see Elements
    sympy_apply: Callable | None = None  # one element's SymPy expression from its operands' expressions
    scalar_cost: Callable | None = None  # (in_types, out_type) -> scalar operations an expansion makes
    # (attrs, in_types, out_type) -> products one item's kernel computes beyond its result's elements (einsum:
    # its contractions), counted with the elements in max_request_elements; None: none
    work: Callable | None = None
    source: str | None = None  # stand-alone NumPy definition of `elementwise_fn`, where it has no source of its own

    def __post_init__(self):
        if self.expand is None:
            if self.elementwise_fn is not None:
                self.expand = expand_elementwise(self.name)
            elif self.moves_elements:
                self.expand = expand_by_kernel(self.kernel)
        if self.scalar_cost is None:
            self.scalar_cost = _no_cost if self.moves_elements or not self.operands else _output_cost
        if self.sympy_apply is None and self.expression is not None:
            self.sympy_apply = _substitute(self.expression, self.operands)

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
                raise GraphError(node.id, f"op '{self.name}' has no attribute {quoted(key)} (attributes: {known})")
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
    # Shapes, axes, permutations and indices have an entry per dimension, and a tensor its dimensions.
    rank = value.ndim if spec.kind == "tensor" else len(value) if spec.kind in ("ints", "index") else 0
    if rank > MAX_RANK:
        raise GraphError(node.id, f"attribute '{spec.name}' has {rank} {'dimensions' if spec.kind == 'tensor' else 'entries'};"
                                  f" values have at most {MAX_RANK} dimensions")
    return value


class Elements(Protocol):
    """What an element-level backend provides to ops' expansions: elements are whatever it
    computes with (a scalar program's variable ids, SymPy expressions)."""

    def apply(self, op: str, args: tuple) -> object:
        """One element of the elementwise op `op` on operand elements `args`."""

    def reduce(self, op: str, row: list, empty: object) -> object:
        """`row` combined by the binary elementwise op `op` (`empty` when the row is empty)."""

    def number(self, value: float) -> object:
        """A constant element."""

    def semiring_zero(self) -> object:
        """0̄ of the backend's semiring (0 for the real one)."""

    def semiring_one(self) -> object:
        """1̄ of the backend's semiring (1 for the real one)."""

    def index(self, element: object) -> int | None:
        """The integer an index element holds when it is known at expansion time (an integer
        input given as a constant), else None: data-dependent indexing (gather) expands only then."""


def element_array(values, shape) -> np.ndarray:
    """An object array of `shape` holding `values` (a flat sequence)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


def expand_elementwise(name: str):
    """Output element k is `op(operand elements at k)`, operands broadcast to the output."""

    def expand(el: Elements, operands, attrs, in_types, out_type) -> np.ndarray:
        aligned = [np.broadcast_to(a, out_type.shape).reshape(-1) for a in operands]
        n = math.prod(out_type.shape)
        return element_array([el.apply(name, tuple(a[k] for a in aligned)) for k in range(n)], out_type.shape)

    return expand


def expand_by_kernel(kernel_factory):
    """An op that only moves elements runs its own kernel on arrays of elements."""

    def expand(el: Elements, operands, attrs, in_types, out_type) -> np.ndarray:
        moved = kernel_factory(attrs, in_types, out_type)(*operands)
        return np.asarray(moved, dtype=object).reshape(out_type.shape)

    return expand


def reduce_elements(x: np.ndarray, axes, keepdims: bool, combine: Callable[[list], object]) -> np.ndarray:
    """`combine(row)` over each row of x's elements along `axes` (None: all)."""
    rank = x.ndim
    axes = tuple(range(rank)) if axes is None else tuple(sorted(a % rank for a in axes))
    kept = [i for i in range(rank) if i not in axes]
    out_shape = tuple(x.shape[i] for i in kept)
    # the row length counted, not inferred with -1: NumPy cannot infer it when there are no rows
    rows = x.transpose(kept + list(axes)).reshape(math.prod(out_shape), math.prod(x.shape[a] for a in axes))
    out = element_array([combine(list(row)) for row in rows], out_shape)
    if keepdims:
        out = out.reshape(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return out


def input_cost(in_types, out_type) -> int:
    """A reduction's scalar operations: one per input element."""
    return in_types[0].size


def _no_cost(in_types, out_type) -> int:
    return 0


def _output_cost(in_types, out_type) -> int:
    return out_type.size


def _substitute(expression, operands: tuple[str, ...]):
    """The expression with its operands' symbols replaced by the given elements, in operand order."""
    position = {s: operands.index(str(s)) for s in expression.free_symbols}
    return lambda *args: expression.xreplace({s: args[k] for s, k in position.items()})


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
    if shapes and all(s == shapes[0] for s in shapes[1:]):  # the common case, without NumPy's general rule
        return tuple(shapes[0])
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise GraphError(node.id, f"operand shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast") from None


@dataclass
class Registry:
    ops: dict[str, OpDef] = field(default_factory=dict)
    _by_sympy_function: dict | None = field(default=None, repr=False, compare=False)

    def add(self, op: OpDef) -> OpDef:
        if op.name in self.ops:
            raise ValueError(f"op '{op.name}' registered twice")
        self.ops[op.name] = op
        self._by_sympy_function = None
        return op

    def check(self) -> None:
        """Facts that must hold across ops (raises ValueError): each SymPy function is one op's."""
        self.by_sympy_function()

    def get(self, node: Node) -> OpDef:
        try:
            return self.ops[node.op]
        except KeyError:
            raise GraphError(node.id, f"unknown op {quoted(node.op)}") from None

    def __iter__(self):
        return iter(self.ops.values())

    def by_sympy_function(self) -> dict[type, OpDef]:
        """SymPy function class -> the elementwise op it is (sin -> sin, sigmoid -> sigmoid)."""
        import sympy as sp

        if self._by_sympy_function is None:
            table: dict[type, OpDef] = {}
            for op in self.ops.values():
                if op.kind == "elementwise" and isinstance(op.expression, sp.Function):
                    other = table.setdefault(op.expression.func, op)
                    if other is not op:  # formulas would turn one op into the other
                        raise ValueError(f"ops '{other.name}' and '{op.name}' are both the SymPy function "
                                         f"{op.expression.func.__name__}: give '{op.name}' a function of its own")
            self._by_sympy_function = table
        return self._by_sympy_function
