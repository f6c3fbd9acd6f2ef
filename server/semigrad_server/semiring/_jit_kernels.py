"""The numba implementations behind `kernels` (imported only when numba is installed).

Compiled lazily, on the first call of each function, for one argument signature (`kernels`
always passes C-contiguous read-only inputs, int64 item indices and a fresh C-contiguous
output), and cached on disk by numba (`cache=True`), so later processes load the machine
code instead of compiling it again.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# Codes of ⊕ and ⊗ for the shared loop below; each entry point fixes them as constants, so
# after inlining LLVM drops the branches and vectorises the inner loop. The small helpers
# (`_combine`, `_accumulate`, `_tile`, ...) are left for LLVM to inline: inlined by numba
# (inline="always") every call site was typed again, and each entry point took ~6 s to compile
# instead of ~2 (the same machine code speed; a cold `make test` compiles dozens of them).
ADD_MAX, ADD_MIN = 0, 1
MUL_MUL, MUL_ADD, MUL_MAX, MUL_MIN = 0, 1, 2, 3
K_BLOCK = 64  # rows of b per panel: they stay in cache while 4 rows of a sweep them
J_BLOCK = 256  # columns per tile: 4 output rows of it (8 KB) stay in L1, a panel of b (128 KB) in L2
WINNER_PANEL_ROWS = 8  # rows of a from which the winners' search reads a transposed copy of b
PRUNED_ALONE = 0.9  # a pruned k-best pass bounds an entry by ratio × its best alone from this ratio up
KBEST_J_BLOCK = 64  # the k-best pointer kernel's tiles: an entry's block bests, read across blocks, stay in L2


def _no_nan_extremum(name: str):
    """A numba intrinsic: LLVM's `name` ("llvm.maxnum" or "llvm.minnum") of two float64 values
    that are never NaN (the `nnan` flag): one maxsd/minsd, and inside a loop one vmaxpd/vminpd per
    four lanes. Written as `x if x > y else y`, the same value, LLVM turns the loop's
    `out[j] = max(v, out[j])` into a compare and a masked store, which does not vectorise well
    (a BERT-width 128 × 768 × 3072 (max, ×) product: 1.7 → 4.0 G products a second)."""

    @intrinsic
    def extremum(typingctx, x, y):
        if not (x == types.float64 and y == types.float64):
            return None

        def codegen(context, builder, signature, args):
            double = ir.DoubleType()
            function = builder.module.declare_intrinsic(name, [double], ir.FunctionType(double, [double, double]))
            return builder.call(function, args, fastmath=("nnan",))

        return types.float64(types.float64, types.float64), codegen

    return extremum


_max_no_nan = _no_nan_extremum("llvm.maxnum")
_min_no_nan = _no_nan_extremum("llvm.minnum")


@numba.njit
def _combine(code, x, y, nan):
    """⊗. max and min propagate NaN like np.maximum and np.minimum (`|`, not `or`: no branch);
    without `nan` (no operand is NaN) LLVM's maxnum / minnum."""
    if code == MUL_MUL:
        return x * y
    if code == MUL_ADD:
        return x + y
    if code == MUL_MAX:
        if not nan:
            return _max_no_nan(x, y)
        return x if ((x > y) | (x != x)) else y
    if not nan:
        return _min_no_nan(x, y)
    return x if ((x < y) | (x != x)) else y


@numba.njit
def _accumulate(code, v, acc, nan):
    """acc ⊕ v, NaN-propagating when `nan`: once the accumulator is NaN nothing replaces it.
    Without `nan` LLVM's maxnum / minnum, the same result when no value is NaN and 4× faster
    than the NaN-propagating comparison (a BERT-width 128 × 768 × 3072 max-times product:
    1.0 → 4.0 G products a second)."""
    if code == ADD_MAX:
        if not nan:
            return _max_no_nan(v, acc)
        return v if ((v > acc) | (v != v)) else acc
    if not nan:
        return _min_no_nan(v, acc)
    return v if ((v < acc) | (v != v)) else acc


@numba.njit
def _product(code, x, y, nan, zero):
    """x ⊗ y, where a NaN product with an operand equal to 0̄ (`zero`) is 0̄: 0̄ annihilates,
    0 · ∞ and −∞ + ∞ included (a path through a zero partial is removed, whatever else is on
    it). Without `nan` no product is NaN and this is ⊗ itself."""
    v = _combine(code, x, y, nan)
    if nan:
        return zero if (v != v) & ((x == zero) | (y == zero)) else v
    return v


@numba.njit
def _tile(at, bt, ot, j0, j1, o0, k0, k1, add, mul, nan, zero):
    """ot[i, o0 + j - j0] ⊕= ⊕_{k0 ≤ k < k1} at[i, k] ⊗ bt[k, j] for every row i and j0 ≤ j < j1 (o0:
    where the columns start in ot, j0 when ot is as wide as bt, 0 for a scratch tile): four rows
    of a at a time (each element of b loaded once for four output rows), along contiguous rows of
    b and ot. Rows are slices indexed from 0 (range(w)): indices LLVM knows are not negative, so
    the inner loops vectorise (an index from range(j0, j1) keeps numba's wraparound)."""
    m = ot.shape[0]
    w = j1 - j0
    i0 = 0
    while i0 + 4 <= m:
        r0, r1, r2, r3 = ot[i0, o0:o0 + w], ot[i0 + 1, o0:o0 + w], ot[i0 + 2, o0:o0 + w], ot[i0 + 3, o0:o0 + w]
        for kk in range(k0, k1):
            x0, x1, x2, x3 = at[i0, kk], at[i0 + 1, kk], at[i0 + 2, kk], at[i0 + 3, kk]
            brow = bt[kk, j0:j1]
            for j in range(w):
                y = brow[j]
                r0[j] = _accumulate(add, _product(mul, x0, y, nan, zero), r0[j], nan)
                r1[j] = _accumulate(add, _product(mul, x1, y, nan, zero), r1[j], nan)
                r2[j] = _accumulate(add, _product(mul, x2, y, nan, zero), r2[j], nan)
                r3[j] = _accumulate(add, _product(mul, x3, y, nan, zero), r3[j], nan)
        i0 += 4
    for i in range(i0, m):
        row = ot[i, o0:o0 + w]
        for kk in range(k0, k1):
            x = at[i, kk]
            brow = bt[kk, j0:j1]
            for j in range(w):
                row[j] = _accumulate(add, _product(mul, x, brow[j], nan, zero), row[j], nan)


@numba.njit(inline="always")
def _tropical(a, b, ia, ib, zero, out, add, mul, nan):
    """out[t, i, j] = ⊕_k a[ia[t], i, k] ⊗ b[ib[t], k, j], from `zero`. Tiled over columns
    (J_BLOCK when there are 4 rows or more: 4 output rows of a tile stay in L1) and over k (a
    K_BLOCK × J_BLOCK panel of b stays in L2), each tile by `_tile`. Each entry still
    ⊕-accumulates its k in increasing order."""
    items, m, n = out.shape
    kc = a.shape[2]
    for t in range(items):
        at = a[ia[t]]
        bt = b[ib[t]]
        ot = out[t]
        for i in range(m):
            row = ot[i]
            for j in range(n):
                row[j] = zero
        jb = J_BLOCK if m >= 4 else n  # rows of a matrix-vector product: one sweep is fastest
        for j0 in range(0, n, max(1, jb)):
            j1 = min(n, j0 + jb)
            for k0 in range(0, kc, K_BLOCK):
                _tile(at, bt, ot, j0, j1, j0, k0, min(kc, k0 + K_BLOCK), add, mul, nan, zero)


_OPTIONS = {"cache": True, "nogil": True, "error_model": "numpy"}

# Two top-level entry points per (⊕, ⊗) pair, written out (NaN-propagating, and `_no_nan` for
# operands whose products cannot be NaN, kernels.nan_free_products): LLVM folds the constant operators
# into each compiled loop, and its on-disk cache needs functions defined at module level (a
# factory making them in a loop would recompile in every process).


@numba.njit(**_OPTIONS)
def max_mul(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MAX, MUL_MUL, True)


@numba.njit(**_OPTIONS)
def max_mul_no_nan(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MAX, MUL_MUL, False)


@numba.njit(**_OPTIONS)
def max_add(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MAX, MUL_ADD, True)


@numba.njit(**_OPTIONS)
def max_add_no_nan(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MAX, MUL_ADD, False)


@numba.njit(**_OPTIONS)
def max_max(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MAX, MUL_MAX, True)


@numba.njit(**_OPTIONS)
def max_max_no_nan(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MAX, MUL_MAX, False)


@numba.njit(**_OPTIONS)
def max_min(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MAX, MUL_MIN, True)


@numba.njit(**_OPTIONS)
def max_min_no_nan(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MAX, MUL_MIN, False)


@numba.njit(**_OPTIONS)
def min_mul(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MIN, MUL_MUL, True)


@numba.njit(**_OPTIONS)
def min_mul_no_nan(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MIN, MUL_MUL, False)


@numba.njit(**_OPTIONS)
def min_add(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MIN, MUL_ADD, True)


@numba.njit(**_OPTIONS)
def min_add_no_nan(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MIN, MUL_ADD, False)


@numba.njit(**_OPTIONS)
def min_max(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MIN, MUL_MAX, True)


@numba.njit(**_OPTIONS)
def min_max_no_nan(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MIN, MUL_MAX, False)


@numba.njit(**_OPTIONS)
def min_min(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MIN, MUL_MIN, True)


@numba.njit(**_OPTIONS)
def min_min_no_nan(a, b, ia, ib, zero, out):
    _tropical(a, b, ia, ib, zero, out, ADD_MIN, MUL_MIN, False)


@numba.njit(inline="always")
def _winners(a, b, ia, ib, zero, value, first, blocks, add, mul):
    """value[t, i, j] = ⊕_k a[ia[t], i, k] ⊗ b[ib[t], k, j] from `zero` (no product may be NaN), and
    first[t, i, j] = the first k whose product equals it, where it is not `zero` (-1 elsewhere).

    The products are ⊕-accumulated per block of k (`blocks`: one (m, n) slice per block, tiled as
    `_tropical`, vectorised); an entry's value is the ⊕ of its blocks, and its first k is searched
    only in the first block that attains the value (scalar, at most a block's length), block by
    block; with WINNER_PANEL_ROWS rows or more, over a transposed copy of the block's rows of b,
    so that an entry's search reads b along k contiguously (down a column of b each k was a cache
    miss: 2/3 of the kernel's time on a BERT-width 32 × 768 × 3072 product; with fewer rows the
    copy costs more than the misses it saves: a layer norm's 1 × 768 × 768 row products).
    Tracking the winning k in the vectorised loop itself would need a select per product, which
    LLVM turns into a masked store (0.5 G products a second against 4)."""
    items, m, n = value.shape
    kc = a.shape[2]
    nb = blocks.shape[0]
    kb = -(-kc // nb)
    transposed = m >= WINNER_PANEL_ROWS
    panel = np.empty((n, kb) if transposed else (1, 1))  # panel[j, kk - k0] = b[kk, j], k0 ≤ kk < k0 + kb
    for t in range(items):
        at = a[ia[t]]
        bt = b[ib[t]]
        ft = first[t]
        for blk in range(nb):
            for i in range(m):
                row = blocks[blk, i]
                for j in range(n):
                    row[j] = zero
        jb = J_BLOCK if m >= 4 else n
        for j0 in range(0, n, max(1, jb)):
            j1 = min(n, j0 + jb)
            for blk in range(nb):
                _tile(at, bt, blocks[blk], j0, j1, j0, blk * kb, min(kc, (blk + 1) * kb), add, mul, False, zero)
        for i in range(m):  # the values, and the first block attaining each (in `first` until the search,
            # as -2 - block: a k found in an earlier block is not read as a block number)
            for j in range(n):
                v = zero
                for blk in range(nb):
                    v = _accumulate(add, blocks[blk, i, j], v, False)
                value[t, i, j] = v
                found = -1
                if v != zero:
                    for blk in range(nb):
                        if blocks[blk, i, j] == v:
                            found = -2 - blk
                            break
                ft[i, j] = found
        for blk in range(nb):  # each entry's first k, in its block
            k0, k1 = blk * kb, min(kc, (blk + 1) * kb)
            if transposed:
                for kk in range(k0, k1):
                    b_row = bt[kk]
                    for j in range(n):
                        panel[j, kk - k0] = b_row[j]
            for i in range(m):
                x_row = at[i]
                f_row = ft[i]
                for j in range(n):
                    if f_row[j] != -2 - blk:
                        continue
                    v = value[t, i, j]
                    f_row[j] = -1  # (found below: the block's best is one of its products)
                    for kk in range(k0, k1):
                        y = panel[j, kk - k0] if transposed else bt[kk, j]
                        if _combine(mul, x_row[kk], y, False) == v:
                            f_row[j] = kk
                            break


@numba.njit(**_OPTIONS)
def winners_max_mul(a, b, ia, ib, zero, value, first, blocks):
    _winners(a, b, ia, ib, zero, value, first, blocks, ADD_MAX, MUL_MUL)


@numba.njit(**_OPTIONS)
def winners_max_add(a, b, ia, ib, zero, value, first, blocks):
    _winners(a, b, ia, ib, zero, value, first, blocks, ADD_MAX, MUL_ADD)


@numba.njit(**_OPTIONS)
def winners_max_max(a, b, ia, ib, zero, value, first, blocks):
    _winners(a, b, ia, ib, zero, value, first, blocks, ADD_MAX, MUL_MAX)


@numba.njit(**_OPTIONS)
def winners_max_min(a, b, ia, ib, zero, value, first, blocks):
    _winners(a, b, ia, ib, zero, value, first, blocks, ADD_MAX, MUL_MIN)


@numba.njit(**_OPTIONS)
def winners_min_mul(a, b, ia, ib, zero, value, first, blocks):
    _winners(a, b, ia, ib, zero, value, first, blocks, ADD_MIN, MUL_MUL)


@numba.njit(**_OPTIONS)
def winners_min_add(a, b, ia, ib, zero, value, first, blocks):
    _winners(a, b, ia, ib, zero, value, first, blocks, ADD_MIN, MUL_ADD)


@numba.njit(**_OPTIONS)
def winners_min_max(a, b, ia, ib, zero, value, first, blocks):
    _winners(a, b, ia, ib, zero, value, first, blocks, ADD_MIN, MUL_MAX)


@numba.njit(**_OPTIONS)
def winners_min_min(a, b, ia, ib, zero, value, first, blocks):
    _winners(a, b, ia, ib, zero, value, first, blocks, ADD_MIN, MUL_MIN)


@numba.njit(**_OPTIONS)
def kbest(a, b0, bt, ia, ib, blocks, out, stop):
    """out[:, t, i, j] = the k largest of a[p, ia[t], i, kk] · bt[q, ib[t], j, kk] over kk, p, q,
    descending, 0-padded. a and bt hold up to k lists sorted descending in p (in q), non-negative
    (the ranks past them 0); b0 = bt[0] transposed: (items, kk, n).

    Per row i of the output:
    1. best[blk, j] = the largest head a_0 · b_0 in each of `blocks` blocks of kk (vectorised
       over j, like `max_mul`).
    2. bound[j] = the k-th largest of best[:, j] (0 with fewer than k blocks): the smallest of
       k products from different kk, so at most the k-th best value (a max-min insertion
       network, vectorised over j).
    3. Per j, the k best start as k copies of the bound: candidates ≤ bound cannot change the
       k best values (when fewer than k candidates exceed it, the values between it and the
       k-th best all equal it). A product a_p · b_q ≤ a_0 · b_0 and decreases with p and q,
       so only blocks whose best head exceeds the current k-th value are scanned, in them
       only kk whose head does, and within a kk a product ≤ it ends its row of q (and the
       loop over p when q = 0). A value equal to it is skipped: the values stay the same.
    Returns early, unfinished, once stop[0] is set (polled every row: `deadline.stoppable`)."""
    k = out.shape[0]
    ka, kq = a.shape[0], bt.shape[0]  # the ranks each holds (those past them are 0: not passed)
    kc = a.shape[3]
    items, m, n = out.shape[1], out.shape[2], out.shape[3]
    kb = (kc + blocks - 1) // blocks
    best = np.empty((blocks, n))
    bound = np.empty((k, n))
    top = np.empty(k)
    for t in range(items):
        ta = ia[t]
        tb = ib[t]
        for i in range(m):
            if stop[0]:
                return
            a0 = a[0, ta, i]
            for blk in range(blocks):  # 1.
                row = best[blk]
                for j in range(n):
                    row[j] = 0.0
                for kk in range(blk * kb, min(kc, (blk + 1) * kb)):
                    x = a0[kk]
                    brow = b0[tb, kk]
                    for j in range(n):
                        v = x * brow[j]
                        row[j] = v if v > row[j] else row[j]
            for r in range(k):  # 2. bound[r] = the (r+1)-th largest so far
                for j in range(n):
                    bound[r, j] = 0.0
            for blk in range(blocks):
                v = best[blk]
                for r in range(k - 1, 0, -1):
                    cur = bound[r]
                    prev = bound[r - 1]
                    for j in range(n):
                        c = prev[j] if prev[j] < v[j] else v[j]
                        cur[j] = c if c > cur[j] else cur[j]
                cur = bound[0]
                for j in range(n):
                    cur[j] = v[j] if v[j] > cur[j] else cur[j]
            for j in range(n):  # 3.
                last = bound[k - 1, j]
                for r in range(k):
                    top[r] = last
                bj = bt[0, tb, j]
                for blk in range(blocks):
                    if best[blk, j] <= last:
                        continue
                    for kk in range(blk * kb, min(kc, (blk + 1) * kb)):
                        if a0[kk] * bj[kk] <= last:
                            continue
                        for p in range(ka):
                            ap = a[p, ta, i, kk]
                            q = 0
                            while q < min(k // (p + 1), kq):
                                v = ap * bt[q, tb, j, kk]
                                if v <= last:
                                    break
                                r = k - 1  # insert v, shifting the smaller ones down
                                while r > 0 and top[r - 1] < v:
                                    top[r] = top[r - 1]
                                    r -= 1
                                top[r] = v
                                last = top[k - 1]
                                q += 1
                            if q == 0:  # a_p · b_0 ≤ last: so is every a_p' · b_q, p' ≥ p
                                break
                for r in range(k):
                    out[r, t, i, j] = top[r]


@numba.njit
def _ahead(add, x, y):
    """x is strictly better than y in ⊕'s order (larger for max, smaller for min)."""
    if add == ADD_MAX:
        return x > y
    return x < y


@numba.njit
def _other(add, x, y):
    """The worse of x and y in ⊕'s order (no NaN)."""
    if add == ADD_MAX:
        return _min_no_nan(x, y)
    return _max_no_nan(x, y)


@numba.njit(inline="always")
def _offer(va, pa, qa, vb, pb, qb, t, i, tb, j, kk, zero, pointers, bound, cv, cp, cq, add, mul, nan):
    """Offer the products a[t, i, kk] ⊗ b[tb, kk, j] over both operands' ranks to an entry's K best so far
    (cv, cp, cq: values, pointers, partials, best first; a product enters when better, or equal
    with a smaller pointer). Ranks are sorted best first and end at `zero`, and ⊗ is monotone:
    a product that does not enter (or is worse than `bound`) ends its row of b's ranks, and when
    it is b's first, a's ranks too. A NaN product is no candidate."""
    K = cv.shape[0]
    for ra in range(va.shape[3]):
        x = va[t, i, kk, ra]
        if x == zero:
            break
        worse_head = False
        for rb in range(vb.shape[3]):
            y = vb[tb, kk, j, rb]
            if y == zero:
                break
            v = _combine(mul, x, y, nan)
            if nan and v != v:
                continue
            if _ahead(add, bound, v):
                worse_head = rb == 0
                break
            p = pa[t, i, kk, ra] if pointers & 1 else -1.0
            if pointers & 2:
                p = max(p, pb[tb, kk, j, rb])
            if not (_ahead(add, v, cv[K - 1]) or (v == cv[K - 1] and p < cp[K - 1])):
                if v != cv[K - 1]:
                    worse_head = rb == 0
                    break
                continue
            q = qa[t, i, kk, ra] * qb[tb, kk, j, rb]
            s = K - 1
            while s > 0 and (_ahead(add, v, cv[s - 1]) or (v == cv[s - 1] and p < cp[s - 1])):
                cv[s], cp[s], cq[s] = cv[s - 1], cp[s - 1], cq[s - 1]
                s -= 1
            cv[s], cp[s], cq[s] = v, p, q
        if worse_head:
            break


@numba.njit(**_OPTIONS)
def kbest_pointers_any(va, pa, qa, vb, pb, qb, zero, pointers, add, mul, ov, op, oq, stop):
    """The one-pass form of `_kbest_pointers` for any operands (NaN products are skipped): every
    kk of every entry offered in order; ⊕ and ⊗ codes given at run time. Stopped as
    `_kbest_pointers` is, polled every row."""
    items, m, kc, ka = va.shape
    n = vb.shape[2]
    worst = -np.inf if add == ADD_MAX else np.inf
    for t in range(items):
        for i in range(m):
            if stop[0]:
                return
            for j in range(n):
                cv, cp, cq = ov[t, i, j], op[t, i, j], oq[t, i, j]
                for kk in range(kc):
                    _offer(va, pa, qa, vb, pb, qb, t, i, t, j, kk, zero, pointers, worst, cv, cp, cq, add, mul, True)


@numba.njit
def _kth_best_block(best, r, w, chosen, add, worst):
    """chosen[s, j] = the (s+1)-th best of best[:, r, j] over the blocks (worst where there are
    fewer), for the first w columns: an insertion network, vectorised along j. chosen[K - 1] is
    the bound of `_kbest_pointers` step 2."""
    K, blocks = chosen.shape[0], best.shape[0]
    for s in range(K):
        for j in range(w):
            chosen[s, j] = worst
    if blocks < K:
        return
    for blk in range(blocks):
        v = best[blk, r]
        for s in range(K - 1, 0, -1):
            cur = chosen[s]
            prev = chosen[s - 1]
            for j in range(w):
                cur[j] = _accumulate(add, cur[j], _other(add, prev[j], v[j]), False)
        cur = chosen[0]
        for j in range(w):
            cur[j] = _accumulate(add, cur[j], v[j], False)


@numba.njit(inline="always")
def _prune_bound(best, r, w, chosen, ratio, add, worst):
    """chosen[K - 1, j], the bound of `_kbest_pointers` step 2, for a pass pruned at `ratio`
    (> 0; `pointer_kernels.kbest_pointer_matmul`, ⊗ = × over values ≥ 0): ratio × entry j's
    best value (the best of its block bests: ranks are sorted and ⊗ is monotone, so the best
    head is the best product), or the K-th best block where that is better. Near 1 (at least
    PRUNED_ALONE) the ratio's bound alone: the K-th best block's network is not worth its cost."""
    K = chosen.shape[0]
    bound = chosen[K - 1]
    if ratio < PRUNED_ALONE:
        _kth_best_block(best, r, w, chosen, add, worst)
    else:
        for jj in range(w):
            bound[jj] = worst
    for jj in range(w):
        top = best[0, r, jj]
        for blk in range(1, best.shape[0]):
            top = _accumulate(add, top, best[blk, r, jj], False)
        t = top * ratio
        if _ahead(add, t, bound[jj]):
            bound[jj] = t


@numba.njit(inline="always")
def _kbest_pointers(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, add, mul, ratio, stop):
    """The k best products with back-pointers (`pointer_kernels.kbest_pointer_matmul`), for
    operands whose products cannot be NaN: ov/op/oq[t, i, j, :] = the K best of
    va[t, i, kk, p] ⊗ vb[t, kk, j, q] over kk, p, q by value, then pointer max(pa, pb) (smaller
    first), each with partial qa · qb. Operands: (items, m, kk, ranks) and (items, kk, n, ranks),
    ranks sorted best first and ended by `zero`; `pointers`: bit 1 when a carries pointers, bit 2
    when b does (NONE, -1, for a side without); ov/op/oq filled with zero, -1, 0.

    The same candidates in the same order as the one-pass kernel, minus those that cannot enter,
    tile by tile of KBEST_J_BLOCK columns (each tile's columns of b first copied compact):
    1. best[blk, r, j] = the ⊕ of the heads va[..., 0] ⊗ vb[..., 0] over each of `blocks` blocks
       of kk, four rows of a at a time (`_tile`, vectorised); ⊗ is monotone and ranks are sorted, so a
       block's best head bounds every product in it.
    2. bound = the K-th best of an entry's block bests: K products from different kk, so no
       better than the K-th best value. Blocks strictly worse than the bound, or than the K-th
       value held so far, are skipped (an equal value may still enter with a smaller pointer).
    3. In the other blocks each kk whose head reaches the bound is offered (`_offer`), as the
       one-pass form (`kbest_pointers_any`) offers every kk.
    It returns early, its output unfinished, once stop[0] is set (polled every four rows of a
    tile: `deadline.stoppable`)."""
    items, m, kc, ka = va.shape
    n, kb = vb.shape[2], vb.shape[3]
    K = ov.shape[3]
    length = (kc + blocks - 1) // blocks
    worst = -np.inf if add == ADD_MAX else np.inf
    best = np.empty((blocks, 4, KBEST_J_BLOCK))
    at = np.empty((4, kc))  # four rows of a's heads (rows past m repeat the last one)
    heads_b = np.empty((KBEST_J_BLOCK, kc))  # the tile's columns of b's heads, each contiguous along kk
    # the tile's columns of b (all ranks; pointers only when b has them), compact: what the
    # offers read stays in cache instead of striding over all of b's columns
    width = min(n, KBEST_J_BLOCK)
    tile_h = np.empty(kc * width if kb > 1 else 1)
    tile_v, tile_q = np.empty(kc * width * kb), np.empty(kc * width * kb)
    tile_p = np.empty(kc * width * kb if pointers & 2 else 1)
    chosen = np.empty((K, KBEST_J_BLOCK))
    for t in range(items):
        for j0 in range(0, n, KBEST_J_BLOCK):
            j1 = min(n, j0 + KBEST_J_BLOCK)
            w = j1 - j0
            vt, qt = tile_v[:kc * w * kb].reshape((1, kc, w, kb)), tile_q[:kc * w * kb].reshape((1, kc, w, kb))
            pt = tile_p[:kc * w * kb].reshape((1, kc, w, kb)) if pointers & 2 else tile_p.reshape((1, 1, 1, 1))
            bt = (tile_v if kb == 1 else tile_h)[:kc * w].reshape((kc, w))  # b's heads for step 1
            for kk in range(kc):
                for jj in range(w):
                    heads_b[jj, kk] = vb[t, kk, j0 + jj, 0]
                    if kb > 1:
                        bt[kk, jj] = vb[t, kk, j0 + jj, 0]
                    for rb in range(kb):
                        vt[0, kk, jj, rb] = vb[t, kk, j0 + jj, rb]
                        qt[0, kk, jj, rb] = qb[t, kk, j0 + jj, rb]
                        if pointers & 2:
                            pt[0, kk, jj, rb] = pb[t, kk, j0 + jj, rb]
            for i0 in range(0, m, 4):
                if stop[0]:
                    return
                rows = min(4, m - i0)
                for r in range(4):
                    for kk in range(kc):
                        at[r, kk] = va[t, i0 + min(r, rows - 1), kk, 0]
                for blk in range(blocks):  # 1.
                    tile = best[blk]
                    for r in range(4):
                        for j in range(w):
                            tile[r, j] = worst
                    _tile(at, bt, tile, 0, w, 0, blk * length, min(kc, (blk + 1) * length), add, mul, False, zero)
                for r in range(rows):
                    i = i0 + r
                    if ratio > 0.0:
                        _prune_bound(best, r, w, chosen, ratio, add, worst)
                    else:
                        _kth_best_block(best, r, w, chosen, add, worst)  # 2.
                    bound = chosen[K - 1]
                    for blk in range(blocks):  # 3. block by block (its panel of b stays in L1), each kk in order
                        heads = best[blk, r]
                        for jj in range(w):
                            head = heads[jj]
                            if _ahead(add, bound[jj], head):
                                continue
                            j = j0 + jj
                            cv, cp, cq = ov[t, i, j], op[t, i, j], oq[t, i, j]
                            if _ahead(add, cv[K - 1], head):
                                continue
                            heads_a, heads_j, low = at[r], heads_b[jj], bound[jj]
                            for kk in range(blk * length, min(kc, (blk + 1) * length)):
                                if _ahead(add, low, _combine(mul, heads_a[kk], heads_j[kk], False)):
                                    continue  # (from copies in cache: most kk end here)
                                _offer(va, pa, qa, vt, pt, qt, t, i, 0, jj, kk, zero, pointers, low, cv, cp, cq, add,
                                       mul, False)


@numba.njit(inline="always")
def _kbest_pointers_rows(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, add, mul, ratio, stop):
    """`_kbest_pointers` for operands of fewer than four rows of a (m < 4) and b a lifted partial
    (one rank, no pointers: vb, qb (items, kk, n)): a row-wise Jacobian's k-best adjoint (layer
    norm, softmax: one matmul a row, (1, n) by (n, n)) is thousands of them. The same three
    steps, over one row at a time, reading b where it is: the tiles `_kbest_pointers` copies are
    worth it when four rows of a read them, but a single row reads a tile once, and copying it
    cost 3× the rest (BERT width, n 768: 7.7 ms a row, 2.2 without). Each entry's candidate kk
    are listed, without a branch a kk, before they are offered in order (`_offer`). Stopped as
    `_kbest_pointers` is, polled every row."""
    items, m, kc, ka = va.shape
    n = vb.shape[2]
    K = ov.shape[3]
    length = (kc + blocks - 1) // blocks
    worst = -np.inf if add == ADD_MAX else np.inf
    best = np.empty((blocks, 1, KBEST_J_BLOCK))
    chosen = np.empty((K, KBEST_J_BLOCK))
    passing = np.empty(blocks, np.int64)
    picked = np.empty(kc, np.int64)
    at = np.empty((1, kc))
    b_ranks, q_ranks = vb.reshape((items, kc, n, 1)), qb.reshape((items, kc, n, 1))  # b's one rank, as `_offer` reads
    no_pointers = np.full((1, 1, 1, 1), -1.0)
    for t in range(items):
        bt = vb[t]
        for i in range(m):
            if stop[0]:
                return
            heads_a = at[0]
            for kk in range(kc):
                heads_a[kk] = va[t, i, kk, 0]
            for j0 in range(0, n, KBEST_J_BLOCK):
                j1 = min(n, j0 + KBEST_J_BLOCK)
                w = j1 - j0
                for blk in range(blocks):  # 1. the block bests of this row's tile
                    tile = best[blk]
                    for j in range(w):
                        tile[0, j] = worst
                    _tile(at, bt, tile, j0, j1, 0, blk * length, min(kc, (blk + 1) * length), add, mul, False, zero)
                if ratio > 0.0:
                    _prune_bound(best, 0, w, chosen, ratio, add, worst)
                else:
                    _kth_best_block(best, 0, w, chosen, add, worst)  # 2. the bound: the K-th best block
                for jj in range(w):  # 3. the kk reaching the bound, then their offers
                    low = chosen[K - 1, jj]
                    j = j0 + jj
                    reached = 0
                    for blk in range(blocks):
                        passing[reached] = blk
                        reached += not _ahead(add, low, best[blk, 0, jj])
                    count = 0
                    for s in range(reached):
                        blk = passing[s]
                        for kk in range(blk * length, min(kc, (blk + 1) * length)):
                            picked[count] = kk
                            count += not _ahead(add, low, _combine(mul, heads_a[kk], bt[kk, j], False))
                    cv, cp, cq = ov[t, i, j], op[t, i, j], oq[t, i, j]
                    for s in range(count):
                        _offer(va, pa, qa, b_ranks, no_pointers, q_ranks, t, i, t, j, picked[s], zero, pointers & 1, low,
                               cv, cp, cq, add, mul, False)


@numba.njit(**_OPTIONS)
def kbest_pointers_max_mul(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ADD_MAX, MUL_MUL, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_max_add(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ADD_MAX, MUL_ADD, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_max_max(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ADD_MAX, MUL_MAX, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_max_min(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ADD_MAX, MUL_MIN, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_min_mul(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ADD_MIN, MUL_MUL, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_min_add(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ADD_MIN, MUL_ADD, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_min_max(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ADD_MIN, MUL_MAX, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_min_min(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers(va, pa, qa, vb, pb, qb, zero, blocks, pointers, ov, op, oq, ADD_MIN, MUL_MIN, ratio, stop)


@numba.njit(**_OPTIONS)
def neg_xlogx(p, r, tiny):
    """r = -(log(max(p, tiny)) · p) elementwise over flat arrays: the NumPy form's operations in
    one pass (its log is libm's, as NumPy's without AVX-512)."""
    for i in range(p.size):
        x = p[i]
        r[i] = -(math.log(x if x > tiny else tiny) * x)


@numba.njit(**_OPTIONS)
def kbest_pointers_rows_max_mul(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers_rows(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ADD_MAX, MUL_MUL, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_rows_max_add(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers_rows(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ADD_MAX, MUL_ADD, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_rows_max_max(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers_rows(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ADD_MAX, MUL_MAX, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_rows_max_min(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers_rows(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ADD_MAX, MUL_MIN, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_rows_min_mul(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers_rows(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ADD_MIN, MUL_MUL, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_rows_min_add(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers_rows(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ADD_MIN, MUL_ADD, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_rows_min_max(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers_rows(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ADD_MIN, MUL_MAX, ratio, stop)


@numba.njit(**_OPTIONS)
def kbest_pointers_rows_min_min(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ratio, stop):
    _kbest_pointers_rows(va, pa, qa, vb, qb, zero, blocks, pointers, ov, op, oq, ADD_MIN, MUL_MIN, ratio, stop)
