"""`semigrad viz FILE -o graph.svg`: a picture of a graph, drawn in-process (no server).

FILE is JSON, like `semigrad check`'s but with everything except the graph optional:

    {"graph":  <semigrad.v1.Graph in the protobuf JSON mapping>,
     "inputs": {"<input>": <nested list of numbers, or a semigrad.v1.Tensor in the JSON mapping>},
     "semiring": "real", "semiring_params": {"k": 3}, "wrt": ["x"],
     "best_path": {"input": "A", "index": [0, 0]}}

With inputs, nodes are labelled with their values and gradients; `best_path` (a selective
semiring) highlights the best path from that input element. The output's suffix picks the
format: .dot/.gv writes the DOT text, anything else (.svg, .png, .pdf) is rendered with the
graphviz Python package and Graphviz's dot program. Exit status: 0 written, 1 cannot render,
2 bad input.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping

from semigrad.viz import render_dot

from ..engine import Engine
from ..errors import SemigradError
from ..service.graph_file import BadInput, load_graph_file
from .draw import draw

FILE_KEYS = {"graph", "inputs", "semiring", "semiring_params", "wrt", "best_path"}
DOT_SUFFIXES = {".dot", ".gv"}


def viz(path: str, output: str | None, overrides: Mapping[str, object]) -> int:
    try:
        request = {**load_viz_file(path), **{k: v for k, v in overrides.items() if v is not None}}
        engine = Engine()
        cg, _ = engine.register(request["graph"])
        inputs, semiring = request.get("inputs") or {}, str(request.get("semiring") or "real")
        params, wrt = request.get("semiring_params") or {}, _names(request.get("wrt"))
        highlight = _best_path(engine, cg.id, inputs, semiring, params, wrt, request.get("best_path"))
        dot = draw(engine, cg.id, inputs, semiring=semiring, semiring_params=params, wrt=wrt, highlight=highlight)
    except BadInput as e:
        print(f"semigrad viz: {e}", file=sys.stderr)
        return 2
    except SemigradError as e:
        print(f"semigrad viz: {e.status}: {e}", file=sys.stderr)
        return 2
    if output is None or output == "-":
        sys.stdout.write(dot)
    elif Path(output).suffix.lower() in DOT_SUFFIXES:
        Path(output).write_text(dot, encoding="utf-8")
    else:
        try:
            render_dot(dot, output)
        except (ImportError, RuntimeError, ValueError) as e:
            print(f"semigrad viz: {e}", file=sys.stderr)
            return 1
    return 0


def load_viz_file(path: str) -> dict:
    return load_graph_file(path, keys=FILE_KEYS, required=("graph",), command="viz")


def parse_best_path(text: str) -> dict:
    """INPUT:I,J,... (e.g. A:0,1) as {"input": ..., "index": [...]}."""
    name, sep, index = text.rpartition(":")
    try:
        if not sep or not name:
            raise ValueError
        return {"input": name, "index": [int(i) for i in index.split(",") if i.strip()]}
    except ValueError:
        raise BadInput(f"--best-path expects INPUT:I,J,... (e.g. A:0,1), got '{text}'") from None


def _best_path(engine, graph_id, inputs, semiring, params, wrt, best_path) -> list:
    if best_path is None:
        return []
    if isinstance(best_path, str):
        best_path = parse_best_path(best_path)
    if not inputs:
        raise BadInput("a best path needs \"inputs\"")
    if not isinstance(best_path, dict) or "input" not in best_path:
        raise BadInput("\"best_path\" must be {\"input\": NAME, \"index\": [...]}")
    start = (str(best_path["input"]), tuple(int(i) for i in best_path.get("index", ())))
    result = engine.gradient(graph_id, inputs, wrt=wrt, semiring=semiring, semiring_params=params,
                             best_paths=[start])
    return [(node, index) for node, index, _ in result.best_paths[0].steps]


def _names(value) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]
