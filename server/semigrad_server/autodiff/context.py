"""What an adjoint rule may emit: the semiring's operations as graph nodes.

Rules in `ops` call these methods and never build arithmetic themselves, so one rule
serves every semiring. `RealContext` emits ordinary ops (so a backward graph can be
differentiated again); semiring contexts emit semiring ops.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import sympy as sp

from ..errors import FailedPrecondition
from ..ir import Node, Type
from ..ops import REGISTRY
from .builder import GraphBuilder


class AdjointContext:
    commutative = True
    real = False  # the real semiring's ordinary ops (rules may then use real-only shortcuts, as einsum does)
    valued: frozenset = frozenset()  # nodes holding semiring values: none, the real adjoints are plain arrays

    def __init__(self, builder: GraphBuilder):
        self.builder = builder

    # -- graph access
    def type(self, ref: str) -> Type:
        return self.builder.types[ref]

    def attrs(self, node: Node) -> dict:
        return self.builder.attrs[node.id]

    def emit(self, op: str, inputs: Sequence[str], **attrs) -> str:
        return self.builder.emit(op, inputs, **attrs)

    def const(self, value, dtype: str) -> str:
        return self.builder.const(value, dtype)

    def emit_adjoint(self, op: str, inputs: Sequence[str], **attrs) -> str:
        """Emit an op whose value is an adjoint, as its operands are (a hook on the backward pass)."""
        return self.emit(op, inputs, **attrs)

    # -- what the walk hands on (back-pointers stamp adjoints here: autodiff.best_path)
    def at_output(self, ref: str, seed: str) -> str:
        """The seed of output node `ref` as it enters the backward pass."""
        return seed

    def passed_on(self, ref: str, g: str) -> str:
        """The accumulated adjoint of `ref` as its adjoint rule receives it."""
        return g

    # -- derivative formulas
    def edge(self, partial: sp.Expr, env: dict, g: str) -> str | None:
        """φ(partial) ⊗ g for a SymPy partial whose symbols are bound to node ids in `env`."""
        if partial.is_number:
            return self.edge_const(float(partial), g)
        dtype = self.type(g).dtype
        return self.edge_value(self.emit_sympy(partial, env, dtype), g)

    def emit_sympy(self, expr: sp.Expr, env: dict, dtype: str) -> str:
        if expr in env:
            return env[expr]
        if expr.is_number:
            return self.const(float(expr), dtype)
        emit = lambda e: self.emit_sympy(e, env, dtype)  # noqa: E731
        if isinstance(expr, sp.Add):
            plus, minus = [], []
            for term in expr.args:
                coeff, _ = term.as_coeff_Mul()
                (minus if coeff.is_negative else plus).append(-term if coeff.is_negative else term)
            value = self._chain("add", [emit(t) for t in plus]) if plus else self.emit("neg", [emit(minus.pop(0))])
            for term in minus:
                value = self.emit("sub", [value, emit(term)])
            return value
        if isinstance(expr, sp.Mul):
            coeff, factors = expr.as_coeff_mul()
            num = [f for f in factors if not _is_reciprocal(f)]
            den = [1 / f for f in factors if _is_reciprocal(f)]
            value = self._chain("mul", [emit(f) for f in num]) if num else None
            if abs(coeff) != 1:
                c = self.const(float(abs(coeff)), dtype)
                value = self.emit("mul", [c, value]) if value else c
            if den:
                value = self.emit("div", [value or self.const(1.0, dtype), self._chain("mul", [emit(f) for f in den])])
            return self.emit("neg", [value]) if coeff.is_negative else value
        if isinstance(expr, sp.Pow):
            base, exp = expr.args
            if exp == 2:
                return self.emit("square", [emit(base)])
            if exp == sp.Rational(1, 2):
                return self.emit("sqrt", [emit(base)])
            if exp.is_number and exp.is_negative:
                return self.emit("div", [self.const(1.0, dtype), emit(base ** -exp)])
            return self.emit("pow", [emit(base), emit(exp)])
        op = REGISTRY.by_sympy_function().get(expr.func)
        if op is not None:
            args = expr.args[:len(op.operands)]  # Heaviside(x) may carry its value at 0 as a second argument
            return self.emit(op.name, [emit(a) for a in args])
        raise FailedPrecondition(f"cannot turn the derivative formula '{expr}' into graph nodes")

    def _chain(self, op: str, ids: list[str]) -> str:
        value = ids[0]
        for other in ids[1:]:
            value = self.emit(op, [value, other])
        return value

    # -- broadcasting
    def unbroadcast(self, g: str, from_shape: tuple, to_shape: tuple) -> str:
        """⊕-reduce g (shaped `from_shape`) over the axes that broadcasting added to `to_shape`."""
        if g is None or from_shape == to_shape:
            return g
        extra = len(from_shape) - len(to_shape)
        padded = (1,) * extra + tuple(to_shape)
        axes = tuple(i for i, (f, t) in enumerate(zip(from_shape, padded)) if i < extra or (t == 1 and f != 1))
        if axes:
            g = self.reduce(g, axes, keepdims=True)
        return self.emit("reshape", [g], shape=tuple(to_shape))

    # -- the algebra (a semiring's operations)
    def edge_value(self, partial: str, g: str) -> str:
        raise NotImplementedError

    def edge_const(self, c: float, g: str) -> str | None:
        raise NotImplementedError

    def lift(self, x: str) -> str:
        raise NotImplementedError

    def add(self, a: str, b: str) -> str:
        raise NotImplementedError

    def reduce(self, g: str, axes: tuple, keepdims: bool) -> str:
        raise NotImplementedError

    def matmul(self, a: str, b: str) -> str:
        raise NotImplementedError

    def scatter(self, g: str, index: tuple, shape: tuple) -> str:
        raise NotImplementedError

    def row_vjp(self, kind: str, y: str, scale: str, g: str) -> str:
        """⊕_i φ(J[..., i, j]) ⊗ g[..., i] along the last axis, J the per-row Jacobian of the
        fused row op `kind` (ops/nn.py ROW_JACOBIANS) built from rows y and scale: the dense
        element-level adjoint of softmax, log_softmax and layer_norm (the real rule uses their
        O(n) formulas instead)."""
        raise NotImplementedError

    def scatter_add(self, g: str, indices: str, axis: int, size: int, origin: str) -> str:
        """⊕ of g's slices along `axis` into `size` slots by `indices` (an int64 node): the
        adjoint of a gather (`origin`: the gather node, which index errors name)."""
        raise NotImplementedError

    def cumsum(self, g: str, axis: int, reverse: bool) -> str:
        """Inclusive ⊕-scan of g along `axis` (from the end when `reverse`): cumsum's adjoint."""
        raise NotImplementedError

    def one(self, t: Type) -> str:
        raise NotImplementedError

    def seed(self, seed_input: str) -> str:
        raise NotImplementedError


def _is_reciprocal(factor: sp.Expr) -> bool:
    return isinstance(factor, sp.Pow) and factor.exp.is_number and factor.exp.is_negative


class RealContext(AdjointContext):
    """(+, ×, 0, 1, φ = id): ordinary reverse mode, emitted as ordinary ops."""

    real = True

    def edge_value(self, partial, g):
        return self.emit("mul", [partial, g])

    def edge_const(self, c, g):
        if c == 1:
            return g
        if c == -1:
            return self.emit("neg", [g])
        if c == 0:
            return None
        return self.emit("mul", [self.const(c, self.type(g).dtype), g])

    def lift(self, x):
        return x

    def add(self, a, b):
        return self.emit("add", [a, b])

    def reduce(self, g, axes, keepdims):
        return self.emit("sum", [g], axes=tuple(axes), keepdims=keepdims)

    def matmul(self, a, b):
        return self.emit("matmul", [a, b])

    def scatter(self, g, index, shape):
        return self.emit("scatter_index", [g], index=tuple(index), shape=tuple(shape))

    def scatter_add(self, g, indices, axis, size, origin):
        return self.emit("scatter_add", [g, indices], axis=axis, size=size, origin=origin)

    def cumsum(self, g, axis, reverse):
        if not reverse:
            return self.emit("cumsum", [g], axis=axis)
        flip = (slice(None),) * axis + (slice(None, None, -1),)
        return self.emit("index", [self.emit("cumsum", [self.emit("index", [g], index=flip)], axis=axis)], index=flip)

    def one(self, t):
        return self.emit("broadcast_to", [self.const(1, t.dtype)], shape=t.shape)

    def seed(self, seed_input):
        return seed_input


class SemiringContext(AdjointContext):
    """Emits semiring ops bound to one configured semiring. Structural ops applied to
    semiring values are recorded in `valued`: for tuple carriers they map over components."""

    def __init__(self, builder: GraphBuilder, semiring):
        super().__init__(builder)
        self.semiring = semiring
        self.commutative = semiring.commutative
        self.valued: set[str] = set()
        one, zero = semiring.ones(()), semiring.zeros(())
        self._is_one = lambda v: bool(np.all(semiring.equal(v, one, rtol=0, atol=0)))
        self._is_zero = lambda v: bool(np.all(semiring.equal(v, zero, rtol=0, atol=0)))

    def structural_on_values(self) -> frozenset:
        """Structural nodes whose operand is a semiring value: for tuple carriers their
        kernels apply to each component (semiring ops take whole values themselves)."""
        return frozenset(n for n in self.valued if self.builder.ops[n].moves_elements and self.builder.ops[n].bound is None)

    def _sr(self, op: str, inputs, **attrs) -> str:
        node = self.emit(op, inputs, **attrs)
        self.valued.add(node)
        return node

    def emit(self, op, inputs, **attrs):
        node = self.builder.emit(op, inputs, **attrs)
        opdef = self.builder.registry.ops[op]
        if opdef.moves_elements and opdef.bound is None and inputs and inputs[0] in self.valued:
            self.valued.add(node)
        return node

    def emit_adjoint(self, op, inputs, **attrs):
        # A semiring value: structural ops it flows into map over a tuple carrier's components.
        return self._sr(op, inputs, **attrs)

    def edge_value(self, partial, g):
        return self._sr("sr_mul", [self._sr("sr_lift", [partial]), g])

    def edge_const(self, c, g):
        lifted = self.semiring.lift(np.float64(c))
        if self._is_one(lifted):
            return g
        if self._is_zero(lifted):
            return None
        return self.edge_value(self.const(c, "float64"), g)

    def lift(self, x):
        return self._sr("sr_lift", [x])

    def add(self, a, b):
        return self._sr("sr_add", [a, b])

    def reduce(self, g, axes, keepdims):
        return self._sr("sr_sum", [g], axes=tuple(axes), keepdims=keepdims)

    def matmul(self, a, b):
        return self._sr("sr_matmul", [a, b])

    def scatter(self, g, index, shape):
        return self._sr("sr_scatter", [g], index=tuple(index), shape=tuple(shape))

    def row_vjp(self, kind, y, scale, g):
        return self._sr("sr_row_vjp", [y, scale, g], kind=kind)

    def scatter_add(self, g, indices, axis, size, origin):
        return self._sr("sr_scatter_add", [g, indices], axis=axis, size=size, origin=origin)

    def cumsum(self, g, axis, reverse):
        return self._sr("sr_cumsum", [g], axis=axis, reverse=reverse)

    def one(self, t):
        return self._sr("sr_ones", [], shape=t.shape)

    def seed(self, seed_input):
        return self._sr("sr_lift", [seed_input])


class PointerContext(SemiringContext):
    """A semiring context for `semiring.pointers.PointerSemiring`: every accumulated adjoint
    is stamped with its own element ids before its node's adjoint rule receives it, and every
    seed with the output's pointer, so each ⊕ records which consumer element won. Ids grow
    with graph order, then element index (`offsets`: node id -> id of its element 0)."""

    def __init__(self, builder: GraphBuilder, semiring):
        super().__init__(builder, semiring)
        self.offsets: dict[str, int] = {}
        start = 1  # 0: an output's seed
        for node in builder.nodes:  # the forward graph, in order
            self.offsets[node.id] = start
            start += self.type(node.id).size

    def at_output(self, ref, seed):
        return self._sr("sr_tag", [seed], offset=0, each=False)

    def passed_on(self, ref, g):
        return self._sr("sr_tag", [g], offset=self.offsets[ref], each=True)
