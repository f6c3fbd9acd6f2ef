"""SymbolicGradient: derivatives as formulas (text, LaTeX, Python source). The 2×2
determinant's gradient is its cofactor matrix, and the returned source, executed (trusted
server output), equals the numeric gradient."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg
from reference import det_graph


def _run(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<semigrad jacobian>", "exec"), namespace)  # trusted: the test's own server
    return namespace


def test_det2_cofactors_and_python_source(client, rng):
    f = client.register(det_graph(2))
    result = f.symbolic_gradient()
    assert result.outputs["det"].text[()] == "A[0, 0]*A[1, 1] - A[0, 1]*A[1, 0]"
    d = result.derivatives["det", "A"]
    assert d.shape == (2, 2)
    assert d.text.tolist() == [["A[1, 1]", "-A[1, 0]"], ["-A[0, 1]", "A[0, 0]"]]  # the cofactors
    assert d.latex.tolist() == [["A_{1,1}", "- A_{1,0}"], ["- A_{0,1}", "A_{0,0}"]]
    jacobian = _run(result.python)["jacobian"]
    for _ in range(5):
        a = rng.normal(size=(2, 2))
        np.testing.assert_array_equal(jacobian(a)["det"]["A"], f.gradient({"A": a})["A"])
    assert "import" in result.python and "numpy" in result.python
    imports = {line.split()[1] for line in result.python.splitlines() if line.startswith("import ")}
    assert imports <= {"math", "numpy"}
    assert "d det / d A" in str(result)


@pytest.mark.parametrize("n", [3, 4])
def test_det_python_source_equals_numeric_gradient(client, rng, n):
    f = client.register(det_graph(n))
    result = f.symbolic_gradient()
    jacobian = _run(result.python)["jacobian"]
    a = rng.normal(size=(n, n))
    np.testing.assert_allclose(jacobian(a)["det"]["A"], f.gradient({"A": a})["A"], rtol=1e-12, atol=1e-12)
    # The cofactor of A[0, 0] is the determinant of the minor.
    text = result.derivatives["det", "A"].text[0, 0]
    assert "A[0, 0]" not in text and "A[1, 1]" in text


def test_formulas_of_a_graph_with_custom_ops_and_odd_names(client, rng):
    g = sg.Graph()
    x = g.input("my x", (2,))
    s = g.input("scale", ())
    softclip = g.op("softclip", ["x"], "log(1 + exp(x)) - log(1 + exp(x - 1))")
    g.output("loss", sg.sum(softclip(x) * s))
    g.output("peak", sg.max(x))
    f = client.register(g)
    result = f.symbolic_gradient()
    assert set(result.derivatives) == {("loss", "my x"), ("loss", "scale"), ("peak", "my x"), ("peak", "scale")}
    assert "my x[0]" in result.outputs["loss"].text[()]
    assert result.derivatives["peak", "scale"].text[()] == "0"
    assert "def jacobian(input0, scale)" in result.python  # "my x" is not an identifier
    values = {"my x": rng.normal(size=2), "scale": rng.normal()}
    out = _run(result.python)["jacobian"](values["my x"], values["scale"])
    grads = f.gradient(values, outputs="loss")
    np.testing.assert_allclose(out["loss"]["my x"], grads["my x"], rtol=1e-12)
    np.testing.assert_allclose(out["loss"]["scale"], grads["scale"], rtol=1e-12)
    np.testing.assert_allclose(out["peak"]["my x"], f.gradient(values, outputs="peak")["my x"])


def test_wrt_and_outputs_and_no_simplify(client):
    g = sg.Graph()
    x, y = g.input("x", ()), g.input("y", ())
    g.output("f", (x * x - y * y) / (x - y))
    g.output("g", x - y)
    f = client.register(g)
    plain = f.symbolic_gradient(wrt="x", outputs="f", simplify=False)
    assert set(plain.derivatives) == {("f", "x")} and not plain.simplified
    assert plain.derivatives["f", "x"].text[()] != "1"
    simple = f.symbolic_gradient(wrt="x", outputs="f")
    assert simple.simplified
    assert simple.derivatives["f", "x"].text[()] == "1"
    assert simple.outputs["f"].text[()] == "x + y"


def test_too_large_is_a_clear_failed_precondition(client):
    g = sg.Graph()
    a = g.input("a", (80, 80))
    g.output("out", sg.sum(a @ a @ a))
    with pytest.raises(sg.FailedPrecondition, match="symbolic"):
        client.register(g).symbolic_gradient()
