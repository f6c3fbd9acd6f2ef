"""Best paths read from back-pointers, against independent brute force.

* `best_path="all"` and `top_paths=k` on the random graphs of tests/path_reference.py (with
  batch dimensions and seeds), remote and in process: each path is a path of the graph (its
  steps are enumerated edges with the same partials), its value is the best over every
  enumerated path, and where one step sequence is best by a clear margin it is that one.
* The op table (tests/test_op_gradients.py: CASES): for every single-op case, the best path
  of each input element under max_product is the output element of largest |∂out/∂x|, from
  central differences of the case's NumPy function.
* The tie-break rule of docs/semirings.md on exact ties, and the bounds (max_path_steps,
  top_paths' range) on both sides.
"""

from __future__ import annotations

import math
import re

import grpc
import numpy as np
import pytest
from path_reference import random_case
from test_op_gradients import CASES, build

import semigrad as sg
from semigrad import codec
from semigrad_server.engine import Engine
from semigrad_server.errors import InvalidArgument, ResourceExhausted
from semigrad_server.limits import Limits
from semigrad_server.service.convert import graph_from_proto

SEEDS = list(range(32))
_CASES: dict = {}
COMPARED: dict = {}  # seed -> paths compared step by step with a unique brute-force best


def case(seed: int):
    if seed not in _CASES:
        _CASES[seed] = random_case(seed)
    return _CASES[seed]


def enumerated(c, b, name: str, flat: int):
    """Every path from input element (item b, name, flat): (|product| of its partials, its step
    sequence [(node, flat element)], the output it reaches), brute force."""
    _, partials = c.item_partials(b)
    out = []
    for trail, output, element in c.graph.paths(name, flat):
        index = c.path_index((trail, output, element))
        value = math.prod(abs(partials[e]) for e in index)
        steps = tuple((c.graph.edge_list[e].node, c.graph.edge_list[e].out) for e in trail)
        out.append((value, steps, output))
    return out


def flat_of(c, step):
    shape = c.graph.shape(step.node)
    return int(np.ravel_multi_index(step.index, shape)) if step.index else 0


def check_path(c, b, path, paths, where):
    """`path` (a BestPath) is one of the enumerated `paths` with its value."""
    got = tuple((s.node, flat_of(c, s)) for s in path.steps[1:])
    candidates = [v for v, steps, output in paths if steps == got and output == path.output]
    assert candidates, f"not a path of the graph: {path} {where}"
    assert any(v == pytest.approx(path.value["value"], rel=1e-9, abs=1e-300) for v in candidates), where


def unique_best(paths):
    """The step sequence and output of the best path when every path within 1e-9 of the best
    value takes it; None on (near) ties."""
    best = max(v for v, _, _ in paths)
    top = {(steps, output) for v, steps, output in paths if v >= best * (1 - 1e-9)}
    return next(iter(top)) if len(top) == 1 else None


@pytest.mark.parametrize("seed", SEEDS)
def test_every_elements_best_path_is_the_brute_force_best(client, seed):
    check_all_paths(client, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_top_paths_are_the_brute_force_k_best_of_the_whole_graph(client, seed):
    check_top_paths(client, seed)


@pytest.mark.parametrize("seed", SEEDS[:6])
def test_in_process_paths_are_the_brute_force_ones_too(in_process_client, seed):
    check_all_paths(in_process_client, seed)
    check_top_paths(in_process_client, seed)


def check_all_paths(client, seed):
    c = case(seed)
    f = client.register(c.graph.client_graph())
    grads = f.gradient(c.inputs, seeds=c.seeds or None, semiring="max_product", best_path="all")
    check_columns(grads.best_paths, bool(c.seeds))
    expected_starts = [(x, tuple(b) + tuple(int(i) for i in np.unravel_index(flat, shape)))
                       for x, shape in c.graph.inputs.items() for b in c.items()
                       for flat in range(math.prod(shape))]
    assert sorted(p.start for p in grads.best_paths) == sorted(expected_starts)
    assert [p.start for p in grads.best_paths] == sorted(expected_starts, key=lambda s: (
        list(c.graph.inputs).index(s[0]), s[1]))  # input by input, row-major full index
    compared = 0
    for path in grads.best_paths:
        x, full = path.start
        b = full[:len(c.batch)]
        flat = int(np.ravel_multi_index(full[len(c.batch):], c.graph.inputs[x])) if c.graph.inputs[x] else 0
        paths = enumerated(c, b, x, flat)
        where = f"seed {seed} from {x}{list(full)}\n{c.graph.describe()}"
        best = max((v for v, _, _ in paths), default=0.0)
        assert path.value["value"] == pytest.approx(best, rel=1e-9, abs=1e-300), where
        if best == 0.0:
            assert path.steps == () and path.output == "", where
            continue
        assert (path.steps[0].node, path.steps[0].index) == (x, full[len(b):]), where
        check_path(c, b, path, paths, where)
        want = unique_best(paths)
        if want is not None:
            got = tuple((s.node, flat_of(c, s)) for s in path.steps[1:])
            assert (got, path.output) == want, where
            compared += 1
    COMPARED[seed] = compared


def check_columns(paths: sg.BestPaths, seeded: bool):
    """The columns the paths came as read the same path by path (`paths[i]`) as all at once
    (iteration), and without seeds each path's partials multiply to its value (max_product: |∂|
    products; a seed's value at the path's output element is a factor no step shows)."""
    assert isinstance(paths, sg.BestPaths)
    one_by_one = [paths[i] for i in range(len(paths))]
    assert one_by_one == list(paths)
    assert paths.step_start[0] == 0 and paths.step_start[-1] == len(paths.step_node) == len(paths.step_partial)
    for i, path in enumerate(one_by_one):
        rows = paths.step_partial[paths.steps_of(i)]
        assert [s.partial for s in path.steps] == rows.tolist()
        assert paths.nodes[paths.input[i]] == path.start[0]
        if path.steps and not seeded:
            assert path.value["value"] == pytest.approx(math.prod(np.abs(rows).tolist()), rel=1e-12)


def check_top_paths(client, seed):
    c = case(seed)
    k = 5
    f = client.register(c.graph.client_graph())
    first = f.gradient(c.inputs, seeds=c.seeds or None, semiring="max_product", top_paths=k)
    # asked again: the plan's pass now pruned by what the first answer taught it (semiring/pruning.py)
    grads = f.gradient(c.inputs, seeds=c.seeds or None, semiring="max_product", top_paths=k)
    assert grads.best_paths == first.best_paths
    check_columns(grads.best_paths, bool(c.seeds))
    every = []  # (value, item, input, flat, steps, output) of every path of the graph
    for b in c.items():
        for x, shape in c.graph.inputs.items():
            for flat in range(math.prod(shape)):
                every += [(v, b, x, flat, steps, out) for v, steps, out in enumerated(c, b, x, flat) if v != 0]
    values = sorted((e[0] for e in every), reverse=True)[:k]
    where = f"seed {seed}\n{c.graph.describe()}"
    assert [p.value["value"] for p in grads.best_paths] == pytest.approx(values, rel=1e-9, abs=1e-300), where
    for path in grads.best_paths:
        x, full = path.start
        b = full[:len(c.batch)]
        flat = int(np.ravel_multi_index(full[len(c.batch):], c.graph.inputs[x])) if c.graph.inputs[x] else 0
        check_path(c, b, path, enumerated(c, b, x, flat), where)


def test_the_generated_graphs_cover_batches_seeds_and_the_reference_ops():
    """(Runs after the path tests: most elements' best paths were compared step by step.)"""
    if COMPARED:
        assert sum(COMPARED.values()) >= 20, COMPARED
    cases = [case(s) for s in SEEDS]
    assert sum(bool(c.batch) for c in cases) >= 4 and sum(bool(c.seeds) for c in cases) >= 4
    ops = {n.op for c in cases for n in c.graph.nodes}
    assert {"matmul", "sum", "max", "index", "transpose", "broadcast_to", "concat", "stack", "reshape", "where", "mul"} <= ops, ops


# ---------------------------------------------------------------- every op with a semiring adjoint

SINGLE_OP = [case for case in CASES
             if sum(n.op not in ("const",) for n in build(case).to_proto().nodes) == 1]


def jacobian(case, inputs, x):
    """J[j, i] = ∂out[j]/∂x[i] of one item by central differences of the case's NumPy function."""
    _, _, reference, shapes, _ = case
    names = list(inputs)
    base = {k: np.asarray(v, dtype=np.float64) if v.dtype.kind == "f" else v for k, v in inputs.items()}
    point = base[x]
    cols = []
    for i in range(point.size):
        h = 1e-6 * max(1.0, abs(point.flat[i]))
        plus, minus = point.copy(), point.copy()
        plus.flat[i] += h
        minus.flat[i] -= h
        f = lambda v: np.asarray(reference(*[v if n == x else base[n] for n in names]), dtype=np.float64)  # noqa: E731
        cols.append(((f(plus) - f(minus)) / (2 * h)).reshape(-1))
    return np.stack(cols, axis=1)


def test_the_op_table_has_single_op_cases_of_every_kind():
    names = {case[0].split("-")[0] for case in SINGLE_OP}
    assert {"matmul", "softmax", "layer_norm", "conv2d", "max_pool2d", "avg_pool1d", "gather", "scatter_add",
            "einsum", "logsumexp", "concat", "stack", "slice"} <= names | {"matmul"}, names


@pytest.mark.parametrize("case", SINGLE_OP, ids=[c[0] for c in SINGLE_OP])
def test_each_op_reports_its_winner(client, case):
    rng = np.random.default_rng(7)
    _, _, reference, shapes, samplers = case
    inputs = {f"x{i}": sampler(rng, shape) for i, (shape, sampler) in enumerate(zip(shapes, samplers))}
    f = client.register(build(case))
    grads = f.gradient(inputs, semiring="max_product", best_path="all")
    out_shape = np.shape(reference(*inputs.values()))
    by_start = {p.start: p for p in grads.best_paths}
    floats = [x for x, v in inputs.items() if v.dtype.kind == "f"]
    assert len(by_start) == sum(inputs[x].size for x in floats)
    for x in floats:
        column_abs = np.abs(jacobian(case, inputs, x))
        for i in range(inputs[x].size):
            index = tuple(int(v) for v in np.unravel_index(i, inputs[x].shape))
            path = by_start[(x, index)]
            best = column_abs[:, i].max(initial=0.0)
            where = f"{case[0]}: from {x}{list(index)}: {path}, |J| column {column_abs[:, i]}"
            assert path.value["value"] == pytest.approx(best, rel=1e-5, abs=1e-7), where
            if best < 1e-7:
                continue
            assert len(path.steps) == 2 and path.output == "out", where
            j = int(np.ravel_multi_index(path.steps[1].index, out_shape)) if out_shape else 0
            assert column_abs[j, i] == pytest.approx(best, rel=1e-5), where
            assert abs(path.steps[1].partial) == pytest.approx(best, rel=1e-5), where
            runner_up = np.sort(column_abs[:, i])[-2] if column_abs.shape[0] > 1 else 0.0
            if runner_up < best * (1 - 1e-4):
                assert j == int(np.argmax(column_abs[:, i])), where


# ---------------------------------------------------------------- ties


def test_ties_go_to_the_earlier_consumer_then_the_smaller_element(client):
    """x feeds a = x * 2 (first in graph order) and b = x * 2 (same value); a's elements are
    then summed with equal weights. Every path from x has the product 2: the best path takes
    the earlier consumer a, and from a[1] the sum (one element, index ())."""
    g = sg.Graph()
    x = g.input("x", (3,))
    a = g.const(np.array([2.0, 2.0, 2.0]), name="two")
    first = sg.mul(x, a, name="first")
    second = sg.mul(x, a, name="second")
    g.output("y", sg.sum(sg.add(first, second, name="both"), name="total"))
    f = client.register(g)
    grads = f.gradient({"x": np.array([1.0, -1.0, 3.0])}, semiring="max_product", best_path=[("x", (1,))])
    (path,) = grads.best_paths
    assert [(s.node, s.index) for s in path.steps] == [("x", (1,)), ("first", (1,)), ("both", (1,)), ("total", ())]
    assert path.value["value"] == 2.0

    # Equal elements: broadcast x (1,) to (3,), then three equal partials into one max-reduced
    # output of a matmul: every path from x[0] has the same value; the smallest index wins.
    g = sg.Graph()
    x = g.input("x", (1,))
    spread = sg.broadcast_to(x, (3,), name="spread")
    g.output("y", sg.mul(spread, spread, name="sq"))
    f = client.register(g)
    grads = f.gradient({"x": np.array([1.5])}, semiring="max_product", best_path="all")
    (path,) = grads.best_paths
    assert [(s.node, s.index) for s in path.steps] == [("x", (0,)), ("spread", (0,)), ("sq", (0,))]
    assert path.value["value"] == 1.5


def test_top_paths_break_ties_by_input_then_element(client):
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("y", sg.sum(x, name="total"))
    f = client.register(g)
    grads = f.gradient({"x": np.zeros(3)}, semiring="max_product", top_paths=2)
    assert [p.start for p in grads.best_paths] == [("x", (0,)), ("x", (1,))]
    assert [[(s.node, s.index) for s in p.steps] for p in grads.best_paths] == [
        [("x", (0,)), ("total", ())], [("x", (1,)), ("total", ())]]


# ---------------------------------------------------------------- bounds and refusals


def chain(depth: int, n: int) -> sg.Graph:
    g = sg.Graph()
    h = g.input("x", (n,))
    for i in range(depth):
        h = sg.tanh(h, name=f"t{i}")
    g.output("y", sg.sum(h, name="total"))
    return g


def test_max_path_steps_is_checked_before_work_on_both_sides():
    """Each path from x has 1 + depth + 1 steps: 4 paths × 6 steps = 24."""
    engine = Engine(limits=Limits(max_path_steps=24))
    gid = engine.register(graph_from_proto(chain(4, 4).to_proto()))[0].id
    point = {"x": np.array([0.1, 0.2, 0.3, 0.4])}
    result = engine.gradient(gid, point, semiring="max_product", best_paths="all")
    assert sum(len(p.steps) for p in result.best_paths) == 24
    assert engine.gradient(gid, point, semiring="max_product", top_paths=4).best_paths
    small = Engine(limits=Limits(max_path_steps=23))
    gid = small.register(graph_from_proto(chain(4, 4).to_proto()))[0].id
    for kwargs in ({"best_paths": "all"}, {"top_paths": 4}):
        with pytest.raises(Exception) as excinfo:
            small.gradient(gid, point, semiring="max_product", **kwargs)
        assert type(excinfo.value).__name__ == "ResourceExhausted", excinfo.value
        assert "max_path_steps = 23" in str(excinfo.value) and "'x'" in str(excinfo.value) or \
            "top_paths" in str(excinfo.value)


@pytest.mark.parametrize("start, message", [
    (("w", (0, 1)), "'w', which is not a differentiated input"),
    (("x", (0, 4)), "does not address an element of input 'x' (shape [2, 4]"),
    (("x", (1,)), "does not address an element"),
    (("x", (2, 0)), "does not address an element"),
])
def test_a_bad_start_is_refused_before_work(start, message):
    engine = Engine()
    gid = engine.register(graph_from_proto(chain(2, 4).to_proto()))[0].id
    plans = engine.get(gid).plans
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        engine.gradient(gid, {"x": np.ones((2, 4))}, semiring="max_product", best_paths=[("x", (1, 3)), start])
    assert len(plans) == 0  # refused before the gradient's plan was compiled, let alone run
    assert len(engine.gradient(gid, {"x": np.ones((2, 4))}, semiring="max_product",
                               best_paths=[("x", (1, 3)), ("x", (-1, -4))]).best_paths) == 2
    assert len(plans) == 1


def test_the_k_best_carriers_are_counted_before_work():
    """top_paths=k carries 3k arrays per semiring value: a request is checked against the limits with
    them counted (a 600 × 600 input with top_paths=64 had held 5 GB, past every limit)."""
    engine = Engine(limits=Limits(max_request_elements=200_000))
    gid = engine.register(graph_from_proto(chain(2, 1000).to_proto()))[0].id
    point = {"x": np.linspace(-1, 1, 1000)}
    assert len(engine.gradient(gid, point, semiring="max_product", top_paths=2).best_paths) == 2
    with pytest.raises(ResourceExhausted, match=r"limit is 200000.*\(top_paths = 64: 192 arrays per value"):
        engine.gradient(gid, point, semiring="max_product", top_paths=64)


def test_refusals_name_what_is_wrong(client):
    f = client.register(chain(1, 3))
    point = {"x": np.array([0.1, 0.2, 0.3])}
    with pytest.raises(sg.SemigradError) as excinfo:
        f.gradient(point, semiring="entropy", best_path="all")
    assert excinfo.value.code == grpc.StatusCode.FAILED_PRECONDITION and "selective" in excinfo.value.message
    with pytest.raises(sg.SemigradError) as excinfo:
        f.gradient(point, semiring="entropy", top_paths=2)
    assert excinfo.value.code == grpc.StatusCode.FAILED_PRECONDITION and "'entropy'" in excinfo.value.message
    for k in (65, -1):
        with pytest.raises(sg.SemigradError) as excinfo:
            f.gradient(point, semiring="max_product", top_paths=k)
        assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT and "top_paths" in excinfo.value.message
    assert len(f.gradient(point, semiring="max_product", top_paths=64).best_paths) == 3  # only 3 paths exist
    with pytest.raises(sg.SemigradError) as excinfo:
        f.gradient(point, semiring="max_product", top_paths=2, best_path=[("x", (0,))])
    assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(sg.InvalidArgument, match="best_path must be"):
        f.gradient(point, semiring="max_product", best_path="every")
    with pytest.raises(sg.InvalidArgument, match="top_paths is a whole number, got True"):
        f.gradient(point, semiring="max_product", top_paths=True)


@pytest.mark.parametrize("hook", [lambda g: 2 * g, sg.ServerHook("scale", factor=2.0),
                                  sg.ServerHook("record", kind="pre")], ids=["client", "scale", "record"])
@pytest.mark.parametrize("paths", [{"best_path": "all"}, {"best_path": [("x", (1,))]}, {"top_paths": 2}],
                         ids=["all", "list", "top"])
def test_hooks_are_refused_on_path_requests(client, hook, paths):
    """A hook changes contributions, which a path (a product of the graph's own partials) would not
    show: refused by name rather than applied to the back-pointers' ids and partials."""
    f = client.register(chain(2, 3))
    with pytest.raises(sg.InvalidArgument, match=r"hooks \(on 't0'\) cannot be combined with best_path or top_paths"):
        f.gradient({"x": np.array([0.1, 0.2, 0.3])}, semiring="max_product", hooks={"t0": hook}, **paths)


def test_a_nan_element_makes_no_top_paths(client):
    """x[0] is NaN, so its one path's product is NaN: no candidate, and no rank of it fills the list."""
    f = client.register(chain(2, 3))
    x = np.array([np.nan, 0.5, 1.0])
    top = f.gradient({"x": x}, semiring="max_product", top_paths=5).best_paths
    expected = (1 - np.tanh(np.tanh(x[1:])) ** 2) * (1 - np.tanh(x[1:]) ** 2)  # tanh(tanh(x))'
    assert [p.start for p in top] == [("x", (1,)), ("x", (2,))]
    assert [p.value["value"] for p in top] == pytest.approx(expected.tolist(), rel=1e-12)


def test_kbest_top_paths_rank_by_the_kbest_values(client):
    c = case(3)
    f = client.register(c.graph.client_graph())
    kb = f.gradient(c.inputs, seeds=c.seeds or None, semiring="kbest", semiring_params={"k": 4},
                    return_components=True)
    top = f.gradient(c.inputs, seeds=c.seeds or None, semiring="kbest", top_paths=4)
    every = np.sort(np.concatenate([kb.components[x]["kbest"].reshape(-1) for x in c.graph.inputs]))[::-1][:4]
    every = every[every > 0]
    assert [p.value["value"] for p in top.best_paths] == pytest.approx(every.tolist(), rel=1e-12)


@pytest.mark.parametrize("params", [None, {"k": 1}, {"k": 5}])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_kbest_answers_its_own_gradient_beside_its_top_paths(client, params, shape):
    g = sg.Graph()
    x = g.input("x", shape)
    g.output("y", sg.sum(sg.tanh(x * x) * 3.0 + x))
    f = client.register(g)
    point = {"x": np.array([[0.5, 0.2, -1.0], [2.0, -0.3, 0.0]])[:, :shape[0]] if shape else np.array([0.5, -1.5])}
    alone = f.gradient(point, semiring="kbest", semiring_params=params, return_components=True)
    for top_paths in (2, 7):
        both = f.gradient(point, semiring="kbest", semiring_params=params, return_components=True, top_paths=top_paths)
        np.testing.assert_array_equal(both["x"], alone["x"])
        assert both.components["x"].keys() == alone.components["x"].keys()
        for name, value in alone.components["x"].items():
            np.testing.assert_array_equal(both.components["x"][name], value)
        paths = int(np.sum(1 + 2 * (point["x"] != 0)))  # x*x: two paths (of value 0 at x = 0), + x: a third
        assert len(both.best_paths) == min(top_paths, paths)


def test_paths_read_as_a_sequence_of_best_paths(client):
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("y", sg.sum(sg.tanh(sg.mul(x, x, name="sq")), name="total"))
    paths = client.register(g).gradient({"x": np.array([[0.1, -2.0, 0.0], [1.0, 0.5, 3.0]])},
                                        semiring="max_product", best_path="all").best_paths
    every = list(paths)
    assert len(paths) == len(every) == 6 and repr(paths) == f"BestPaths(6 paths, {len(paths.step_node)} steps)"
    assert paths[-1] == every[5] and paths[1:5:2] == every[1:5:2] and paths == every and paths != every[:5]
    assert paths[2].steps == () and paths[2].output == "" and paths[2].value == {"value": 0.0}  # x = 0: no path
    assert [s.node for s in paths[4].steps] == [paths.nodes[n] for n in paths.step_node[paths.steps_of(4)]]
    assert [(s.node, s.index) for s in paths[4].steps] == [("x", (1,)), ("sq", (1,)), ("tanh_0", (1,)), ("total", ())]
    assert [p.start for p in paths] == [("x", (b, i)) for b in range(2) for i in range(3)]
    for read in (False, True):  # before and after the paths were read all at once
        if read:
            list(paths)
        with pytest.raises(IndexError):
            paths[6]
        with pytest.raises(TypeError, match="integers or slices, not float"):
            paths[1.0]
        assert paths[np.int64(4)] == every[4]


def _tampered(columns: dict, name: str, change) -> dict:
    columns = {key: np.array(value) for key, value in columns.items()}
    columns[name] = change(columns[name])
    return columns


@pytest.mark.parametrize("name, change, message", [
    ("step_start", lambda c: np.concatenate([c[:1], [-1], c[2:]]), "step_start does not split"),
    ("step_start", lambda c: c[:-1], "step_start holds"),
    ("step_start", lambda c: c + 1, "step_start does not split"),
    ("step_node", lambda c: c + 100, "step_node holds a value outside"),
    ("input", lambda c: c - 100, "input holds a value outside"),
    ("output", lambda c: c - 2, "output holds a value outside"),
    ("batch", lambda c: np.zeros(10 ** 4, dtype=np.int64), "batch holds int64 of shape (10000,)"),
    ("batch", lambda c: c + 2, "batch holds a value outside 0..1"),
    ("element", lambda c: c + 3, "element holds an element outside"),
    ("step_element", lambda c: c + 3, "step_element holds an element outside"),
    ("step_partial", lambda c: c.astype(np.int64), "step_partial holds int64"),
    ("step_node", lambda c: c.astype(np.float64), "step_node holds float64"),
    ("element", lambda c: c.reshape(-1, 1), "element holds"),
    ("step_node", None, "without their column 'step_node'"),
])
def test_a_path_table_that_does_not_describe_paths_is_refused(name, change, message):
    """What a client reads from a server (or a proxy in between) is checked before a path is made."""
    from semigrad.messages import paths_from
    from semigrad.v1 import semigrad_pb2 as pb
    from semigrad_server.service.convert import put_paths, put_tensors

    engine = Engine()
    gid = engine.register(graph_from_proto(chain(2, 3).to_proto()))[0].id
    paths = engine.gradient(gid, {"x": np.array([[0.1, 0.0, 0.3], [1.0, 2.0, -1.0]])}, semiring="max_product",
                            best_paths="all").best_paths
    table = pb.PathTable()
    put_paths(table, paths)
    assert paths_from(table) == paths and len(paths) == 6
    columns = dict(paths.columns)
    if change is None:
        del columns[name]
    else:
        columns = _tampered(columns, name, change)
    with pytest.raises(ValueError, match=re.escape(message)):
        sg.BestPaths(paths.nodes, paths.shapes, paths.outputs, paths.batch_shape, columns, paths.values)
    table.columns.clear()
    put_tensors(table.columns, columns)
    with pytest.raises(ValueError, match=re.escape(message)):
        paths_from(table)


@pytest.mark.parametrize("change, message", [
    (lambda t: t.shapes[0].values.append(-2), "negative dimension"),
    (lambda t: t.batch_shape.__setitem__(0, -1), "negative dimension"),
    (lambda t: t.nodes.append("extra"), "nodes,"),
    (lambda t: t.values["value"].Clear() or codec.write_tensor(t.values["value"], np.zeros(1)),
     "values['value'] holds float64 of shape (1,)"),
])
def test_a_path_table_with_wrong_names_or_shapes_is_refused(change, message):
    from semigrad.messages import paths_from
    from semigrad.v1 import semigrad_pb2 as pb
    from semigrad_server.service.convert import put_paths

    engine = Engine()
    gid = engine.register(graph_from_proto(chain(1, 2).to_proto()))[0].id
    table = pb.PathTable()
    put_paths(table, engine.gradient(gid, {"x": np.ones((3, 2))}, semiring="max_product", best_paths="all").best_paths)
    change(table)
    with pytest.raises(ValueError, match=re.escape(message)):
        paths_from(table)
