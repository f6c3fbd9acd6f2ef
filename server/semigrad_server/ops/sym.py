"""SymPy functions for ops that SymPy lacks, with derivatives written in stable forms.

`sigmoid'` is `sigmoid*(1-sigmoid)` rather than SymPy's `exp(-x)/(1+exp(-x))**2`, which
overflows; `softplus' = sigmoid`. Printing them gives the op names, so formulas read
back as the ops a client can send.
"""

from __future__ import annotations

import sympy as sp


class sigmoid(sp.Function):
    def fdiff(self, argindex=1):
        s = sigmoid(self.args[0])
        return s * (1 - s)


class softplus(sp.Function):
    def fdiff(self, argindex=1):
        return sigmoid(self.args[0])


class relu(sp.Function):
    def fdiff(self, argindex=1):
        return sp.Heaviside(self.args[0])


class log1p(sp.Function):
    def fdiff(self, argindex=1):
        return 1 / (1 + self.args[0])


class expm1(sp.Function):
    def fdiff(self, argindex=1):
        return sp.exp(self.args[0])


X, Y = sp.symbols("x y", real=True)


class maximum(sp.Function):
    """max(x, y) as a binary function. Unlike sp.Max it never flattens nested maxima into one
    n-ary Max nor compares its arguments (quadratic in their number); its derivative is the
    op's rule, Heaviside(x - y) (1/2 at ties), and it prints as the op's name."""

    nargs = 2

    @classmethod
    def eval(cls, x, y):
        if x.is_Number and y.is_Number:
            return sp.Max(x, y)
        if x == y:
            return x
        return None

    def fdiff(self, argindex=1):
        x, y = self.args
        return sp.Heaviside(x - y) if argindex == 1 else sp.Heaviside(y - x)


class minimum(sp.Function):
    """min(x, y) as a binary function (see maximum)."""

    nargs = 2

    @classmethod
    def eval(cls, x, y):
        if x.is_Number and y.is_Number:
            return sp.Min(x, y)
        if x == y:
            return x
        return None

    def fdiff(self, argindex=1):
        x, y = self.args
        return sp.Heaviside(y - x) if argindex == 1 else sp.Heaviside(x - y)
