"""`semigrad check FILE` and `semigrad diff EXPR OPERAND...`: in-process, readable, and the
exit status says whether the derivatives agree (0), disagree (1) or the input is bad (2)."""

from __future__ import annotations

import json
import re

import pytest
import semigrad as sg
from google.protobuf import json_format
from reference import det_graph
from semigrad import codec
from semigrad_server.cli import main


def softclip_graph(grad: str | None) -> sg.Graph:
    g = sg.Graph()
    x = g.input("x", (3,))
    clip = g.op("softclip", ["x"], "log(1 + exp(x)) - log(1 + exp(x - 1))", grads=grad and {"x": grad})
    g.output("loss", sg.sum(clip(x, name="clip") ** 2))
    return g


def write(tmp_path, doc: dict, name="check.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def graph_json(g: sg.Graph) -> dict:
    return json_format.MessageToDict(g.to_proto())


def test_check_passes(tmp_path, capsys):
    path = write(tmp_path, {"graph": graph_json(softclip_graph(None)), "inputs": {"x": [0.5, -1.0, 2.0]}})
    assert main(["check", path]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "reverse vs symbolic" in out


def test_check_fails_and_names_the_node(tmp_path, capsys):
    path = write(tmp_path, {"graph": graph_json(softclip_graph("2*x")), "inputs": {"x": [0.5, -1.0, 2.0]}})
    assert main(["check", path]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "suspects: 'clip'" in out


def test_check_options_and_tensor_json(tmp_path, capsys):
    tensor = json_format.MessageToDict(codec.to_tensor([[1.0, 2.0], [3.0, 5.0]]))
    doc = {"graph": graph_json(det_graph(2)), "inputs": {"A": tensor}, "methods": ["reverse", "symbolic"],
           "atol": 1e-9}
    path = write(tmp_path, doc)
    assert main(["check", path, "--method", "reverse", "--method", "finite_difference", "--richardson",
                 "--localize"]) == 0
    out = capsys.readouterr().out
    assert "finite_difference" in out and "symbolic" not in out and "Richardson" in out
    assert "atol 1e-09" in out and "localisation" in out


def test_check_semiring(tmp_path, capsys):
    doc = {"graph": graph_json(det_graph(3)), "inputs": {"A": [[1, 2, 0], [0.5, 1, 3], [2, 1, 1]]},
           "semiring": "kbest", "semiring_params": {"k": 2}}
    assert main(["check", write(tmp_path, doc)]) == 0
    assert "path_enumeration" in capsys.readouterr().out


@pytest.mark.parametrize("content,match", [
    ("not json", "not valid JSON"),
    (json.dumps({"graph": {}}), "\"inputs\""),
    (json.dumps({"graph": {"nodes": [{"idd": "x"}]}, "inputs": {}}), "semigrad.v1.Graph"),
    (json.dumps({"graph": {}, "inputs": {}, "typo": 1}), "unknown key 'typo'"),
    (json.dumps({"graph": {"inputs": [{"name": "x"}], "outputs": [{"name": "y", "node": "x"}]},
                 "inputs": {"x": "abc"}}), "input 'x'"),
    (json.dumps({"graph": {"inputs": [{"name": "x", "shape": ["2"]}], "outputs": [{"name": "y", "node": "x"}]},
                 "inputs": {"x": [[1, 2], [3, 4]]}}), "one point"),
])
def test_check_bad_input_exits_2(tmp_path, capsys, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["check", str(path)]) == 2
    assert match in capsys.readouterr().err


def test_check_missing_file(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_diff_prints_partials_and_checks_them(capsys):
    assert main(["diff", "x*sin(y)", "x", "y", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "d f / d x = sin(y)" in out and "d f / d y = x*cos(y)" in out and "all derivatives agree" in out


def test_diff_at_a_given_point_with_a_wrong_hand_written_derivative(capsys):
    assert main(["diff", "x**3", "x", "--at", "x=2", "--grad", "x=3*x"]) == 1
    out = capsys.readouterr().out
    assert "x = 2" in out and "MISMATCH" in out and "12" in out


@pytest.mark.parametrize("args", [["diff", "x.__class__", "x"], ["diff", "x + z", "x"],
                                  ["diff", "x", "x", "--at", "y=1"], ["diff", "x", "1x"]])
def test_diff_bad_input_exits_2(capsys, args):
    assert main(args) == 2
    assert capsys.readouterr().err


def test_the_documented_check_file_works(tmp_path, capsys):
    """docs/crosscheck.md's example file: its hand-written derivative is wrong, and check says where."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "crosscheck.md").read_text()
    (example,) = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    path = tmp_path / "softclip.json"
    path.write_text(example)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "suspects: 'clip'" in out and "atol 1e-06" in out


def gather_graph_json() -> dict:
    g = sg.Graph()
    x, i = g.input("x", (3,)), g.input("i", (2,), "int64")
    g.output("y", sg.sum(sg.sin(sg.gather(x, i))))
    return graph_json(g)


# The file's numbers follow the client's rule (tests/test_lossy_casts.py): a value the declared
# dtype would change is refused naming the input, both dtypes and the element (found by an
# attacker: 2.5 became index 2, strings were taken as int64, huge integers gave a traceback).
@pytest.mark.parametrize("command", ["check", "viz"])
@pytest.mark.parametrize("inputs,match", [
    ({"x": [0.1, 0.2, 0.3], "i": [0, 2.5]}, r"input 'i' cannot be cast from float64 to int64 .* element \[1\] is 2.5"),
    ({"x": [0.1, 0.2, 0.3], "i": ["0", "1"]}, r"input 'i' holds strings"),
    ({"x": [None, 0.2, 0.3], "i": [0, 1]}, r"input 'x' holds NoneType data"),
    ({"x": [0.1, 0.2, 0.3], "i": [0, 2**64]}, r"input 'i' .* element \[1\] is 18446744073709551616"),
    ({"x": [10**330, 0.2, 0.3], "i": [0, 1]}, r"input 'x' .* to float64 .* element \[0\] is 1000"),
])
def test_a_lossy_input_in_the_file_exits_2(tmp_path, capsys, command, inputs, match):
    path = write(tmp_path, {"graph": gather_graph_json(), "inputs": inputs})
    assert main([command, path]) == 2
    assert re.search(match, capsys.readouterr().err)


def test_exact_numbers_in_the_file_are_taken(tmp_path, capsys):
    path = write(tmp_path, {"graph": gather_graph_json(), "inputs": {"x": [0.1, 0.2, 0.3], "i": [0, 2.0]}})
    assert main(["check", path]) == 0
