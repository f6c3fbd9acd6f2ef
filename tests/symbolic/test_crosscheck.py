"""CrossCheck over gRPC: reverse mode, the symbolic gradient and finite differences agree for
every built-in op and for det-by-minors; a wrong custom derivative is caught and its node
named; other semirings are checked against brute-force path enumeration; limits are clear."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg
from reference import det_graph
from test_op_gradients import CASES, build

REAL_METHODS = {"reverse", "symbolic", "finite_difference"}


def point(rng, case):
    _, _, _, shapes, samplers = case
    return {f"x{i}": sampler(rng, shape) for i, (shape, sampler) in enumerate(zip(shapes, samplers))}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_builtin_op_three_methods_agree(client, rng, case):
    f = client.register(build(case))
    report = f.crosscheck(point(rng, case))
    ran = {m.method for m in report.methods if m.ran}
    expected = set(REAL_METHODS)
    if any(n.op in ("argmax", "argmin") for n in build(case).to_proto().nodes):
        # An index the data picks has no element-level form: SymPy is not run, and says why.
        assert "'arg" in report.method("symbolic").detail and "element-level form" in report.method("symbolic").detail
        expected.discard("symbolic")
    assert expected <= ran, report
    assert report.passed, report
    assert not report.localized and not report.suspects
    # Every method returns the full Jacobian block: output shape + input shape.
    out_shape = f.output_specs["out"].shape
    for m in report.methods:
        for (output, x), block in m.blocks.items():
            assert block.shape == out_shape + f.input_specs[x].shape


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_det_by_minors_three_methods_agree(client, rng, n):
    f = client.register(det_graph(n))
    a = rng.normal(size=(n, n))
    report = f.crosscheck({"A": a}, richardson=True)
    assert report.passed, report
    assert {m.method for m in report.methods if m.ran} == REAL_METHODS | {"complex_step"}
    expected = np.linalg.det(a) * np.linalg.inv(a).T
    for m in report.methods:
        np.testing.assert_allclose(m.blocks["det", "A"], expected, rtol=1e-6, atol=1e-8, err_msg=m.method)
    symbolic = report.method("symbolic").blocks["det", "A"]
    np.testing.assert_allclose(report.method("reverse").blocks["det", "A"], symbolic, rtol=1e-12, atol=1e-12)


def softclip_np(x):
    return np.log1p(np.exp(x)) - np.log1p(np.exp(x - 1))


# id, operands, expression, a wrong derivative, the right one (None: let SymPy derive it)
RULES = [
    ("softclip", ["x"], "log(1 + exp(x)) - log(1 + exp(x - 1))", {"x": "2*x"},
     {"x": "exp(x)/(1 + exp(x)) - exp(x - 1)/(1 + exp(x - 1))"}),
    ("softclip-derived", ["x"], "log(1 + exp(x)) - log(1 + exp(x - 1))", {"x": "sigmoid(x)"}, None),
    ("xsiny-wrong-y", ["x", "y"], "x * sin(y)", {"y": "-x * cos(y)"}, {"x": "sin(y)", "y": "x * cos(y)"}),
    ("swish-off-by-factor", ["x"], "x * sigmoid(x)", {"x": "sigmoid(x) * (1 + x * (1 - sigmoid(x))) * 1.01"},
     {"x": "sigmoid(x) * (1 + x * (1 - sigmoid(x)))"}),
    ("ratio-sign-error", ["a", "b"], "a / b", {"b": "a / b**2"}, {"b": "-a / b**2"}),
]


def network(rule, grads):
    """The custom op inside a small network, so the error has to travel through other nodes."""
    _, operands, expression, _, _ = rule
    g = sg.Graph()
    x, w = g.input("x", (3,)), g.input("w", (3, 2))
    op = g.op("userop", operands, expression, grads=grads)
    h = sg.tanh(x @ w)  # (2,)
    args = [h, h * 0.5 + 1.5][: len(operands)]
    g.output("loss", sg.sum(op(*args, name="the_custom_node") ** 2))
    g.output("aux", sg.exp(-h))
    return g


@pytest.mark.parametrize("rule", RULES, ids=[r[0] for r in RULES])
def test_wrong_derivative_is_caught_and_localised(client, rng, rule):
    values = {"x": rng.normal(size=3), "w": rng.normal(size=(3, 2))}
    wrong = client.register(network(rule, rule[3])).crosscheck(values)
    assert not wrong.passed, wrong
    assert wrong.localized and wrong.suspects == ("the_custom_node",), wrong
    failing = {(c.method, c.reference) for c in wrong.comparisons if not c.passed}
    assert failing == {("reverse", "symbolic"), ("reverse", "finite_difference"), ("reverse", "complex_step")} & \
        {(c.method, c.reference) for c in wrong.comparisons}
    (bad,) = [c for c in wrong.node_checks if not c.passed]
    assert bad.node == "the_custom_node" and bad.op == "userop" and bad.checked
    assert "the_custom_node" in str(wrong) and "FAILED" in str(wrong)
    right = client.register(network(rule, rule[4])).crosscheck(values)
    assert right.passed, right
    assert "PASSED" in str(right)


def test_localisation_on_request_and_report_contents(client, rng):
    f = client.register(network(RULES[0], None))
    report = f.crosscheck({"x": rng.normal(size=3), "w": rng.normal(size=(3, 2))}, localize=True, wrt="x",
                          outputs="loss", methods=["reverse", "finite_difference"], atol=1e-6, rtol=1e-4, step=1e-5)
    assert report.passed and report.localized and not report.suspects
    assert [m.method for m in report.methods] == ["reverse", "finite_difference"]
    assert report.atol == 1e-6 and report.rtol == 1e-4
    assert {n.node for n in report.node_checks} >= {"the_custom_node"}
    assert all(n.checked and n.passed for n in report.node_checks)
    (comparison,) = report.comparisons
    (block,) = comparison.blocks
    assert (block.output, block.input) == ("loss", "x") and block.abs_error.shape == (3,)
    assert "h = 1e-05" in report.method("finite_difference").detail


def test_complex_step_only_where_every_op_is_analytic(client, rng):
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("out", sg.sum(sg.abs(x) * sg.sin(x)))
    report = client.register(g).crosscheck({"x": rng.uniform(0.5, 1.0, size=3)})
    cs = report.method("complex_step")
    assert not cs.ran and "abs" in cs.detail and report.passed


def test_tolerances_decide(client, rng):
    g = sg.Graph()
    x = g.input("x", (2,))
    g.output("out", sg.sum(sg.exp(x)))
    f = client.register(g)
    values = {"x": rng.normal(size=2)}
    assert f.crosscheck(values, methods=["reverse", "finite_difference"]).passed
    # A huge step and no tolerance: finite differences are visibly off.
    report = f.crosscheck(values, methods=["reverse", "finite_difference"], step=0.1, atol=0, rtol=0)
    assert not report.passed and report.comparisons[0].max_rel_error > 1e-4
    assert report.localized  # (with no tolerance at all, the node-level differences disagree too)


def _scalar_graph():
    g = sg.Graph()
    x = g.input("x", (2,))
    n = g.input("n", (2,), "int64")
    g.output("out", sg.sum(sg.abs(x) * x))
    g.output("count", n * 2)
    return g


@pytest.mark.parametrize("kwargs,error,match", [
    ({"methods": ["magic"]}, sg.InvalidArgument, "unknown cross-check method 'magic'"),
    ({"methods": ["path_enumeration"]}, sg.InvalidArgument, "other kind of semiring"),
    ({"methods": ["reverse"]}, sg.InvalidArgument, "at least two methods"),
    ({"methods": ["reverse", "complex_step"]}, sg.FailedPrecondition, "not analytic"),
    ({"atol": -1}, sg.InvalidArgument, "atol"),
    ({"rtol": float("nan")}, sg.InvalidArgument, "rtol"),
    ({"step": 2.0}, sg.InvalidArgument, "step"),
    ({"outputs": "count"}, sg.InvalidArgument, "cannot be differentiated"),
    ({"wrt": "n"}, sg.InvalidArgument, "only float inputs"),
    ({"semiring": "nonesuch"}, sg.FailedPrecondition, "unknown semiring"),
])
def test_bad_requests(client, kwargs, error, match):
    f = client.register(_scalar_graph())
    with pytest.raises(error, match=match):
        f.crosscheck({"x": [1.0, 2.0], "n": [1, 2]}, **kwargs)


def test_one_point_only(client):
    f = client.register(_scalar_graph())
    with pytest.raises(sg.InvalidArgument, match="one point"):
        f.crosscheck({"x": np.ones((3, 2)), "n": [1, 2]})
    assert f.crosscheck({"x": [1.0, 2.0], "n": [1, 2]}).passed  # int inputs and outputs are left out


def test_symbolic_past_its_limit_is_a_clear_failed_precondition(client, rng):
    g = sg.Graph()
    a = g.input("a", (40, 40))
    b = g.input("b", (40, 40))
    g.output("out", sg.sum((a @ b) @ a))
    f = client.register(g)
    values = {"a": rng.normal(size=(40, 40)), "b": rng.normal(size=(40, 40))}
    with pytest.raises(sg.FailedPrecondition, match="symbolic"):
        f.crosscheck(values)
    report = f.crosscheck(values, methods=["reverse", "finite_difference"])  # without it, it runs
    assert report.passed, report


def test_full_jacobian_past_its_limit(client):
    g = sg.Graph()
    x = g.input("x", (2000,))
    g.output("out", sg.exp(x))
    with pytest.raises(sg.FailedPrecondition, match="Jacobian"):
        client.register(g).crosscheck({"x": np.zeros(2000)}, methods=["reverse", "finite_difference"])
