"""Graph builder: a Graph collects inputs, nodes and outputs; a Handle names one value in it."""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from . import codec, numpy_api, shapes
from . import functions as F  # functions imports this module too: use F at call time only
from .v1 import semigrad_pb2 as pb


class Graph:
    """A computation graph under construction.

    >>> g = Graph()
    >>> x = g.input("x", (3,))
    >>> g.output("y", (x * x).sum())
    Handle('sum_1', shape=(), dtype='float64')
    >>> g.to_proto().outputs[0].node
    'sum_1'
    """

    def __init__(self) -> None:
        self._inputs: list[pb.GraphInput] = []
        self._nodes: list[pb.Node] = []
        self._outputs: list[pb.GraphOutput] = []
        self._op_defs: dict[str, pb.OpDef] = {}  # custom ops by name
        self._ids: set[str] = set()  # input names and node ids share one namespace
        self._counter = 0

    def input(self, name: str, shape: Sequence[int], dtype="float64") -> Handle:
        """Declare an input of per-item ``shape`` and ``dtype`` (float64, float32, int64, bool)."""
        shape = tuple(int(d) for d in shape)
        dtype = codec.dtype_name(dtype)
        self._claim(name)
        wire_dtype = codec.dtype_to_proto(dtype)
        self._inputs.append(pb.GraphInput(name=name, shape=shape, dtype=wire_dtype))
        return Handle(self, name, shape, dtype)

    def const(self, value, *, name: str | None = None) -> Handle:
        """Add a ``const`` node holding ``value`` (array-like; integers are stored as int64)."""
        array = np.asarray(value)
        return self.add_node(
            "const", (), {"value": codec.to_tensor(array)},
            shape=array.shape, dtype=codec.value_dtype_name(array.dtype), name=name,
        )

    def add_node(
        self,
        op: str,
        inputs: Sequence[Handle],
        attrs: Mapping[str, object] | None = None,
        *,
        shape: Sequence[int] | None = None,
        dtype: str | None = None,
        name: str | None = None,
    ) -> Handle:
        """Add a node of any ``op`` (low level; prefer the semigrad functions and operators).

        ``attrs`` values are encoded with :func:`semigrad.codec.attr_value`; ``shape`` and
        ``dtype`` are the statically known result type, or None if unknown.
        """
        for handle in inputs:
            if not isinstance(handle, Handle) or handle.graph is not self:
                raise ValueError(f"{op}: operand {handle!r} is not a value of this graph")
        encoded = {key: codec.attr_value(value) for key, value in (attrs or {}).items()}
        node_id = self._new_id(op) if name is None else name
        self._claim(node_id)
        self._nodes.append(pb.Node(id=node_id, op=op, inputs=[h.id for h in inputs], attrs=encoded))
        return Handle(self, node_id, None if shape is None else tuple(shape), dtype)

    def output(self, name: str, handle: Handle) -> Handle:
        """Expose ``handle`` as the graph output ``name``; returns ``handle``."""
        if not isinstance(handle, Handle) or handle.graph is not self:
            raise ValueError(f"output {name!r}: {handle!r} is not a value of this graph")
        if any(o.name == name for o in self._outputs):
            raise ValueError(f"duplicate output name {name!r}")
        self._outputs.append(pb.GraphOutput(name=name, node=handle.id))
        return handle

    def op(self, name: str, operands: Sequence[str], expression: str,
           grads: Mapping[str, str] | Sequence[str | None] | None = None, *, doc: str = "") -> CustomOp:
        """Define a custom elementwise op and return it as a function of Handles.

        ``expression`` is in the server's safe expression language: numbers, the ``operands``
        by name, ``+ - * / **``, parentheses and the elementwise op functions (``sin``, ``exp``,
        ``log``, ``sigmoid``, ``maximum``...). ``grads`` optionally gives the derivative with
        respect to some operands (a mapping ``{operand: expression}``, or one entry per operand,
        None for "derive it"); the server derives the others with SymPy. The op then works like a
        built-in elementwise op: broadcasting, batches, every semiring, cross-checks.

        >>> g = Graph()
        >>> softclip = g.op("softclip", ["x"], "log(1 + exp(x)) - log(1 + exp(x - 1))")
        >>> y = softclip(g.input("x", (3,)))
        """
        operands = [str(o) for o in operands]
        if isinstance(grads, Mapping):
            derivatives = {str(k): str(v) for k, v in grads.items() if v is not None}
        else:
            grads = list(grads or [])
            if grads and len(grads) != len(operands):
                raise ValueError(f"op {name!r}: {len(grads)} derivatives for {len(operands)} operands")
            derivatives = {o: str(d) for o, d in zip(operands, grads) if d is not None}
        unknown = sorted(set(derivatives) - set(operands))
        if unknown:
            raise ValueError(f"op {name!r}: derivative given for {unknown[0]!r}, which is not an operand")
        definition = pb.OpDef(name=name, operands=operands, expression=expression, derivatives=derivatives, doc=doc)
        existing = self._op_defs.get(name)
        if existing is not None and existing != definition:
            raise ValueError(f"op {name!r} is already defined differently in this graph")
        self._op_defs[name] = definition
        return CustomOp(self, definition)

    def expr(self, expression: str, *, name: str | None = None, **operands) -> Handle:
        """A one-off expression of Handles (or numbers) given by keyword, e.g.
        ``g.expr("x * sin(y)", x=a, y=b)``: an anonymous custom op applied to them."""
        if not operands:
            raise ValueError("expr needs at least one operand, given by keyword")
        digest = hashlib.sha256(repr((expression, list(operands))).encode()).hexdigest()[:12]
        return self.op(f"expr_{digest}", list(operands), expression)(name=name, **operands)

    def __contains__(self, name: str) -> bool:
        """Whether an input or node of this graph has id ``name``."""
        return name in self._ids

    def to_proto(self) -> pb.Graph:
        """Return the graph as a ``semigrad.v1.Graph`` message."""
        return pb.Graph(inputs=self._inputs, nodes=self._nodes, outputs=self._outputs,
                        op_defs=list(self._op_defs.values()))

    def _claim(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"names must be non-empty strings, got {name!r}")
        if name in self._ids:
            raise ValueError(f"name {name!r} is already used in this graph")
        self._ids.add(name)

    def _new_id(self, op: str) -> str:
        while True:
            candidate = f"{op}_{self._counter}"
            self._counter += 1
            if candidate not in self._ids:
                return candidate


def _is_index_array(key) -> bool:
    """An int64 Handle, or a NumPy array or list of integers with at least one axis."""
    if isinstance(key, Handle):
        return key.dtype == "int64"
    if isinstance(key, (np.ndarray, list)):
        array = np.asarray(key)
        return array.ndim > 0 and array.dtype.kind in "iu"
    return False


def _operator(function_name: str, reflected: bool = False):
    """A binary operator method calling ``semigrad.<function_name>``.

    Operands of foreign types give NotImplemented, so Python tries the other operand.
    """

    def method(self, other):
        if not isinstance(other, _OPERAND_TYPES):
            return NotImplemented
        function = getattr(F, function_name)
        return function(other, self) if reflected else function(self, other)

    return method


class Handle:
    """A symbolic value of a :class:`Graph`: a graph input or a node.

    ``graph``, ``id`` (node id or input name), ``shape`` (tuple, or None when not inferred
    client-side) and ``dtype`` (name, or None). Operators build nodes: ``+ - * / ** @``, unary
    ``-``, ``abs()``, comparisons, basic indexing ``x[0, 1:3, ::-1]`` (an int64 Handle or integer
    array as the whole key gathers along the first axis: ``table[tokens]``) and ``.T``; Python numbers
    and arrays mixed in become consts. Handles hash by identity and have no truth value.
    """

    __array_priority__ = 1000  # NumPy arrays and scalars defer to our reflected operators

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """``np.sin(h)``, ``array * h``...: NumPy ufuncs build nodes (see numpy_api.py)."""
        return numpy_api.array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        """``np.sum(h, axis=0)``, ``np.where(c, h, 0)``...: NumPy functions build nodes (numpy_api.py)."""
        return numpy_api.array_function(func, args, kwargs)

    def __array__(self, *args, **kwargs):
        raise TypeError(f"{self!r} is a graph value, not an array: it has no value until the graph runs "
                        "(a NumPy function semigrad does not map tried to convert it)")
    __iter__ = None  # no iteration through __getitem__
    __hash__ = object.__hash__  # __eq__ builds a node, so hash by identity

    def __init__(self, graph: Graph, id: str, shape: tuple[int, ...] | None, dtype: str | None):
        self.graph = graph
        self.id = id
        self.shape = shape
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"Handle({self.id!r}, shape={self.shape}, dtype={self.dtype!r})"

    def __bool__(self) -> bool:
        raise TypeError("a Handle has no truth value (comparisons build graph nodes)")

    def __neg__(self) -> Handle:
        return F.neg(self)

    def __abs__(self) -> Handle:
        return F.abs(self)

    __add__ = _operator("add")
    __radd__ = _operator("add", reflected=True)
    __sub__ = _operator("sub")
    __rsub__ = _operator("sub", reflected=True)
    __mul__ = _operator("mul")
    __rmul__ = _operator("mul", reflected=True)
    __truediv__ = _operator("div")
    __rtruediv__ = _operator("div", reflected=True)
    __pow__ = _operator("pow")
    __rpow__ = _operator("pow", reflected=True)
    __matmul__ = _operator("matmul")
    __rmatmul__ = _operator("matmul", reflected=True)
    __lt__ = _operator("lt")
    __le__ = _operator("le")
    __gt__ = _operator("gt")
    __ge__ = _operator("ge")
    __eq__ = _operator("eq")
    __ne__ = _operator("ne")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of {self!r}: " + ("a 0-d value" if self.shape == () else "shape not known"))
        return self.shape[0]

    @property
    def ndim(self) -> int:
        """The number of axes (per item)."""
        if self.shape is None:
            raise TypeError(f"the shape of {self!r} is not known client-side")
        return len(self.shape)

    def transpose(self, *axes, name: str | None = None) -> Handle:
        """Permute axes (as ``ndarray.transpose``: none reverses them)."""
        if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            (axes,) = axes
        return F.transpose(self, axes or None, name=name)

    def __getitem__(self, key) -> Handle:
        """Basic indexing (ints and slices); an int64 Handle or an integer array as the whole key
        is NumPy's integer-array indexing along the first axis, ``np.take(x, key, axis=0)``
        (a gather: ``table[tokens]`` is an embedding lookup)."""
        if _is_index_array(key):
            return F.gather(self, key, axis=0)
        return F.index(self, key)

    @property
    def T(self) -> Handle:
        """Transpose (reversed axes)."""
        return F.transpose(self)

    def sum(self, axis=None, keepdims: bool = False, *, name: str | None = None) -> Handle:
        """Sum over ``axis`` (int, tuple, or None for all); see :func:`semigrad.sum`."""
        return F.sum(self, axis, keepdims, name=name)

    def mean(self, axis=None, keepdims: bool = False, *, name: str | None = None) -> Handle:
        """Mean over ``axis``; see :func:`semigrad.mean`."""
        return F.mean(self, axis, keepdims, name=name)

    def max(self, axis=None, keepdims: bool = False, *, name: str | None = None) -> Handle:
        """Maximum over ``axis``; see :func:`semigrad.max`."""
        return F.max(self, axis, keepdims, name=name)

    def min(self, axis=None, keepdims: bool = False, *, name: str | None = None) -> Handle:
        """Minimum over ``axis``; see :func:`semigrad.min`."""
        return F.min(self, axis, keepdims, name=name)

    def reshape(self, *shape, name: str | None = None) -> Handle:
        """Reshape to ``shape``, given as ints or as one sequence (one -1 allowed)."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            (shape,) = shape
        return F.reshape(self, shape, name=name)


class CustomOp:
    """A custom op of a Graph (see :meth:`Graph.op`): call it on Handles or numbers, by
    position or by operand name, to add a node, e.g. ``op(x, y)`` or ``op(x=a, y=b)``."""

    def __init__(self, graph: Graph, definition: pb.OpDef):
        self.graph = graph
        self.definition = definition
        self.name = definition.name
        self.operands = tuple(definition.operands)

    def __repr__(self) -> str:
        return f"CustomOp({self.name!r}, operands={list(self.operands)}, expression={self.definition.expression!r})"

    def __call__(self, *args, name: str | None = None, **kwargs) -> Handle:
        if len(args) > len(self.operands):
            raise TypeError(f"op {self.name!r} takes {len(self.operands)} operand(s), got {len(args)}")
        values = dict(zip(self.operands, args))
        for key, value in kwargs.items():
            if key not in self.operands:
                raise TypeError(f"op {self.name!r} has no operand {key!r} (operands: {', '.join(self.operands)})")
            if key in values:
                raise TypeError(f"op {self.name!r}: operand {key!r} given twice")
            values[key] = value
        missing = [o for o in self.operands if o not in values]
        if missing:
            raise TypeError(f"op {self.name!r}: missing operand(s) {', '.join(missing)}")
        ordered = [values[o] for o in self.operands]
        if not any(isinstance(v, Handle) for v in ordered):
            ordered[0] = self.graph.const(np.asarray(ordered[0], dtype=np.float64))
        handles = F._handles(ordered)
        if any(h.graph is not self.graph for h in handles):
            raise ValueError(f"op {self.name!r} belongs to another graph")
        try:
            shape = shapes.broadcast(*(h.shape for h in handles))
        except ValueError as error:
            raise ValueError(f"{self.name}: {error}") from None
        dtypes = {h.dtype for h in handles}
        dtype = dtypes.pop() if len(dtypes) == 1 and None not in dtypes else None
        return self.graph.add_node(self.name, handles, shape=shape, dtype=dtype, name=name)


_OPERAND_TYPES = (Handle, numbers.Number, np.ndarray, np.generic)
