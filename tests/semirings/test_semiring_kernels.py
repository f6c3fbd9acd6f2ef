"""The plugin API's matmul kernels (semigrad_server.semiring.kernels) and the optimised
semiring operations built on them, against brute force: explicit Python loops over every
product, for both implementations (numba, forced even on tiny shapes, and NumPy), on random
shapes with empty axes, broadcast batch axes, zeros, ties, infinities and NaN.

Selective results and k-best values are exact (the kernels only select among products that
are computed the same way), so everything is compared with assert_array_equal.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import semigrad_paths.kbest as kbest_module
import semigrad_server.semiring.base as base_module
from path_reference import over_paths, random_case
from semigrad_server.engine import Engine
from semigrad_server.semiring import kernels
from semigrad_server.semiring.loader import SemiringRegistry
from semigrad_server.service.convert import graph_from_proto

IMPLEMENTATIONS = [pytest.param("numba", marks=pytest.mark.skipif(not kernels.numba_available(),
                                                                  reason="numba is not installed")), "numpy"]
OPS = {"mul": np.multiply, "add": np.add, "max": np.maximum, "min": np.minimum}


@pytest.fixture(scope="module")
def registry():
    return SemiringRegistry()


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request, monkeypatch):
    """Every kernel call in the test uses this implementation, numba even on tiny products."""
    previous = kernels.set_backend(request.param)
    monkeypatch.setattr(kernels, "NUMBA_MIN_WORK", 0)
    yield request.param
    kernels.set_backend(previous)


def counted(kernel: str, implementation: str) -> int:
    return kernels.calls.get((kernel, implementation), 0)


# ---------------------------------------------------------------- brute force


def brute_tropical(a, b, add, mul, zero):
    """⊕ over k of a[..., i, k] ⊗ b[..., k, j], one scalar at a time, from `zero`; a NaN product
    with an operand equal to `zero` is `zero` (0̄ annihilates: 0 · ∞, −∞ + ∞)."""
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    (m, kc), n = a.shape[-2:], b.shape[-1]
    a, b = np.broadcast_to(a, lead + (m, kc)), np.broadcast_to(b, lead + (kc, n))
    out = np.empty(lead + (m, n))
    with np.errstate(all="ignore"):
        for *t, i, j in itertools.product(*map(range, lead + (m, n))):
            acc = np.float64(zero)
            for kk in range(kc):
                x, y = a[(*t, i, kk)], b[(*t, kk, j)]
                product = OPS[mul](x, y)
                if np.isnan(product) and (x == zero or y == zero):
                    product = np.float64(zero)
                acc = OPS[add](acc, product)
            out[(*t, i, j)] = acc
    return out


def brute_kbest(a, b):
    """For each (..., i, j): every product a[p][..., i, kk] · b[q][..., kk, j] (all k² pairs of
    every kk), sorted, the k largest, 0-padded."""
    k = len(a)
    lead = np.broadcast_shapes(*(x.shape[:-2] for x in (*a, *b)))
    (m, kc), n = a[0].shape[-2:], b[0].shape[-1]
    a = [np.broadcast_to(x, lead + (m, kc)) for x in a]
    b = [np.broadcast_to(x, lead + (kc, n)) for x in b]
    out = np.empty((k,) + lead + (m, n))
    for *t, i, j in itertools.product(*map(range, lead + (m, n))):
        products = sorted((a[p][(*t, i, kk)] * b[q][(*t, kk, j)] for kk in range(kc) for p in range(k)
                           for q in range(k)), reverse=True)
        out[(slice(None), *t, i, j)] = (products + [0.0] * k)[:k]
    return list(out)


def random_values(rng, shape, *, zeros=0.25, ties=False, special=()):
    x = rng.normal(size=shape) * 2
    x[rng.random(shape) < zeros] = 0.0
    if ties:
        x = np.round(x)
    for value in special:  # a few infinities or NaN
        if x.size:
            x.flat[rng.integers(0, x.size, size=max(1, x.size // 10))] = value
    return x


def sorted_lists(rng, k, shape, *, ties=False):
    """k arrays, sorted descending elementwise and non-negative, with 0..k non-zero entries."""
    x = np.sort(np.abs(rng.normal(size=(k,) + tuple(shape))), axis=0)[::-1]
    if ties:
        x = np.round(x * 2) / 2
    count = rng.integers(0, k + 1, size=shape)
    return list(np.where(np.arange(k).reshape((-1,) + (1,) * len(shape)) < count, x, 0.0))


SHAPES = [((3, 4), (4, 5)), ((2, 1, 3, 7), (4, 7, 2)), ((5, 0), (0, 3)), ((0, 3), (3, 2)), ((9, 5), (5, 1)),
          ((1, 6), (6, 20)), ((3, 2, 4), (4, 6)), ((2, 3), (2, 3, 2)), ((6, 33), (33, 5)), ((1, 1), (1, 1))]
SHAPE_IDS = ["x".join(map(str, a)) + "@" + "x".join(map(str, b)) for a, b in SHAPES]


# ---------------------------------------------------------------- tropical_matmul


@pytest.mark.parametrize("shapes", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("add,mul", list(itertools.product(kernels.ADDS, kernels.MULS)))
def test_tropical_matmul_matches_brute_force(implementation, add, mul, shapes):
    rng = np.random.default_rng(len(add + mul) + sum(map(len, shapes)))
    a, b = random_values(rng, shapes[0], ties=True), random_values(rng, shapes[1])
    for zero in (None, 0.0):
        want = brute_tropical(a, b, add, mul, kernels._IDENTITY[add] if zero is None else zero)
        before = counted("tropical_matmul", implementation), counted("tropical_matmul", "constant operand")
        got = kernels.tropical_matmul(a, b, add=add, mul=mul, zero=zero)
        after = counted("tropical_matmul", implementation), counted("tropical_matmul", "constant operand")
        assert sum(after) == sum(before) + 1  # 1×1 operands are constant: the shortcut
        assert got.dtype == np.float64 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("special", [(np.inf,), (-np.inf,), (np.nan,), (np.inf, -np.inf, np.nan)],
                         ids=["inf", "-inf", "nan", "all"])
@pytest.mark.parametrize("add,mul", list(itertools.product(kernels.ADDS, kernels.MULS)))
def test_tropical_matmul_infinities_and_nan_as_numpy(implementation, add, mul, special):
    """inf · 0, inf - inf: NaN products make their entry NaN, as np.maximum / np.minimum do,
    except where an operand is 0̄ (here 0.0), which annihilates."""
    rng = np.random.default_rng(5)
    a = random_values(rng, (2, 6, 9), special=special)
    b = random_values(rng, (9, 7), special=special)
    want = brute_tropical(a, b, add, mul, 0.0)
    np.testing.assert_array_equal(kernels.tropical_matmul(a, b, add, mul, zero=0.0), want)


# Values placed in a and in b (both also hold zeros), and whether a NaN product is possible for
# each ⊗: 0 · ±∞ for ×, ∞ − ∞ for +, a NaN operand for every ⊗.
NAN_CASES = [  # (in a, in b, ⊗ that can make a NaN)
    (None, None, ()),
    (None, np.inf, ("mul",)),
    (None, -np.inf, ("mul",)),
    (-np.inf, -np.inf, ("mul",)),
    (np.inf, -np.inf, ("mul", "add")),
    (-np.inf, np.inf, ("mul", "add")),
    (None, np.nan, ("mul", "add", "max", "min")),
]


@pytest.mark.parametrize("in_a,in_b,nan_from", NAN_CASES, ids=[f"{a}-{b}" for a, b, _ in NAN_CASES])
@pytest.mark.parametrize("add,mul", list(itertools.product(kernels.ADDS, kernels.MULS)))
def test_numba_compares_plainly_only_when_no_product_can_be_nan(implementation, add, mul, in_a, in_b, nan_from):
    """The numba kernels skip their NaN-propagating comparisons when no product can be NaN (then
    no ⊕ of products can be): finite operands, and infinities where ⊗ cannot meet their NaN
    partner (a log-space semiring's -∞ under +). Both kernels give brute force's result."""
    if implementation != "numba":
        pytest.skip("the numba kernels' choice")
    rng = np.random.default_rng(7)
    a, b = random_values(rng, (5, 9)), random_values(rng, (9, 6))
    assert (a == 0).any() and (b == 0).any()
    if in_a is not None:
        a[1, 3] = in_a
    if in_b is not None:
        b[4, 2] = in_b
    key = "tropical_matmul operands (numba)"
    before = counted(key, "no NaN possible"), counted(key, "NaN possible")
    got = kernels.tropical_matmul(a, b, add, mul, zero=0.0)
    after = counted(key, "no NaN possible"), counted(key, "NaN possible")
    assert (after[0] - before[0], after[1] - before[1]) == ((0, 1) if mul in nan_from else (1, 0))
    np.testing.assert_array_equal(got, brute_tropical(a, b, add, mul, 0.0))


# ---------------------------------------------------------------- tropical_winners


@pytest.mark.parametrize("transposed", [False, True], ids=["b", "b-transposed"])
@pytest.mark.parametrize("shapes", SHAPES + [((2, 7, 70), (70, 300)), ((6, 33), (33, 260)), ((5, 2000), (2000, 9))],
                         ids=SHAPE_IDS + ["2x7x70@70x300", "6x33@33x260", "5x2000@2000x9"])
@pytest.mark.parametrize("add,mul", list(itertools.product(kernels.ADDS, kernels.MULS)))
def test_tropical_winners_are_the_first_k_attaining_each_value(implementation, add, mul, shapes, transposed):
    """Small integers: many products tie. The values are tropical_matmul's; each entry's winner is
    the first k whose product equals its value, -1 where the value is 0̄. The shapes cross the
    compiled kernel's 4-row tiles, J_BLOCK columns and its blocks of k (2,000: 16 blocks of 125),
    and its transposed form (matrix-vector products, and b the transpose of a contiguous array)."""
    rng = np.random.default_rng(sum(map(len, shapes)) + len(add + mul))
    a = np.round(random_values(rng, shapes[0]))
    b = np.round(random_values(rng, shapes[1]))
    if transposed:
        b = np.swapaxes(np.ascontiguousarray(np.swapaxes(b, -1, -2)), -1, -2)
    value, first = kernels.tropical_winners(a, b, add, mul, zero=0.0)
    products = OPS[mul](a[..., :, :, None], b[..., None, :, :])  # (..., m, k, n), every product
    want = OPS[add].reduce(products, axis=-2, initial=0.0)
    np.testing.assert_array_equal(value, want)
    hit = products == want[..., :, None, :]
    first_hit = np.argmax(hit, axis=-2) if hit.shape[-2] else np.zeros(want.shape, dtype=int)  # the first True
    want_first = np.where(want == 0.0, -1, first_hit)
    assert hit.any(axis=-2)[want != 0.0].all()
    np.testing.assert_array_equal(first, want_first)


@pytest.mark.parametrize("budget", [1 << 22, 3 * 7 * 9, 7 * 9 - 1], ids=["blocks", "three-blocks", "one-block"])
def test_tropical_winners_scratch_stays_within_the_block_budget(implementation, monkeypatch, budget):
    """The compiled kernel's per-block slices (7 × 9 each) are cut to MATMUL_BLOCK_ELEMENTS: the
    default allows all 16, a budget of three slices three, and one smaller than a slice a single
    block (the first k searched over all of k). The same answers each time."""
    monkeypatch.setattr(base_module, "MATMUL_BLOCK_ELEMENTS", budget)
    rng = np.random.default_rng(12)
    a, b = np.round(random_values(rng, (7, 2000))), np.round(random_values(rng, (2000, 9)))
    value, first = kernels.tropical_winners(a, b, "max", "mul", zero=0.0)
    products = a[:, :, None] * b[None]
    np.testing.assert_array_equal(value, np.maximum.reduce(products, axis=1, initial=0.0))
    np.testing.assert_array_equal(first, np.where(value == 0.0, -1, np.argmax(products == value[:, None, :], axis=1)))


@pytest.mark.parametrize("rows", [7, 8, 25])
@pytest.mark.parametrize("add,mul", [("max", "mul"), ("min", "add")])
def test_tropical_winners_search_each_block_with_and_without_a_transposed_b(implementation, rows, add, mul):
    """From WINNER_PANEL_ROWS rows of a the first winning k is searched in a transposed copy of each
    block's rows of b: both sides of it (8), over five blocks of k, with many ties (a k found in
    one block is never taken for another block's number)."""
    if implementation == "numba":
        assert kernels.jit_kernels().WINNER_PANEL_ROWS == 8
    rng = np.random.default_rng(rows)
    a, b = np.round(random_values(rng, (2, rows, 300))), np.round(random_values(rng, (2, 300, 70)))
    zero = 0.0 if mul == "mul" else (np.inf if add == "min" else -np.inf)
    value, first = kernels.tropical_winners(a, b, add, mul, zero=zero)
    products = a[..., :, :, None] * b[..., None, :, :] if mul == "mul" else a[..., :, :, None] + b[..., None, :, :]
    expected = kernels.UFUNCS[add].reduce(products, axis=-2, initial=zero)
    np.testing.assert_array_equal(value, expected)
    np.testing.assert_array_equal(first, np.where(value == zero, -1, np.argmax(products == value[..., None, :], axis=-2)))


@pytest.mark.parametrize("special", [np.nan, np.inf])
def test_tropical_winners_refuse_operands_whose_products_may_be_nan(implementation, special):
    a, b = np.zeros((2, 3)), np.ones((3, 4))
    b[1, 2] = special
    assert kernels.tropical_winners(a, b, "max", "mul") is None  # nan · 0, inf · 0
    assert (kernels.tropical_winners(a, b, "max", "add") is None) == np.isnan(special)


@pytest.mark.parametrize("c", [2.5, 1.0, 0.0, -3.0, np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("add,mul", list(itertools.product(kernels.ADDS, kernels.MULS)))
def test_tropical_matmul_with_a_constant_operand(implementation, add, mul, c):
    """An operand that is one value everywhere (a seed 1̄, broadcast or not) takes a shortcut,
    c ⊗ (⊕_k x[k]), where ⊗ is strictly increasing in c; the same values either way."""
    rng = np.random.default_rng(11)
    x = random_values(rng, (2, 5, 7), ties=True, special=(np.inf,))
    x[0, 0, 0] = np.nan
    almost = np.full((5, 4), c)
    almost[2, 1] = 7.0  # equal first, middle and last elements, but not constant
    for a, b in [(np.broadcast_to(c, (3, 5)), x), (x.swapaxes(-1, -2), np.broadcast_to(c, (5, 4))),
                 (np.full((2, 3, 5), c), x), (x.swapaxes(-1, -2), almost)]:
        want = brute_tropical(a, b, add, mul, kernels._IDENTITY[add])
        got = kernels.tropical_matmul(a, b, add, mul)
        assert got.flags.c_contiguous and got.flags.writeable
        np.testing.assert_array_equal(got, want)


def test_tropical_matmul_implementations_agree_on_big_operands():
    """Big enough for every block of both implementations (k panels, 4-row groups, column
    tiles of the compiled kernel past J_BLOCK = 256 columns with a short last tile, 3 rows
    and matrix-vector products in one sweep, transposed matrix-vector products): the same
    values exactly."""
    if not kernels.numba_available():
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(3)
    for shapes in [((3, 37, 150), (150, 29)), ((130, 70), (70, 3)), ((1, 64, 128), (5, 128, 64)),
                   ((7, 70), (70, 530)), ((3, 70), (70, 530)), ((2, 1, 90), (90, 300))]:
        for special in ((), (np.inf,)):  # both compiled variants: no NaN possible, and NaN-propagating
            a, b = random_values(rng, shapes[0], ties=True), random_values(rng, shapes[1], special=special)
            # b as the transpose of a contiguous array too (a lifted weight's wᵀ): computed as (bᵀ ⊗ aᵀ)ᵀ
            for b in (b, np.swapaxes(np.ascontiguousarray(np.swapaxes(b, -1, -2)), -1, -2)):
                for add, mul in itertools.product(kernels.ADDS, kernels.MULS):
                    np.testing.assert_array_equal(kernels.tropical_matmul(a, b, add, mul, backend="numba"),
                                                  kernels.tropical_matmul(a, b, add, mul, backend="numpy"))


@pytest.mark.parametrize("cache_block", [1, 64, 1 << 16], ids=["k-at-a-time", "small-blocks", "default"])
def test_tropical_matmul_numpy_blocks(monkeypatch, cache_block):
    """The NumPy loop one k at a time, in blocks, and blocks bounded by MATMUL_BLOCK_ELEMENTS."""
    monkeypatch.setattr(kernels, "CACHE_BLOCK_ELEMENTS", cache_block)
    rng = np.random.default_rng(4)
    a, b = random_values(rng, (2, 1, 5, 11)), random_values(rng, (3, 11, 4))
    want = brute_tropical(a, b, "max", "add", -np.inf)
    np.testing.assert_array_equal(kernels.tropical_matmul(a, b, "max", "add", backend="numpy"), want)
    monkeypatch.setattr(base_module, "MATMUL_BLOCK_ELEMENTS", 7)
    np.testing.assert_array_equal(kernels.tropical_matmul(a, b, "max", "add", backend="numpy"), want)


def test_tropical_matmul_takes_read_only_and_strided_operands_and_leaves_them_alone(implementation):
    rng = np.random.default_rng(6)
    a = random_values(rng, (6, 8)).T  # a transposed view: (8, 6)
    b = np.broadcast_to(random_values(rng, (6, 1)), (6, 5))  # read-only, stride 0
    a_copy, b_copy = a.copy(), b.copy()
    got = kernels.tropical_matmul(a, b, "min", "add")
    np.testing.assert_array_equal(got, brute_tropical(a_copy, b_copy, "min", "add", np.inf))
    np.testing.assert_array_equal(a, a_copy)
    np.testing.assert_array_equal(b, b_copy)


@pytest.mark.parametrize("call,message", [
    (lambda: kernels.tropical_matmul(np.ones((2, 2)), np.ones((2, 2)), add="sum"), "add must be"),
    (lambda: kernels.tropical_matmul(np.ones((2, 2)), np.ones((2, 2)), mul="div"), "mul must be"),
    (lambda: kernels.tropical_matmul(np.ones(2), np.ones((2, 2))), "at least 2 dimensions"),
    (lambda: kernels.tropical_matmul(np.ones((2, 3)), np.ones((2, 2))), "contraction sizes differ"),
    (lambda: kernels.tropical_matmul(np.ones((2, 2)), np.ones((2, 2)), backend="gpu"), "unknown kernel backend"),
    (lambda: kernels.set_backend("gpu"), "unknown kernel backend"),
])
def test_tropical_matmul_rejects_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_backend_switch():
    previous = kernels.set_backend("numpy")
    try:
        assert kernels.backend() == "numpy"
        before = counted("tropical_matmul", "numpy")
        kernels.tropical_matmul(np.arange(1600.0).reshape(40, 40), np.arange(1600.0).reshape(40, 40))
        assert counted("tropical_matmul", "numpy") == before + 1
    finally:
        kernels.set_backend(previous)
    assert kernels.backend() == previous
    if not kernels.numba_available():
        with pytest.raises(RuntimeError, match="numba"):
            kernels.set_backend("numba")


def test_an_unusable_numba_falls_back_to_numpy(monkeypatch, caplog):
    """numba installed but unable to compile the kernels: a warning, then NumPy."""
    class Broken:
        def __getattr__(self, name):
            def kernel(*args):
                raise RuntimeError("cannot compile here")
            return kernel

    monkeypatch.setattr(kernels, "_jit", lambda: Broken())
    monkeypatch.setattr(kernels, "_NUMBA_INSTALLED", True)
    previous = kernels.set_backend("numba")
    try:
        rng = np.random.default_rng(8)
        a, b = random_values(rng, (40, 30)), random_values(rng, (30, 50))
        with caplog.at_level("WARNING", logger="semigrad.kernels"):
            got = kernels.tropical_matmul(a, b, "max", "add")
        assert "numba cannot be used" in caplog.text and kernels.backend() == "numpy"
        np.testing.assert_array_equal(got, kernels.tropical_matmul(a, b, "max", "add", backend="numpy"))
        kernels.set_backend("numba")
        lists = sorted_lists(rng, 3, (40, 30)), sorted_lists(rng, 3, (30, 50))
        for x, y in zip(kernels.kbest_matmul(*lists), kernels.kbest_matmul(*lists, backend="numpy")):
            np.testing.assert_array_equal(x, y)
        assert kernels.backend() == "numpy"
        with pytest.raises(RuntimeError, match="cannot compile"):  # unless numba is asked for by name
            kernels.tropical_matmul(a, b, backend="numba")
    finally:
        kernels.set_backend(previous)


# ---------------------------------------------------------------- kbest_matmul

KBEST_SHAPES = [((3, 4), (4, 5)), ((2, 1, 3, 7), (4, 7, 2)), ((5, 0), (0, 3)), ((4, 1), (1, 3)), ((9, 2), (2, 1)),
                ((2, 40), (40, 3)), ((3, 2, 4), (4, 6))]
KBEST_IDS = ["x".join(map(str, a)) + "@" + "x".join(map(str, b)) for a, b in KBEST_SHAPES]


@pytest.mark.parametrize("shapes", KBEST_SHAPES, ids=KBEST_IDS)
@pytest.mark.parametrize("k", [1, 2, 3, 5, 9, 17])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_kbest_matmul_matches_brute_force(implementation, k, shapes, ties):
    """k > the number of paths (kk = 0, 1, 2 with large k) pads with 0; ties and zeros."""
    rng = np.random.default_rng(k * 31 + len(shapes[0]) + ties)
    a, b = sorted_lists(rng, k, shapes[0], ties=ties), sorted_lists(rng, k, shapes[1], ties=ties)
    got = kernels.kbest_matmul(a, b)
    assert len(got) == k
    for x, y in zip(got, brute_kbest(a, b)):
        assert x.dtype == np.float64
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("held", [(1, 1), (1, 5), (3, 1), (4, 2), (5, 5)], ids=lambda h: f"a{h[0]}-b{h[1]}")
def test_kbest_matmul_of_values_holding_fewer_ranks(implementation, held):
    """Values whose last ranks are 0 everywhere (a lifted partial holds one: its k - 1 zeros
    are not stacked for the kernel), on either side or both, as views of one 0 or arrays."""
    k = 5
    rng = np.random.default_rng(sum(held))
    a, b = sorted_lists(rng, k, (3, 2, 6)), sorted_lists(rng, k, (6, 4))
    a = a[:held[0]] + [np.broadcast_to(0.0, a[0].shape)] * (k - held[0])
    b = b[:held[1]] + [np.zeros(b[0].shape)] * (k - held[1])
    for x, y in zip(kernels.kbest_matmul(a, b), brute_kbest(a, b)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("k", [2, 3, 8])
def test_kbest_matmul_many_candidates_in_one_block(implementation, k):
    """Skewed rows (all the large heads in one block of the contraction axis) and all-equal
    values: many candidates above the first bound for one entry."""
    rng = np.random.default_rng(k)
    a, b = sorted_lists(rng, k, (3, 160)), sorted_lists(rng, k, (160, 4))
    a = [x * np.where(np.arange(160) < 12, 1e3, 1.0) for x in a]
    for left, right in [(a, b), ([np.ones((3, 160))] * k, [np.ones((160, 4))] * k)]:
        for x, y in zip(kernels.kbest_matmul(left, right), brute_kbest(left, right)):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("k", [2, 3, 8])
def test_kbest_matmul_numpy_in_small_chunks(monkeypatch, k):
    """Row and item chunks, and slices of candidates reduced to the k best as they come, when
    the arrays would not fit MATMUL_BLOCK_ELEMENTS."""
    monkeypatch.setattr(base_module, "MATMUL_BLOCK_ELEMENTS", 64)
    rng = np.random.default_rng(9)
    a, b = sorted_lists(rng, k, (2, 1, 6, 20), ties=True), sorted_lists(rng, k, (3, 20, 5))
    for x, y in zip(kernels.kbest_matmul(a, b, backend="numpy"), brute_kbest(a, b)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("c", [[1.0, 0.0, 0.0], [2.0, 2.0, 0.5], [0.0, 0.0, 0.0], [3.0, 1e-300, 1e-310]],
                         ids=["one", "ties", "zero", "tiny"])
def test_kbest_matmul_with_a_constant_operand(implementation, c):
    """An operand that is one sorted list everywhere (the seed 1̄ = (1, 0, ..., 0)) takes a
    shortcut: c ⊗ (the k best over the contraction axis of the other); the same values."""
    rng = np.random.default_rng(12)
    other = sorted_lists(rng, 3, (2, 6, 9), ties=True)
    const = [np.broadcast_to(v, (4, 6)) for v in c]
    for a, b in [(const, other), ([x.swapaxes(-1, -2) for x in other], [np.broadcast_to(v, (6, 5)) for v in c]),
                 ([np.full((4, 6), v) for v in c], other)]:
        got = kernels.kbest_matmul(a, b)
        for x, y in zip(got, brute_kbest(a, b)):
            assert x.flags.c_contiguous and x.flags.writeable
            np.testing.assert_array_equal(x, y)


def test_kbest_matmul_implementations_agree_on_big_operands():
    if not kernels.numba_available():
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(10)
    for k in (2, 3, 7, 20):
        a, b = sorted_lists(rng, k, (2, 40, 130), ties=k == 7), sorted_lists(rng, k, (130, 33))
        for x, y in zip(kernels.kbest_matmul(a, b, backend="numba"), kernels.kbest_matmul(a, b, backend="numpy")):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("a,b,message", [
    ([np.ones((2, 2)), 2 * np.ones((2, 2))], [np.ones((2, 2))] * 2, "sorted descending"),
    ([np.broadcast_to(1.0, (2, 2)), np.broadcast_to(2.0, (2, 2))], [np.ones((2, 2))] * 2, "sorted descending"),
    ([np.broadcast_to(1.0, (2, 2)), np.eye(2) * 3], [np.ones((2, 2))] * 2, "sorted descending"),
    ([-np.ones((2, 2))], [np.ones((2, 2))], "non-negative"),
    ([np.full((2, 2), np.nan)], [np.ones((2, 2))], "finite"),
    ([np.ones((2, 2))], [np.full((2, 2), np.inf)], "finite"),
    ([np.ones((2, 2))] * 2, [np.ones((2, 2))], "same non-zero length"),
    ([], [], "same non-zero length"),
])
def test_kbest_matmul_rejects_values_it_cannot_take(a, b, message):
    with pytest.raises(ValueError, match=message):
        kernels.kbest_matmul(a, b)


# ---------------------------------------------------------------- the plugins that use them

KERNEL_SEMIRINGS = [("max_product", {}), ("maxplus", {}), ("minplus", {}), ("bottleneck", {}), ("kbest", {"k": 1}),
                    ("kbest", {"k": 2}), ("kbest", {"k": 3}), ("kbest", {"k": 17}), ("kbest", {"k": 64})]
KERNEL_IDS = [name + "".join(f"-{k}={v}" for k, v in params.items()) for name, params in KERNEL_SEMIRINGS]


def naive_matmul(s, a, b):
    """⊕ over k of a[..., :, k] ⊗ b[..., k, :] with the semiring's reference ⊕ and ⊗."""
    add = getattr(s, "_add_reference", s.add)
    mul = getattr(s, "_mul_reference", s.mul)
    out = s.zeros(np.broadcast_shapes(s.shape(a)[:-2], s.shape(b)[:-2]) + (s.shape(a)[-2], s.shape(b)[-1]))
    for k in range(s.shape(a)[-1]):
        out = add(out, mul(s.map(lambda c: c[..., :, k, None], a), s.map(lambda c: c[..., None, k, :], b)))
    return out


def assert_same(s, got, want):
    assert s.shape(got) == s.shape(want)
    for x, y in zip(s.components_of(got), s.components_of(want)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("shapes", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("name,params", KERNEL_SEMIRINGS, ids=KERNEL_IDS)
def test_plugin_matmul_matches_naive(registry, implementation, name, params, shapes):
    s = registry.get(name, params)
    rng = np.random.default_rng(17)
    a, b = s.sample(rng, shapes[0]), s.sample(rng, shapes[1])
    assert_same(s, s.matmul(a, b), naive_matmul(s, a, b))


@pytest.mark.parametrize("name,params", KERNEL_SEMIRINGS, ids=KERNEL_IDS)
def test_plugin_matmul_of_lifted_partials_with_zeros_and_ties(registry, implementation, name, params):
    """What backward passes multiply: lifted partials (zeros, ties, tiny and huge ones)."""
    s = registry.get(name, params)
    rng = np.random.default_rng(18)
    d = random_values(rng, (2, 5, 30), ties=True) * rng.choice([1.0, 1e-200, 1e200], size=(2, 5, 30))
    a, b = s.lift(d), s.lift(random_values(rng, (30, 6), ties=True))
    assert_same(s, s.matmul(a, b), naive_matmul(s, a, b))


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the reference code's inf · 0
@pytest.mark.parametrize("special", [(np.inf,), (np.nan,)], ids=["inf", "nan"])
@pytest.mark.parametrize("k", [1, 3])
def test_kbest_non_finite_values_take_the_reference_path(registry, implementation, k, special):
    """inf · 0 = NaN: kbest's fast paths hand such values to the original sort-based code."""
    s = registry.get("kbest", {"k": k})
    rng = np.random.default_rng(19)
    a = s.lift(random_values(rng, (4, 7), special=special))
    b = s.add(s.lift(random_values(rng, (7, 3))), s.lift(random_values(rng, (7, 3))))
    c = s.lift(random_values(rng, (4, 7)))
    assert_same(s, s.matmul(a, b), s._matmul_reference(a, b))
    assert_same(s, s.add(a, c), s._add_reference(a, c))
    assert_same(s, s.mul(a, c), s._mul_reference(a, c))
    assert_same(s, s.sum(a, axis=(-1,)), s._sum_reference(a, axis=(-1,)))


def brute_top(values, k):
    """The k largest of a list of scalars, 0-padded."""
    return (sorted(values, reverse=True) + [0.0] * k)[:k]


@pytest.mark.parametrize("sum_by", ["network", "sort"])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 16, 17, 64])
def test_kbest_add_mul_sum_match_brute_force(registry, monkeypatch, k, sum_by):
    """⊕ and ⊗, elementwise with broadcasting, and the ⊕-reduce over any axes, against sorting
    every candidate: by selection networks (used for small k on big arrays, here forced on
    small ones; never above k = 16) and by the sort-based reference code."""
    monkeypatch.setattr(kbest_module, "SUM_NETWORK_MIN_SIZE", 0 if sum_by == "network" else 1 << 62)
    monkeypatch.setattr(kbest_module, "NETWORK_MIN_SIZE_PER_K", 0 if sum_by == "network" else 1 << 62)
    s = registry.get("kbest", {"k": k})
    rng = np.random.default_rng(k)
    a, b = sorted_lists(rng, k, (2, 1, 3), ties=True), sorted_lists(rng, k, (4, 3), ties=True)
    add = s.components_of(s.add(s._pack(tuple(a)), s._pack(tuple(b))))
    mul = s.components_of(s.mul(s._pack(tuple(a)), s._pack(tuple(b))))
    assert all(c.shape == (2, 4, 3) for c in add + mul)
    for i, j, m in np.ndindex(2, 4, 3):
        left, right = [c[i, 0, m] for c in a], [c[j, m] for c in b]
        np.testing.assert_array_equal([c[i, j, m] for c in add], brute_top(left + right, k))
        np.testing.assert_array_equal([c[i, j, m] for c in mul], brute_top([x * y for x in left for y in right], k))
    full = (2, 3, 4, 5)
    x = sorted_lists(rng, k, full, ties=True)
    for axis in [(-1,), (-2,), (-3, -1), (-4, -2), (-3, -2, -1)]:
        axes = sorted(ax % 4 for ax in axis)
        rest = [ax for ax in range(4) if ax not in axes]
        for keepdims in (False, True):
            got = s.components_of(s.sum(s._pack(tuple(x)), axis=axis, keepdims=keepdims))
            shape = tuple(1 if ax in axes else n for ax, n in enumerate(full)) if keepdims else \
                tuple(full[ax] for ax in rest)
            assert all(c.shape == shape for c in got), (axis, keepdims)
            for index in np.ndindex(*(full[ax] for ax in rest)):
                select, at = [slice(None)] * 4, [0] * 4
                for ax, i in zip(rest, index):
                    select[ax] = at[ax] = i
                candidates = [float(v) for c in x for v in np.ravel(c[tuple(select)])]
                where = tuple(at) if keepdims else index
                np.testing.assert_array_equal([c[where] for c in got], brute_top(candidates, k))


@pytest.mark.parametrize("k,n", [(2, 96), (3, 96), (17, 64)])
def test_kbest_matmul_memory_stays_bounded_with_numpy(registry, monkeypatch, k, n):
    """The NumPy k-best matmul with blocks of 2¹⁶ elements: far below the full product."""
    import semiring_cost

    monkeypatch.setattr(base_module, "MATMUL_BLOCK_ELEMENTS", 1 << 16)
    s = registry.get("kbest", {"k": k})
    rng = np.random.default_rng(0)
    a, b = s.sample(rng, (n, n)), s.sample(rng, (n, n))
    previous = kernels.set_backend("numpy")
    try:
        peak = semiring_cost.peak_bytes(lambda: s.matmul(a, b))
    finally:
        kernels.set_backend(previous)
    assert peak < n**3 * 8 * k / 4, peak


# ---------------------------------------------------------------- whole backward passes

PATH_SEEDS = range(16)


@pytest.fixture(scope="module")
def engine():
    return Engine()


@pytest.mark.parametrize("name,params", [("max_product", {}), ("maxplus", {}), ("minplus", {}), ("bottleneck", {}),
                                         ("kbest", {"k": 1}), ("kbest", {"k": 3}), ("kbest", {"k": 8})],
                         ids=["max_product", "maxplus", "minplus", "bottleneck", "kbest-1", "kbest-3", "kbest-8"])
def test_backward_passes_through_the_kernels_equal_path_enumeration(registry, engine, implementation, name, params):
    """Random graphs (matmuls with batch axes among them) with every semiring matmul going
    through the kernel implementation under test: ⊕ over the enumerated paths."""
    s = registry.get(name, params)
    before = sum(counted(kernel, implementation) for kernel in ("tropical_matmul", "kbest_matmul"))
    for seed in PATH_SEEDS:
        c = random_case(seed)
        gid = engine.register(graph_from_proto(c.graph.client_graph().to_proto()))[0].id
        r = engine.gradient(gid, c.inputs, seeds=c.seeds, semiring=name, semiring_params=params,
                            return_components=True, backend="tensor")
        for b in c.items():
            _, partials = c.item_partials(b)
            for x, shape in c.graph.inputs.items():
                for flat in range(math.prod(shape)):
                    full = tuple(b) + tuple(int(i) for i in np.unravel_index(flat, shape))
                    paths = [c.path_index(p) for p in c.graph.paths(x, flat)]
                    want = s.read(over_paths(s, paths, partials))
                    for key, value in want.items():
                        np.testing.assert_allclose(np.asarray(r.components[x][key])[full], value, rtol=1e-12,
                                                   atol=0, err_msg=f"seed {seed}, d/d{x}{list(full)}: {key}")
    used = sum(counted(kernel, implementation) for kernel in ("tropical_matmul", "kbest_matmul"))
    assert used > before


@pytest.mark.parametrize("shape, axis, kept", [((0, 4), (1,), (0,)), ((2, 0, 4), (2,), (2, 0)),
                                               ((2, 0, 4), (1,), (2, 4)), ((3, 4), (0, 1), ())])
def test_kbest_sum_with_empty_axes(shape, axis, kept):
    """An empty axis, reduced or kept: the k best of no candidates are 0̄; of twelve ones, ones."""
    s = kbest_module.KBestSemiring(3)
    out = s.sum(s.lift(np.ones(shape)), axis)
    assert s.shape(out) == kept
    reduced = math.prod(shape[a] for a in axis)
    want = [np.full(kept, 1.0 if i < reduced else 0.0) for i in range(3)]
    for got, expected in zip(s.components_of(out), want):
        np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------- neg_xlogx


def _neg_xlogx_by_definition(p):
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(p > 0, -p * np.log(p), 0.0)
    return np.where(np.isnan(p), np.nan, r)


@pytest.mark.parametrize("layout", ["C", "F", "strided", "broadcast", "scalar", "float32"])
def test_neg_xlogx_is_the_entropy_lifts_r_in_either_implementation(implementation, layout):
    rng = np.random.default_rng(5)
    p = np.abs(rng.normal(size=(6, 5))) * rng.choice([0.0, 1e-310, 1.0, 1e300], size=(6, 5))
    p.flat[:3] = [np.inf, np.nan, 5e-324]
    p = {"C": p, "F": np.asfortranarray(p), "strided": p[::2, ::2], "broadcast": np.broadcast_to(p[:1], (3, 5)),
         "scalar": np.float64(0.25), "float32": np.where(p < 1e30, p, 2.5).astype(np.float32)}[layout]
    r = kernels.neg_xlogx(p)
    np.testing.assert_array_max_ulp(r, _neg_xlogx_by_definition(p), maxulp=1)  # within an ulp of NumPy's SIMD log
    if np.ndim(p) == 2 and (p.flags.c_contiguous or p.flags.f_contiguous):
        assert r.strides == np.empty_like(np.asarray(p, dtype=np.float64)).strides  # p's layout


def test_neg_xlogx_runs_compiled_from_numba_min_work_elements():
    if not kernels.numba_available():
        pytest.skip("numba is not installed")
    previous = kernels.set_backend("numba")
    try:
        rng = np.random.default_rng(6)
        for size, implementation in ((kernels.NUMBA_MIN_WORK - 1, "numpy"), (kernels.NUMBA_MIN_WORK, "numba")):
            p = np.abs(rng.normal(size=size))
            before = counted("neg_xlogx", implementation)
            r = kernels.neg_xlogx(p)
            assert counted("neg_xlogx", implementation) == before + 1
            np.testing.assert_array_max_ulp(r, _neg_xlogx_by_definition(p), maxulp=1)
        big = np.abs(rng.normal(size=(300, 200))).T  # a transposed weight
        np.testing.assert_array_max_ulp(kernels.neg_xlogx(big, backend="numba"),
                                        kernels.neg_xlogx(big, backend="numpy"), maxulp=1)
    finally:
        kernels.set_backend(previous)
