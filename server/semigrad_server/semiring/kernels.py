"""Array kernels for semiring plugins (part of the plugin API, version 1).

Matmuls that BLAS cannot do, for plugins to call instead of writing their own loops:

* `tropical_matmul(a, b, add, mul, zero)`: out[..., i, j] = ⊕_k a[..., i, k] ⊗ b[..., k, j]
  with ⊕ ∈ {max, min} and ⊗ ∈ {×, +, max, min}: max_product is (max, ×), maxplus (max, +),
  minplus (min, +), bottleneck (max, min).
* `tropical_winners(a, b, add, mul, zero)`: `tropical_matmul`'s values and, for each entry, the
  first k whose product attains it: the winning edge, which back-pointers record.
* `kbest_matmul(a, b)`: the matmul of the k-best semiring, whose values are k arrays sorted
  descending: the k largest products a[p][..., i, k] · b[q][..., k, j] over k, p and q.

Each runs compiled with numba when numba is installed (`pip install 'semigrad[jit]'`) and as
NumPy otherwise; both give exactly the same values (they only select among the products,
which are computed the same way). Neither builds the m × k × n products at once: the NumPy
code works on blocks within `base.MATMUL_BLOCK_ELEMENTS`, the compiled loops only copy their
operands. Leading (batch) axes broadcast as in `np.matmul`. Plugins keep depending on NumPy
alone: the server that loads them provides this module.

`backend()` is the implementation in use: "numba", or "numpy" when numba is not installed or
the environment variable SEMIGRAD_KERNELS=numpy asks for it (`set_backend` changes it for
the process, `backend=` for one call). Products of fewer than `NUMBA_MIN_WORK` multiply-adds
run in NumPy anyway (the call overhead dominates there). The first compiled call of each
kernel in a process loads it from numba's on-disk cache, or compiles it (about a second)
the first time. If numba is installed but cannot compile the kernels, a warning is logged
and NumPy is used from then on.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import threading

import numpy as np

from ..deadline import stoppable
from ..errors import Cancelled, DeadlineExceeded
from . import base

ADDS = ("max", "min")
MULS = ("mul", "add", "max", "min")
BACKENDS = ("numba", "numpy")

# Below this many multiply-adds (m·k·n times batch items) NumPy runs whatever the backend.
NUMBA_MIN_WORK = 1 << 14
# Elements of the NumPy temporaries per block: small enough to stay in the L2 cache.
CACHE_BLOCK_ELEMENTS = 1 << 16
# A k-best matmul of this many products or more (~4 ms) polls a stop flag set at the deadline
# (`deadline.stoppable`); a smaller one is not worth the watcher thread
STOPPABLE_PRODUCTS = 1 << 20

UFUNCS = {"max": np.maximum, "min": np.minimum, "mul": np.multiply, "add": np.add}
_IDENTITY = {"max": -np.inf, "min": np.inf}
_NUMBA_INSTALLED = importlib.util.find_spec("numba") is not None
log = logging.getLogger("semigrad.kernels")


def _initial_backend() -> str:
    if os.environ.get("SEMIGRAD_KERNELS", "").strip().lower() == "numpy" or not _NUMBA_INSTALLED:
        return "numpy"
    return "numba"


_backend = _initial_backend()
# Calls per (kernel, implementation) in this process, e.g. ("tropical_matmul", "numba"): 12; the
# implementation "constant operand" is the shortcut for an operand that is one value everywhere.
calls: dict[tuple[str, str], int] = {}


def backend() -> str:
    """The implementation used for products that are not tiny: "numba" or "numpy"."""
    return _backend


def numba_available() -> bool:
    """Whether numba is installed (the "numba" backend can be used)."""
    return _NUMBA_INSTALLED


def set_backend(name: str) -> str:
    """Use "numba" or "numpy" from now on in this process; returns the previous backend.
    "numba" without numba installed raises RuntimeError."""
    global _backend
    _check_backend(name)
    previous, _backend = _backend, name
    return previous


def _check_backend(name: str) -> None:
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r} (choose from {', '.join(BACKENDS)})")
    if name == "numba" and not _NUMBA_INSTALLED:
        raise RuntimeError("the numba kernel backend needs numba installed (pip install 'semigrad[jit]')")


def _choose(backend: str | None, work: int) -> str:
    if backend is not None:
        _check_backend(backend)
        if backend == "numba":
            _jit()  # raises if the kernels cannot be compiled
        return backend
    if _backend != "numba" or work < NUMBA_MIN_WORK:
        return "numpy"
    try:
        _jit()
    except Exception as e:  # numba installed but unusable (a broken install, an old version)
        _disable_numba(e)
        return "numpy"
    return "numba"


def _disable_numba(error: Exception) -> None:
    global _backend
    log.warning("semiring kernels: numba cannot be used (%s: %s); using NumPy", type(error).__name__, error)
    _backend = "numpy"


def count(kernel: str, implementation: str) -> None:
    """One more call of `kernel` run by `implementation` (in `calls`: tests and metrics read it)."""
    key = (kernel, implementation)
    calls[key] = calls.get(key, 0) + 1


# ---------------------------------------------------------------- tropical_matmul


def tropical_matmul(a, b, add: str = "max", mul: str = "mul", zero: float | None = None,
                    backend: str | None = None) -> np.ndarray:
    """out[..., i, j] = `add`-reduce over k of `mul`(a[..., i, k], b[..., k, j]), from `zero`.

    a: (..., m, k) and b: (..., k, n), converted to float64, at least 2-D each; the leading
    axes broadcast. add: "max" or "min"; mul: "mul", "add", "max" or "min". zero: the value
    of an entry when k = 0, and where every reduction starts (default -inf for max, +inf for
    min; max_product passes 0.0, its 0̄, so every entry is max(0, ...)). A NaN product makes
    its entry NaN (as np.maximum / np.minimum). backend: "numba" or "numpy" to force one
    (default `backend()`). Returns a new C-contiguous float64 array (..., m, n).

    An operand that is one value c everywhere (like a seed 1̄) by which ⊗ is increasing takes
    a shortcut with the same values: c ⊗ (⊕_k of the other operand).
    """
    if add not in ADDS:
        raise ValueError(f"tropical_matmul: add must be one of {ADDS}, got {add!r}")
    if mul not in MULS:
        raise ValueError(f"tropical_matmul: mul must be one of {MULS}, got {mul!r}")
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, kc, n, lead = _matmul_shapes(a, b, "tropical_matmul")
    zero = _IDENTITY[add] if zero is None else float(zero)
    items = math.prod(lead)
    implementation = _choose(backend, items * m * n * kc)
    if kc == 0 or items * m * n == 0:
        count("tropical_matmul", implementation)
        return np.full(lead + (m, n), zero)
    constant = _constant_operand(a, b, mul, zero)
    if constant is not None:
        count("tropical_matmul", "constant operand")
        return _tropical_constant(a, b, constant, lead, add, mul, zero)
    count("tropical_matmul", implementation)
    if implementation == "numba":
        try:
            return _tropical_numba(a, b, lead, add, mul, zero)
        except Exception as e:  # the kernel does not compile here: NumPy from now on
            if backend == "numba":
                raise
            _disable_numba(e)
    return _tropical_numpy(a, b, lead, add, mul, zero)


def _constant_operand(a: np.ndarray, b: np.ndarray, mul: str, zero: float) -> str | None:
    """"a" or "b" when that operand is one value everywhere (a seed 1̄, say) by which ⊗ is
    strictly increasing, so that ⊕_k c ⊗ x_k = c ⊗ (⊕_k x_k) exactly (rounding is
    monotone; no NaN appears that the products would not have made): c > 0 finite for ×,
    c finite for +, any c but NaN and 0̄ for max and min (0̄ annihilates a NaN product, which the
    reduced form would not see)."""
    for name, x in (("a", a), ("b", b)):
        if _is_constant(x):
            c = float(x.flat[0])
            if (c > 0 and math.isfinite(c)) if mul == "mul" else math.isfinite(c) if mul == "add" else c == c != zero:
                return name
    return None


def _is_constant(x: np.ndarray) -> bool:
    """Whether x is one value everywhere (not NaN), and not empty."""
    return x.size > 0 and everywhere(x, x.flat[0])


def everywhere(x, value: float) -> bool:
    """Whether every element of x is `value` (True when x is empty): one comparison for a value
    broadcast from one (every stride 0: a seed 1̄, a lifted partial's empty ranks), three for
    most arrays that are not (the first, middle and last elements first), else every element's."""
    x = np.asarray(x)
    if x.size == 0:
        return True
    if not any(x.strides):
        return bool(x.flat[0] == value)
    return bool(x.flat[0] == value and x.flat[-1] == value and x.flat[x.size // 2] == value and np.all(x == value))


def _tropical_constant(a, b, which, lead, add, mul, zero):
    """⊕_k c ⊗ x[k] = c ⊗ (⊕_k x[k]) when `which` operand is the constant c: one reduction."""
    reduce_, combine = UFUNCS[add], UFUNCS[mul]
    m, n = a.shape[-2], b.shape[-1]
    if which == "a":
        c, reduced = a.flat[0], reduce_.reduce(b, axis=-2)[..., None, :]  # (..., 1, n)
    else:
        c, reduced = b.flat[0], reduce_.reduce(a, axis=-1)[..., :, None]  # (..., m, 1)
    out = reduce_(zero, combine(reduced, c))
    return np.ascontiguousarray(np.broadcast_to(out, lead + (m, n)), dtype=np.float64)


def _matmul_shapes(a: np.ndarray, b: np.ndarray, what: str):
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"{what} needs operands of at least 2 dimensions, got {a.shape} and {b.shape}")
    m, kc = a.shape[-2:]
    if b.shape[-2] != kc:
        raise ValueError(f"{what}: contraction sizes differ: {a.shape} @ {b.shape}")
    return m, kc, b.shape[-1], np.broadcast_shapes(a.shape[:-2], b.shape[:-2])


def annihilate(products, a, b, zero: float):
    """`products` (of a ⊗ b, broadcast) with every NaN product that has an operand equal to 0̄
    (`zero`) set to 0̄, in place (a number for numbers): 0̄ annihilates, 0 · ∞ and −∞ + ∞
    included, so a path through a zero partial is removed whatever else is on it
    (docs/semirings.md). One pass and no temporary when no product is NaN (nor +inf and -inf
    both: their sum is NaN too)."""
    if type(products) is not np.ndarray:
        return np.float64(zero) if products != products and (a == zero or b == zero) else products
    with np.errstate(invalid="ignore", over="ignore"):
        total = np.sum(products)
    if total == total:
        return products
    nan = np.isnan(products)
    if nan.any():
        np.copyto(products, zero, where=nan & ((np.asarray(a) == zero) | (np.asarray(b) == zero)))
    return products


def _tropical_numpy(a, b, lead, add, mul, zero):
    """Blocked over k: per block, the products (kb, batch..., m, n) go into one reusable
    buffer and are ⊕-reduced over its first axis into the output (`out=` throughout). The
    block keeps the buffer within the cache, and within MATMUL_BLOCK_ELEMENTS."""
    m, kc = a.shape[-2:]
    n = b.shape[-1]
    reduce_, combine = UFUNCS[add], UFUNCS[mul]
    # Same number of leading axes on both, then k first: a block of k is a leading axis.
    a = a.reshape((1,) * (len(lead) + 2 - a.ndim) + a.shape)
    b = b.reshape((1,) * (len(lead) + 2 - b.ndim) + b.shape)
    # Contiguous copies (O(m·k + k·n), against O(m·k·n) work): the products then read rows
    # of b and columns of a in order, whatever the operands' strides (often transposed views).
    left = np.ascontiguousarray(np.moveaxis(a, -1, 0))[..., None]  # (k, ..., m, 1)
    right = np.ascontiguousarray(np.moveaxis(b, -2, 0))[..., None, :]  # (k, ..., 1, n)
    out = np.full(lead + (m, n), zero)
    budget = max(1, min(CACHE_BLOCK_ELEMENTS, base.MATMUL_BLOCK_ELEMENTS))
    kb = int(max(1, min(kc, budget // max(1, out.size))))
    with np.errstate(invalid="ignore", over="ignore"):
        if kb == 1:
            tmp = np.empty_like(out)
            for k in range(kc):
                combine(left[k], right[k], out=tmp)
                annihilate(tmp, left[k], right[k], zero)
                reduce_(out, tmp, out=out)
            return out
        tmp = np.empty((kb,) + out.shape)
        part = np.empty_like(out)
        for start in range(0, kc, kb):
            stop = min(kc, start + kb)
            t = tmp[: stop - start]
            combine(left[start:stop], right[start:stop], out=t)
            annihilate(t, left[start:stop], right[start:stop], zero)
            reduce_.reduce(t, axis=0, out=part)
            reduce_(out, part, out=out)
    return out


_MIN_ROW = 16  # numba: output rows shorter than this (and than the columns) are computed transposed


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def _copied(x: np.ndarray) -> int:
    """Elements the compiled kernels copy to read x as C-contiguous matrices."""
    return 0 if x.flags.c_contiguous else x.size


def _transposed_is_better(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the compiled kernels should compute outᵀ = bᵀ ⊗ aᵀ instead (every ⊗ here
    commutes): when the inner loop's rows (of b and the output) are short (a matrix-vector
    product), or when the operands are transposes of contiguous arrays (a lifted weight's local
    derivative, wᵀ) whose contiguous copies would cost more than transposing the output back."""
    m, n = a.shape[-2], b.shape[-1]
    return (n < _MIN_ROW and m > n) or _copied(a) + _copied(b) > _copied(_t(b)) + _copied(_t(a)) + m * n


def _tropical_numba(a, b, lead, add, mul, zero, flipped=False):
    m, kc = a.shape[-2:]
    n = b.shape[-1]
    if not flipped and _transposed_is_better(a, b):
        return np.ascontiguousarray(_t(_tropical_numba(_t(b), _t(a), lead, add, mul, zero, flipped=True)))
    ia, ib = item_indices(a.shape[:-2], b.shape[:-2], lead)
    a3 = readonly(np.ascontiguousarray(a.reshape((-1, m, kc))))
    b3 = readonly(np.ascontiguousarray(b.reshape((-1, kc, n))))
    out = np.empty((ia.size, m, n))
    no_nan = nan_free_products(a3, b3, mul)
    count("tropical_matmul operands (numba)", "no NaN possible" if no_nan else "NaN possible")
    kernel = getattr(_jit(), f"{add}_{mul}_no_nan" if no_nan else f"{add}_{mul}")
    kernel(a3, b3, readonly(ia), readonly(ib), zero, out)
    return out.reshape(lead + (m, n))


# ---------------------------------------------------------------- tropical_winners

# tropical_winners' compiled kernel keeps one (m, n) slice per block of k, at most this many
# blocks (and blocks of at least K_BLOCK, within base.MATMUL_BLOCK_ELEMENTS of scratch): an
# entry's winner is searched within one block.
WINNER_BLOCKS = 16


def tropical_winners(a, b, add: str = "max", mul: str = "mul", zero: float | None = None,
                     backend: str | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(value, first): value = `tropical_matmul(a, b, add, mul, zero)`, and first[..., i, j] = the
    first k whose product a[..., i, k] ⊗ b[..., k, j] equals value[..., i, j] (an int64 array),
    -1 where the value is `zero` (no product beat the start). None when a product of the operands
    may be NaN (`nan_free_products`): the winner of a NaN-propagating ⊕ is not defined."""
    if add not in ADDS or mul not in MULS:
        raise ValueError(f"tropical_winners: add must be one of {ADDS} and mul one of {MULS}, got {add!r}, {mul!r}")
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, kc, n, lead = _matmul_shapes(a, b, "tropical_winners")
    zero = _IDENTITY[add] if zero is None else float(zero)
    if not nan_free_products(a, b, mul):
        return None
    items = math.prod(lead)
    implementation = _choose(backend, items * m * n * kc)
    count("tropical_winners", implementation)
    if kc == 0 or items * m * n == 0:
        return np.full(lead + (m, n), zero), np.full(lead + (m, n), -1, dtype=np.int64)
    if implementation == "numba":
        try:
            return _winners_numba(a, b, lead, add, mul, zero)
        except Exception as e:  # the kernel does not compile here: NumPy from now on
            if backend == "numba":
                raise
            _disable_numba(e)
    value = _tropical_numpy(a, b, lead, add, mul, zero)
    return value, _first_numpy(a, b, value, mul, zero)


def _winners_numba(a, b, lead, add, mul, zero, flipped=False):
    m, kc = a.shape[-2:]
    n = b.shape[-1]
    if not flipped and _transposed_is_better(a, b):  # the same k wins each entry of outᵀ = bᵀ ⊗ aᵀ
        value, first = _winners_numba(_t(b), _t(a), lead, add, mul, zero, flipped=True)
        return np.ascontiguousarray(_t(value)), np.ascontiguousarray(_t(first))
    ia, ib = item_indices(a.shape[:-2], b.shape[:-2], lead)
    value, first = np.empty((ia.size, m, n)), np.empty((ia.size, m, n), dtype=np.int64)
    # the blocks: at most WINNER_BLOCKS, and at most MATMUL_BLOCK_ELEMENTS of scratch unless one
    # block alone is more (then one, the size of the output: an entry's first k is then searched
    # over all of k)
    blocks = min(WINNER_BLOCKS, -(-kc // _jit().K_BLOCK), base.MATMUL_BLOCK_ELEMENTS // (m * n))
    getattr(_jit(), f"winners_{add}_{mul}")(readonly(np.ascontiguousarray(a.reshape((-1, m, kc)))),
                                            readonly(np.ascontiguousarray(b.reshape((-1, kc, n)))),
                                            readonly(ia), readonly(ib), zero, value, first,
                                            np.empty((max(1, blocks), m, n)))
    return value.reshape(lead + (m, n)), first.reshape(lead + (m, n))


def _first_numpy(a, b, value, mul, zero):
    """Each k from the last to the first: where its products equal `value`, k (so the earliest
    match is the one left); -1 where the value is `zero`. Temporaries of the output's size."""
    first = np.full(value.shape, -1, dtype=np.int64)
    won = value != zero
    left = np.moveaxis(a, -1, 0)[..., None]  # (k, ..., m, 1)
    right = np.moveaxis(b, -2, 0)[..., None, :]  # (k, ..., 1, n)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(a.shape[-1] - 1, -1, -1):
            np.copyto(first, k, where=won & (UFUNCS[mul](left[k], right[k]) == value))
    return first


def nan_free_products(a: np.ndarray, b: np.ndarray, mul: str) -> bool:
    """Whether no product a[i, k] ⊗ b[k, j] can be NaN, so that neither can any ⊕ of products
    (max and min of non-NaN values are not NaN): the kernel's plain comparisons then give the
    same values as its NaN-propagating ones, ~4× faster. Finite operands never make a NaN
    (overflow is ±inf); with infinities, × makes one from 0 · ∞ and + from ∞ − ∞ (log-space
    semirings' operands hold -∞ for 0̄, and need no NaN check for it). Reads the operands a few
    times (m·k + k·n) against the product's m·k·n."""
    if all_finite(a) and all_finite(b):
        return True
    if np.isnan(a).any() or np.isnan(b).any():
        return False
    if mul == "mul":
        return not ((np.isinf(a).any() and (b == 0).any()) or (np.isinf(b).any() and (a == 0).any()))
    if mul == "add":
        return not ((np.isposinf(a).any() and np.isneginf(b).any()) or (np.isneginf(a).any() and np.isposinf(b).any()))
    return True  # max and min of non-NaN operands


def all_finite(x: np.ndarray) -> bool:
    """No NaN or ±inf in x: its sum is finite (one pass, no temporary; an infinity or NaN
    anywhere makes the sum one), or, when the sum overflowed, every element is."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.sum(x))) or bool(np.isfinite(x).all())


# ---------------------------------------------------------------- kbest_matmul


def kbest_matmul(a, b, backend: str | None = None) -> list[np.ndarray]:
    """The matmul of the k-best semiring: for each (..., i, j), the k largest of the products
    a[p][..., i, kk] · b[q][..., kk, j] over kk and p, q < k, descending, padded with 0.

    a: k arrays (..., m, kk), b: k arrays (..., kk, n) (broadcastable within each sequence),
    finite, non-negative and sorted descending along the sequence (a[0] ≥ a[1] ≥ ... ≥ 0
    elementwise), as k-best values are; ValueError otherwise. Leading axes broadcast.
    backend: as for `tropical_matmul`. Returns k new float64 arrays (..., m, n). An operand
    whose k arrays are each one value everywhere takes a shortcut, as in `tropical_matmul`.
    """
    a = np.broadcast_arrays(*(np.asarray(c, dtype=np.float64) for c in a))
    b = np.broadcast_arrays(*(np.asarray(c, dtype=np.float64) for c in b))
    k = len(a)
    if k == 0 or len(b) != k:
        raise ValueError(f"kbest_matmul needs two sequences of the same non-zero length, got {len(a)} and {len(b)}")
    for name, seq in (("a", a), ("b", b)):
        if not _sorted_finite_nonnegative(seq):
            raise ValueError(f"kbest_matmul: {name} must be finite, non-negative and sorted descending along the sequence")
    m, kc, n, lead = _matmul_shapes(a[0], b[0], "kbest_matmul")
    items = math.prod(lead)
    implementation = _choose(backend, items * m * n * kc)
    if kc == 0 or items * m * n == 0:
        count("kbest_matmul", implementation)
        return [np.zeros(lead + (m, n)) for _ in range(k)]
    if k == 1:
        return [tropical_matmul(a[0], b[0], "max", "mul", zero=0.0, backend=implementation)]
    for which, const, other in (("a", a, b), ("b", b, a)):
        if all(_is_constant(c) for c in const):  # one k-best value everywhere (a seed 1̄)
            count("kbest_matmul", "constant operand")
            return _kbest_constant(which, [float(c.flat[0]) for c in const], other, lead, m, n)
    count("kbest_matmul", implementation)
    la, lb = a[0].shape[:-2], b[0].shape[:-2]
    ia, ib = item_indices(la, lb, lead)
    if implementation == "numba":  # (the NumPy form takes every rank)
        a, b = a[:held_ranks(a)], b[:held_ranks(b)]
    a_rows = np.stack([x.reshape((-1, m, kc)) for x in a])  # (ranks, items_a, m, kc)
    b_cols = np.stack([np.swapaxes(x.reshape((-1, kc, n)), -1, -2) for x in b])  # (ranks, items_b, n, kc)
    out = None
    if implementation == "numba":
        out = np.empty((k, items, m, n))
        heads = readonly(np.ascontiguousarray(b[0].reshape((-1, kc, n))))
        blocks = min(kc, max(8, 2 * k))
        operands = (readonly(a_rows), heads, readonly(b_cols), readonly(ia), readonly(ib), blocks, out)
        try:  # (kbest at k = 64 over a 4,000 x 64 matmul: seconds in one call, stopped at the deadline)
            stoppable(lambda stop: _jit().kbest(*operands, stop), "in a k-best matmul",
                      watched=items * m * n * kc >= STOPPABLE_PRODUCTS)
        except (DeadlineExceeded, Cancelled):
            raise
        except Exception as e:  # the kernel does not compile here: NumPy from now on
            if backend == "numba":
                raise
            _disable_numba(e)
            out = None
    if out is None:
        a_rows, b_cols = (x if len(x) == k else np.concatenate([x, np.zeros((k - len(x),) + x.shape[1:])])
                          for x in (a_rows, b_cols))
        out = _kbest_numpy(a_rows, b_cols, ia, ib)
    return [c.reshape(lead + (m, n)) for c in out]


def held_ranks(ranks, zero: float = 0.0) -> int:
    """How many leading ranks of a k-best value (best first) can hold anything but `zero` (at
    least one): only those are stacked for a kernel. A lifted partial's k - 1 zeros, stacked,
    cost k times its size (kbest at k = 64 over a row op's Jacobian blocks: 0.5 GB a block)."""
    r = len(ranks)
    while r > 1 and everywhere(ranks[r - 1], zero):
        r -= 1
    return r


def _kbest_constant(which, c, other, lead, m, n) -> list[np.ndarray]:
    """kbest_matmul when one operand is the same sorted list c everywhere: multiplying by
    c_p ≥ 0 is non-decreasing (rounding included), so the k best products over kk, p, q are
    those of c with the k best values over kk of the other operand: S = ⊕_kk other[kk], then
    c ⊗ S (the k largest c_p · S_r), broadcast to (..., m, n)."""
    k = len(c)
    # Every value of every list, the contraction axis last: (..., n, k·kk) or (..., m, k·kk).
    values = np.concatenate([np.swapaxes(x, -1, -2) if which == "a" else x for x in other], axis=-1)
    if values.shape[-1] > k:
        values = -np.partition(-values, k - 1, axis=-1)[..., :k]
    best = -np.sort(-values, axis=-1)  # (..., n or m, k), descending
    products = [(c[p], r) for p in range(k) for r in range(k) if (p + 1) * (r + 1) <= k]
    if which == "a":
        candidates = np.stack([cp * best[..., r] for cp, r in products], axis=-1)
    else:
        candidates = np.stack([best[..., r] * cp for cp, r in products], axis=-1)
    top = -np.sort(-candidates, axis=-1)[..., :k]  # (..., n or m, k)
    top = np.moveaxis(top, -1, 0)[..., None, :] if which == "a" else np.moveaxis(top, -1, 0)[..., :, None]
    return [np.ascontiguousarray(np.broadcast_to(t, lead + (m, n))) for t in top]


def _sorted_finite_nonnegative(seq) -> bool:
    for p, c in enumerate(seq):
        if c.size == 0:
            continue
        if not any(c.strides):  # one value broadcast: check it once
            c = np.full(1, c.flat[0])
        lo, hi = np.min(c), np.max(c)
        if not (math.isfinite(hi) and lo >= 0):  # NaN fails both
            return False
        if p and np.any(c > seq[p - 1]):
            return False
    return True


# The NumPy k-best matmul cuts the contraction axis into at least this many blocks.
KBEST_MIN_BLOCKS = 16


def _kbest_numpy(a_rows, b_cols, ia, ib) -> np.ndarray:
    """The k-best matmul (k ≥ 2) in NumPy; a_rows (k, items_a, m, kc), b_cols (k, items_b, n, kc)
    sorted descending along the first axis. Returns (k, items, m, n).

    Only the heads a_0 · b_0 are examined for every (i, kk, j), by a (max, ×) matmul; the
    tails only where they can matter:

    1. The contraction axis is cut into nb ≥ k blocks; best[b] = the largest head in block b
       (a batched (max, ×) matmul). The k-th largest of best over b, L, is the smallest of k
       products from different kk, so L ≤ the true k-th best value.
    2. Candidates ≤ L do not change the k best *values*: those are the k largest candidates
       > L, completed with copies of L when fewer than k exceed it (every value between L
       and the k-th best is then L). A product a_p · b_q ≤ a_0 · b_0, so only blocks with
       best > L (fewer than k per (i, j)), and in them only the kk whose head exceeds L, have
       candidates > L.
    3. Those few candidates are gathered and the k largest kept per (i, j).
    """
    k, _, m, kc = a_rows.shape
    n, items = b_cols.shape[2], ia.size
    pi, pj = _pairs(k)
    kb = max(1, kc // max(KBEST_MIN_BLOCKS, k))  # so that there are at least min(kc, max(16, k)) blocks
    nb = -(-kc // kb)
    # Heads padded with zeros to nb blocks of kb (0 is below every candidate that counts).
    a_heads = np.zeros(a_rows.shape[1:3] + (nb * kb,))
    a_heads[..., :kc] = a_rows[0]
    b_heads = np.zeros(b_cols.shape[1:3] + (nb * kb,))
    b_heads[..., :kc] = b_cols[0]
    a_blocks = a_heads.reshape(a_heads.shape[:2] + (nb, kb))  # (items_a, m, nb, kb)
    b_blocks = b_heads.reshape(b_heads.shape[:2] + (nb, kb))  # (items_b, n, nb, kb)
    a_flat = np.moveaxis(a_rows, 0, -1)  # (items_a, m, kc, k): a kk's k values side by side
    b_flat = np.moveaxis(b_cols, 0, -1)
    a_flat = np.ascontiguousarray(a_flat).reshape(-1, k)
    b_flat = np.ascontiguousarray(b_flat).reshape(-1, k)
    out = np.empty((k, items, m, n))
    # Chunks of (items, rows) whose nb × rows × n block maxima stay within the budget.
    # Chunks of (items, rows) whose arrays stay within the budget: per output entry, nb block
    # maxima and at most (k - 1) · kb heads of the blocks above the bound.
    budget = max(1, base.MATMUL_BLOCK_ELEMENTS // 8)
    per_entry = max(nb, min(nb, k - 1) * kb)
    rows = max(1, min(m, budget // max(1, per_entry * n)))
    step = max(1, budget // max(1, per_entry * n * m)) if rows == m else 1
    for t0 in range(0, items, step):
        t1 = min(items, t0 + step)
        for i0 in range(0, m, rows):
            i1 = min(m, i0 + rows)
            out[:, t0:t1, i0:i1, :] = _kbest_chunk(a_blocks, b_blocks, a_flat, b_flat, ia[t0:t1], ib[t0:t1],
                                                    i0, i1, kc, pi, pj, budget)
    return out


def _kbest_chunk(a_blocks, b_blocks, a_flat, b_flat, ta, tb, i0, i1, kc, pi, pj, budget) -> np.ndarray:
    """The k best for items (ta, tb) and rows i0:i1 of the output: (k, items, rows, n)."""
    k = a_flat.shape[1]
    m, nb, kb = a_blocks.shape[1:]
    items, rows, n = ta.size, i1 - i0, b_blocks.shape[1]
    # 1. The best head per block: a (max, ×) matmul batched over (item, block).
    left = np.moveaxis(a_blocks[ta, i0:i1], 2, 1)  # (items, nb, rows, kb)
    right = np.moveaxis(b_blocks[tb], 1, 3)  # (items, nb, kb, n)
    best = tropical_matmul(left, right, "max", "mul", zero=0.0, backend="numpy")  # (items, nb, rows, n)
    bound = _kth_largest(best.reshape(items, nb, rows * n), k, axis=1).reshape(-1)  # per entry
    best = np.moveaxis(best, 1, -1).reshape(-1, nb)  # (entries, nb); entry = (item, row, column)
    # 2. The blocks with a head above the bound; in them, the kk whose head is above it.
    entry, block = np.nonzero(best > bound[:, None])
    t, rest = np.divmod(entry, rows * n)
    i, j = np.divmod(rest, n)
    i += i0
    heads = (a_blocks.reshape(-1, kb)[(ta[t] * m + i) * nb + block]
             * b_blocks.reshape(-1, kb)[(tb[t] * n + j) * nb + block])  # (blocks kept, kb)
    kept, offset = np.nonzero(heads > bound[entry][:, None])
    entry, t, i, j = entry[kept], t[kept], i[kept], j[kept]
    kk = block[kept] * kb + offset
    # 3. Their candidates a_p · b_q above the bound (in slices of at most `budget` products),
    # then the k best per entry.
    a_index, b_index = (ta[t] * m + i) * kc + kk, (tb[t] * n + j) * kc + kk
    size = max(1, budget // pi.size)
    values, owners, held = [], [], 0
    for s0 in range(0, entry.size, size):
        part = slice(s0, s0 + size)
        products = a_flat[a_index[part]][:, pi] * b_flat[b_index[part]][:, pj]  # (kk, pairs)
        kept, pair = np.nonzero(products > bound[entry[part]][:, None])
        values.append(products[kept, pair])
        owners.append(entry[part][kept])
        held += kept.size
        if held > budget and s0 + size < entry.size:  # keep only the k best so far of each entry
            values, owners = _held_top(values, owners, bound, k)
            held = values[0].size
    values = np.concatenate(values) if values else np.zeros(0)
    owners = np.concatenate(owners) if owners else np.zeros(0, dtype=np.intp)
    top = _top_per_entry(values, owners, bound, k)  # (entries, k)
    return np.moveaxis(top, -1, 0).reshape(k, items, rows, n)


def _held_top(values, owners, bound, k):
    """The candidates held so far reduced to the k best of each entry (still sorted by entry)."""
    values, owners = np.concatenate(values), np.concatenate(owners)
    order = np.argsort(owners, kind="stable")
    top = _top_per_entry(values[order], owners[order], bound, k)
    above = top > bound[:, None]
    return [top[above]], [np.nonzero(above)[0]]


def _kth_largest(x: np.ndarray, k: int, axis: int) -> np.ndarray:
    """The k-th largest along `axis` (0 when the axis is shorter than k). For small k a max-min
    insertion network over the slices (elementwise, no sorting); np.partition otherwise."""
    size = x.shape[axis]
    if size < k:
        return np.zeros(np.delete(x.shape, axis))
    if k > 8:
        return np.take(np.partition(x, size - k, axis=axis), size - k, axis=axis)
    slices = np.moveaxis(x, axis, 0)
    top = [np.zeros(slices.shape[1:]) for _ in range(k)]  # top[r]: the (r+1)-th largest so far
    tmp = np.empty(slices.shape[1:])
    for v in slices:
        for r in range(k - 1, 0, -1):
            np.maximum(top[r], np.minimum(top[r - 1], v, out=tmp), out=top[r])
        np.maximum(top[0], v, out=top[0])
    return top[k - 1]


def _top_per_entry(values, entry, fill, k) -> np.ndarray:
    """(len(fill), k): per entry e, the k largest of values[entry == e] and of k copies of
    fill[e], descending. `entry` is non-decreasing and every value exceeds its entry's fill."""
    entries = fill.shape[0]
    counts = np.bincount(entry, minlength=entries)
    width = max(k, int(counts.max()) if counts.size else 0)
    starts = np.cumsum(counts) - counts
    if width > 4 * k + 16:  # a few entries with many candidates (ties, skewed data): sort them
        order = np.lexsort((-values, entry))
        values, entry = values[order], entry[order]
        rank = np.arange(values.size) - starts[entry]
        best = rank < k
        top = np.empty((entries, k))
        top[:] = fill[:, None]
        top[entry[best], rank[best]] = values[best]
        return top
    if k <= 8:
        # Columns of candidates (fill where an entry has fewer), inserted one column at a time
        # into the k best rows by a max-min network: elementwise over the entries, no sort.
        dense = np.empty((width, entries))
        dense[:] = fill
        if values.size:
            dense[np.arange(values.size) - starts[entry], entry] = values
        top = [fill.copy() for _ in range(k)]
        tmp = np.empty(entries)
        for column in dense:
            for r in range(k - 1, 0, -1):
                np.maximum(top[r], np.minimum(top[r - 1], column, out=tmp), out=top[r])
            np.maximum(top[0], column, out=top[0])
        return np.stack(top, axis=-1)
    dense = np.empty((entries, width))
    dense[:] = fill[:, None]
    if values.size:
        dense[entry, np.arange(values.size) - starts[entry]] = values
    if width > k:
        dense = np.partition(dense, width - k, axis=-1)[:, width - k:]
    return np.sort(dense, axis=-1)[:, ::-1]


def _pairs(k: int) -> tuple[np.ndarray, np.ndarray]:
    """(p, q) with (p+1)(q+1) ≤ k: for sorted non-negative lists, the only products that can
    be among the k largest (at least (p+1)(q+1) - 1 others are ≥ a_p · b_q)."""
    pairs = [(p, q) for p in range(k) for q in range(k) if (p + 1) * (q + 1) <= k]
    return np.array([p for p, _ in pairs], dtype=np.intp), np.array([q for _, q in pairs], dtype=np.intp)


# ---------------------------------------------------------------- neg_xlogx

_TINY = np.float64(5e-324)  # the smallest positive float64


def neg_xlogx(p, backend: str | None = None) -> np.ndarray:
    """-p log p elementwise for p ≥ 0 (converted to float64), 0 log 0 = 0, NaN stays NaN: the
    entropy semiring's R of lifted partials p = |d|. A new array laid out as p is when p is
    contiguous (a weight's local derivative is often its transpose, and passes between
    differently ordered arrays are strided), else C-ordered.

    The NumPy form takes four passes (log of max(p, smallest subnormal) is log p for every p > 0
    and a finite -744.4 at p = 0, whose product with p is then 0); the compiled one does the same
    operations in one (nearly all of its time is the logs: a 768 × 3072 weight, ~17 ms). Their
    values are equal where both call libm's log, within an ulp where NumPy has a SIMD log of its
    own (AVX-512). backend: as for `tropical_matmul`."""
    p = np.asarray(p, dtype=np.float64)
    implementation = _choose(backend, p.size)
    count("neg_xlogx", implementation)
    if implementation == "numba" and (p.flags.c_contiguous or p.flags.f_contiguous):
        r = np.empty_like(p)  # p's layout (K order), so both ravel as views
        try:
            _jit().neg_xlogx(readonly(p.ravel(order="K")), r.ravel(order="K"), _TINY)
            return r
        except Exception as e:  # the kernel does not compile here: NumPy from now on
            if backend == "numba":
                raise
            _disable_numba(e)
    r = np.maximum(p, _TINY, out=np.empty_like(p))
    np.log(r, out=r)
    np.multiply(r, p, out=r)
    np.negative(r, out=r)
    return r


# ---------------------------------------------------------------- shared


def item_indices(lead_a: tuple, lead_b: tuple, lead: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For batch shapes that broadcast to `lead`: int64 arrays ia, ib of length prod(lead) such
    that item t of the broadcast batch (C order) reads item ia[t] of the first operand's batch
    and ib[t] of the second's (each flattened in C order). No operand is broadcast in memory."""
    lead = np.broadcast_shapes(lead_a, lead_b) if lead is None else tuple(lead)
    if tuple(lead_a) == tuple(lead_b) == lead:
        ia = np.arange(math.prod(lead), dtype=np.int64)
        return ia, ia
    ia = np.broadcast_to(np.arange(math.prod(lead_a), dtype=np.int64).reshape(lead_a), lead).ravel()
    ib = np.broadcast_to(np.arange(math.prod(lead_b), dtype=np.int64).reshape(lead_b), lead).ravel()
    return np.ascontiguousarray(ia), np.ascontiguousarray(ib)


def jit_kernels():
    """The numba kernels module (`_jit_kernels`), imported and compiled on first use; raises
    when numba is not installed."""
    return _jit()


def readonly(x: np.ndarray) -> np.ndarray:
    """Kernels always see read-only arrays (numba compiles read-only and writable arrays apart)."""
    view = x.view()
    view.flags.writeable = False
    return view


_JIT = None
_JIT_LOCK = threading.Lock()


def _jit():
    """The numba kernels module, imported on first use."""
    global _JIT
    if _JIT is None:
        with _JIT_LOCK:
            if _JIT is None:
                from . import _jit_kernels

                _JIT = _jit_kernels
    return _JIT
