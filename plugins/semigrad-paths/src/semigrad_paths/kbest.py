"""The k-best semiring: the k largest path products of |∂|."""

from __future__ import annotations

import numbers

import numpy as np
from semigrad_server.semiring.base import MATMUL_BLOCK_ELEMENTS, Semiring

DEFAULT_K = 3
MAX_K = 64


def _pairs(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j) with (i+1)(j+1) ≤ k: for sorted non-negative inputs, the only
    products that can be among the k largest (≥ (i+1)(j+1) - 1 other products are ≥ a_i b_j).
    About k ln k pairs instead of k²."""
    pairs = [(i, j) for i in range(k) for j in range(k) if (i + 1) * (j + 1) <= k]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


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
    """

    name = "kbest"
    description = "the k largest path products of |local derivative| (parameter k, default 3)"
    commutative = True
    idempotent = False
    selective = False
    components = DEFAULT_K
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
        return self._pack((p,) + tuple(np.zeros_like(p) for _ in range(self.k - 1)))

    def add(self, a, b):
        return self._top(np.stack(np.broadcast_arrays(*self.components_of(a), *self.components_of(b))))

    def mul(self, a, b):
        comps = np.broadcast_arrays(*self.components_of(a), *self.components_of(b))
        left, right = np.stack(comps[: self.k]), np.stack(comps[self.k:])
        return self._top(left[self._i] * right[self._j])

    def _top(self, candidates: np.ndarray):
        """The k largest along axis 0 (which has ≥ k entries), descending, as a value."""
        k = self.k
        if candidates.shape[0] > k:
            candidates = -np.partition(-candidates, k - 1, axis=0)[:k]
        best = np.sort(candidates, axis=0)[::-1]
        return self._pack(tuple(best[i] for i in range(k)))

    def _pack(self, comps: tuple):
        """A carrier value from its k arrays (a bare ndarray when k = 1)."""
        return comps[0] if self.k == 1 else comps

    # ------------------------------------------------------------ reductions
    def sum(self, a, axis, keepdims=False):
        comps = np.broadcast_arrays(*self.components_of(a))
        nd = comps[0].ndim
        axes = sorted({ax % nd for ax in axis}) if nd else []
        stacked = np.stack(comps)  # (k, *shape)
        moved = np.moveaxis(stacked, [ax + 1 for ax in axes], list(range(1, len(axes) + 1)))
        rest = moved.shape[1 + len(axes):]
        candidates = moved.reshape((-1,) + rest)  # k · (reduced size) candidates
        if candidates.shape[0] == 0:
            out = self.zeros(rest)
        else:
            out = self._top(candidates)
        if keepdims:
            out = self.map(lambda c: np.expand_dims(c, tuple(axes)), out)
        return out

    def matmul(self, a, b):
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
            part = self.sum(self.mul(left, right), axis=(-2,))
            out = part if out is None else self.add(out, part)
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
