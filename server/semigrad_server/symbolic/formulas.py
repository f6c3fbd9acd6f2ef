"""A symbolic gradient as formulas: text and LaTeX per element, and stand-alone Python
source (importing only math and numpy) computing every Jacobian block.

In text, input elements read `A[0, 1]` (scalar inputs by their name); in LaTeX
`A_{0,1}`. In the Python source each graph input is an argument (its name when that is a
safe identifier, else `input<k>`), so `A[0, 1]` is also the code that reads the element.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import sympy as sp
from sympy.printing.str import StrPrinter

from ..deadline import interruptibly
from .expand import element_name
from .gradient import SymbolicJacobian, simplified, sympy_failures, symbolic_jacobian
from .numeric import HELPERS, Printer, helper_source

IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}\Z")
RESERVED = frozenset({"numpy", "math", "jacobian", *HELPERS})


@dataclass
class FormulaBlock:
    output: str
    input: str  # "" for an output's own formulas
    shape: tuple[int, ...]
    text: list[str] = field(default_factory=list)
    latex: list[str] = field(default_factory=list)


@dataclass
class Formulas:
    outputs: list[FormulaBlock]
    derivatives: list[FormulaBlock]
    python: str
    simplified: bool
    detail: str = ""


def symbolic_gradient(engine, graph_id: str, wrt: Sequence[str] = (), outputs: Sequence[str] = (),
                      simplify: bool = True, deadline: float | None = None) -> Formulas:
    """The SymbolicGradient RPC: every derivative of the outputs as formulas."""
    from .crosscheck import select_outputs

    cg = engine.get(graph_id)
    outputs = select_outputs(cg, outputs)
    wrt = cg.wrt_inputs(wrt)
    return interruptibly("computing the symbolic gradient", _formulas_of, cg, outputs, wrt, simplify, deadline)


def _formulas_of(cg, outputs, wrt, simplify, deadline) -> Formulas:
    jac = symbolic_jacobian(cg, outputs, wrt, deadline=deadline)
    with sympy_failures("the formulas"):
        return formulas(cg, jac, simplify)


def formulas(cg, jac: SymbolicJacobian, simplify: bool = True) -> Formulas:
    ex = jac.expansion
    latex_names = {s: _latex_name(name, index) for s, (name, index) in ex.elements.items()}
    text = _Text({s: element_name(name, index) for s, (name, index) in ex.elements.items()})
    blocks = {("", name): array for name, array in jac.outputs.items()}
    blocks.update({(x, name): jac.blocks[name, x] for name, x in jac.blocks})
    detail = ""
    if simplify:
        flat = [e for array in blocks.values() for e in array.flat]
        done, detail = simplified(flat)
        k = 0
        for key, array in blocks.items():
            array = np.array(done[k:k + array.size], dtype=object).reshape(array.shape)
            k += array.size
            blocks[key] = array
            if key[0]:
                jac.blocks[key[1], key[0]] = array
    out = []
    for (x, name), array in blocks.items():
        block = FormulaBlock(name, x, array.shape)
        for e in array.flat:
            block.text.append(text.doprint(e))
            block.latex.append(sp.latex(e, symbol_names=latex_names))
        out.append(block)
    return Formulas([b for b in out if not b.input], [b for b in out if b.input], python_source(cg, jac), simplify,
                    detail)


def python_source(cg, jac: SymbolicJacobian) -> str:
    """Source of `jacobian(<every graph input>)` -> {output: {input: ndarray}}."""
    taken = set(RESERVED)
    args = {spec.name: _python_name(spec.name, k, taken) for k, spec in enumerate(cg.graph.inputs)}
    names = {s: f"{args[name]}[{', '.join(map(str, index))}]" if index else args[name]
             for s, (name, index) in jac.expansion.elements.items()}
    keys = list(jac.blocks)
    flat = [e for key in keys for e in jac.blocks[key].flat]
    temps = sp.numbered_symbols("_t")
    replacements, reduced = sp.cse(flat, symbols=temps) if flat else ([], [])
    printer = Printer(names)
    body = []
    for spec in cg.graph.inputs:
        arg = args[spec.name]
        dtype = ", dtype=numpy.float64" if spec.dtype.startswith("float") else ""
        body.append(f"    {arg} = numpy.asarray({arg}{dtype})")
    for temp, e in replacements:
        body.append(f"    {printer.doprint(temp)} = {printer.doprint(e)}")
    result, k = [], 0
    for n, key in enumerate(keys):
        shape = jac.blocks[key].shape
        exprs = reduced[k:k + int(np.prod(shape, dtype=np.int64))]
        k += len(exprs)
        var = f"_d{n}"
        if not exprs:
            body.append(f"    {var} = numpy.zeros({shape!r})")
        else:
            items = ", ".join(printer.doprint(e) for e in exprs)
            body.append(f"    {var} = numpy.reshape(numpy.array([{items}], dtype=numpy.float64), {shape!r})")
        result.append((key, var))
    by_output: dict[str, list[str]] = {}
    for (output, x), var in result:
        by_output.setdefault(output, []).append(f"{x!r}: {var}")
    body.append("    return {" + ", ".join(f"{o!r}: {{{', '.join(v)}}}" for o, v in by_output.items()) + "}")
    signature = ", ".join(args.values())
    mapping = "\n".join(f"#   {arg}: input {name!r}, shape {list(cg.types[name].shape)}" for name, arg in args.items())
    return (f"# Partial derivatives of graph {cg.id}, generated by semigrad.\n"
            f"# jacobian({signature}) returns {{output: {{input: array}}}}, each array shaped output shape + input\n"
            f"# shape, for one point (arguments with their declared shapes, no batch dimensions).\n"
            f"# Arguments:\n{mapping}\n"
            "import math  # noqa: F401\n"
            "import numpy\n\n\n"
            f"{helper_source(printer)}"
            f"def jacobian({signature}):\n" + "\n".join(body) + "\n")


class _Text(StrPrinter):
    """SymPy's text form, with input elements by their names (A[0, 1])."""

    def __init__(self, names: dict):
        super().__init__()
        self.names = names

    def _print_Symbol(self, expr):
        return self.names.get(expr, expr.name)


def _python_name(name: str, k: int, taken: set[str]) -> str:
    candidate = name if IDENTIFIER.match(name) and not keyword.iskeyword(name) else f"input{k}"
    while candidate in taken:
        candidate += "_"
    taken.add(candidate)
    return candidate


def _latex_name(name: str, index: tuple[int, ...]) -> str:
    escaped = re.sub(r"([\\{}_^#$%&~])", r"\\\1", name)
    base = escaped if len(name) == 1 else r"\mathrm{" + escaped + "}"
    return f"{base}_{{{','.join(map(str, index))}}}" if index else base
