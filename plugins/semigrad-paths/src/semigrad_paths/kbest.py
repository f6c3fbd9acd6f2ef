"""The k-best semiring: the k largest path products of |∂|."""

from __future__ import annotations

import math
import numbers

import numpy as np
from semigrad_server.deadline import check
from semigrad_server.semiring import kernels
from semigrad_server.semiring.base import MATMUL_BLOCK_ELEMENTS, Semiring

DEFAULT_K = 3
MAX_K = 64
# Up to this k, and on arrays of at least NETWORK_MIN_SIZE_PER_K · k elements, ⊕ and ⊗ are
# selection networks of elementwise max and min (O(k²) array operations, no sorting); for
# bigger k or smaller arrays sorting the candidates is faster.
NETWORK_MAX_K = 16
NETWORK_MIN_SIZE_PER_K = 96
# The ⊕-reduce halves with the network for k up to this, on at least this many elements.
SUM_NETWORK_MAX_K = 4
SUM_NETWORK_MIN_SIZE = 8192


def _pairs(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j) with (i+1)(j+1) ≤ k: for sorted non-negative inputs, the only
    products that can be among the k largest (≥ (i+1)(j+1) - 1 other products are ≥ a_i b_j).
    About k ln k pairs instead of k²."""
    pairs = [(i, j) for i in range(k) for j in range(k) if (i + 1) * (j + 1) <= k]
    return np.array([p[0] for p in pairs], dtype=np.intp), np.array([p[1] for p in pairs], dtype=np.intp)


class KBestSemiring(Semiring):
    """For each input element, the k largest products of |∂| along paths to the output,
    in descending order (0 where there are fewer than k paths with a non-zero product).

    Carrier: k arrays, sorted descending and non-negative (structure of arrays).
      a ⊕ b = the k largest of the 2k values of a and b
      a ⊗ b = the k largest of the k² pairwise products a_i b_j
      0̄ = (0, ..., 0), 1̄ = (1, 0, ..., 0), φ(d) = (|d|, 0, ..., 0)
    Parameter k (int, 1 ≤ k ≤ 64, default 3): `configure({"k": 5})`. As the plugin API
    requires, with k = 1 a value is a bare ndarray (then kbest is max_product).
    read() returns {"value": best product, "kbest": the k values stacked on a last axis}.

    Every operation only selects among exact products a_i · b_j, so any correct algorithm
    gives the same values. ⊕ and ⊗ are selection networks of max and min for k ≤ 16, the
    matmul is the server's k-best kernel. Values with a NaN (or, for the matmul, an infinity)
    take the sort-based reference code (`_*_reference`, the original implementation), which
    orders NaN last.
    """

    name = "kbest"
    description = "the k largest path products of |local derivative| (parameter k, default 3)"
    commutative = True
    idempotent = False
    selective = False
    components = DEFAULT_K
    lift_arrays = 1  # a lift's other ranks are views of one 0
    primary = "value"
    parameters = {"k": f"how many best path products to keep (int, 1..{MAX_K}, default {DEFAULT_K})"}

    def __init__(self, k: int = DEFAULT_K):
        self.k = _check_k(k)
        self.components = self.k
        self.component_names = tuple(f"best{i + 1}" for i in range(self.k))
        self._i, self._j = _pairs(self.k)

    def configure(self, params):
        params = dict(params or {})
        unknown = sorted(set(params) - {"k"})
        if unknown:
            raise ValueError(f"semiring 'kbest' has no parameter {', '.join(map(repr, unknown))} (it takes: k)")
        k = _check_k(params.get("k", DEFAULT_K))
        return self if k == self.k else type(self)(k)

    @property
    def key(self) -> str:
        return f"{self.name}:k={self.k}"

    # ------------------------------------------------------------ elementwise
    def zeros(self, shape):
        return self._pack(tuple(np.zeros(shape) for _ in range(self.k)))

    def ones(self, shape):
        return self._pack((np.ones(shape),) + tuple(np.zeros(shape) for _ in range(self.k - 1)))

    def lift(self, d):
        p = np.abs(np.asarray(d, dtype=np.float64))
        zero = np.broadcast_to(np.float64(0.0), p.shape)  # read-only: nothing writes into a lifted value
        return self._pack((p,) + (zero,) * (self.k - 1))

    def add(self, a, b):
        shape = self._shape_of(a, b)
        if not self._network(shape):
            return self._add_reference(a, b)
        out = _merge(self.components_of(a), self.components_of(b), self.k, shape)
        if _any_nan(out):
            return self._add_reference(a, b)
        return self._pack(tuple(out))

    def mul(self, a, b):
        shape = self._shape_of(a, b)
        if not self._network(shape):
            return self._mul_reference(a, b)
        out = _product_top(self.components_of(a), self.components_of(b), self.k, shape)
        if _any_nan(out):
            return self._mul_reference(a, b)
        return self._pack(tuple(out))

    def _network(self, shape) -> bool:
        return self.k <= NETWORK_MAX_K and math.prod(shape) >= NETWORK_MIN_SIZE_PER_K * self.k

    def _shape_of(self, *values) -> tuple[int, ...]:
        return np.broadcast_shapes(*(np.shape(c) for v in values for c in self.components_of(v)))

    def _pack(self, comps: tuple):
        """A carrier value from its k arrays (a bare ndarray when k = 1)."""
        return comps[0] if self.k == 1 else comps

    # ------------------------------------------------------------ reductions
    def sum(self, a, axis, keepdims=False):
        comps = np.broadcast_arrays(*self.components_of(a))
        nd = comps[0].ndim
        axes = sorted({ax % nd for ax in axis}) if nd else []
        rest = [ax for ax in range(nd) if ax not in axes]
        shape = tuple(comps[0].shape[ax] for ax in rest)
        # The ⊕ network costs O(k²) array operations per halving: worth it for small k on big
        # arrays; otherwise (and for an empty axis) one partition of all the candidates.
        if self.k > SUM_NETWORK_MAX_K or comps[0].size < SUM_NETWORK_MIN_SIZE or \
                any(comps[0].shape[ax] == 0 for ax in axes):
            return self._sum_reference(a, axis, keepdims)
        # Reduced axes last, flattened into one: pairwise halving with the ⊕ network.
        parts = [np.transpose(c, rest + axes).reshape(shape + (-1,)) for c in comps]
        size = parts[0].shape[-1]
        while size > 1:
            half = size // 2
            merged = _merge([p[..., :half] for p in parts], [p[..., half:2 * half] for p in parts], self.k,
                            shape + (half,))
            if size % 2:
                merged = [np.concatenate([m, p[..., 2 * half:]], axis=-1) for m, p in zip(merged, parts)]
            parts, size = merged, half + size % 2
        out = [np.array(p[..., 0]) for p in parts]
        if _any_nan(out):
            return self._sum_reference(a, axis, keepdims)
        if keepdims:
            out = [np.expand_dims(c, tuple(axes)) for c in out]
        return self._pack(tuple(out))

    def matmul(self, a, b):
        """out[..., i, j] = the k largest of a_p[..., i, kk] · b_q[..., kk, j] over kk, p, q: the
        server's k-best kernel (`semigrad_server.semiring.kernels.kbest_matmul`: numba when
        installed, else NumPy; bounded memory), or the reference for values it does not take
        (NaN, infinities)."""
        try:
            return self._pack(tuple(kernels.kbest_matmul(self.components_of(a), self.components_of(b))))
        except ValueError:
            return self._matmul_reference(a, b)

    # ------------------------------------------------------------ the reference algorithms
    # Sort-based, and the only ones defined for NaN (ordered last by the sorts) and infinities
    # (inf · 0 = NaN). Kept as they were: the fast paths above must give the same values.
    def _add_reference(self, a, b):
        return self._top_by_blocks(np.broadcast_arrays(*self.components_of(a), *self.components_of(b)), np.stack,
                                   2 * self.k)

    def _mul_reference(self, a, b):
        k = self.k

        def products(comps):
            left, right = np.stack(comps[:k])[self._i], np.stack(comps[k:])[self._j]
            with np.errstate(invalid="ignore"):
                return kernels.annihilate(left * right, left, right, 0.0)  # 0 (no path) · ∞ is no path

        return self._top_by_blocks(np.broadcast_arrays(*self.components_of(a), *self.components_of(b)), products,
                                   len(self._i) + 2 * k)

    def _top_by_blocks(self, comps, candidates, held: int):
        """The k largest of `candidates(comps)` (arrays of one shape in, (count, ...) out),
        computed over blocks of elements so that no more than about MATMUL_BLOCK_ELEMENTS
        values are held at once (`held`: values held per element, candidates and their copies
        in `_best`): at k = 64 a ⊗ of every element at once held ~280 products an element,
        past the memory the request was estimated (and admitted) at."""
        shape, size = comps[0].shape, comps[0].size
        step = max(1, MATMUL_BLOCK_ELEMENTS // (3 * held))
        if size <= step:
            return self._top(candidates(comps))
        flat = [np.reshape(c, -1) for c in comps]
        out = np.empty((self.k, size))
        for start in range(0, size, step):
            check("in a kbest step")  # (each block ~10-40 ms: the request's deadline holds between them)
            out[:, start:start + step] = self._best(candidates([c[start:start + step] for c in flat]))
        return self._pack(tuple(out[r].reshape(shape) for r in range(self.k)))

    def _best(self, candidates: np.ndarray) -> np.ndarray:
        """The k largest along axis 0 (which has ≥ k entries), descending, NaN after every
        number (sorted as -candidates: NumPy sorts NaN last): (k, ...)."""
        k = self.k
        if candidates.shape[0] > k:
            candidates = -np.partition(-candidates, k - 1, axis=0)[:k]
        return -np.sort(-candidates, axis=0)

    def _top(self, candidates: np.ndarray):
        """The k largest along axis 0 (which has ≥ k entries), descending, as a value."""
        best = self._best(candidates)
        return self._pack(tuple(best[i] for i in range(self.k)))

    def _sum_reference(self, a, axis, keepdims=False):
        comps = np.broadcast_arrays(*self.components_of(a))
        nd = comps[0].ndim
        axes = sorted({ax % nd for ax in axis}) if nd else []
        stacked = np.stack(comps)  # (k, *shape)
        moved = np.moveaxis(stacked, [ax + 1 for ax in axes], list(range(1, len(axes) + 1)))
        rest = moved.shape[1 + len(axes):]
        count = moved.shape[0] * math.prod(moved.shape[1:1 + len(axes)])  # k · (reduced size) candidates
        candidates = moved.reshape((count,) + rest)  # (an explicit count: rest may hold a 0)
        if candidates.shape[0] == 0:
            out = self.zeros(rest)
        else:
            out = self._top(candidates)
        if keepdims:
            out = self.map(lambda c: np.expand_dims(c, tuple(axes)), out)
        return out

    def _matmul_reference(self, a, b):
        """Blocked over the contraction axis so that ⊗ (≈ k ln k candidates per element)
        never holds more than about MATMUL_BLOCK_ELEMENTS values at once."""
        m, kk = self.shape(a)[-2:]
        n = self.shape(b)[-1]
        lead = np.broadcast_shapes(self.shape(a)[:-2], self.shape(b)[:-2])
        per_k = max(1, m * n * int(np.prod(lead, dtype=np.int64)) * len(self._i))
        block = max(1, MATMUL_BLOCK_ELEMENTS // per_k)
        out = None
        for start in range(0, kk, block):
            stop = min(kk, start + block)
            left = self.map(lambda c: c[..., :, start:stop, None], a)
            right = self.map(lambda c: c[..., None, start:stop, :], b)
            part = self._sum_reference(self._mul_reference(left, right), axis=(-2,))
            out = part if out is None else self._add_reference(out, part)
        if out is None:
            return self.zeros(lead + (m, n))
        return out

    # ------------------------------------------------------------ reading, checks
    def read(self, value):
        comps = np.broadcast_arrays(*self.components_of(value))
        return {"value": np.asarray(comps[0]), "kbest": np.stack(comps, axis=-1)}

    def sample(self, rng, shape):
        """Carrier values with 0..k non-zero entries, sorted descending (richer than lift)."""
        shape = tuple(shape)
        values = np.sort(np.abs(rng.normal(size=(self.k,) + shape)), axis=0)[::-1]
        count = rng.integers(0, self.k + 1, size=shape)
        values = np.where(np.arange(self.k).reshape((-1,) + (1,) * len(shape)) < count, values, 0.0)
        return self._pack(tuple(values[i] for i in range(self.k)))


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (numbers.Integral, float)) or (isinstance(k, float) and not k.is_integer()):
        raise ValueError(f"parameter 'k' of semiring 'kbest' must be an integer, got {k!r}")
    k = int(k)
    if not 1 <= k <= MAX_K:
        raise ValueError(f"parameter 'k' of semiring 'kbest' must be between 1 and {MAX_K}, got {k}")
    return k


# ---------------------------------------------------------------- selection networks


def _merge(a, b, k: int, shape) -> list[np.ndarray]:
    """The min(k, len(a) + len(b)) largest of the union of two lists of arrays, each list
    sorted descending elementwise, as new arrays of `shape` (the broadcast shape).

    The r-th largest (from 0) of the union is max over s of min(a[s-1], b[r-s]): the best way
    to pick r+1 values, s of them from a and r+1-s from b, is their top ones, and the smallest
    of those is min(a[s-1], b[r-s]) (a[-1] = b[-1] = +inf: taking none from a list)."""
    la, lb = len(a), len(b)
    out, tmp = [], np.empty(shape)
    for r in range(min(k, la + lb)):
        acc = None
        for s in range(max(0, r + 1 - lb), min(r + 1, la) + 1):
            if s == 0:
                term = b[r]
            elif s == r + 1:
                term = a[r]
            else:
                term = np.minimum(a[s - 1], b[r - s], out=tmp)
            if acc is None:
                acc = np.empty(shape)
                np.copyto(acc, term)
            else:
                np.maximum(acc, term, out=acc)
        out.append(acc)
    return out


def _product_top(a, b, k: int, shape) -> list[np.ndarray]:
    """The k largest of the pairwise products a[p] · b[q] (lists of k arrays sorted descending,
    non-negative): row p, the products a[p] · b[q] for (p+1)(q+1) ≤ k, is sorted descending
    in q; the rows are merged with `_merge`."""
    top = None
    with np.errstate(invalid="ignore"):  # 0 (no path) · ∞ is no path: 0, not NaN
        for p in range(k):
            row = [kernels.annihilate(np.multiply(a[p], b[q]), a[p], b[q], 0.0) for q in range(k // (p + 1))]
            top = row if top is None else _merge(top, row, k, shape)
    return top


def _any_nan(arrays) -> bool:
    """Whether any of these arrays holds a NaN (max and min propagate NaN into the outputs)."""
    return any(c.size and math.isnan(np.max(c)) for c in arrays)
