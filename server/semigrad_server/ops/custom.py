"""Elementwise ops defined at run time (a graph's custom ops), built like the built-in ones.

`custom_op` takes the op already in SymPy form (its expression over operand symbols and one
partial derivative per operand) and a NumPy function computing the expression; parsing the
user's text and compiling the function is the job of `symbolic.custom`. The op then has
what a built-in elementwise op has: broadcasting between operands, batch dimensions,
the common adjoint rule (φ(∂f/∂x_k) ⊗ g, broadcasting undone by a ⊕-reduce, so every
semiring works), and its expression and derivative formulas for describing it.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import sympy as sp

from ..errors import GraphError
from ..ir import Type
from .base import OpDef, broadcast_item_shapes
from .elementwise import elementwise_kernel, elementwise_vjp


def custom_op(name: str, symbols: Sequence[sp.Symbol], expression: sp.Expr, partials: Sequence[sp.Expr],
              forward: Callable, doc: str = "", analytic: bool = False) -> OpDef:
    """An elementwise op computing `forward(*operands)` (NumPy, broadcasting), whose partial
    derivative with respect to operand k is `partials[k]` (a SymPy expression of `symbols`).
    `analytic`: forward is analytic and takes complex arrays."""
    symbols = tuple(symbols)

    def infer(node, in_types, attrs):
        for pos, t in enumerate(in_types):
            if not t.is_float:
                raise GraphError(node.id, f"custom op '{name}' takes float operands; operand {pos} "
                                          f"({symbols[pos]}) is {t.dtype}")
        dtype = np.result_type(*(np.dtype(t.dtype) for t in in_types)).name
        return Type(broadcast_item_shapes(node, [t.shape for t in in_types]), dtype)

    def kernel(attrs, in_types, out_type):
        dtype = np.dtype(out_type.dtype)

        def run(*arrays):
            value = np.asarray(forward(*arrays))
            if value.dtype.kind != "c":  # a complex step keeps its imaginary part
                value = value.astype(dtype, copy=False)
            shape = np.broadcast_shapes(*(np.shape(a) for a in arrays))
            return value if value.shape == shape else np.broadcast_to(value, shape)

        return elementwise_kernel(run, in_types, out_type)

    return OpDef(
        name=name,
        kind="elementwise",
        operands=tuple(str(s) for s in symbols),
        infer=infer,
        kernel=kernel,
        vjp=elementwise_vjp(dict(enumerate(partials)), symbols),
        expression=expression,
        derivatives=tuple((str(s), str(p)) for s, p in zip(symbols, partials)),
        partials=tuple(partials),
        doc=doc or f"custom op: {expression}",
        elementwise_fn=lambda *elements: np.asarray(forward(*elements), dtype=np.float64),
        analytic=analytic,
    )
