"""Generates straight-line Python from a scalar program, in two flavours sharing one source:

* `floats`: every variable is a Python float (or bool): one point, no NumPy per-op cost.
  Python raises where IEEE arithmetic returns inf or NaN (1/0, log(-1), exp(1000)); the
  executable then reruns the point with the `arrays` flavour, so results stay IEEE.
* `arrays`: every variable is a 1-D array over the batch (or a float when it does not
  depend on the batch); each instruction is one vectorised ufunc call.

Registers are reused once a variable is dead, so memory is freed at last use.
"""

from __future__ import annotations

import math


from .scalarize import ELEMENTWISE_FNS, ScalarProgram

INFIX = {"add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}", "neg": "-{0}",
         "square": "{0} * {0}", "lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}",
         "eq": "{0} == {1}", "ne": "{0} != {1}"}


def _f_sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _f_softplus(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x))) if x == x else x


def _f_relu(x):
    return x if not x <= 0 else 0.0


def _f_sign(x):
    return x if x != x else (1.0 if x > 0 else (-1.0 if x < 0 else 0.0))


def _f_heaviside(x):
    return x if x != x else (1.0 if x > 0 else (0.0 if x < 0 else 0.5))


def _f_maximum(a, b):
    return a if a >= b or a != a else b


def _f_minimum(a, b):
    return a if a <= b or a != a else b


FLOAT_FNS = {
    "pow": math.pow, "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "log1p": math.log1p,
    "expm1": math.expm1, "sin": math.sin, "cos": math.cos, "tan": math.tan, "tanh": math.tanh,
    "sigmoid": _f_sigmoid, "softplus": _f_softplus, "abs": abs, "relu": _f_relu, "erf": math.erf,
    "sign": _f_sign, "heaviside": _f_heaviside, "maximum": _f_maximum, "minimum": _f_minimum,
}


def generate_source(p: ScalarProgram, flavour: str) -> str:
    """The source of `def program(inputs, C, F)`: inputs are sequences of element values.
    Only our own op names and numbers reach the source, never text from a request."""
    last_use: dict[int, int] = {}
    for i, (_, _, args) in enumerate(p.instrs):
        for a in args:
            last_use[a] = i
    pinned = {int(v) for _, _, ids in p.outputs for v in ids.reshape(-1)}
    names: dict[int, str] = {}
    free: list[str] = []
    counter = 0

    def name_of(var: int) -> str:
        if var in p.consts:
            value = p.consts[var]
            if var in p.semiring_vars or not isinstance(value, (float, bool)):
                return f"C[{var}]"
            if isinstance(value, bool) or math.isfinite(value):
                return repr(value)
            return "math.nan" if value != value else ("math.inf" if value > 0 else "-math.inf")
        return names[var]

    lines = ["def program(inputs, C, F):"]
    for k, (_, _, ids) in enumerate(p.inputs):
        targets = []
        for var in ids.reshape(-1):
            names[int(var)] = f"i{int(var)}"
            targets.append(names[int(var)])
        if targets:
            lines.append(f"    {', '.join(targets)}{',' if len(targets) == 1 else ''} = inputs[{k}]")
    for i, (var, op, args) in enumerate(p.instrs):
        operands = [name_of(a) for a in args]
        for a in set(args):  # registers whose last use is this instruction become free after it
            if last_use.get(a) == i and a not in pinned and a in names and names[a].startswith("r"):
                free.append(names[a])
        if free:
            target = free.pop()
        else:
            target = f"r{counter}"
            counter += 1
        names[var] = target
        lines.append(f"    {target} = {expression(op, operands, flavour)}")
    outs = ", ".join("(" + ", ".join(name_of(int(v)) for v in ids.reshape(-1)) + ("," if ids.size == 1 else "") + ")"
                     for _, _, ids in p.outputs)
    lines.append(f"    return ({outs}{',' if len(p.outputs) == 1 else ''})")
    return "\n".join(lines) + "\n"


def expression(op: str, operands: list[str], flavour: str) -> str:
    """Source of one instruction. Flavours: "floats" and "arrays" call functions from the table
    `F`; "compiled" (numba) calls module-level `F_<op>` names (see jit.compile_function)."""
    if op in INFIX:
        return INFIX[op].format(*operands)
    if op == "where" and flavour != "arrays":
        return f"({operands[1]} if {operands[0]} else {operands[2]})"
    if flavour == "compiled":
        return f"F_{op}({', '.join(operands)})"
    return f"F[{op!r}]({', '.join(operands)})"


def functions(flavour: str, semiring=None) -> dict:
    table = dict(FLOAT_FNS) if flavour == "floats" else dict(ELEMENTWISE_FNS)
    if semiring is not None:
        table.update({"sr_add": semiring.add, "sr_mul": semiring.mul, "sr_lift": semiring.lift})
    return table


def compile_program(p: ScalarProgram, flavour: str):
    source = generate_source(p, flavour)
    namespace = {"math": math}
    exec(compile(source, f"<semigrad {flavour} program>", "exec"), namespace)  # our own generated code
    return namespace["program"], source


def const_table(p: ScalarProgram) -> list:
    table = [None] * p.n_vars
    for var, value in p.consts.items():
        table[var] = value
    return table
