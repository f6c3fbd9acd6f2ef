"""SymPy expressions → NumPy: a code printer that knows the functions of the expression
language, the namespace its code runs in, and the definitions a stand-alone Python source
needs (importing only math and numpy).

Every function is printed as one call: the NumPy ufunc where there is one, otherwise a
helper whose kernel is the op's own NumPy kernel (so a custom op computes exactly what the
built-in op of the same name does). Derivatives may contain `DiracDelta` (of sign and
heaviside), taken as 0 like the built-in ops' derivative rules; and `Piecewise` (from
`where`), printed as numpy.select.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
import sympy as sp
from sympy.printing.numpy import NumPyPrinter

from ..errors import FailedPrecondition
from ..ops.elementwise import ELEMENTWISE
from ..ops.sym import expm1, log1p, maximum, minimum, relu, sigmoid, softplus

_KERNELS = {name: fn for name, _, fn, _, _ in ELEMENTWISE}


def _zero(x, *orders):
    return np.zeros_like(np.asarray(x, dtype=np.float64))


# SymPy function -> name called in generated code.
CALLS: dict[type, str] = {
    sp.sin: "numpy.sin", sp.cos: "numpy.cos", sp.tan: "numpy.tan", sp.tanh: "numpy.tanh", sp.exp: "numpy.exp",
    sp.log: "numpy.log", log1p: "numpy.log1p", expm1: "numpy.expm1", sp.sign: "numpy.sign", sp.Abs: "numpy.abs",
    sp.Max: "numpy.maximum", sp.Min: "numpy.minimum", maximum: "numpy.maximum", minimum: "numpy.minimum",
    sigmoid: "sigmoid", softplus: "softplus", relu: "relu", sp.erf: "erf", sp.Heaviside: "heaviside",
    sp.DiracDelta: "dirac_delta",
}
# Helpers that are not NumPy functions: the kernel used when evaluating here, and the
# definition written into stand-alone source (the same function, importing only math/numpy).
HELPERS: dict[str, tuple[Callable, str]] = {
    "sigmoid": (_KERNELS["sigmoid"], "def sigmoid(x):\n    return numpy.exp(-numpy.logaddexp(0.0, -x))\n"),
    "softplus": (_KERNELS["softplus"], "def softplus(x):\n    return numpy.logaddexp(0.0, x)\n"),
    "relu": (_KERNELS["relu"], "def relu(x):\n    return numpy.maximum(x, 0)\n"),
    "erf": (_KERNELS["erf"], "erf = numpy.vectorize(math.erf, otypes=[numpy.float64])\n"),
    "heaviside": (_KERNELS["heaviside"], "def heaviside(x):\n    return numpy.heaviside(x, 0.5)\n"),
    "dirac_delta": (_zero, "def dirac_delta(x, *orders):  # derivative of a step: 0 (as the op rules take it)\n"
                           "    return numpy.zeros_like(numpy.asarray(x, dtype=numpy.float64))\n"),
}
NAMESPACE: dict[str, object] = {"numpy": np, "math": math, **{name: fn for name, (fn, _) in HELPERS.items()}}


class Printer(NumPyPrinter):
    """NumPy code for the expression language; `names` maps symbols to the code that reads them."""

    def __init__(self, names: Mapping[sp.Symbol, str] | None = None):
        super().__init__({"fully_qualified_modules": True, "inline": True, "strict": True})
        self.names = dict(names or {})
        self.used: set[str] = set()

    def _print_Symbol(self, expr):
        if expr in self.names:
            return self.names[expr]
        return super()._print_Symbol(expr)

    def _print_Float(self, expr):
        value = float(expr)
        return repr(value) if math.isfinite(value) else f"numpy.float64({str(value)!r})"

    def _print_Function(self, expr):
        call = CALLS.get(type(expr))
        if call is None:
            raise FailedPrecondition(f"no NumPy form for the function '{type(expr).__name__}' in '{_short(expr)}'")
        self.used.add(call)
        args = [self._print(a) for a in expr.args]
        if type(expr) in (sp.Heaviside, sp.DiracDelta):
            args = args[:1]
        if type(expr) in (sp.Max, sp.Min):
            code = args[-1]
            for a in reversed(args[:-1]):
                code = f"{call}({a}, {code})"
            return code
        return f"{call}({', '.join(args)})"


for _cls in CALLS:  # dispatch every listed function to _print_Function (NumPyPrinter has its own for some)
    setattr(Printer, f"_print_{_cls.__name__}", Printer._print_Function)


def lambdify(symbols: Sequence[sp.Symbol], exprs, cse: bool = False) -> Callable:
    """A NumPy function of `symbols` computing `exprs` (an expression or a list of them).

    The expressions are SymPy objects built by this package (never request text); the code
    lambdify generates calls only NumPy and the helpers above.
    """
    try:
        return sp.lambdify(list(symbols), exprs, modules=[NAMESPACE], printer=Printer(), cse=cse,
                           docstring_limit=0)
    except FailedPrecondition:
        raise
    except (TypeError, ValueError, NotImplementedError) as e:  # e.g. a construct the printer does not support
        raise FailedPrecondition(f"cannot compile an expression to NumPy: {e}") from None


def helper_source(printer: Printer) -> str:
    """Definitions of the helpers a printer's code called (for stand-alone source)."""
    return "".join(HELPERS[name][1] + "\n" for name in sorted(HELPERS) if name in printer.used)


def _short(expr, limit: int = 60) -> str:
    text = str(expr)
    return text if len(text) <= limit else text[:limit] + "..."
