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


from .scalarize import ScalarProgram


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
        lines.append(f"    {target} = {expression(p.ops[op], operands, flavour)}")
    outs = ", ".join("(" + ", ".join(name_of(int(v)) for v in ids.reshape(-1)) + ("," if ids.size == 1 else "") + ")"
                     for _, _, ids in p.outputs)
    lines.append(f"    return ({outs}{',' if len(p.outputs) == 1 else ''})")
    return "\n".join(lines) + "\n"


def expression(op, operands: list[str], flavour: str) -> str:
    """Source of one instruction of OpDef `op`. Flavours: "floats" and "arrays" call functions
    from the table `F`; "compiled" (numba) calls module-level `F_<op>` names (see jit.compile_function)."""
    if op.infix is not None:
        return op.infix.format(*operands)
    if flavour == "compiled":
        return f"F_{op.name}({', '.join(operands)})"
    return f"F[{op.name!r}]({', '.join(operands)})"


def functions(p: ScalarProgram, flavour: str) -> dict:
    """The table `F` of a program's generated code: each op's function over floats (where it
    has one) or over arrays."""
    if flavour == "floats":
        return {name: op.float_fn or op.elementwise_fn for name, op in p.ops.items()}
    return {name: op.elementwise_fn for name, op in p.ops.items()}


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
