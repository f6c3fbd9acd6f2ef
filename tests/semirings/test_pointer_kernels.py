"""The back-pointer matmuls (semiring/pointer_kernels.py) against plain Python loops over the
products, with many exact ties (small integers), for every (⊕, ⊗) of the tropical semirings."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from semigrad_server.semiring import kernels, pointer_kernels

MULS = {"mul": lambda a, b: a * b, "add": lambda a, b: a + b,  # ⊗ as the semirings' ufuncs: max and min propagate NaN
        "max": lambda a, b: float(np.maximum(a, b)), "min": lambda a, b: float(np.minimum(a, b))}
CASES = [("max", "mul", 0.0), ("max", "add", -np.inf), ("min", "add", np.inf), ("max", "min", 0.0)]


def key(order, v, p):
    return (-v if order == "max" else v, p)


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("order,mul,zero", CASES)
def test_one_winner_with_the_smallest_pointer_on_ties(order, mul, zero):
    rng = np.random.default_rng(1)
    m, kk, n = 3, 5, 4
    va, vb = rng.integers(0, 3, (m, kk)).astype(float), rng.integers(0, 3, (kk, n)).astype(float)
    pa = np.full((m, kk), -1.0)  # a: lifted partials (no pointer); b: adjoints with pointers
    pb = rng.permutation(kk * n).reshape(kk, n).astype(float)
    qa, qb = rng.normal(size=(m, kk)), rng.normal(size=(kk, n))
    v, p, q = pointer_matmul = pointer_kernels.pointer_matmul((va, pa, qa), (vb, pb, qb), order, mul, zero)
    for i, j in itertools.product(range(m), range(n)):
        cands = [(MULS[mul](va[i, k], vb[k, j]), max(pa[i, k], pb[k, j]), qa[i, k] * qb[k, j]) for k in range(kk)]
        best = min(cands, key=lambda c: key(order, c[0], c[1]))
        assert (v[i, j], p[i, j], q[i, j]) == best, (i, j, cands, pointer_matmul)


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("lifted", [True, False])
@pytest.mark.parametrize("order,mul,zero", CASES[:3])
def test_the_k_best_with_ranks(order, mul, zero, lifted):
    rng = np.random.default_rng(2)
    K, m, kk, n = 3, 2, 4, 3
    worst = 0.0 if zero == 0.0 else zero

    def klist(shape, ranks):
        v = np.sort(rng.integers(1, 4, (K,) + shape).astype(float), axis=0)
        v = v[::-1] if order == "max" else v
        v[ranks:] = worst
        p = rng.permutation(K * int(np.prod(shape))).reshape((K,) + shape).astype(float)
        return list(v) + list(p) + list(rng.normal(size=(K,) + shape))

    a = klist((m, kk), 1 if lifted else K)
    b = klist((kk, n), K)
    out = pointer_kernels.kbest_pointer_matmul(tuple(a), tuple(b), K, order, mul, zero)
    for i, j in itertools.product(range(m), range(n)):
        cands = [(MULS[mul](a[ra][i, k], b[rb][k, j]), max(a[K + ra][i, k], b[K + rb][k, j]),
                  a[2 * K + ra][i, k] * b[2 * K + rb][k, j])
                 for k in range(kk) for ra in range(K) for rb in range(K)
                 if a[ra][i, k] != worst and b[rb][k, j] != worst]
        cands.sort(key=lambda c: key(order, c[0], c[1]))
        for r in range(K):
            got = (out[r][i, j], out[K + r][i, j], out[2 * K + r][i, j])
            want = cands[r] if r < len(cands) else (zero, -1.0, 0.0)
            assert got[:2] == want[:2] and got[2] == pytest.approx(want[2]), (i, j, r, got, cands[:K])


def sequential(a, b, order, mul, zero):
    """The definition, one k at a time: the state starts at (0̄, no pointer, partial 0) and a
    product replaces it when its value is better, or equal with a smaller pointer."""
    (va, pa, qa), (vb, pb, qb) = a, b
    m, kk = va.shape
    n = vb.shape[1]
    out = np.empty((3, m, n))
    for i, j in itertools.product(range(m), range(n)):
        state = (zero, -1.0, 0.0)
        for k in range(kk):
            v, p = MULS[mul](va[i, k], vb[k, j]), max(pa[i, k], pb[k, j])
            if v == v and (key(order, v, p) < key(order, *state[:2])):
                state = (v, p, qa[i, k] * qb[k, j])
        out[:, i, j] = state
    return out


# Which operand carries pointers and how: the two-pass form needs one side without pointers and
# the other's increasing along k (an adjoint's element ids); anything else takes the one-pass kernel.
LAYOUTS = {
    "b carries, increasing": (False, "increasing", True),
    "a carries, increasing": (True, "increasing", True),
    "b carries, permuted": (False, "permuted", False),
    "both carry": (None, "increasing", False),
}


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("special", [None, np.nan], ids=["plain", "nan"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("order,mul,zero", CASES)
def test_two_passes_or_one_give_the_definitions_winners(order, mul, zero, layout, special, monkeypatch):
    """Values and each entry's first winning k (kernels.tropical_winners) when the layout allows it, the
    one-pass kernel otherwise: both the triples of the definition, on many ties, entries no
    product beats (0̄), rows past the 4-row tiles and columns past J_BLOCK."""
    monkeypatch.setattr(kernels, "NUMBA_MIN_WORK", 0)
    rng = np.random.default_rng(3)
    m, kk, n = 6, 7, 260
    va, vb = rng.integers(-1, 3, (m, kk)).astype(float), rng.integers(-1, 3, (kk, n)).astype(float)
    if special is not None:
        vb[2, 5] = special
    a_carries, pointers, two_pass = LAYOUTS[layout]

    def carried(shape):  # element ids in C order: increasing along k on either side
        ids = np.arange(np.prod(shape), dtype=float).reshape(shape) + 10
        return rng.permutation(ids.ravel()).reshape(shape) if pointers == "permuted" else ids

    pa = carried((m, kk)) if a_carries in (True, None) else np.full((m, kk), -1.0)
    pb = carried((kk, n)) if a_carries in (False, None) else np.full((kk, n), -1.0)
    qa, qb = rng.normal(size=(m, kk)), rng.normal(size=(kk, n))
    before = kernels.calls.get(("tropical_winners", "numba"), 0)
    got = pointer_kernels.pointer_matmul((va, pa, qa), (vb, pb, qb), order, mul, zero)
    ran_two = kernels.calls.get(("tropical_winners", "numba"), 0) > before
    assert ran_two == (two_pass and special is None)
    want = sequential((va, pa, qa), (vb, pb, qb), order, mul, zero)
    for c in range(3):
        np.testing.assert_array_equal(got[c], want[c])


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("order,mul,zero", CASES)
def test_batched_adjoints_against_one_shared_weight(order, mul, zero, monkeypatch):
    """Adjoints of 3 batch items (pointers: their element ids) against one lifted weight broadcast
    over the batch: the winners item by item, as the definition's."""
    monkeypatch.setattr(kernels, "NUMBA_MIN_WORK", 0)
    rng = np.random.default_rng(4)
    items, m, kk, n = 3, 5, 9, 7
    va = rng.integers(-1, 3, (items, m, kk)).astype(float)
    pa = np.arange(items * m * kk, dtype=float).reshape(items, m, kk)
    qa = rng.normal(size=(items, m, kk))
    vb = rng.integers(-1, 3, (kk, n)).astype(float)
    pb, qb = np.broadcast_to(-1.0, (kk, n)), rng.normal(size=(kk, n))
    got = pointer_kernels.pointer_matmul((va, pa, qa), (vb, pb, qb), order, mul, zero)
    for t in range(items):
        want = sequential((va[t], pa[t], qa[t]), (vb, pb, qb), order, mul, zero)
        for c in range(3):
            np.testing.assert_array_equal(got[c][t], want[c])


def kbest_definition(a, b, K, order, mul, zero):
    """The K best (value, pointer, partial) over k and both operands' ranks, by value in ⊕'s order
    then the smaller pointer (max of the two), padded with (0̄, -1, 0); NaN products and ranks
    holding 0̄ are not candidates. Vectorised over every (i, j) at once."""
    va, pa, qa = (np.stack(a[c * K:(c + 1) * K], -1) for c in range(3))  # (m, kk, K)
    vb, pb, qb = (np.stack(b[c * K:(c + 1) * K], -1) for c in range(3))
    ufunc = kernels.UFUNCS[mul]
    v = ufunc(va[:, None, :, :, None], np.swapaxes(vb, 0, 1)[None, :, :, None, :])  # (m, n, kk, ra, rb)
    p = np.maximum(pa[:, None, :, :, None], np.swapaxes(pb, 0, 1)[None, :, :, None, :])
    q = qa[:, None, :, :, None] * np.swapaxes(qb, 0, 1)[None, :, :, None, :]
    valid = (va != zero)[:, None, :, :, None] & (np.swapaxes(vb, 0, 1) != zero)[None, :, :, None, :] & (v == v)
    m, n = v.shape[:2]
    v, p, q, valid = (x.reshape(m, n, -1) for x in (v, p, q, valid))
    sort_key = np.where(valid, -v if order == "max" else v, np.inf)
    ranked = np.lexsort((p, sort_key), axis=-1)[..., :K]
    took = np.take_along_axis(valid, ranked, -1)
    pick = [np.where(took, np.take_along_axis(x, ranked, -1), fill) for x, fill in ((v, zero), (p, -1.0), (q, 0.0))]
    pad = K - pick[0].shape[-1]
    return [np.pad(x, ((0, 0), (0, 0), (0, max(0, pad))), constant_values=fill)
            for x, fill in zip(pick, (zero, -1.0, 0.0))]


# (K, kk): the block-bound kernel's bound needs at least K blocks of k (kk ≥ K); blocks hold
# one k up to kk = 4K, more past it (pointer_kernels.K_BLOCKS_PER_RANK, K_BLOCK_LENGTH)
BLOCKINGS = {"fewer k than K": (4, 3), "one k per block": (3, 12), "blocks of several k": (3, 70),
             "K = 10": (10, 200)}


def kbest_case(order, mul, zero, K, kk, carriers, special, seed=5, m=6, items=()):
    """Operands with many ties (small integers), some elements holding fewer ranks, rows past the
    4-row groups and columns past KBEST_J_BLOCK (m 6, n 70); `special` written into b; `items`:
    leading axes of both."""
    rng = np.random.default_rng(seed)
    n = 70

    def klist(shape, carries):
        ranks = K if carries else 1  # a lifted partial: one rank, no pointers
        v = np.sort(rng.integers(0 if zero == 0.0 else -1, 4, (K,) + shape).astype(float), axis=0)
        v = v[::-1] if order == "max" else v
        v[ranks:] = zero
        cut = rng.integers(1, ranks + 1, shape)  # some elements hold fewer ranks
        v[np.arange(K).reshape((K,) + (1,) * len(shape)) >= cut] = zero
        if carries:
            p = rng.permutation(K * int(np.prod(shape))).reshape((K,) + shape).astype(float)
        else:
            p = np.full((K,) + shape, -1.0)
        return list(v) + list(p) + list(rng.normal(size=(K,) + shape))

    a = klist(items + (m, kk), carriers in ("a", "both"))
    b = klist(items + (kk, n), carriers in ("b", "both"))
    if special is not None:
        b[0][kk // 2, 3] = special
    return a, b


def check_kbest(order, mul, zero, K, kk, carriers, special, kernel, m=6, items=()):
    a, b = kbest_case(order, mul, zero, K, kk, carriers, special, m=m, items=items)
    before = kernels.calls.get(("kbest_pointer_matmul", kernel), 0)
    out = pointer_kernels.kbest_pointer_matmul(tuple(a), tuple(b), K, order, mul, zero)
    assert kernels.calls.get(("kbest_pointer_matmul", kernel), 0) == before + 1
    for item in np.ndindex(items):
        want = kbest_definition([x[item] for x in a], [x[item] for x in b], K, order, mul, zero)
        for c in range(3):
            got = np.stack([x[item] for x in out[c * K:(c + 1) * K]], -1)
            np.testing.assert_array_equal(got, want[c], err_msg=f"item {item}, component {c}")


# The block-bound kernel is one generic loop compiled per (⊕, ⊗) (~15 s each, cold): both
# orders, both kinds of 0̄ and two ⊗ here; the tropical kernels' tests cover every ⊗ of the loop
# they share (_tile, _combine).
@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("carriers", ["a", "b", "both"])
@pytest.mark.parametrize("blocking", list(BLOCKINGS))
@pytest.mark.parametrize("order,mul,zero", [CASES[0], CASES[2]])
def test_the_k_best_block_bound_gives_the_definitions_k_best(order, mul, zero, blocking, carriers):
    """The K best with ranks and pointers, against the definition, with fewer than K blocks of
    k (no bound) and more, one k per block and several."""
    check_kbest(order, mul, zero, *BLOCKINGS[blocking], carriers, None, "block bound")


# rows of a on either side of pointer_kernels.ROWS_KERNEL_MAX_M, with b a lifted partial (a
# carries) or not: the by-rows kernel only for fewer rows and b lifted
ROWS = [(1, "a", "block bound, by rows"), (3, "a", "block bound, by rows"), (4, "a", "block bound"),
        (1, "both", "block bound"), (2, "b", "block bound")]


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("m,carriers,kernel", ROWS)
@pytest.mark.parametrize("blocking", ["fewer k than K", "blocks of several k", "K = 10"])
@pytest.mark.parametrize("order,mul,zero", [CASES[0], CASES[2]])
def test_the_k_best_of_a_few_rows_give_the_definitions_k_best(order, mul, zero, blocking, m, carriers, kernel):
    """A row-wise Jacobian's adjoint (layer norm: a (1, n) row of adjoints by its (n, n) lifted
    Jacobian, for a batch of rows): 2 × 3 items of m rows, against the definition item by item."""
    check_kbest(order, mul, zero, *BLOCKINGS[blocking], carriers, None, kernel, m=m, items=(2, 3))


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("carriers", ["a", "b", "both"])
@pytest.mark.parametrize("order,mul,zero", CASES)
def test_operands_that_may_make_nan_take_the_one_pass_form(order, mul, zero, carriers):
    """An operand holding NaN: every k offered (the NaN product is no candidate, later ranks
    still are), the definition's K best."""
    check_kbest(order, mul, zero, *BLOCKINGS["blocks of several k"], carriers, np.nan, "one pass")


# CHUNK_WORK: every row in one kernel call; 7 rows a call (the last call short); one row a call
CHUNKINGS = {"one call": None, "chunks of 7 rows": 7, "chunks of 1 row": 1}


def chunked(monkeypatch, rows_per_call, work_per_row):
    if rows_per_call is not None:
        monkeypatch.setattr(pointer_kernels, "CHUNK_WORK", rows_per_call * work_per_row)


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("k,candidates", [(1, 1), (3, 3), (3, 7), (10, 20), (10, 100)])
def test_the_k_best_candidates_are_lexsorts_first_k(k, candidates, sign, chunking, monkeypatch):
    """top_candidates against np.lexsort((p, -sign · v)) (stable, NaN last): values with many
    ties, ±0, ±inf and NaN, pointers with ties too, candidates sorted or not; the rows in one
    kernel call or several (the deadline checked between them)."""
    chunked(monkeypatch, CHUNKINGS[chunking], candidates * k)
    rng = np.random.default_rng(6)
    rows = 400
    v = rng.choice([0.0, -0.0, 1.0, 2.0, 3.0, np.inf, -np.inf, np.nan], size=(rows, candidates),
                   p=[.2, .1, .2, .2, .1, .07, .07, .06])
    v[: rows // 2] = np.sort(v[: rows // 2], axis=-1)[:, ::-1] if sign > 0 else np.sort(v[: rows // 2], axis=-1)
    p = rng.integers(-1, 4, size=(rows, candidates)).astype(float)
    q = rng.normal(size=(rows, candidates))
    got = pointer_kernels.top_candidates(v, p, q, k, sign)
    order = np.lexsort((p, -sign * v), axis=-1)[:, :k]
    for g, x in zip(got, (v, p, q)):
        np.testing.assert_array_equal(g, np.take_along_axis(x, order, -1))


@pytest.mark.skipif(pointer_kernels._kernels() is None, reason="numba not installed")
@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("k", [1, 3, 10])
def test_a_k_best_sum_of_two_values_is_lexsorts_first_k_of_both(k, sign, chunking, monkeypatch):
    """top_of_two(a, b) (a k-best ⊕, each value's k ranks as they are) against np.lexsort of a's
    candidates then b's: ties between the values, ±0, ±inf and NaN, strided operands. A third of
    the rows hold ranks in the selection's order (as k-best values do: merged), a third in
    value order only (ties of value unordered by pointer, NaN first when larger is better:
    inserted), and in a third only one operand's are in order."""
    chunked(monkeypatch, CHUNKINGS[chunking], 2 * k * k)
    rng = np.random.default_rng(7)
    rows = 300

    def value(ordered):
        v = rng.choice([0.0, -0.0, 1.0, 2.0, np.inf, -np.inf, np.nan], size=(rows, k), p=[.2, .1, .3, .2, .07, .07, .06])
        v = np.sort(v, axis=-1)[:, ::-1] if sign > 0 else np.sort(v, axis=-1)
        p = rng.integers(-1, 4, size=(rows, k)).astype(float)
        order = np.lexsort((p, -sign * v), axis=-1)
        v[ordered], p[ordered] = np.take_along_axis(v, order, -1)[ordered], np.take_along_axis(p, order, -1)[ordered]
        q = rng.normal(size=(rows, 2 * k))[:, ::2]  # strided
        return v, p, q

    third = np.arange(rows) % 3
    a, b = value(third != 1), value(third == 0)
    got = pointer_kernels.top_of_two(a, b, sign)
    v, p, q = (np.concatenate([x, y], -1) for x, y in zip(a, b))
    order = np.lexsort((p, -sign * v), axis=-1)[:, :k]
    for g, x in zip(got, (v, p, q)):
        np.testing.assert_array_equal(g, np.take_along_axis(x, order, -1))


def _ranks_of(whole):
    return [whole[..., r] for r in range(whole.shape[-1])]


_OWNER = np.arange(2 * 3 * 4, dtype=float).reshape(2, 3, 4)
_CONSTANT = np.broadcast_to(0.0, (2, 3))
STACKS = {  # parts -> whether they are one buffer's last axis, evenly spaced
    "a k-best op's ranks": (_ranks_of(_OWNER), True),
    "reshaped": ([x.reshape(3, 2) for x in _ranks_of(_OWNER)], True),
    "transposed": ([x.T for x in _ranks_of(_OWNER)], True),
    "one constant repeated": ([_CONSTANT] * 3, True),
    "ranks out of order": ([_OWNER[..., 1], _OWNER[..., 0], _OWNER[..., 2]], False),
    "a rank skipped": ([_OWNER[..., 0], _OWNER[..., 1], _OWNER[..., 3]], False),
    "two buffers": ([_OWNER[..., 0], _OWNER[..., 1].copy()], False),
    "other strides": ([_OWNER[..., 0], np.ascontiguousarray(_OWNER[..., 1])], False),
    "one rank": ([_OWNER[..., 0]], False),
    "not arrays": ([0.0, 1.0], False),
}


@pytest.mark.parametrize("case", list(STACKS))
def test_ranks_are_read_in_place_only_when_they_are_one_buffers_last_axis(case):
    """stacked_view: the ranks' (..., k) view, read-only, equal to np.stack of them, exactly when
    they are evenly spaced views of one buffer; None otherwise (they are then stacked: a copy)."""
    parts, in_place = STACKS[case]
    view = pointer_kernels.stacked_view(parts)
    assert (view is not None) == in_place
    if in_place:
        np.testing.assert_array_equal(view, np.stack(parts, -1))
        assert not view.flags.writeable
