"""Pictures: the server's DOT text checked structurally (nodes, edges, labels, highlighted
path), rendering det-by-minors 3×3 to SVG and PNG, and `semigrad viz`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import semigrad as sg
from google.protobuf import json_format
from test_describe import small_graph
from workloads import det_graph

QUOTED = r'"((?:[^"\\]|\\.)*)"'
NODE = re.compile(rf"^  {QUOTED} \[(.*)\];$")
EDGE = re.compile(rf"^  {QUOTED} -> {QUOTED}(?: \[(.*)\])?;$")
ATTR = re.compile(rf'(\w+)=(?:{QUOTED}|([^,\s]+))')
NO_DOT = "Graphviz's dot program is not installed (the Makefile installs Debian's graphviz where it can)"


def parse_dot(dot: str) -> tuple[dict[str, dict], list[tuple[str, str, dict]]]:
    """Nodes {id: attrs} and edges [(tail, head, attrs)] of the server's DOT (one statement a line)."""
    lines = dot.splitlines()
    assert lines[0] == "digraph semigrad {" and lines[-1] == "}"
    nodes, edges = {}, []
    for line in lines[4:-1]:
        if m := EDGE.match(line):
            edges.append((unescape(m[1]), unescape(m[2]), attrs(m[3] or "")))
        else:
            m = NODE.match(line)
            assert m, f"not a node or edge statement: {line!r}"
            nodes[unescape(m[1])] = attrs(m[2])
    return nodes, edges


def attrs(text: str) -> dict:
    return {key: unescape(quoted) if quoted is not None and bare == "" else bare
            for key, quoted, bare in ATTR.findall(text)}


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], text)


def label_lines(node: dict) -> list[str]:
    return node["label"].split("\n")


@pytest.fixture(scope="module")
def small(client):
    return client.register(small_graph())


@pytest.fixture(scope="module")
def det3(client):
    return client.register(det_graph(3))


def test_structure_matches_the_graph(small):
    nodes, edges = parse_dot(small.to_dot())
    graph = small.graph
    assert list(nodes) == [i.name for i in graph.inputs] + [n.id for n in graph.nodes]
    assert sorted((a, b) for a, b, _ in edges) == sorted((ref, n.id) for n in graph.nodes for ref in n.inputs)
    assert label_lines(nodes["x"]) == ["x", "input", "float64[2]"] and nodes["x"]["fillcolor"] == "lightblue"
    assert label_lines(nodes["n3"]) == ["n3", "div", "float64[2]"]
    assert label_lines(nodes["n5"]) == ["n5", "mul", "float64[]", "output out"]
    assert label_lines(nodes["n1"])[-1] == "output s"
    assert nodes["n5"]["fillcolor"] == "darkolivegreen1" and nodes["n1"]["fillcolor"] == "darkolivegreen1"
    assert {e[2].get("label") for e in edges if e[1] == "n3"} == {"0", "1"}  # operand positions
    assert all(a.get("color") != "red" for a in nodes.values())  # nothing highlighted


def test_values_and_gradients_computed_by_the_server(small):
    x, y, z = np.array([0.5, 1.0]), np.array([2.0, 3.0]), 2.0
    nodes, _ = parse_dot(small.to_dot(inputs={"x": x, "y": y, "z": z}))

    def shown(v) -> str:
        v = np.asarray(v)
        return f"{float(v):.4g}" if v.ndim == 0 else "[" + ", ".join(f"{e:.4g}" for e in v) + "]"

    # d(out + sum(s)) with out = 2 sum(sin(x) y / z), s = sin(x); every float input is differentiated
    expected = {
        "x": (x, np.cos(x) * (2 * y / z + 1)), "y": (y, 2 * np.sin(x) / z),
        "z": (z, -2 * np.sum(np.sin(x) * y) / z**2), "n1": (np.sin(x), 2 * y / z + 1),
        "n2": (np.sin(x) * y, np.full(2, 2 / z)), "n4": (np.sum(np.sin(x) * y / z), 2.0),
        "n5": (2 * np.sum(np.sin(x) * y / z), 1.0),
    }
    for ref, (value, grad) in expected.items():
        assert label_lines(nodes[ref])[3:5] == [f"value {shown(value)}", f"grad {shown(grad)}"], ref
    assert label_lines(nodes["c"])[3:] == ["value 2"]  # a constant requires no gradient


def test_given_values_and_gradients_are_shown_as_given(small):
    nodes, _ = parse_dot(small.to_dot(values={"n1": [9, 9], "z": 3}, gradients={"n4": 0.25}))
    assert label_lines(nodes["n1"])[3] == "value [9, 9]"
    assert label_lines(nodes["z"])[3] == "value 3"
    assert label_lines(nodes["n4"])[3] == "grad 0.25"
    big = parse_dot(small.to_dot(values={"n1": np.arange(6.0).reshape(3, 2)}))[0]["n1"]
    assert label_lines(big)[3] == "value mean 2.5, min 0, max 5"


def test_highlighted_path(small):
    nodes, edges = parse_dot(small.to_dot(highlight_path=[("x", [1]), ("n1", [1]), ("n2", (1,))]))
    red = {ref for ref, a in nodes.items() if a.get("color") == "red"}
    assert red == {"x", "n1", "n2"}
    assert "path [1]" in label_lines(nodes["n2"])
    assert sorted((a, b) for a, b, e in edges if e.get("color") == "red") == [("n1", "n2"), ("x", "n1")]
    with pytest.raises(sg.InvalidArgument, match="unknown node or input 'nope'"):
        small.to_dot(highlight_path=[("nope", [])])


def test_best_path_of_a_selective_semiring_is_highlighted(det3):
    a = np.array([[2.0, -1.0, 0.5], [1.0, 3.0, -2.0], [0.5, 1.0, 4.0]])
    best = det3.gradient({"A": a}, semiring="max_product", best_path=[("A", (1, 2))]).best_paths[0]
    nodes, edges = parse_dot(det3.to_dot(inputs={"A": a}, semiring="max_product", highlight_path=best))
    steps = [s.node for s in best.steps]
    assert steps[0] == "A" and steps[-1] == det3.graph.outputs[0].node
    assert {ref for ref, at in nodes.items() if at.get("color") == "red"} == set(steps)
    assert {(t, h) for t, h, e in edges if e.get("color") == "red"} == set(zip(steps, steps[1:]))
    assert "path [1, 2]" in label_lines(nodes["A"])


def test_render_without_the_graphviz_package_says_what_to_install(small, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)
    with pytest.raises(ImportError, match=r"semigrad\[viz\]"):
        small.render(tmp_path / "g.svg")


@pytest.mark.skipif(shutil.which("dot") is None, reason=NO_DOT)
def test_render_det3_to_svg_and_png(det3, tmp_path):
    a = np.arange(9.0).reshape(3, 3) + np.eye(3)
    svg = det3.render(tmp_path / "det.svg", inputs={"A": a})
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert all(f">{n.id}</text>" in text for n in det3.graph.nodes)
    png = det3.render(tmp_path / "det.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def viz_file(tmp_path, **extra) -> str:
    path = tmp_path / "det.json"
    doc = {"graph": json_format.MessageToDict(det_graph(3).to_proto()), **extra}
    path.write_text(json.dumps(doc))
    return str(path)


def run_viz(*args):
    return subprocess.run([sys.executable, "-m", "semigrad_server", "viz", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.skipif(shutil.which("dot") is None, reason=NO_DOT)
def test_viz_command_writes_an_svg(tmp_path):
    path = viz_file(tmp_path, inputs={"A": [[2, 1, 0], [1, 3, 1], [0, 1, 4]]}, semiring="max_product",
                    best_path={"input": "A", "index": [0, 0]})
    result = run_viz(path, "-o", str(tmp_path / "det.svg"))
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "det.svg").read_text()
    assert "<svg" in text and "max_product semiring" in text and "stroke=\"red\"" in text


def test_viz_command_writes_dot_text_and_rejects_bad_files(tmp_path):
    result = run_viz(viz_file(tmp_path), "-o", str(tmp_path / "det.dot"))
    assert result.returncode == 0, result.stderr
    nodes, _ = parse_dot((tmp_path / "det.dot").read_text())
    assert set(nodes) == {"A"} | {n.id for n in det_graph(3).to_proto().nodes}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"graph": {}, "colour": "red"}))
    result = run_viz(str(bad))
    assert result.returncode == 2 and "unknown key 'colour'" in result.stderr
    result = run_viz(viz_file(tmp_path), "--best-path", "A:0,0")
    assert result.returncode == 2 and "needs \"inputs\"" in result.stderr
