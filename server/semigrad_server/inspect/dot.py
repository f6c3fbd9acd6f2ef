"""A graph as DOT text (Graphviz's language; no Graphviz needed to write it).

Like torchviz: inputs are light-blue leaves at the top, ops grey, outputs green at the
bottom; every node shows its id, op, shape and dtype and, when given, a summary of its value
and gradient. A highlighted path (node, element) — e.g. a selective semiring's best path —
is drawn in red, nodes and the edges between consecutive steps. One statement per line.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..ir import Graph, Type
from .summary import array_text

INPUT_STYLE = 'shape=box, style="rounded,filled", fillcolor=lightblue'
CONST_STYLE = 'shape=box, style="rounded,filled", fillcolor=white'
OUTPUT_STYLE = "fillcolor=darkolivegreen1, peripheries=2"
HIGHLIGHT_STYLE = "color=red, penwidth=3, fontcolor=red"

PathSteps = Sequence[tuple[str, tuple[int, ...]]]


def graph_dot(graph: Graph, types: Mapping[str, Type], values: Mapping[str, np.ndarray] | None = None,
              gradients: Mapping[str, np.ndarray] | None = None, highlight: PathSteps = (),
              title: str = "") -> str:
    values, gradients = values or {}, gradients or {}
    on_path: dict[str, list[tuple[int, ...]]] = {}
    for ref, index in highlight:
        on_path.setdefault(ref, []).append(tuple(index))
    outputs: dict[str, list[str]] = {}
    for name, ref in graph.outputs:
        outputs.setdefault(ref, []).append(name)

    def node_line(ref: str, op: str, style: str) -> str:
        t = types[ref]
        lines = [ref, op, f"{t.dtype}{list(t.shape)}"]
        if ref in values:
            lines.append("value " + array_text(values[ref]))
        if ref in gradients:
            lines.append("grad " + array_text(gradients[ref]))
        lines += ["output " + name for name in outputs.get(ref, ())]
        lines += [f"path {list(index)}" if index else "path" for index in on_path.get(ref, ())]
        attrs = [f"label={quote(chr(10).join(lines))}", style] + [OUTPUT_STYLE] * (ref in outputs)
        attrs += [HIGHLIGHT_STYLE] * (ref in on_path)
        return f"  {quote(ref)} [{', '.join(a for a in attrs if a)}];"

    path_edges = {(a, b) for (a, _), (b, _) in zip(highlight, highlight[1:])}
    body = [node_line(spec.name, "input", INPUT_STYLE) for spec in graph.inputs]
    edges = []
    for node in graph.nodes:
        body.append(node_line(node.id, node.op, CONST_STYLE if node.op == "const" else ""))
        for pos, ref in enumerate(node.inputs):
            attrs = [f"label={quote(str(pos))}"] if len(node.inputs) > 1 else []
            attrs += [HIGHLIGHT_STYLE] if (ref, node.id) in path_edges else []
            edges.append(f"  {quote(ref)} -> {quote(node.id)}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    header = ["digraph semigrad {",
              f"  graph [rankdir=TB, fontname=Helvetica, label={quote(title)}, labelloc=t];",
              '  node [shape=box, style="rounded,filled", fillcolor=lightgrey, fontname=Helvetica, fontsize=10];',
              "  edge [color=gray40, fontname=Helvetica, fontsize=9];"]
    return "\n".join(header + body + edges + ["}"]) + "\n"


def quote(text: str) -> str:
    """A DOT quoted string; line breaks become centred label breaks."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
