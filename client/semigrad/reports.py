"""Results of CrossCheck and SymbolicGradient as plain Python objects."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import codec
from .v1 import semigrad_pb2 as pb


@dataclass(frozen=True)
class MethodReport:
    """One way to the derivative: ``method`` ("reverse", "symbolic", "finite_difference",
    "complex_step", "path_enumeration"), whether it ``ran``, how (or why not: ``detail``),
    and its ``blocks``: ``{(output, input): array}`` (real semiring: the Jacobian block,
    shaped output shape + input shape; other semirings: path sums, shaped like the input)."""

    method: str
    ran: bool
    detail: str
    seconds: float
    blocks: dict

    @classmethod
    def from_proto(cls, m: pb.MethodReport) -> MethodReport:
        return cls(m.method, m.ran, m.detail, m.seconds,
                   {(b.output, b.input): codec.from_tensor(b.value) for b in m.blocks})


@dataclass(frozen=True)
class BlockComparison:
    """Errors of one block, per element (``abs_error``, ``rel_error``) and at most; ``worst`` is
    the index of the element furthest outside the tolerance, with both values there."""

    output: str
    input: str
    abs_error: np.ndarray
    rel_error: np.ndarray
    max_abs_error: float
    max_rel_error: float
    worst: tuple[int, ...]
    worst_value: float
    worst_reference: float
    passed: bool


@dataclass(frozen=True)
class Comparison:
    """``method`` against ``reference``: passes when every element of every block has
    |a - b| <= atol + rtol·|b| (b from the reference)."""

    method: str
    reference: str
    passed: bool
    max_abs_error: float
    max_rel_error: float
    blocks: tuple[BlockComparison, ...]

    @classmethod
    def from_proto(cls, c: pb.MethodComparison) -> Comparison:
        return cls(c.method, c.reference, c.passed, c.max_abs_error, c.max_rel_error, tuple(
            BlockComparison(b.output, b.input, codec.from_tensor(b.abs_error), codec.from_tensor(b.rel_error),
                            b.max_abs_error, b.max_rel_error, tuple(b.worst), b.worst_value, b.worst_reference,
                            b.passed) for b in c.blocks))


@dataclass(frozen=True)
class NodeCheck:
    """A node's local derivative rule for one operand (``position``; the op calls it
    ``operand``; fed by ``source``) against finite differences of that node alone."""

    node: str
    op: str
    position: int
    operand: str
    source: str
    rule: str
    checked: bool
    passed: bool
    max_abs_error: float
    max_rel_error: float
    detail: str


@dataclass(frozen=True)
class CrossCheckReport:
    """The answer of :meth:`RegisteredGraph.crosscheck`. ``passed`` is True when every
    comparison passed; ``suspects`` names the nodes whose local rule disagrees with finite
    differences (filled when a comparison failed, or when localisation was asked for).
    ``str(report)`` is a readable report."""

    passed: bool
    semiring: str
    atol: float
    rtol: float
    methods: tuple[MethodReport, ...]
    comparisons: tuple[Comparison, ...]
    localized: bool
    node_checks: tuple[NodeCheck, ...]
    suspects: tuple[str, ...]
    text: str

    @classmethod
    def from_proto(cls, r: pb.CrossCheckResponse) -> CrossCheckReport:
        return cls(r.passed, r.semiring, r.atol, r.rtol, tuple(MethodReport.from_proto(m) for m in r.methods),
                   tuple(Comparison.from_proto(c) for c in r.comparisons), r.localized,
                   tuple(NodeCheck(c.node, c.op, c.position, c.operand, c.source, c.rule, c.checked, c.passed,
                                   c.max_abs_error, c.max_rel_error, c.detail) for c in r.node_checks),
                   tuple(r.suspects), r.text)

    def method(self, name: str) -> MethodReport:
        """The report of method ``name``."""
        for m in self.methods:
            if m.method == name:
                return m
        raise KeyError(f"no method {name!r} in this report (methods: {', '.join(m.method for m in self.methods)})")

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Formulas:
    """Formulas of one block, as arrays of strings shaped ``shape``: ``text`` (SymPy's form,
    input elements written ``A[0, 1]``) and ``latex``."""

    output: str
    input: str
    shape: tuple[int, ...]
    text: np.ndarray
    latex: np.ndarray

    @classmethod
    def from_proto(cls, b: pb.FormulaBlock) -> Formulas:
        shape = tuple(b.shape)
        text = np.array([f.text for f in b.formulas], dtype=object).reshape(shape)
        latex = np.array([f.latex for f in b.formulas], dtype=object).reshape(shape)
        return cls(b.output, b.input, shape, text, latex)


@dataclass(frozen=True)
class SymbolicGradient:
    """The answer of :meth:`RegisteredGraph.symbolic_gradient`: ``outputs`` maps each output
    to its :class:`Formulas`, ``derivatives`` maps ``(output, input)`` to the formulas of
    d output[j] / d input[i] (shaped output shape + input shape), ``python`` is stand-alone
    source (imports only math and numpy) defining ``jacobian(<inputs in graph order>)``."""

    outputs: dict = field(default_factory=dict)
    derivatives: dict = field(default_factory=dict)
    python: str = ""
    simplified: bool = False
    detail: str = ""

    @classmethod
    def from_proto(cls, r: pb.SymbolicGradientResponse) -> SymbolicGradient:
        return cls({b.output: Formulas.from_proto(b) for b in r.outputs},
                   {(b.output, b.input): Formulas.from_proto(b) for b in r.derivatives},
                   r.python, r.simplified, r.detail)

    def __str__(self) -> str:
        lines = []
        for name, f in self.outputs.items():
            lines += _listing(name, f)
        for (output, x), f in self.derivatives.items():
            lines += _listing(f"d {output} / d {x}", f)
        if self.detail:
            lines.append(f"({self.detail})")
        return "\n".join(lines)


def _listing(title: str, f: Formulas) -> list[str]:
    if f.text.ndim == 0:
        return [f"{title} = {f.text[()]}"]
    lines = [f"{title}:"]
    for index in np.ndindex(*f.text.shape):
        lines.append(f"  {list(index)}: {f.text[index]}")
    return lines
