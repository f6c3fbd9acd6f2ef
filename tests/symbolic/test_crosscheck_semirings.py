"""CrossCheck under semirings other than the real one: the backward pass's path sums against
brute-force path enumeration, same report shape; graphs with too many paths are refused."""

from __future__ import annotations

import pytest
import semigrad as sg
from reference import det_graph


def _semirings(client) -> list[tuple[str, dict]]:
    out = []
    for s in client.list_semirings():
        if s.status == "ok" and s.name != "real":
            out.append((s.name, {}))
            if "k" in s.parameters:
                out.append((s.name, {"k": 2}))
    return out


def composite():
    g = sg.Graph()
    x, w = g.input("x", (3,)), g.input("w", (3, 2))
    h = sg.tanh(x @ w)  # matmul: a semiring matmul in the backward pass
    clip = g.op("softclip", ["x"], "log(1 + exp(x)) - log(1 + exp(x - 1))")
    y = clip(h) * x[:2] + sg.broadcast_to(sg.sum(x), (2,))  # broadcasting undone by a ⊕-reduce
    g.output("y", y)
    g.output("z", sg.max(sg.stack([x, x * x]), axis=0))
    return g


def det3():
    return det_graph(3)


GRAPHS = {"composite": (composite, lambda rng: {"x": rng.normal(size=3), "w": rng.normal(size=(3, 2))}),
          "det3": (det3, lambda rng: {"A": rng.normal(size=(3, 3))})}


@pytest.mark.parametrize("graph", GRAPHS, ids=list(GRAPHS))
def test_backward_pass_matches_path_enumeration(client, rng, graph):
    build, sample = GRAPHS[graph]
    f = client.register(build())
    values = sample(rng)
    semirings = _semirings(client)
    assert {"log", "counting", "max_product"} <= {name for name, _ in semirings}
    for name, params in semirings:
        report = f.crosscheck(values, semiring=name, semiring_params=params)
        assert report.passed, report
        assert [m.method for m in report.methods] == ["reverse", "path_enumeration"]
        (comparison,) = report.comparisons
        assert (comparison.method, comparison.reference) == ("reverse", "path_enumeration")
        for (output, x), block in report.method("reverse").blocks.items():
            assert block.shape == f.input_specs[x].shape  # per input element: the path sum to the output
        assert report.semiring.startswith(name)


def test_counting_counts_paths(client, rng):
    """x*x is two paths; y = x*x + x has three from x to y."""
    g = sg.Graph()
    x = g.input("x", ())
    g.output("y", x * x + x)
    report = client.register(g).crosscheck({"x": rng.uniform(0.5, 1.0)}, semiring="counting")
    assert report.passed
    assert float(report.method("path_enumeration").blocks["y", "x"]) == 3.0


def test_too_many_paths_is_a_failed_precondition(client):
    g = sg.Graph()
    y = g.input("x", ())
    for _ in range(20):  # 2**20 paths
        y = y + y
    g.output("y", y)
    f = client.register(g)
    with pytest.raises(sg.FailedPrecondition, match="paths"):
        f.crosscheck({"x": 1.0}, semiring="counting")
    assert float(f.gradient({"x": 1.0}, semiring="counting")["x"]) == 2.0 ** 20


def test_methods_for_the_other_kind_are_refused(client, rng):
    f = client.register(det3())
    with pytest.raises(sg.InvalidArgument, match="other kind of semiring"):
        f.crosscheck({"A": rng.normal(size=(3, 3))}, semiring="log", methods=["reverse", "symbolic"])
