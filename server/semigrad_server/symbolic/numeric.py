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

import inspect
import math
from typing import Callable, Mapping, Sequence

import numpy as np
import sympy as sp
from sympy.printing.numpy import NumPyPrinter

from ..errors import FailedPrecondition
from ..ops import REGISTRY


def _zero(x, *orders):
    return np.zeros_like(np.asarray(x, dtype=np.float64))


def _numpy_name(fn) -> str | None:
    name = getattr(fn, "__name__", None)
    return f"numpy.{name}" if name and getattr(np, name, None) is fn else None


def _tables():
    """SymPy function -> the name generated code calls, and the helpers (functions that are not
    NumPy's) as (the kernel evaluated here, its stand-alone definition): both from the ops."""
    calls: dict[type, str] = {sp.Max: "numpy.maximum", sp.Min: "numpy.minimum", sp.DiracDelta: "dirac_delta"}
    helpers: dict[str, tuple[Callable, str]] = {
        "dirac_delta": (_zero, "def dirac_delta(x, *orders):  # derivative of a step: 0 (as the op rules take it)\n"
                               "    return numpy.zeros_like(numpy.asarray(x, dtype=numpy.float64))\n"),
    }
    for function, op in REGISTRY.by_sympy_function().items():
        call = _numpy_name(op.elementwise_fn)
        if call is None:
            call = op.name
            helpers[op.name] = (op.elementwise_fn, op.source or inspect.getsource(op.elementwise_fn))
        calls[function] = call
    return calls, helpers


CALLS, HELPERS = _tables()
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
