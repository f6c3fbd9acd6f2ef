"""Several semirings in one request (GradientRequest.semirings): one forward pass and one
backward walk under the product semiring, each member's result equal to its own request.

The reference for each member is that member's own single-semiring request (itself checked
against brute-force path enumeration in test_path_enumeration.py): the product must give the
same arrays exactly, on the random graphs of tests/path_reference.py (batch dims, seeds,
broadcasting, matmuls, reductions), on both executors."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg
from path_reference import random_case

import semigrad_server.engine.engine as engine_module
from semigrad_server.engine import Engine
from semigrad_server.errors import FailedPrecondition, InvalidArgument
from semigrad_server.semiring import Semiring, TropicalSemiring, check_axioms
from semigrad_server.semiring.loader import SemiringRegistry
from semigrad_server.semiring.product import MAX_MEMBERS, ProductSemiring
from semigrad_server.service.convert import graph_from_proto

MEMBERS = ["real", "max_product", "entropy", "signed_max_product", "kbest", "log", "boolean", "counting",
           "maxplus", "minplus", "bottleneck"]
SEEDS = range(12)


def _case(seed):
    return random_case(seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_each_member_equals_its_own_request(client, seed):
    c = _case(seed)
    f = client.register(c.graph.client_graph())
    params = {"kbest": {"k": 2}}
    both = f.gradient(c.inputs, seeds=c.seeds or None, semiring=MEMBERS, semiring_params=params,
                      return_components=True)
    assert isinstance(both, sg.SemiringGradients) and list(both) == MEMBERS  # in the order asked
    for name in MEMBERS:
        alone = f.gradient(c.inputs, seeds=c.seeds or None, semiring=name,
                           semiring_params={"k": 2} if name == "kbest" else None, return_components=True)
        assert set(both[name]) == set(alone), name
        for x in alone:
            np.testing.assert_array_equal(both[name][x], alone[x], err_msg=f"seed {seed}, {name}, d/d{x}")
            assert both[name][x].dtype == alone[x].dtype
            assert both[name].components[x].keys() == alone.components[x].keys()
            for key, value in alone.components[x].items():
                np.testing.assert_array_equal(both[name].components[x][key], value,
                                              err_msg=f"seed {seed}, {name}.{key}, d/d{x}")


@pytest.mark.parametrize("seed", SEEDS[:6])
def test_each_member_equals_its_own_request_on_the_tensor_plan(seed):
    c = _case(seed)
    engine = Engine()
    gid = engine.register(graph_from_proto(c.graph.client_graph().to_proto()))[0].id
    names = ["real", "max_product", "entropy", "signed_max_product"]
    both = engine.gradient(gid, c.inputs, seeds=c.seeds, semirings=names, backend="tensor", return_components=True)
    for name in names:
        alone = engine.gradient(gid, c.inputs, seeds=c.seeds, semiring=name, backend="tensor", return_components=True)
        for x, value in alone.gradients.items():
            np.testing.assert_array_equal(both.semirings[name].gradients[x], value, err_msg=f"{name} d/d{x}")
            for key, part in alone.components.get(x, {}).items():
                np.testing.assert_array_equal(both.semirings[name].components[x][key], part)


class Counted(Semiring):
    """A member that delegates to another semiring and counts its own operations."""

    def __init__(self, inner: Semiring, name: str):
        self.inner, self.name = inner, name
        self.components, self.component_names, self.primary = inner.components, inner.component_names, inner.primary
        self.commutative, self.idempotent, self.selective = inner.commutative, inner.idempotent, inner.selective
        self.calls: dict[str, int] = {}

    def _count(self, what):
        self.calls[what] = self.calls.get(what, 0) + 1

    def __getattribute__(self, attr):
        if attr in ("zeros", "ones", "add", "mul", "lift", "sum", "matmul", "scatter_add"):
            inner = object.__getattribute__(self, "inner")
            object.__getattribute__(self, "_count")(attr)
            return getattr(inner, attr)
        return object.__getattribute__(self, attr)

    def read(self, value):
        return self.inner.read(value)

    def equal(self, a, b, rtol=1e-9, atol=1e-12):
        return self.inner.equal(a, b, rtol=rtol, atol=atol)

    @property
    def key(self):
        return "counted-" + self.name


def test_one_forward_pass_and_one_backward_walk(monkeypatch):
    """The product request runs one plan (forward and backward together) where three single
    requests run three (none of them is a plain real gradient: all take run_plan); and each member's operations — its own vectorised matmul and sum
    included — run exactly as often as in its own request: one walk, shared."""
    base = SemiringRegistry()
    registry = SemiringRegistry(entry_points=[])
    counted = {name: Counted(base.get(name), name) for name in ("counting", "max_product", "entropy")}
    registry.available.update(counted)
    engine = Engine(semirings=registry)
    g = sg.Graph()
    x = g.input("x", (4, 3))
    w = g.input("w", (3, 5))
    h = sg.tanh(x @ w)
    g.output("y", (h @ sg.transpose(w)).sum() + sg.sin(x).sum())
    gid = engine.register(graph_from_proto(g.to_proto()))[0].id
    rng = np.random.default_rng(0)
    point = {"x": rng.normal(size=(2, 4, 3)), "w": rng.normal(size=(3, 5))}
    runs = []
    real_run = engine_module.run_plan
    monkeypatch.setattr(engine_module, "run_plan", lambda *a, **k: runs.append(1) or real_run(*a, **k))

    alone = {}
    for name, s in counted.items():
        s.calls.clear()
        engine.gradient(gid, point, semiring=name, backend="tensor")
        alone[name] = dict(s.calls)
    assert len(runs) == 3
    for s in counted.values():
        s.calls.clear()
    result = engine.gradient(gid, point, semirings=list(counted), backend="tensor")
    assert len(runs) == 4  # one more plan run: one forward pass, one backward walk
    for name, s in counted.items():
        # The reductions (⊕-reduce and matmul, the heavy steps) run as often as alone. (Edges
        # whose lifted constant is 1̄ for one member but not for all are skipped alone, and are a
        # ⊗ by 1̄ in the product: lift and mul counts may differ, not values.)
        for kind in ("sum", "matmul"):
            assert s.calls.get(kind, 0) == alone[name].get(kind, 0), (name, kind, s.calls, alone[name])
        assert s.calls["matmul"] >= 3, name  # the member's own matmul served the product
    assert set(result.semirings) == set(counted)


# ---------------------------------------------------------------- with the other request features


@pytest.fixture(scope="module")
def mlp(client):
    g = sg.Graph()
    x = g.input("x", (3,))
    w = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]])
    h = sg.tanh(g.const(w) @ x, name="h")
    g.output("y", (h * h).sum())
    g.output("z", sg.sin(x).sum())
    return client.register(g)


def test_outputs_retained_gradients_and_server_hooks(mlp):
    point = {"x": np.array([[0.3, -0.7, 1.1], [0.2, 0.5, -0.4]])}
    names = ["real", "max_product", "entropy"]
    options = dict(retain=["h"], hooks={"h": [sg.ServerHook("scale", factor=0.5), sg.ServerHook("record")]},
                   return_components=True)
    both, outputs = mlp.gradient(point, semiring=names, return_outputs=True, **options)
    assert both.outputs is outputs and set(outputs) == {"y", "z"}
    _, want_outputs = mlp.gradient(point, semiring="entropy", return_outputs=True, **options)
    for out in outputs:
        np.testing.assert_array_equal(outputs[out], want_outputs[out])
    for name in names:
        alone = mlp.gradient(point, semiring=name, **options)
        np.testing.assert_array_equal(both[name]["x"], alone["x"])
        np.testing.assert_array_equal(both[name].retained["h"], alone.retained["h"])
        assert both[name].records.keys() == alone.records.keys() and alone.records
        for key, parts in alone.records.items():
            assert both[name].records[key].keys() == parts.keys()
            for part, value in parts.items():
                np.testing.assert_array_equal(both[name].records[key][part], value)


def test_refusals(mlp):
    point = {"x": np.array([0.3, -0.7, 1.1])}
    with pytest.raises(sg.FailedPrecondition, match="best paths"):
        mlp.gradient(point, semiring=["max_product", "real"], best_path=[("x", (0,))])
    with pytest.raises(sg.InvalidArgument, match="'entropy' is requested twice"):
        mlp.gradient(point, semiring=["entropy", "real", "entropy"])
    with pytest.raises(sg.FailedPrecondition, match="unknown semiring 'nope'"):
        mlp.gradient(point, semiring=["real", "nope"])
    with pytest.raises(sg.InvalidArgument, match="'k'"):
        mlp.gradient(point, semiring=["real", "kbest"], semiring_params={"kbest": {"k": 0}})
    with pytest.raises(sg.InvalidArgument, match="'<semiring>.<parameter>'"):
        mlp.gradient(point, semiring=["real", "kbest"], semiring_params={"k": 2})
    for names, at in ([""], 0), (["real", ""], 1):
        with pytest.raises(sg.InvalidArgument, match=rf"semirings\[{at}\] is empty"):
            mlp.gradient(point, semiring=names)


def test_a_list_of_one_is_that_semiring(mlp):
    point = {"x": np.array([0.3, -0.7, 1.1])}
    one = mlp.gradient(point, semiring=["entropy"])
    np.testing.assert_array_equal(one["entropy"]["x"], mlp.gradient(point, semiring="entropy")["x"])


def test_both_semiring_and_a_list_is_refused():
    engine = Engine()
    g = sg.Graph()
    x = g.input("x", ())
    g.output("y", x * 2.0)
    gid = engine.register(graph_from_proto(g.to_proto()))[0].id
    with pytest.raises(InvalidArgument, match="both semiring 'entropy' and a list"):
        engine.gradient(gid, {"x": np.float64(1.0)}, semiring="entropy", semirings=["real", "max_product"])


def test_at_most_max_members():
    registry = SemiringRegistry(entry_points=[])
    base = SemiringRegistry().get("max_product")
    for i in range(MAX_MEMBERS + 1):
        registry.available[f"m{i}"] = Counted(base, f"m{i}")
    names = [f"m{i}" for i in range(MAX_MEMBERS + 1)]
    s = registry.product(names[:MAX_MEMBERS])
    assert isinstance(s, ProductSemiring) and s.components == MAX_MEMBERS
    with pytest.raises(InvalidArgument, match=f"at most {MAX_MEMBERS}"):
        registry.product(names)
    with pytest.raises(InvalidArgument, match="empty"):
        registry.product([])
    with pytest.raises(FailedPrecondition):
        registry.product(["m0", "missing"])


def test_the_product_is_a_semiring():
    from semigrad_server.semiring import check_axioms
    registry = SemiringRegistry()
    s = registry.product(["real", "entropy", "signed_max_product", "boolean", "kbest"])
    assert s.components == 1 + 2 + 2 + 1 + 3
    assert check_axioms(s, samples=128) == []


def test_gradient_many_streams_several_semirings(mlp):
    """Chunks of a streamed job reassemble per semiring, equal to one call on the whole batch."""
    rng = np.random.default_rng(3)
    point = {"x": rng.normal(size=(7, 3))}
    names = ["real", "entropy", "signed_max_product"]
    whole = mlp.gradient(point, semiring=names, return_components=True, retain=["h"])
    streamed = mlp.gradient_many(point, chunk_size=3, semiring=names, return_components=True, retain=["h"])
    assert isinstance(streamed, sg.SemiringGradients) and list(streamed) == names  # in the order asked
    for name in names:
        np.testing.assert_array_equal(streamed[name]["x"], whole[name]["x"])
        np.testing.assert_array_equal(streamed[name].retained["h"], whole[name].retained["h"])
        for key, value in whole[name].components["x"].items():
            np.testing.assert_array_equal(streamed[name].components["x"][key], value)


def fused_rows(n: int) -> sg.Graph:
    """softmax, layer_norm and logsumexp of an n-wide x: fused row ops."""
    g = sg.Graph()
    x = g.input("x", (n,))
    w = np.random.default_rng(0).normal(size=(n, n))
    g.output("y", (sg.softmax(g.const(w) @ x) * np.arange(float(n))).sum() + sg.layer_norm(x).sum() * 0.3
             + sg.logsumexp(x))
    return g


def test_real_in_a_list_is_the_gradient_up_to_rounding(client):
    """With fused ops (softmax, layer_norm, logsumexp) the real member runs their element-level
    adjoints, not the O(n) formulas: the same gradient, to rounding."""
    f = client.register(fused_rows(5))
    point = {"x": np.random.default_rng(1).normal(size=(4, 5))}
    both = f.gradient(point, semiring=["real", "max_product"])
    np.testing.assert_allclose(both["real"]["x"], f.gradient(point)["x"], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("others", [["max_product"], ["real", "max_product", "entropy"], ["kbest", "counting"]])
@pytest.mark.parametrize("member", ["log_counting", "log", "max_product", "entropy", "counting"])
def test_row_ops_give_each_member_its_own_request_exactly(client, member, others):
    """Fused row ops (softmax, layer_norm, logsumexp) take their adjoint in column blocks
    sized by the carrier's arrays: a member must not round differently beside others."""
    others = [o for o in others if o != member]
    f = client.register(fused_rows(6))
    point = {"x": np.random.default_rng(1).normal(size=(3, 6))}
    alone = f.gradient(point, semiring=member)
    both = f.gradient(point, semiring=[member] + others)
    np.testing.assert_array_equal(both[member]["x"], alone["x"])


def test_on_one_executor_a_member_is_its_own_request_bit_for_bit(client):
    """log_counting alone folds its mean's φ(1/3) = 1̄ away, in a list it cannot: with backend
    auto this 3-element graph ran on the tensor plan alone and the scalar program in the list,
    log 3 against log 2 ⊕ log 1, an ulp apart. On one executor: the same bits."""
    g = sg.Graph()
    a, x = g.input("a", (2, 3)), g.input("x", (3,))
    g.output("m", sg.mean(a, axis=-1))
    g.output("y", sg.softmax(x))
    f = client.register(g)
    point = {"a": np.array([[0.68, 0.13, 1.24], [-0.40, 2.52, 0.42]]),
             "x": np.array([-0.874279516980727, 0.7680011820656408, -0.010954219720065186])}
    for backend in ("tensor", "scalar"):
        alone = f.gradient(point, semiring="log_counting", backend=backend)["x"]
        for other in ("max_product", "real", "counting"):
            both = f.gradient(point, semiring=["log_counting", other], backend=backend)["log_counting"]["x"]
            np.testing.assert_array_equal(both, alone, err_msg=f"{backend}, with {other}")
    alone = f.gradient(point, semiring="log_counting")["x"]
    np.testing.assert_allclose(f.gradient(point, semiring=["log_counting", "real"])["log_counting"]["x"], alone,
                               rtol=1e-15)


def test_the_cache_of_products_is_bounded(monkeypatch):
    import semigrad_server.semiring.loader as loader_module
    monkeypatch.setattr(loader_module, "MAX_CACHED_PRODUCTS", 2)
    registry = SemiringRegistry()
    first = registry.product(["real", "entropy"])
    assert registry.product(["real", "entropy"]) is first  # kept
    second = registry.product(["entropy", "real"])
    assert registry.product(["entropy", "real"]) is second and registry.product(["real", "entropy"]) is first
    registry.product(["real", "max_product"])  # a third: the cache starts over
    again = registry.product(["real", "entropy"])
    assert again is not first and again.key == first.key


def test_members_whose_lift_reads_magnitudes_share_one():
    """max_product's φ is |d| and entropy's Z is |d|: the product takes |d| once and hands the
    same array to both (no pass and weight-sized copy each); the values are each member's own
    lift's, and the other members lift d themselves."""
    registry = SemiringRegistry()
    product = registry.product(["real", "max_product", "entropy", "log"])
    d = np.random.default_rng(1).normal(size=(4, 5)).T * np.array([0.0, 1.0, -2.0, 1e-300])
    lifted = product.split(product.lift(d))
    for member, value in zip(product.members, lifted):
        for got, want in zip(member.components_of(value), member.components_of(member.lift(d))):
            np.testing.assert_array_equal(got, want, err_msg=member.name)
    assert lifted[1] is lifted[2][0]  # one |d|
    assert [m.magnitude_lift for m in product.members] == [False, True, True, False]


class _SignReading(TropicalSemiring):
    """(max, +) over d itself (a semiring on signed values), while claiming its φ reads |d| alone."""

    name = "sign_reading"
    multiplication, zero, one = "add", -np.inf, 0.0
    magnitude_lift = True

    def lift(self, d):
        d = np.asarray(d, dtype=np.float64)
        return np.where(d == 0, -np.inf, d)  # φ(0) = 0̄

    def lift_magnitude(self, p):
        return self.lift(p)


class _Writing(_SignReading):
    """Honest about its φ (|d|), but writes into the |d| it is handed."""

    name = "writing"

    def lift(self, d):
        return np.abs(np.asarray(d, dtype=np.float64)) * 0.5

    def lift_magnitude(self, p):
        p *= 0.5
        return p


def test_a_lift_that_does_not_read_magnitudes_alone_fails_its_check():
    """A product hands lift_magnitude(|d|) to the members that set magnitude_lift: one whose φ
    reads the sign would answer differently alone and in a list, so the loader's check refuses it."""
    assert check_axioms(_SignReading()) == ["φ(d) = lift_magnitude(|d|) (declared)"]
    for name in ("max_product", "entropy"):
        assert check_axioms(SemiringRegistry().get(name, None)) == [], name


def test_no_member_can_write_into_the_shared_magnitudes():
    registry = SemiringRegistry()
    product = ProductSemiring([_Writing(), registry.get("max_product", None)])
    d = np.array([-4.0, 3.0, 0.5])
    with pytest.raises(ValueError, match="read-only"):
        product.lift(d)
    for shape in ((), (3,)):  # a 0-d |d| is an array too (np.abs of one is a NumPy scalar)
        value = ProductSemiring([registry.get("entropy", None), registry.get("max_product", None)]).lift(
            np.full(shape, -2.0))
        assert all(isinstance(c, np.ndarray) for c in value)
