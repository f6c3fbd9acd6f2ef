"""Unit tests of the semiring plugins (semigrad-paths, semigrad-logic), on the semirings
themselves: axioms, hand-computed path sums, reductions and matmuls against naive loops."""

from __future__ import annotations

import math
from importlib import metadata

import numpy as np
import pytest
import semigrad_paths.kbest as kbest_module
import semigrad_server.semiring.base as base_module
from semigrad_server.semiring import Semiring, check_axioms
from semigrad_server.semiring.loader import GROUP, SemiringRegistry

PLUGINS = {
    "semigrad-paths": ("max_product", "log", "entropy", "kbest", "signed_max_product", "log_entropy", "log_counting",
                       "log_signed_max_product"),
    "semigrad-logic": ("boolean", "counting", "maxplus", "minplus", "bottleneck"),
}
NAMES = [name for names in PLUGINS.values() for name in names]


@pytest.fixture(scope="module")
def registry():
    return SemiringRegistry()


def semiring(registry, name, **params) -> Semiring:
    return registry.get(name, params)


# Every plugin semiring, plus kbest with other k (k = 1 makes the carrier a bare ndarray).
CONFIGS = [(name, {}) for name in NAMES] + [("kbest", {"k": 1}), ("kbest", {"k": 2}), ("kbest", {"k": 64})]
CONFIG_IDS = [name + "".join(f"-{k}={v}" for k, v in params.items()) for name, params in CONFIGS]


# ---------------------------------------------------------------- discovery and axioms


def test_every_plugin_semiring_loads(registry):
    records = {r.name: r for r in registry.records}
    for dist, names in PLUGINS.items():
        for name in names:
            assert name in records, f"no entry point '{name}' in {GROUP}"
            r = records[name]
            assert (r.status, r.error, r.distribution, r.version) == ("ok", "", dist, "0.1.0")
            assert r.semiring.name == name
            assert r.semiring.description and type(r.semiring).__doc__


@pytest.mark.parametrize("name,params", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_axioms(registry, name, params, seed):
    assert check_axioms(semiring(registry, name, **params), seed=seed, samples=256) == []


@pytest.mark.parametrize("name", NAMES)
def test_declared_properties(registry, name):
    s = semiring(registry, name)
    expected = {  # (commutative, idempotent, selective, components)
        "max_product": (True, True, True, 1), "log": (True, False, False, 1),
        "entropy": (True, False, False, 2), "kbest": (True, False, False, 3),
        "boolean": (True, True, True, 1), "counting": (True, False, False, 1),
        "maxplus": (True, True, True, 1), "minplus": (True, True, True, 1),
        "bottleneck": (True, True, True, 1), "signed_max_product": (True, True, False, 2),
        "log_entropy": (True, False, False, 2), "log_counting": (True, False, False, 1),
        "log_signed_max_product": (True, True, False, 4),
    }[name]
    assert (s.commutative, s.idempotent, s.selective, s.components) == expected


# ---------------------------------------------------------------- hand-computed cases


def over_paths(s: Semiring, paths):
    """⊕ over paths of ⊗ of φ(partial) along each path, with add and mul only."""
    total = s.zeros(())
    for path in paths:
        value = s.ones(())
        for d in path:
            value = s.mul(s.lift(np.float64(d)), value)
        total = s.add(total, value)
    return total


def read(s, value):
    return {k: np.asarray(v) for k, v in s.read(value).items()}


H_04_06 = -(0.4 * math.log(0.4) + 0.6 * math.log(0.6))  # weights 1.0 and 1.5 → p = 0.4, 0.6

# Two parallel paths with partials 2 and 3, then an edge 0.5 (and 1 for the add joining them):
# path products 1.0 and 1.5.
TWO_PATHS = [[2, 1, 0.5], [3, 1, 0.5]]
EXPECTED = {
    "real": {"value": 2.5},
    "max_product": {"value": 1.5},
    "log": {"value": math.log(2.5)},
    "entropy": {"entropy": H_04_06, "Z": 2.5, "R": -1.5 * math.log(1.5)},
    "kbest": {"value": 1.5, "kbest": [1.5, 1.0, 0.0]},
    "boolean": {"value": True},
    "counting": {"value": 2.0},
    "maxplus": {"value": math.log(1.5)},
    "minplus": {"value": math.log(1.0)},
    "bottleneck": {"value": 0.5},  # max(min(2, 1, 0.5), min(3, 1, 0.5))
    "signed_max_product": {"max": 1.5, "min": 1.0},
    "log_entropy": {"entropy": H_04_06, "log_Z": math.log(2.5), "Q": -1.5 * math.log(1.5) / 2.5},
    "log_counting": {"value": math.log(2.0)},
    "log_signed_max_product": {"log_abs_max": math.log(1.5), "sign_max": 1.0, "log_abs_min": 0.0, "sign_min": 1.0,
                               "max": 1.5, "min": 1.0},
}


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("extra", [[], [[0.0, 7.0]], [[4.0, 0.0, 2.0]]], ids=["two-paths", "zero-first", "zero-mid"])
def test_two_parallel_paths(registry, name, extra):
    """A path through a zero partial drops out (φ(0) = 0̄) whatever the semiring."""
    s = semiring(registry, name)
    got = read(s, over_paths(s, TWO_PATHS + extra))
    assert set(got) == set(EXPECTED[name])
    for key, want in EXPECTED[name].items():
        np.testing.assert_allclose(got[key], want, rtol=1e-12, atol=1e-15, err_msg=f"{name}: {key}")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_two_parallel_paths_with_sum_and_matmul(registry, name):
    """The same by ⊕-reduce over stacked paths and by a 1×2 @ 2×1 semiring matmul."""
    s = semiring(registry, name)
    first = s.lift(np.array([[2.0, 3.0]]))  # x → a (partial 2), x → b (partial 3)
    second = s.lift(np.array([[0.5], [0.5]]))  # a → y, b → y through the add and the 0.5 edge
    via_matmul = s.matmul(first, second)
    paths = s.mul(s.lift(np.array([2.0, 3.0])), s.lift(np.array([0.5, 0.5])))
    via_sum = s.sum(paths, axis=(-1,))
    for key, want in EXPECTED[name].items():
        np.testing.assert_allclose(read(s, via_matmul)[key][0, 0], want, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(read(s, via_sum)[key], want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("paths", [[[1.5], [1.5]], [[0.3, 2.0], [0.6]], [[4.0, 0.25], [0.5, 2.0], [0.0, 9.0]]])
def test_entropy_of_two_equal_weight_paths_is_log_2(registry, paths):
    h = read(semiring(registry, "entropy"), over_paths(semiring(registry, "entropy"), paths))["entropy"]
    assert h == pytest.approx(math.log(2), rel=1e-12)


def test_entropy_of_one_path_is_0_and_of_no_path_is_0(registry):
    s = semiring(registry, "entropy")
    assert read(s, over_paths(s, [[0.3, 7.0]]))["entropy"] == pytest.approx(0, abs=1e-15)
    out = read(s, over_paths(s, [[0.0, 7.0]]))
    assert (out["entropy"], out["Z"], out["R"]) == (0, 0, 0)


def test_entropy_of_n_paths_matches_the_formula(registry):
    s = semiring(registry, "entropy")
    w = np.random.default_rng(5).uniform(0.1, 3, size=7)
    p = w / w.sum()
    got = read(s, s.sum(s.lift(w), axis=(-1,)))["entropy"]
    assert got == pytest.approx(-(p * np.log(p)).sum(), rel=1e-12)


def test_kbest_of_paths(registry):
    s = semiring(registry, "kbest")  # k = 3
    np.testing.assert_array_equal(read(s, over_paths(s, [[1.5], [1.0]]))["kbest"], [1.5, 1.0, 0.0])
    five = [[2.0, 3.0], [0.5], [4.0], [1.0, 0.25], [7.0, 0.0]]  # 6, 0.5, 4, 0.25 (and a zero path)
    np.testing.assert_array_equal(read(s, over_paths(s, five))["kbest"], [6.0, 4.0, 0.5])
    s5 = semiring(registry, "kbest", k=5)
    np.testing.assert_array_equal(read(s5, over_paths(s5, five))["kbest"], [6.0, 4.0, 0.5, 0.25, 0.0])
    assert read(s5, over_paths(s5, five))["value"] == 6.0


def test_kbest_composes_path_sets(registry):
    """{2, 1} ⊗ {3, 0.5} = top-3 of {6, 1, 3, 0.5} = (6, 3, 1)."""
    s = semiring(registry, "kbest")
    a = s.add(s.lift(np.float64(2)), s.lift(np.float64(1)))
    b = s.add(s.lift(np.float64(3)), s.lift(np.float64(0.5)))
    np.testing.assert_array_equal(np.stack(s.mul(a, b)), [6.0, 3.0, 1.0])


def test_minplus_ignores_zero_partials_but_keeps_small_ones(registry):
    s = semiring(registry, "minplus")
    assert s.lift(np.float64(0)) == np.inf
    assert read(s, over_paths(s, [[1e-3, 2.0], [0.0, 1.0], [5.0]]))["value"] == pytest.approx(math.log(2e-3))


# ---------------------------------------------------------------- reductions and matmul


def naive_matmul(s: Semiring, a, b):
    """⊕ over k of a[..., :, k] ⊗ b[..., k, :], one k at a time."""
    out = None
    for k in range(s.shape(a)[-1]):
        term = s.mul(s.map(lambda c: c[..., :, k, None], a), s.map(lambda c: c[..., None, k, :], b))
        out = term if out is None else s.add(out, term)
    return out


def naive_sum(s: Semiring, a, axis: int):
    out = None
    for i in range(s.shape(a)[axis]):
        term = s.map(lambda c: np.take(c, i, axis=axis), a)
        out = term if out is None else s.add(out, term)
    return out


@pytest.fixture
def small_blocks(monkeypatch):
    """Make blocked matmuls use many small blocks."""
    monkeypatch.setattr(base_module, "MATMUL_BLOCK_ELEMENTS", 16)
    monkeypatch.setattr(kbest_module, "MATMUL_BLOCK_ELEMENTS", 16)


@pytest.mark.parametrize("name,params", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("shapes", [((4, 5), (5, 3)), ((2, 1, 3, 7), (4, 7, 2)), ((3, 1), (1, 4)), ((2, 3), (3, 1))])
@pytest.mark.parametrize("blocks", ["default-blocks", "small-blocks"])
def test_matmul_matches_naive(registry, name, params, shapes, blocks, request):
    if blocks == "small-blocks":
        request.getfixturevalue("small_blocks")
    s = semiring(registry, name, **params)
    rng = np.random.default_rng(7)
    a, b = (s.sample(rng, shape) for shape in shapes)
    want = naive_matmul(s, a, b)
    for got in (s.matmul(a, b), Semiring.matmul(s, a, b)):  # the plugin's, the base's blocked default
        assert s.shape(got) == s.shape(want)
        assert np.all(s.equal(got, want)), name


@pytest.mark.parametrize("name,params", CONFIGS, ids=CONFIG_IDS)
def test_matmul_with_empty_inner_dimension_is_zero(registry, name, params):
    s = semiring(registry, name, **params)
    got = s.matmul(s.zeros((2, 3, 0)), s.zeros((2, 0, 4)))
    assert s.shape(got) == (2, 3, 4)
    assert np.all(s.equal(got, s.zeros((2, 3, 4))))


@pytest.mark.parametrize("name,params", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("axis", [(-1,), (-2,), (-3,), (-1, -3), (-3, -2, -1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum_matches_repeated_add(registry, name, params, axis, keepdims):
    s = semiring(registry, name, **params)
    x = s.sample(np.random.default_rng(3), (2, 3, 4, 5))  # a leading batch axis too
    want = x
    for ax in sorted(axis):  # most negative first, so the others keep their numbers
        want = naive_sum(s, want, ax)
        if keepdims:
            want = s.map(lambda c: np.expand_dims(c, ax), want)
    got = s.sum(x, axis=axis, keepdims=keepdims)
    assert s.shape(got) == s.shape(want)
    assert np.all(s.equal(got, want))


@pytest.mark.parametrize("name,params", CONFIGS, ids=CONFIG_IDS)
def test_sum_over_an_empty_axis_is_zero(registry, name, params):
    s = semiring(registry, name, **params)
    got = s.sum(s.zeros((3, 0)), axis=(-1,))
    assert s.shape(got) == (3,) and np.all(s.equal(got, s.zeros((3,))))
    got = s.sum(s.zeros((3, 0)), axis=(-1,), keepdims=True)
    assert s.shape(got) == (3, 1) and np.all(s.equal(got, s.zeros((3, 1))))


@pytest.mark.parametrize("name,params", CONFIGS, ids=CONFIG_IDS)
def test_elementwise_ops_broadcast(registry, name, params):
    s = semiring(registry, name, **params)
    rng = np.random.default_rng(11)
    a, b = s.sample(rng, (2, 1, 3)), s.sample(rng, (4, 3))
    for op in (s.add, s.mul):
        got = op(a, b)
        assert s.shape(got) == (2, 4, 3)
        for i in range(2):
            for j in range(4):
                one = op(s.map(lambda c: c[i, 0], a), s.map(lambda c: c[j], b))
                assert np.all(s.equal(s.map(lambda c: c[i, j], got), one))


@pytest.mark.parametrize("name,params", CONFIGS, ids=CONFIG_IDS)
def test_lift_of_zero_is_zero_without_warnings(registry, name, params):
    s = semiring(registry, name, **params)
    with np.errstate(all="raise"):
        value = s.lift(np.array([0.0, -0.0, 2.0, -3.0]))
        assert np.all(s.equal(s.map(lambda c: c[:2], value), s.zeros((2,))))
        s.read(value)


# ---------------------------------------------------------------- log semiring numerics


def test_logsumexp_sum_handles_all_minus_inf_slices(registry):
    s = semiring(registry, "log")
    x = np.array([[-np.inf, -np.inf], [0.0, -np.inf], [1000.0, 1000.0], [-1000.0, -1001.0]])
    with np.errstate(all="raise"):
        got = s.sum(x, axis=(-1,))
    np.testing.assert_allclose(got, [-np.inf, 0.0, 1000 + math.log(2), -1000 + math.log1p(math.exp(-1))])


def test_log_matmul_equals_log_of_exp_matmul(registry):
    s = semiring(registry, "log")
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(3, 4, 6)) * 3, rng.normal(size=(6, 5)) * 3
    a[rng.random(a.shape) < 0.3] = -np.inf
    b[rng.random(b.shape) < 0.3] = -np.inf
    a[0, 1, :] = -np.inf  # a row of zeros
    b[:, 2] = -np.inf  # a column of zeros
    with np.errstate(divide="ignore"):
        want = np.log(np.exp(a) @ np.exp(b))
    with np.errstate(all="raise"):
        got = s.matmul(a, b)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.all(np.isneginf(got[0, 1, :])) and np.all(np.isneginf(got[..., 2]))


def exact_log_matmul(a, b):
    t = a[..., :, :, None] + b[..., None, :, :]
    m = np.max(t, axis=-2, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(t - m), axis=-2)) + m[..., 0, :]


def test_log_matmul_is_exact_where_exponentials_would_underflow(registry):
    s = semiring(registry, "log")
    # Row and column maxima at different k: the max-shifted products all underflow.
    a = np.array([[0.0, -2000.0], [-5.0, -3000.0]])
    b = np.array([[-2000.0, -1.0], [0.0, 2.0]])
    got = s.matmul(a, b)
    np.testing.assert_allclose(got, exact_log_matmul(a, b), rtol=1e-14)
    assert got[0, 0] == pytest.approx(-2000 + math.log(2), rel=1e-15)
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(2, 7, 9)) * 600, rng.normal(size=(9, 6)) * 600  # huge spread
    a[rng.random(a.shape) < 0.2] = -np.inf
    np.testing.assert_allclose(s.matmul(a, b), exact_log_matmul(a, b), rtol=1e-12)


# ---------------------------------------------------------------- kbest


def kbest_blocks(monkeypatch, s, blocked: bool, held: int) -> None:
    """The reference ⊕ and ⊗ over blocks of 7 elements (the last one short), or all at once."""
    if blocked:
        monkeypatch.setattr(kbest_module, "MATMUL_BLOCK_ELEMENTS", 7 * 3 * held)


@pytest.mark.parametrize("blocked", [False, True], ids=["at once", "blocks of 7"])
@pytest.mark.parametrize("k", [1, 2, 3, 7, 64])
def test_kbest_mul_keeps_the_k_largest_pairwise_products(registry, k, blocked, monkeypatch):
    """mul only looks at pairs with (i+1)(j+1) ≤ k; compare with all k² pairs (ties, zero pads).
    The reference code (k > 16, or these 200 elements) also over blocks of elements."""
    s = semiring(registry, "kbest", k=k)
    kbest_blocks(monkeypatch, s, blocked, len(s._i) + 2 * k)
    rng = np.random.default_rng(k)
    a, b = s.sample(rng, (200,)), s.sample(rng, (200,))
    ca, cb = np.stack(s.components_of(a)), np.stack(s.components_of(b))
    ca[:, :20] = np.round(ca[:, :20])  # ties
    ca = np.sort(ca, axis=0)[::-1]
    a = tuple(ca) if k > 1 else ca[0]
    products = (ca[:, None] * cb[None, :]).reshape(k * k, -1)
    want = np.sort(products, axis=0)[::-1][:k]
    np.testing.assert_array_equal(np.stack(s.components_of(s.mul(a, b))), want)


@pytest.mark.parametrize("blocked", [False, True], ids=["at once", "blocks of 7"])
@pytest.mark.parametrize("k", [2, 7, 64])
def test_kbest_add_keeps_the_k_largest_of_both(registry, k, blocked, monkeypatch):
    """⊕ against sorting both values' 2k entries, ties and zero pads among them, broadcast."""
    s = semiring(registry, "kbest", k=k)
    kbest_blocks(monkeypatch, s, blocked, 2 * k)
    rng = np.random.default_rng(k)
    a, b = s.sample(rng, (40, 5)), s.sample(rng, (1, 5))
    ca, cb = np.stack(s.components_of(a)), np.stack(s.components_of(b))
    ca[:, :10] = np.round(ca[:, :10])
    ca = np.sort(ca, axis=0)[::-1]
    want = np.sort(np.concatenate([ca, np.broadcast_to(cb, ca.shape)]), axis=0)[::-1][:k]
    np.testing.assert_array_equal(np.stack(s.components_of(s.add(tuple(ca), b))), want)


def test_kbest_configure_and_key(registry):
    default = semiring(registry, "kbest")
    assert (default.k, default.components, default.key) == (3, 3, "kbest:k=3")
    five = default.configure({"k": 5})
    assert (five.k, five.components, len(five.component_names)) == (5, 5, 5)
    assert "5" in five.key and five.key != default.key
    assert default.configure({}).k == 3 and default.components == 3  # the default is unchanged
    assert default.configure({"k": 4.0}).k == 4
    assert five.read(five.ones((2,)))["kbest"].shape == (2, 5)


@pytest.mark.parametrize("params,word", [({"k": 0}, "'k'"), ({"k": 65}, "'k'"), ({"k": 2.5}, "'k'"),
                                         ({"k": "3"}, "'k'"), ({"k": True}, "'k'"), ({"n": 3}, "'n'"),
                                         ({"k": 3, "j": 1}, "'j'")])
def test_kbest_rejects_bad_parameters(registry, params, word):
    with pytest.raises(ValueError, match=word):
        semiring(registry, "kbest").configure(params)


def test_other_semirings_take_no_parameters(registry):
    for name in NAMES:
        if name != "kbest":
            with pytest.raises(ValueError, match="no parameters"):
                semiring(registry, name).configure({"k": 3})


# ---------------------------------------------------------------- broken semirings fail


class _Reals(Semiring):
    name = "broken"
    description = "test double"

    def zeros(self, shape):
        return np.zeros(shape)

    def ones(self, shape):
        return np.ones(shape)

    def add(self, a, b):
        return np.add(a, b)

    def mul(self, a, b):
        return np.multiply(a, b)

    def lift(self, d):
        return np.asarray(d, dtype=np.float64)


class LeftBiasedAdd(_Reals):
    """⊕ = a + 2b: neither commutative nor associative."""

    def add(self, a, b):
        return np.add(a, 2 * b)


class FalselyIdempotent(_Reals):
    idempotent = True


class LiftWithoutZero(_Reals):
    def lift(self, d):
        return np.asarray(d, dtype=np.float64) + 1


class WrongSum(_Reals):
    def sum(self, a, axis, keepdims=False):
        return np.max(a, axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("cls,law", [(LeftBiasedAdd, "⊕ is commutative"), (LeftBiasedAdd, "⊕ is associative"),
                                     (FalselyIdempotent, "⊕ is idempotent (declared)"),
                                     (LiftWithoutZero, "φ(0) = 0̄"), (WrongSum, "sum agrees with repeated ⊕")])
def test_broken_semiring_fails_naming_the_law(cls, law):
    assert law in check_axioms(cls())


def test_loader_rejects_a_broken_semiring_naming_the_law():
    ep = metadata.EntryPoint("broken", f"{__name__}:LeftBiasedAdd", GROUP)
    (record,) = SemiringRegistry([ep]).records
    assert record.status == "failed"
    assert "⊕ is commutative" in record.error


# ---------------------------------------------------------------- signed max-product


def test_signed_max_product_of_paths(registry):
    """The largest and the smallest signed path product, by hand; zero edges drop out."""
    s = semiring(registry, "signed_max_product")
    paths = [[2.0, -1.0, 0.5], [3.0, 1.0, 0.5], [-4.0, -1.0], [0.0, -100.0]]  # -1, 1.5, 4; the last has a 0
    assert {k: float(v) for k, v in read(s, over_paths(s, paths)).items()} == {"max": 4.0, "min": -1.0}
    negative = [[-2.0, 0.5], [3.0, -1.0], [-0.25]]  # -1, -3, -0.25: the most positive is -0.25
    assert {k: float(v) for k, v in read(s, over_paths(s, negative)).items()} == {"max": -0.25, "min": -3.0}
    assert {k: float(v) for k, v in read(s, over_paths(s, [[0.0, 2.0], [5.0, 0.0]])).items()} == \
        {"max": -np.inf, "min": np.inf}  # no path with non-zero partials: the empty set
    # {2, -3} ⊗ {-1, 4}: products {-2, 8, 3, -12}
    a = s.add(s.lift(np.float64(2)), s.lift(np.float64(-3)))
    b = s.add(s.lift(np.float64(-1)), s.lift(np.float64(4)))
    assert tuple(map(float, s.mul(a, b))) == (8.0, -12.0)
    assert tuple(map(float, s.mul(a, s.zeros(())))) == (-np.inf, np.inf)


@pytest.mark.parametrize("kernel_backend", ["numpy", "numba"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_signed_max_product_matmul_matches_naive(registry, kernel_backend, seed):
    """The kernel-based matmul against one-k-at-a-time ⊕ of ⊗, on operands with empty
    entries, single products, one-signed rows (where the smallest |product| decides), zeros
    (products that underflowed: an empty entry against them is inf · 0) and batch axes."""
    from semigrad_server.semiring import kernels
    if kernel_backend == "numba" and not kernels.numba_available():
        pytest.skip("numba not installed")
    s = semiring(registry, "signed_max_product")
    rng = np.random.default_rng(seed)

    def operand(shape, sign):
        hi, lo = s.sample(rng, shape)
        if sign:  # every product of one sign
            empty = hi < lo
            hi, lo = sign * np.abs(hi), sign * np.abs(lo)
            hi, lo = np.where(empty, -np.inf, np.maximum(hi, lo)), np.where(empty, np.inf, np.minimum(hi, lo))
        zero = rng.random(shape) < 0.05
        return np.where(zero, 0.0, hi), np.where(zero, 0.0, lo)

    previous = kernels.set_backend(kernel_backend)
    try:
        for sa, sb in [(1, 1), (1, -1), (0, 0), (-1, 0)]:
            a, b = operand((2, 1, 30, 40), sa), operand((3, 40, 20), sb)
            got, want = s.matmul(a, b), naive_matmul(s, a, b)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
    finally:
        kernels.set_backend(previous)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_log_signed_max_product_matmul_matches_naive_over_huge_log_ranges(registry, seed):
    """The scaled kernel matmul against one-k-at-a-time ⊕ of ⊗, with logs spread over ±2000
    (far past float64 once exponentiated) so that scaled factors underflow and entries are
    recomputed exactly; rows of one sign (the smallest |product| decides) and empty entries."""
    s = semiring(registry, "log_signed_max_product")
    rng = np.random.default_rng(seed)

    def operand(shape, spread, sign):
        hi, lo = rng.normal(size=shape), rng.normal(size=shape)
        hi, lo = np.maximum(hi, lo), np.minimum(hi, lo)
        if sign:
            hi, lo = sign * np.abs(hi), sign * np.abs(lo)
            hi, lo = np.maximum(hi, lo), np.minimum(hi, lo)
        scale = np.exp(0)  # logs: log|v| + an offset of up to ±spread
        h, lw = s.lift(hi * scale), s.lift(lo * scale)
        offset = rng.uniform(-spread, spread, size=shape)
        value = [h[0], h[1] + h[0] * offset, lw[2], lw[3] + lw[2] * offset]
        empty = rng.random(shape) < 0.1
        return tuple(np.where(empty, z, v) for z, v in zip(s.zeros(shape), value))

    for spread, sa, sb in [(2000, 0, 0), (2000, 1, -1), (50, -1, 0), (1, 0, 0)]:
        a, b = operand((2, 6, 9), spread, sa), operand((9, 5), spread, sb)
        got, want = s.matmul(a, b), naive_matmul(s, a, b)
        for key in ("sign_max", "sign_min"):
            np.testing.assert_array_equal(s.read(got)[key], s.read(want)[key])
        for key in ("log_abs_max", "log_abs_min"):
            np.testing.assert_allclose(s.read(got)[key], s.read(want)[key], rtol=1e-12, atol=1e-9)
