"""The safe expression language: a whitelist over Python's `ast`, turned into SymPy by hand.

An expression is made of numbers, the named operands, `+ - * / **`, unary `-` and `+`,
parentheses, and calls of the elementwise op functions (`sin(x)`, `maximum(x, y)`, ... —
every elementwise op of the registry that has a SymPy expression, by its op name). Everything else is
refused with InvalidArgument naming the offending piece. Request text never reaches `eval`,
`exec`, `sympify` or `parse_expr`: `ast.parse` only parses it, and the SymPy objects are
built here, node by node.

Time and memory are bounded before SymPy sees anything: the text's length and characters
are checked first, the bracket depth is pre-scanned, the tree's size and depth are limited
while walking it, literals are bounded, and constant exponents are bounded (so `9**9**9**9`
is refused at `9**387420489` without being computed). Every constant subexpression stays a
plain SymPy number: functions and powers of constants are computed numerically here (SymPy's
own evaluation of, say, `sign(sin(exp(exp(exp(10)))))` does not finish), folded constants keep
a bounded bit length, and undefined or non-real constants (`1/0`, `log(-1)`) are refused.
"""

from __future__ import annotations

import ast
import math
import re
from fractions import Fraction
from typing import Callable, Sequence

import numpy as np
import sympy as sp

from ..errors import InvalidArgument
from ..ops import REGISTRY

MAX_CHARS = 2000  # characters of one expression
MAX_BRACKET_DEPTH = 32  # nesting of parentheses
MAX_DEPTH = 48  # depth of the syntax tree
MAX_NODES = 600  # nodes of the syntax tree
MAX_LITERAL = 1e15  # magnitude of a number literal
MAX_EXPONENT = 100  # magnitude of a constant exponent
MAX_CONSTANT = 1e100  # magnitude of a computed constant (e.g. 10**20, exp(30))
MAX_CONSTANT_BITS = 2048  # bit length of numerators and denominators of computed constants
MAX_OPERANDS = 16
IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}\Z")
# Printable ASCII and plain whitespace: no Unicode (identifiers would be NFKC-normalised), no controls.
ALLOWED_CHARS = frozenset(chr(c) for c in range(0x20, 0x7F)) | frozenset("\t\r\n")


def _function_table() -> dict[str, tuple[int, Callable]]:
    return {op.name: (len(op.operands), op.sympy_apply, op.elementwise_fn) for op in REGISTRY
            if op.kind == "elementwise" and op.expression is not None}


# Op name -> (arity, builder of the SymPy expression from argument expressions, NumPy kernel).
FUNCTIONS: dict[str, tuple[int, Callable, Callable]] = _function_table()

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
_DESCRIBE = {  # what a refused construct is called in error messages
    ast.Attribute: "attribute access", ast.Subscript: "subscript", ast.Lambda: "lambda",
    ast.ListComp: "list comprehension", ast.SetComp: "set comprehension", ast.DictComp: "dict comprehension",
    ast.GeneratorExp: "generator expression", ast.JoinedStr: "f-string", ast.FormattedValue: "f-string",
    ast.NamedExpr: "assignment expression (:=)", ast.Starred: "starred argument", ast.IfExp: "conditional expression",
    ast.BoolOp: "boolean operator", ast.Compare: "comparison", ast.Tuple: "tuple", ast.List: "list",
    ast.Set: "set", ast.Dict: "dict", ast.Slice: "slice", ast.Await: "await", ast.Yield: "yield",
    ast.YieldFrom: "yield from",
}


def check_identifier(name: str, what: str) -> None:
    """Operand and op names: ASCII identifiers, not a function name, no leading underscore."""
    if not isinstance(name, str) or not IDENTIFIER.match(name):
        raise InvalidArgument(f"{what} {_quote(name)} must be an ASCII identifier (a letter, then letters, "
                              f"digits or _; at most 64 characters)")
    if name in FUNCTIONS:
        raise InvalidArgument(f"{what} '{name}' is the name of a function of the expression language")


def parse_expression(text: str, operands: Sequence[str], what: str = "expression") -> sp.Expr:
    """The SymPy expression for `text`, over one real symbol per operand name (in `operands`
    order: see `operand_symbols`). Raises InvalidArgument naming the offending piece."""
    symbols = dict(zip(operands, operand_symbols(operands)))
    if not isinstance(text, str):
        raise InvalidArgument(f"{what}: expected a string, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise InvalidArgument(f"{what}: {len(text)} characters; the limit is {MAX_CHARS}")
    if not text.strip():
        raise InvalidArgument(f"{what} is empty")
    for i, ch in enumerate(text):
        if ch not in ALLOWED_CHARS:
            raise InvalidArgument(f"{what}: character {ch!r} (U+{ord(ch):04X}) at position {i} is not allowed "
                                  f"(printable ASCII only)")
    depth = deepest = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        deepest = max(deepest, depth)
    if deepest > MAX_BRACKET_DEPTH:
        raise InvalidArgument(f"{what}: parentheses nested {deepest} deep; the limit is {MAX_BRACKET_DEPTH}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise InvalidArgument(f"{what}: syntax error: {e.msg} (at position {(e.offset or 1) - 1})") from None
    except (RecursionError, MemoryError):
        raise InvalidArgument(f"{what}: too deeply nested") from None
    except ValueError as e:  # e.g. an integer literal past Python's digit limit
        raise InvalidArgument(f"{what}: {e}") from None
    return _Builder(text, symbols, what).build(tree.body)


def operand_symbols(operands: Sequence[str]) -> tuple[sp.Symbol, ...]:
    """The real SymPy symbols standing for operands (equal names give equal symbols)."""
    if len(operands) > MAX_OPERANDS:
        raise InvalidArgument(f"{len(operands)} operands; the limit is {MAX_OPERANDS}")
    for name in operands:
        check_identifier(name, "operand")
    if len(set(operands)) != len(operands):
        raise InvalidArgument(f"operand names repeat: {', '.join(operands)}")
    return tuple(sp.Symbol(name, real=True) for name in operands)


class _Builder:
    def __init__(self, text: str, symbols: dict[str, sp.Symbol], what: str):
        self.text = text
        self.symbols = symbols
        self.what = what
        self.count = 0

    def fail(self, node: ast.AST, message: str):
        segment = ast.get_source_segment(self.text, node) or ""
        where = f" at {_quote(segment)}" if segment else ""
        raise InvalidArgument(f"{self.what}: {message}{where}")

    def build(self, node: ast.AST) -> sp.Expr:
        expr = self.visit(node, 0)
        if expr.has(sp.I, sp.zoo, sp.nan, sp.oo, sp.S.NegativeInfinity):
            raise InvalidArgument(f"{self.what}: the expression contains an undefined or non-real constant "
                                  f"({_short(expr)}), e.g. from a division by zero or log of a negative number")
        return expr

    def visit(self, node: ast.AST, depth: int) -> sp.Expr:
        self.count += 1
        if self.count > MAX_NODES:
            self.fail(node, f"expression has more than {MAX_NODES} parts")
        if depth > MAX_DEPTH:
            self.fail(node, f"expression nested deeper than {MAX_DEPTH}")
        if isinstance(node, ast.Constant):
            return self.constant(node)
        if isinstance(node, ast.Name):
            if node.id in self.symbols:
                return self.symbols[node.id]
            if node.id in FUNCTIONS:
                self.fail(node, f"'{node.id}' is a function: call it, as in {node.id}(x)")
            known = ", ".join(self.symbols) or "none"
            self.fail(node, f"unknown name {_quote(node.id)} (operands: {known})")
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return self.checked(node, -self.visit(node.operand, depth + 1))
            if isinstance(node.op, ast.UAdd):
                return self.visit(node.operand, depth + 1)
            self.fail(node, f"operator {_op_name(node.op)} is not allowed")
        if isinstance(node, ast.BinOp):
            symbol = _BINARY.get(type(node.op))
            if symbol is None:
                self.fail(node, f"operator {_op_name(node.op)} is not allowed (only + - * / **)")
            if symbol == "**":
                return self.power(node, depth)
            left = self.visit(node.left, depth + 1)
            right = self.visit(node.right, depth + 1)
            if symbol == "+":
                return self.checked(node, left + right)
            if symbol == "-":
                return self.checked(node, left - right)
            if symbol == "*":
                return self.checked(node, left * right)
            return self.checked(node, left / right)
        if isinstance(node, ast.Call):
            return self.call(node, depth)
        what = _DESCRIBE.get(type(node), type(node).__name__)
        self.fail(node, f"{what} is not allowed")

    def constant(self, node: ast.Constant) -> sp.Expr:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = {str: "string", bytes: "bytes", complex: "complex number"}.get(type(value), repr(value))
            self.fail(node, f"{kind} literal is not allowed")
        # An int is compared as it is: converting one of 310 digits or more to float overflows.
        if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > MAX_LITERAL:
            self.fail(node, f"number literal out of range (magnitude at most {MAX_LITERAL:g})")
        if isinstance(value, int):
            return sp.Integer(value)
        frac = Fraction(repr(value))  # the decimal the literal denotes (shortest repr), exactly
        return self.checked(node, sp.Rational(frac.numerator, frac.denominator))

    def power(self, node: ast.BinOp, depth: int) -> sp.Expr:
        exponent = self.visit(node.right, depth + 1)  # right first: a tower is refused at its top
        if exponent.is_Number and bool(abs(exponent) > MAX_EXPONENT):
            self.fail(node, f"constant exponent {_short(exponent)} is too large (magnitude at most {MAX_EXPONENT})")
        base = self.visit(node.left, depth + 1)
        if base.is_Number and exponent.is_Number:
            return self.checked(node, self.fold_power(node, base, exponent))
        return self.checked(node, sp.Pow(base, exponent))

    def fold_power(self, node: ast.AST, base: sp.Number, exponent: sp.Number) -> sp.Expr:
        """A constant power, computed in floating point first (so its size is known)."""
        try:
            value = math.pow(float(base), float(exponent))
        except (OverflowError, ValueError, ZeroDivisionError):
            self.fail(node, f"constant power ({_short(base)})**({_short(exponent)}) is too large or undefined")
        if not math.isfinite(value) or abs(value) > MAX_CONSTANT:
            self.fail(node, f"constant power ({_short(base)})**({_short(exponent)}) is too large")
        if base.is_Rational and exponent.is_Integer and (base != 0 or exponent >= 0):
            exact = sp.Pow(base, exponent)  # cheap: the base is small and |exponent| <= MAX_EXPONENT
            if max(exact.p.bit_length(), exact.q.bit_length()) <= MAX_CONSTANT_BITS:
                return exact
        return sp.Float(value)

    def call(self, node: ast.Call, depth: int) -> sp.Expr:
        if not isinstance(node.func, ast.Name):
            self.fail(node, "only calls of named functions are allowed")
        name = node.func.id
        if name not in FUNCTIONS:
            self.fail(node.func, f"unknown function {_quote(name)} (functions: {', '.join(sorted(FUNCTIONS))})")
        if node.keywords:
            self.fail(node, f"keyword arguments are not allowed in a call of '{name}'")
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                self.fail(arg, "starred argument is not allowed")
        arity, builder, fn = FUNCTIONS[name]
        if len(node.args) != arity:
            self.fail(node, f"'{name}' takes {arity} argument(s), got {len(node.args)}")
        args = [self.visit(a, depth + 1) for a in node.args]
        if all(a.is_Number for a in args):
            return self.fold_call(node, name, fn, args)
        return self.checked(node, builder(*args))

    def fold_call(self, node: ast.AST, name: str, fn: Callable, args: list) -> sp.Expr:
        """A function of constants, computed with the op's NumPy kernel: SymPy never sees
        (and never tries to evaluate) a function of a number."""
        try:
            with np.errstate(all="ignore"):
                value = float(fn(*(np.float64(float(a)) for a in args)))
        except OverflowError:
            value = math.nan
        if not math.isfinite(value):
            self.fail(node, f"constant {name}({', '.join(_short(a) for a in args)}) is undefined or infinite")
        if abs(value) > MAX_CONSTANT:
            self.fail(node, f"constant {name}({', '.join(_short(a) for a in args)}) is too large "
                            f"(magnitude at most {MAX_CONSTANT:g})")
        return sp.Float(value)

    def checked(self, node: ast.AST, expr: sp.Expr) -> sp.Expr:
        """Keep computed constants small, and constant exponents bounded even where SymPy
        combined powers ((x**99)**99 is x**9801) or they came from pow(x, n)."""
        if expr.is_Rational and max(expr.p.bit_length(), expr.q.bit_length()) > MAX_CONSTANT_BITS:
            self.fail(node, f"constant too large (more than {MAX_CONSTANT_BITS} bits)")
        if expr.is_Number and not (expr.is_finite and bool(abs(expr) <= MAX_CONSTANT)):
            self.fail(node, f"constant {_short(expr)} out of range (magnitude at most {MAX_CONSTANT:g})")
        for power in expr.atoms(sp.Pow):
            if power.exp.is_Number and bool(abs(power.exp) > MAX_EXPONENT):
                self.fail(node, f"constant exponent {_short(power.exp)} is too large (magnitude at most "
                                f"{MAX_EXPONENT}) in {_short(power)}")
        return expr


def _op_name(op: ast.AST) -> str:
    names = {ast.FloorDiv: "//", ast.Mod: "%", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>",
             ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^", ast.Not: "not", ast.Invert: "~"}
    return f"'{names.get(type(op), type(op).__name__)}'"


def _quote(value: object, limit: int = 40) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _short(expr: sp.Expr, limit: int = 40) -> str:
    if expr.is_Integer and expr.p.bit_length() > 128:
        return f"<integer of {len(str(abs(expr.p)))} digits>"
    text = str(expr)
    return text if len(text) <= limit else text[:limit] + "..."
