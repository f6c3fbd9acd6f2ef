"""Every semiring against brute-force path enumeration, on random small graphs with batch dims.

The graphs, their values, their element-level edges and local partials, and the enumeration
of paths come from tests/path_reference.py, which shares no code with the server's backward
pass: for each input element the expected result is ⊕ over the enumerated paths of
φ(∂₁) ⊗ φ(∂₂) ⊗ …, folded with the plugin semiring objects' own add, mul, lift and ones.
On the same graphs: the real semiring is the ordinary gradient (central differences of the
interpreter), the invariants between semirings hold, and best paths are valid paths whose
recomputed product is the returned value.
"""

from __future__ import annotations

import math
import os
from importlib import metadata

import numpy as np
import pytest
from path_reference import finite_difference, over_paths, random_case

from semigrad_server.engine import Engine
from semigrad_server.semiring.loader import GROUP
from semigrad_server.service.convert import graph_from_proto

# SEMIGRAD_PATH_SEEDS=500 pytest tests/semirings/test_path_enumeration.py: a deeper sweep.
SEEDS = list(range(int(os.environ.get("SEMIGRAD_PATH_SEEDS", "32"))))
CONFIGS = [("real", {}), ("max_product", {}), ("log", {}), ("entropy", {}), ("kbest", {"k": 3}),
           ("kbest", {"k": 1}), ("boolean", {}), ("counting", {}), ("maxplus", {}), ("minplus", {}),
           ("bottleneck", {}), ("signed_max_product", {}),
           ("log_entropy", {}), ("log_counting", {}), ("log_signed_max_product", {})]
CONFIG_IDS = [name + "".join(f"-{k}={v}" for k, v in params.items()) for name, params in CONFIGS]
SELECTIVE = ["max_product", "boolean", "maxplus", "minplus", "bottleneck"]

_CASES: dict = {}
_SEMIRINGS: dict = {}


def case(seed: int):
    if seed not in _CASES:
        _CASES[seed] = random_case(seed)
    return _CASES[seed]


def semiring(name: str, params: dict):
    """The plugin's own semiring object, loaded straight from its entry point."""
    key = (name, tuple(sorted(params.items())))
    if key not in _SEMIRINGS:
        (ep,) = [ep for ep in metadata.entry_points(group=GROUP) if ep.name == name]
        obj = ep.load()
        _SEMIRINGS[key] = (obj() if isinstance(obj, type) else obj).configure(params)
    return _SEMIRINGS[key]


BACKENDS = ["auto", "tensor"]  # auto: small graphs run as scalar programs


class Result:
    """A gradient answer: `grads[x]`, `components[x][name]`, `best_paths`."""

    def __init__(self, grads, components, best_paths=()):
        self.grads, self.components, self.best_paths = grads, components, list(best_paths)

    def __getitem__(self, x):
        return self.grads[x]


@pytest.fixture(scope="module")
def served(client):
    """served(seed, name, params, backend) -> the server's answer, memoised. "auto" goes through
    the gRPC client (small graphs run as scalar programs); "tensor" asks an in-process Engine
    for its tensor plan, so both executors are checked."""
    graphs, results, engine = {}, {}, Engine()

    def run(seed: int, name: str, params: dict | None = None, backend: str = "auto", best_path=None):
        key = (seed, name, tuple(sorted((params or {}).items())), backend, best_path is not None)
        if key not in results:
            c = case(seed)
            if seed not in graphs:
                graphs[seed] = client.register(c.graph.client_graph())
            if backend == "auto":
                g = graphs[seed].gradient(c.inputs, seeds=c.seeds or None, semiring=name,
                                          semiring_params=params or None, return_components=True,
                                          best_path=best_path)
                results[key] = Result(dict(g), g.components, g.best_paths)
            else:
                if ("engine", seed) not in graphs:
                    graphs["engine", seed] = engine.register(graph_from_proto(graphs[seed].graph))[0].id
                gid = graphs["engine", seed]
                r = engine.gradient(gid, c.inputs, seeds=c.seeds, semiring=name, semiring_params=params,
                                    return_components=True, backend=backend)
                results[key] = Result(r.gradients, r.components)
        return results[key]

    run.graph = lambda seed: graphs[seed] if seed in graphs else (run(seed, "real"), graphs[seed])[1]
    return run


def elements(c):
    """(batch item, input name, flat element, full index) for every input element of every item."""
    for b in c.items():
        for name, shape in c.graph.inputs.items():
            for flat in range(math.prod(shape)):
                yield b, name, flat, tuple(b) + tuple(int(i) for i in np.unravel_index(flat, shape))


def paths_of(c, name, flat):
    return [c.path_index(p) for p in c.graph.paths(name, flat)]


def abs_sum_and_count(c, partials, paths):
    """Σ_paths Π|∂| and the number of paths whose partials are all non-zero."""
    weights = [math.prod(abs(partials[e]) for e in p) for p in paths]
    return sum(weights), sum(w != 0 for w in weights), weights


# ---------------------------------------------------------------- exactness


def test_the_generator_covers_the_ops_and_features():
    cases = [case(seed) for seed in SEEDS]
    ops = {n.op for c in cases for n in c.graph.nodes}
    assert {"add", "sub", "mul", "div", "sin", "tanh", "exp", "square", "matmul", "sum", "mean", "max", "index",
            "transpose", "reshape", "broadcast_to", "concat", "stack", "where"} <= ops, ops
    assert sum(bool(c.batch) for c in cases) >= len(cases) // 3  # batch dims
    assert sum(bool(c.seeds) for c in cases) >= len(cases) // 4  # explicit seeds
    assert any(n.op in ("add", "mul", "sub") and n.inputs[0] == n.inputs[1] for c in cases for n in c.graph.nodes)
    assert any(len(c.graph.outputs) > 1 for c in cases)
    broadcasting = [n for c in cases for n in c.graph.nodes if n.op in ("add", "sub", "mul", "div")
                    and any(c.graph.shape(r) != n.shape for r in n.inputs)]
    assert broadcasting
    matmul_ranks = [[len(c.graph.shape(r)) for r in n.inputs] for c in cases for n in c.graph.nodes if n.op == "matmul"]
    assert any(3 in ranks for ranks in matmul_ranks) and any(1 in ranks for ranks in matmul_ranks)
    counts = [len(c.graph.paths(name, flat)) for c in cases for _, name, flat, _ in elements(c)]
    assert max(counts) >= 20 and 0 in counts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,params", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_semiring_equals_path_enumeration(served, seed, name, params, backend):
    c = case(seed)
    s = semiring(name, params)
    grads = served(seed, name, params, backend)
    for b in c.items():
        _, partials = c.item_partials(b)
        for _, x, flat, full in (e for e in elements(c) if e[0] == b):
            paths = paths_of(c, x, flat)
            want = s.read(over_paths(s, paths, partials))
            got = {k: np.asarray(v)[full] for k, v in grads.components[x].items()}
            where = (f"seed {seed}, {name}{params or ''} ({backend}), d/d{x}{list(full)} over {len(paths)} paths\n"
                     f"{c.graph.describe()}")
            assert set(got) == set(want), where
            scale = 1 + abs_sum_and_count(c, partials, paths)[0] if name == "real" else 1
            for key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=1e-9, atol=1e-12 * scale,
                                           err_msg=f"{key}: {where}")
            assert np.asarray(grads[x])[full] == got[s.primary], where


@pytest.mark.parametrize("seed", SEEDS)
def test_real_semiring_is_the_ordinary_gradient(served, seed):
    """The forward values match the interpreter, and the real semiring's result is the gradient
    of Σ seed·output by central differences (on graphs without max or where, which have kinks)."""
    c = case(seed)
    f = served.graph(seed)
    nodes = [n.id for n in c.graph.nodes if n.op != "const"]
    evaluated = f.evaluate(c.inputs, nodes=nodes)
    for b in c.items():
        values = c.graph.forward(c.item(b))
        for ref in nodes:
            np.testing.assert_allclose(np.broadcast_to(evaluated[ref], c.batch + values[ref].shape)[b], values[ref],
                                       rtol=1e-12, atol=1e-14, err_msg=f"seed {seed}: {ref}")
    default = f.gradient(c.inputs, seeds=c.seeds or None)  # no semiring given: "real"
    real = served(seed, "real")
    for x in c.graph.inputs:
        np.testing.assert_array_equal(default[x], real[x])
        np.testing.assert_allclose(served(seed, "real", {}, "tensor")[x], real[x], rtol=1e-12, atol=1e-14)
    if any(n.op in ("max", "where") for n in c.graph.nodes):
        return
    for b in c.items():
        for x in c.graph.inputs:
            np.testing.assert_allclose(np.asarray(real[x])[b], finite_difference(c, b, x), rtol=1e-5, atol=1e-6,
                                       err_msg=f"seed {seed}, d/d{x}, item {b}\n{c.graph.describe()}")


# ---------------------------------------------------------------- invariants


@pytest.mark.parametrize("seed", SEEDS)
def test_invariants_between_semirings(served, seed):
    c = case(seed)
    got = {name + str(params.get("k", "")): served(seed, name, params) for name, params in CONFIGS}
    for b, x, flat, full in elements(c):
        _, partials = c.item_partials(b)
        paths = paths_of(c, x, flat)
        abs_sum, count, weights = abs_sum_and_count(c, partials, paths)
        where = f"seed {seed}, d/d{x}{list(full)}, {count} non-zero paths of {len(paths)}"
        value = {key: float(np.asarray(g[x])[full]) for key, g in got.items()}
        tol = 1e-9 * (1 + abs_sum)
        assert abs(value["real"]) <= abs_sum + tol, where
        assert math.exp(value["log"]) == pytest.approx(abs_sum, rel=1e-9, abs=1e-300), where
        assert value["max_product"] <= abs_sum + tol, where
        assert value["max_product"] == pytest.approx(max(weights, default=0.0), rel=1e-12, abs=1e-300), where
        assert value["kbest3"] == value["max_product"] == value["kbest1"], where
        top3 = sorted(weights, reverse=True)[:3] + [0.0] * 3
        np.testing.assert_allclose(np.asarray(got["kbest3"].components[x]["kbest"])[full], top3[:3], rtol=1e-12,
                                   err_msg=where)
        assert value["counting"] == count, where
        assert value["boolean"] == (count > 0), where
        assert math.exp(value["maxplus"]) == pytest.approx(value["max_product"], rel=1e-12), where
        weakest = min((w for w in weights if w), default=math.inf)
        assert math.exp(value["minplus"]) == pytest.approx(weakest, rel=1e-12), where
        signed = {key: float(np.asarray(v)[full]) for key, v in got["signed_max_product"].components[x].items()}
        products = [math.prod(partials[e] for e in p) for p in paths]
        products = [w for w, a in zip(products, weights) if a]  # paths with only non-zero partials
        assert signed == {"max": pytest.approx(max(products, default=-math.inf), rel=1e-12, abs=1e-300),
                          "min": pytest.approx(min(products, default=math.inf), rel=1e-12, abs=1e-300)}, where
        if products:
            assert max(abs(signed["max"]), abs(signed["min"])) == pytest.approx(value["max_product"], rel=1e-12), where
        logged = {key: float(np.asarray(v)[full]) for key, v in got["log_signed_max_product"].components[x].items()}
        assert logged["max"] == pytest.approx(signed["max"], rel=1e-12, abs=1e-300), where
        assert logged["min"] == pytest.approx(signed["min"], rel=1e-12, abs=1e-300), where
        if products:
            assert logged["sign_max"] * math.exp(logged["log_abs_max"]) == pytest.approx(max(products), rel=1e-12)
            assert logged["sign_min"] * math.exp(logged["log_abs_min"]) == pytest.approx(min(products), rel=1e-12)
        entropy = value["entropy"]
        assert value["log_entropy"] == pytest.approx(entropy, rel=1e-9, abs=1e-9), where
        assert math.exp(value["log_counting"]) == pytest.approx(count, rel=1e-12, abs=0), where
        assert 0.0 <= entropy <= math.log(max(count, 1)) + 1e-9, where
        if count == 1:
            assert entropy == pytest.approx(0.0, abs=1e-12), where
        z = float(np.asarray(got["entropy"].components[x]["Z"])[full])
        assert z == pytest.approx(abs_sum, rel=1e-9, abs=1e-300), where
        if count:
            p = np.array([w for w in weights if w]) / abs_sum
            assert entropy == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-8, abs=1e-10), where


# ---------------------------------------------------------------- best paths


@pytest.mark.parametrize("name", SELECTIVE)
@pytest.mark.parametrize("seed", SEEDS)
def test_best_paths_are_valid_and_reproduce_the_value(served, seed, name):
    c = case(seed)
    s = semiring(name, {})
    every = list(elements(c))
    grads = served(seed, name, {}, best_path=tuple((x, full) for _, x, _, full in every))
    assert len(grads.best_paths) == len(every)
    outputs_of = {ref: out for out, ref in c.graph.outputs.items()}
    for (b, x, flat, full), path in zip(every, grads.best_paths):
        where = f"seed {seed}, {name}, from {x}{list(full)}: {path}\n{c.graph.describe()}"
        _, partials = c.item_partials(b)
        value = np.asarray(grads[x])[full]
        assert path.start == (x, full), where
        assert path.value == {s.primary: pytest.approx(float(value), rel=1e-12)}, where
        if not c.graph.paths(x, flat) or np.all(s.equal(value, s.zeros(()))):
            assert path.steps == () and path.output == "", where
            continue
        assert (path.steps[0].node, path.steps[0].index, path.steps[0].partial) == (x, full[len(b):], 1.0), where
        trail, ref, element = [], x, flat
        for step in path.steps[1:]:
            to = int(np.ravel_multi_index(step.index, c.graph.shape(step.node))) if step.index else 0
            candidates = [e for e, edge in enumerate(c.graph.edge_list)
                          if (edge.src, edge.inp, edge.node, edge.out) == (ref, element, step.node, to)
                          and partials[e] == pytest.approx(step.partial, rel=1e-12, abs=1e-300)]
            assert candidates, f"step {step} is not an edge of the graph: {where}"
            trail.append(candidates[0])
            ref, element = step.node, to
        assert ref in outputs_of and path.output == outputs_of[ref], where
        full_path = c.path_index((tuple(trail), path.output, element))
        assert np.all(s.equal(over_paths(s, [full_path], partials), value)), where
        if name == "max_product":
            product = math.prod(abs(partials[e]) for e in full_path)
            assert product == pytest.approx(float(value), rel=1e-12), where
