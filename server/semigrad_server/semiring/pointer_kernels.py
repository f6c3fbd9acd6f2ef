"""Compiled matmuls for the back-pointer carriers (semiring.pointers), with numba.

`pointer_matmul`: out[i, j] = the best over k of a[i, k] ⊗ b[k, j] with its pointer (the
larger of the two operands' pointers: only one side carries one) and partial (the product of
the two partials); ties to the smaller pointer. `kbest_pointer_matmul`: the K best such
products over k and the ranks of both operands, best first (its loops in `_jit_kernels`,
beside the tropical kernels whose tiles they share); `top_candidates`: the k best of each
element's candidates. All return None when numba is not installed (or fails to compile): the
callers then use their NumPy forms, which give the same winners (both select among the same
exactly computed products).
"""

from __future__ import annotations

import importlib.util
import logging

import numpy as np

from ..deadline import check, stoppable
from . import kernels as tropical_kernels

log = logging.getLogger("semigrad.kernels")
NONE = -1.0  # the pointer of a value no adjoint reached (constants, lifted partials, 0̄)
_MULS = {"mul": 0, "add": 1, "max": 2, "min": 3}  # the codes of _jit_kernels (MUL_*, ADD_*)
_ADDS = {"max": 0, "min": 1}
K_BLOCKS_PER_RANK = 4  # the block-bound kernel splits k into at least 4 blocks per best kept...
K_BLOCK_LENGTH = 16  # ...and into blocks of at most 16 k
ROWS_KERNEL_MAX_M = 4  # fewer rows of a, b a lifted partial: the by-rows kernel (no tile copies)
CHUNK_WORK = 1 << 25  # candidate comparisons per call of a k-best selection kernel (~15 ms), at most
_compiled = None
_failed = importlib.util.find_spec("numba") is None


def _compile():
    import numba

    @numba.njit(cache=True, nogil=True)
    def product(a, b, kind):
        if kind == 0:
            return a * b
        if kind == 1:
            return a + b
        if kind == 2:  # NaN-propagating, as np.maximum and np.minimum
            return a if (a > b) | (a != a) else b
        return a if (a < b) | (a != a) else b

    @numba.njit(cache=True, nogil=True)
    def better(v, p, cv, cp, maximise):
        if maximise:
            return v > cv or (v == cv and p < cp)
        return v < cv or (v == cv and p < cp)

    @numba.njit(cache=True, nogil=True)
    def single(va, pa, qa, vb, pb, qb, maximise, kind, zero):
        lead, m, kk = va.shape
        n = vb.shape[2]
        ov = np.full((lead, m, n), zero)
        op = np.full((lead, m, n), -1.0)
        oq = np.zeros((lead, m, n))
        for t in range(lead):
            for i in range(m):
                for k in range(kk):
                    a, ap, aq = va[t, i, k], pa[t, i, k], qa[t, i, k]
                    for j in range(n):
                        v = product(a, vb[t, k, j], kind)
                        p = max(ap, pb[t, k, j])
                        if better(v, p, ov[t, i, j], op[t, i, j], maximise):
                            ov[t, i, j] = v
                            op[t, i, j] = p
                            oq[t, i, j] = aq * qb[t, k, j]
        return ov, op, oq

    @numba.njit(cache=True, nogil=True)
    def before(x, y, x2, y2):
        # (x, y) sorts before (x2, y2) by lexsort's order: x ascending with NaN last, then y
        if x != x:
            return x2 != x2 and y < y2
        if x2 != x2 or x < x2:
            return True
        return x == x2 and y < y2

    @numba.njit(cache=True, nogil=True, inline="always")  # (called, it made `top` ~3× slower)
    def insert(v, y, w, sign, cv, cp, cq, held):
        # candidate (v, y, w) into the `held` best so far (cv, cp, cq, K long) in (-sign·v, p)
        # order, after its equals (stably); returns how many are held now
        K = cv.shape[0]
        x = -sign * v
        if held == K and not before(x, y, -sign * cv[K - 1], cp[K - 1]):
            return held
        s = held if held < K else K - 1
        while s > 0 and before(x, y, -sign * cv[s - 1], cp[s - 1]):
            cv[s], cp[s], cq[s] = cv[s - 1], cp[s - 1], cq[s - 1]
            s -= 1
        cv[s], cp[s], cq[s] = v, y, w
        return min(K, held + 1)

    @numba.njit(cache=True, nogil=True)
    def top(v, p, q, K, sign, ov, op, oq):
        # per row: the first K candidates in (-sign·v, p) order, stably (lexsort's first K)
        rows, C = v.shape
        for r in range(rows):
            held = 0
            for c in range(C):
                held = insert(v[r, c], p[r, c], q[r, c], sign, ov[r], op[r], oq[r], held)

    @numba.njit(cache=True, nogil=True)
    def in_order(v, p, sign):
        # whether a row's candidates are in (-sign·v, p) order already (a k-best value's ranks are)
        for c in range(1, v.shape[0]):
            if before(-sign * v[c], p[c], -sign * v[c - 1], p[c - 1]):
                return False
        return True

    @numba.njit(cache=True, nogil=True)
    def top_of_two(va, pa, qa, vb, pb, qb, sign, ov, op, oq):
        # `top` of each row's candidates a's then b's (each (rows, k)), without joining them
        # first: merged when both rows are in order (O(k), ties to a's: stably), else inserted
        rows, K = va.shape
        for r in range(rows):
            if in_order(va[r], pa[r], sign) and in_order(vb[r], pb[r], sign):
                i = j = 0
                for c in range(K):  # i + j = c < K: neither runs out
                    if before(-sign * vb[r, j], pb[r, j], -sign * va[r, i], pa[r, i]):
                        ov[r, c], op[r, c], oq[r, c] = vb[r, j], pb[r, j], qb[r, j]
                        j += 1
                    else:
                        ov[r, c], op[r, c], oq[r, c] = va[r, i], pa[r, i], qa[r, i]
                        i += 1
                continue
            held = 0
            for c in range(K):
                held = insert(va[r, c], pa[r, c], qa[r, c], sign, ov[r], op[r], oq[r], held)
            for c in range(K):
                held = insert(vb[r, c], pb[r, c], qb[r, c], sign, ov[r], op[r], oq[r], held)

    @numba.njit(cache=True, nogil=True)
    def gather(first, ptr, qa, qb, ip, ia, ib, a_carries, out_ptr, out_partial):
        # each entry's pointer and partial at its winning k (first; -1: no winner: NONE, 0)
        items, m, n = first.shape
        for t in range(items):
            pt, at, bt = ptr[ip[t]], qa[ia[t]], qb[ib[t]]
            for i in range(m):
                for j in range(n):
                    k = first[t, i, j]
                    if k < 0:
                        out_ptr[t, i, j] = -1.0
                        out_partial[t, i, j] = 0.0
                    else:
                        out_ptr[t, i, j] = pt[i, k] if a_carries else pt[k, j]
                        out_partial[t, i, j] = at[i, k] * bt[k, j]

    return single, top, gather, top_of_two


def _kernels():
    global _compiled, _failed
    if _compiled is None and not _failed:
        try:
            _compiled = _compile()
        except Exception as e:  # noqa: BLE001 - numba present but unusable: NumPy forms instead
            log.warning("back-pointer kernels unavailable (%s): NumPy is used", e)
            _failed = True
    return _compiled


def _flat(parts, lead, tail):
    return [np.ascontiguousarray(np.broadcast_to(np.asarray(c, dtype=np.float64), lead + tail)).reshape((-1,) + tail)
            for c in parts]


def pointer_matmul(a, b, addition: str, multiplication: str, zero: float):
    """(value, ptr, partial) triples a (..., m, k) and b (..., k, n): the winners' triple, or None."""
    kernels = _kernels()
    if kernels is None:
        return None
    m, kk = np.shape(a[0])[-2:]
    n = np.shape(b[0])[-1]
    lead = tuple(np.broadcast_shapes(np.shape(a[0])[:-2], np.shape(b[0])[:-2]))
    out = _from_values(a, b, lead, addition, multiplication, zero)
    if out is not None:
        return out
    out = kernels[0](*_flat(a, lead, (m, kk)), *_flat(b, lead, (kk, n)), addition == "max",
                     _MULS[multiplication], float(zero))
    return tuple(c.reshape(lead + (m, n)) for c in out)


def _from_values(a, b, lead: tuple, addition: str, multiplication: str, zero: float):
    """The winners' triples from a vectorised matmul, when the winner among equal values is the
    first k: the values and each entry's first k that attains its value
    (`kernels.tropical_winners`), then the pointer and partial of that k gathered (from the
    operands as they are, broadcast, not copied). That is the case when one side carries
    no pointers (NONE: a lifted partial) and the other's increase along k (an adjoint's element
    ids, in order), so that among ties the smallest pointer is the first k, and when no product
    can be NaN (which the one-pass kernel skips, and the matmul would keep). None otherwise: the
    one-pass kernel then decides (~0.5 G products a second against ~3)."""
    (va, pa, qa), (vb, pb, qb) = ([np.asarray(c, dtype=np.float64) for c in x] for x in (a, b))
    if tropical_kernels.everywhere(pb, NONE) and _increasing(pa, axis=-1):
        carrier = "a"
    elif tropical_kernels.everywhere(pa, NONE) and _increasing(pb, axis=-2):
        carrier = "b"
    else:
        return None
    winners = tropical_kernels.tropical_winners(va, vb, addition, multiplication, zero=zero)
    if winners is None:
        return None
    value, first = winners
    shape = value.shape
    items = [_items(x, lead) for x in (pa if carrier == "a" else pb, qa, qb)]
    pointer, partial = np.empty(shape), np.empty(shape)
    _kernels()[2](tropical_kernels.readonly(np.ascontiguousarray(first.reshape((-1,) + shape[-2:]))),
                  *(tropical_kernels.readonly(x) for x, _ in items), *(tropical_kernels.readonly(i) for _, i in items),
                  carrier == "a", pointer.reshape((-1,) + shape[-2:]), partial.reshape((-1,) + shape[-2:]))
    return value, pointer, partial


def _items(x: np.ndarray, lead: tuple) -> tuple[np.ndarray, np.ndarray]:
    """x (..., r, c) as C-contiguous items (-1, r, c) and, for each item of the broadcast `lead`,
    the index of the item of x it reads (`kernels.item_indices`: x's leading axes are not copied
    out to `lead`)."""
    items = np.ascontiguousarray(x).reshape((-1,) + x.shape[-2:])
    return items, tropical_kernels.item_indices(x.shape[:-2], lead, lead)[0]


def _increasing(x: np.ndarray, axis: int) -> bool:
    return x.shape[axis] < 2 or bool((np.diff(x, axis=axis) > 0).all())


def kbest_pointer_matmul(a, b, k: int, addition: str, multiplication: str, zero: float, ratio: float = 0.0):
    """3k-array k-best values (value ranks, pointer ranks, partial ranks): the K best, or None.

    Operands whose products cannot be NaN take the block-bound kernel
    (`_jit_kernels.kbest_pointers_{⊕}_{⊗}`; with fewer than 4 rows of a and b a lifted partial,
    `kbest_pointers_rows_{⊕}_{⊗}`), the others the one-pass form
    (`kbest_pointers_any`); both offer each k with `_jit_kernels._offer`. A side whose pointers
    are all NONE (a lifted partial) passes none; b keeps its layout. `ratio` > 0 (⊗ = × only):
    an entry's candidates worse than ratio × its best are dropped too (`pruning`)."""
    if _kernels() is None:
        return None
    m, kk = np.shape(a[0])[-2:]
    n = np.shape(b[0])[-1]
    lead = tuple(np.broadcast_shapes(np.shape(a[0])[:-2], np.shape(b[0])[:-2]))
    pointers, parts = 0, []
    for bit, x, tail in ((1, a, (m, kk)), (2, b, (kk, n))):
        check("in a k-best matmul")  # (stacking a's ranks took 0.2 s at 2,400 x 64 x 64 ranks)
        ranks = tropical_kernels.held_ranks(x[:k], zero)  # a lifted partial has one rank: the others are 0̄
        values = _stacked(x[:ranks], lead, tail)
        if not all(tropical_kernels.everywhere(p, NONE) for p in x[k:k + ranks]):
            pointers |= bit
            ptrs = _stacked(x[k:k + ranks], lead, tail)
        else:
            ptrs = _NO_POINTERS
        parts.append((values, ptrs, _stacked(x[2 * k:2 * k + ranks], lead, tail)))
    (va, pa, qa), (vb, pb, qb) = parts
    shape = (len(va), m, n, k)
    check("in a k-best matmul")
    ov, op, oq = np.full(shape, float(zero)), np.full(shape, NONE), np.zeros(shape)
    jit = tropical_kernels.jit_kernels()
    operands = [tropical_kernels.readonly(x) for x in (va, pa, qa, vb, pb, qb)]
    if tropical_kernels.nan_free_products(va, vb, multiplication):
        blocks = min(kk, max(K_BLOCKS_PER_RANK * k, -(-kk // K_BLOCK_LENGTH)))
        if m < ROWS_KERNEL_MAX_M and vb.shape[-1] == 1 and not pointers & 2:
            tropical_kernels.count("kbest_pointer_matmul", "block bound, by rows")
            kernel = getattr(jit, f"kbest_pointers_rows_{addition}_{multiplication}")
            operands = operands[:3] + [tropical_kernels.readonly(x[..., 0]) for x in (vb, qb)]
            args = (float(zero), blocks, pointers, ov, op, oq, float(ratio))
        else:
            tropical_kernels.count("kbest_pointer_matmul", "block bound")
            kernel = getattr(jit, f"kbest_pointers_{addition}_{multiplication}")
            args = (float(zero), blocks, pointers, ov, op, oq, float(ratio))
    else:
        tropical_kernels.count("kbest_pointer_matmul", "one pass")
        kernel = jit.kbest_pointers_any
        args = (float(zero), pointers, _ADDS[addition], _MULS[multiplication], ov, op, oq)
    stoppable(lambda stop: kernel(*operands, *args, stop), "in a k-best matmul",
              watched=len(va) * m * n * kk >= tropical_kernels.STOPPABLE_PRODUCTS)
    out = (ov, op, oq)
    return tuple(c[..., r].reshape(lead + (m, n)) for c in out for r in range(k))


_NO_POINTERS = np.full((1, 1, 1, 1), NONE)


def _stacked(parts, lead, tail):
    """Ranks stacked last: (items,) + tail + (ranks,), C-contiguous (one rank, or ranks that are
    the last axis of one C-contiguous array already, as a k-best op leaves them: a view, no copy;
    of one buffer otherwise (`stacked_view`): one copy)."""
    whole = stacked_view(parts)
    if whole is not None:  # one copy at most, where stacking copies every rank twice
        whole = np.ascontiguousarray(np.broadcast_to(whole, lead + tail + (len(parts),)), dtype=np.float64)
        return whole.reshape((-1,) + tail + (len(parts),))
    flat = _flat(parts, lead, tail)
    return flat[0][..., None] if len(flat) == 1 else np.stack(flat, axis=-1)


def stacked_view(parts) -> np.ndarray | None:
    """The read-only (..., len(parts)) view whose last axis `parts` are, when they are evenly
    spaced views of one buffer (a k-best value's ranks as its last op wrote them: each a
    `[..., r]` slice of one (..., k) array, maybe reshaped), or None: stacking them would copy."""
    if len(parts) < 2 or any(type(part) is not np.ndarray for part in parts):
        return None
    first = parts[0]
    owner = first if first.base is None else first.base
    start = first.__array_interface__["data"][0]
    step = parts[1].__array_interface__["data"][0] - start
    for r, part in enumerate(parts):
        if part.shape != first.shape or part.strides != first.strides or \
                part.dtype != first.dtype or (part if part.base is None else part.base) is not owner or \
                part.__array_interface__["data"][0] != start + r * step:
            return None
    return np.lib.stride_tricks.as_strided(first, first.shape + (len(parts),), first.strides + (step,),
                                           writeable=False)


def top_candidates(v, p, q, k: int, sign: float):
    """The k best candidates on the last axis (at least k of them) of values v, pointers p and
    partials q: by value (sign 1: larger first, -1: smaller), then pointer, stably, NaN values
    last: np.lexsort((p, -sign · v))[..., :k]'s picks, by insertion into a sorted list of k
    (candidates usually arrive nearly sorted: lists being merged). None without numba."""
    kernels = _kernels()
    if kernels is None or np.shape(v)[-1] < k:
        return None
    shape = np.shape(v)[:-1]
    rows = [np.ascontiguousarray(x, dtype=np.float64).reshape(-1, np.shape(v)[-1]) for x in (v, p, q)]
    out = [np.empty((len(rows[0]), k)) for _ in range(3)]
    _by_row_chunks(kernels[1], rows, (k, float(sign)), out, rows[0].shape[1] * k)
    return tuple(x.reshape(shape + (k,)) for x in out)


def top_of_two(a, b, sign: float):
    """`top_candidates` of a's k candidates then b's (each (v, p, q), (..., k) arrays of one shape,
    any strides), keeping k: a k-best ⊕ without joining the two values' ranks first. None without
    numba."""
    kernels = _kernels()
    if kernels is None:
        return None
    shape = a[0].shape
    rows = [tropical_kernels.readonly(x.reshape(-1, shape[-1])) for x in (*a, *b)]
    out = [np.empty(rows[0].shape) for _ in range(3)]
    _by_row_chunks(kernels[3], rows, (float(sign),), out, 2 * shape[-1] * shape[-1])
    return tuple(x.reshape(shape) for x in out)


def _by_row_chunks(kernel, rows: list, params: tuple, out: list, work_per_row: int) -> None:
    """kernel(*rows, *params, *out) over chunks of rows of at most CHUNK_WORK (a row's worst
    case: `work_per_row`), the request's deadline checked between them: one call over every
    row is beyond the watchdog's reach (at top_paths = 64 over 40,000 elements, a k-best ⊕
    ran 155 ms uninterrupted, and the deadline went by)."""
    step = max(1, CHUNK_WORK // max(1, work_per_row))
    for start in range(0, len(rows[0]), step):
        check("in a k-best step")
        part = slice(start, start + step)
        kernel(*(x[part] for x in rows), *params, *(x[part] for x in out))
