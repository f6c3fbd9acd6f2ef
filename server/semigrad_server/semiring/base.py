"""The semiring plugin API (version 1).

A backward pass computes, for every input element, ⊕ over all paths to the output of the
⊗-product of lifted local derivatives φ(∂) along the path. A `Semiring` says what ⊕, ⊗,
0̄, 1̄ and φ are, on NumPy arrays:

* A value is one ndarray when `components == 1`, otherwise a tuple of `components`
  ndarrays of equal shape (structure of arrays: entropy carries (Z, R), k-best k arrays).
* Every method works elementwise on broadcastable arrays; arrays may carry leading batch
  axes, and `axis` arguments are negative (counted from the end), so batch axes are never
  touched.
* `lift(d)` maps real local partials into the semiring, and `lift(0)` must be 0̄ so that
  zero-derivative edges drop out.
* `sum` (⊕-reduce) and `matmul` have generic defaults built from `add` and `mul`; override
  them with a vectorised form when one exists (the default matmul is blocked so memory
  stays bounded).
* `read(value)` turns a result into named arrays for the wire: the entry named by
  `primary` is returned as the gradient, the others on request.

Subclass `Semiring`, set the class attributes, implement the elementwise methods, and
declare an entry point in the group `semigrad.semirings` (see docs/writing-a-plugin.md).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

API_VERSION = 1

Value = Any  # np.ndarray, or a tuple of np.ndarray when components > 1

# Elements of m × block × n computed at once by the default matmul (times batch items).
MATMUL_BLOCK_ELEMENTS = 1 << 22


class Semiring:
    """Base class of semiring plugins. Class attributes declare the semiring's properties."""

    name: str = ""
    api_version: int = API_VERSION
    description: str = ""
    commutative: bool = True  # a ⊗ b = b ⊗ a
    idempotent: bool = False  # a ⊕ a = a
    selective: bool = False  # a ⊕ b is a or b (max/min-like): best paths exist
    components: int = 1  # carrier size: arrays per value
    # arrays of its operand's size a `lift` allocates (the others views: a rank's 0̄, a pointer
    # that is NONE); what blocks of lifted local Jacobians are sized by (sr_row_vjp)
    lift_arrays: int | None = None  # None: `components`
    component_names: tuple[str, ...] = ("value",)
    primary: str = "value"  # which entry of read() is the gradient
    # Parameters a request may set (name -> description); see `configure`.
    parameters: Mapping[str, str] = {}
    # φ(d) depends on |d| alone, and `lift_magnitude(|d|)` gives it: a product of semirings then
    # takes |d| once for every member that says so (see `lift_magnitude`).
    magnitude_lift: bool = False

    # ------------------------------------------------------------ to implement
    def zeros(self, shape: Sequence[int]) -> Value:
        """0̄ everywhere: the identity of ⊕ and the annihilator of ⊗."""
        raise NotImplementedError

    def ones(self, shape: Sequence[int]) -> Value:
        """1̄ everywhere: the identity of ⊗."""
        raise NotImplementedError

    def add(self, a: Value, b: Value) -> Value:
        """a ⊕ b, elementwise with broadcasting."""
        raise NotImplementedError

    def mul(self, a: Value, b: Value) -> Value:
        """a ⊗ b, elementwise with broadcasting (a is the edge nearer the input)."""
        raise NotImplementedError

    def lift(self, d: np.ndarray) -> Value:
        """φ: real local partials into the semiring; φ(0) must be 0̄."""
        raise NotImplementedError

    # ------------------------------------------------------------ with defaults
    def lift_magnitude(self, p: np.ndarray) -> Value:
        """φ(d) given p = |d| (float64, ≥ 0), for a semiring that sets `magnitude_lift`. p is
        shared with other members of a product, and read-only; it may be returned as (a
        component of) the value itself (max_product's φ is p). Default: `lift(p)`."""
        return self.lift(p)

    def configure(self, params: Mapping[str, object]) -> "Semiring":
        """Return the semiring to use for a request with these parameters (default: none allowed).
        With no parameters it must behave as the plugin as loaded (requests without parameters
        use that instance directly)."""
        if params:
            raise ValueError(f"semiring '{self.name}' takes no parameters (got {', '.join(params)})")
        return self

    @property
    def key(self) -> str:
        """Identifies a configured semiring (used to cache compiled plans)."""
        return self.name

    def sum(self, a: Value, axis: tuple[int, ...], keepdims: bool = False) -> Value:
        """⊕-reduce over negative `axis` numbers. Default: pairwise halving with `add`."""
        for ax in sorted(axis):
            a = self._reduce_axis(a, ax)
        if not keepdims:
            a = self.map(lambda c: np.squeeze(c, axis=tuple(axis)), a)
        return a

    def _reduce_axis(self, a: Value, ax: int) -> Value:
        size = self.shape(a)[ax]
        if size == 0:
            shape = list(self.shape(a))
            shape[ax] = 1
            return self.zeros(shape)
        while size > 1:
            half = size // 2
            lo = self.map(lambda c: _take(c, ax, 0, half), a)
            hi = self.map(lambda c: _take(c, ax, half, 2 * half), a)
            merged = self.add(lo, hi)
            if size % 2:
                rest = self.map(lambda c: _take(c, ax, 2 * half, size), a)
                merged = self.concat([merged, rest], ax)
            a, size = merged, half + size % 2
        return a

    def matmul(self, a: Value, b: Value) -> Value:
        """out[..., i, j] = ⊕_k a[..., i, k] ⊗ b[..., k, j]; blocked over k to bound memory."""
        m, k = self.shape(a)[-2:]
        n = self.shape(b)[-1]
        lead = np.broadcast_shapes(self.shape(a)[:-2], self.shape(b)[:-2])
        per_k = max(1, m * n * int(np.prod(lead, dtype=np.int64)) * self.components)
        block = max(1, MATMUL_BLOCK_ELEMENTS // per_k)
        out = None
        for start in range(0, k, block):
            stop = min(k, start + block)
            left = self.map(lambda c: c[..., :, start:stop, None], a)
            right = self.map(lambda c: c[..., None, start:stop, :], b)
            part = self.sum(self.mul(left, right), axis=(-2,))
            out = part if out is None else self.add(out, part)
        if out is None:
            return self.zeros(lead + (m, n))
        return out

    def scatter_add(self, values: Value, index: np.ndarray, size: int) -> Value:
        """out[j] = ⊕ of values[k] over the k with index[k] == j (0̄ where none): values are
        flat (one axis, as long as `index`), `index` holds ints in [0, size). The adjoint of a
        gather. Default: sorted by index, equal neighbours merged pairwise with `add` (rounds:
        log2 of the largest multiplicity), so it works for every semiring."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        order = np.argsort(index, kind="stable")
        keys = index[order]
        values = self.map(lambda c: np.asarray(c).reshape(-1)[order], values)
        while keys.size:
            start = np.r_[True, keys[1:] != keys[:-1]]
            rank = np.arange(keys.size) - np.maximum.accumulate(np.where(start, np.arange(keys.size), 0))
            keep = rank % 2 == 0
            paired = keep.copy()
            paired[-1] = False
            paired[:-1] &= ~start[1:]
            if not paired.any():
                break
            i = np.nonzero(paired)[0]
            merged = self.add(self.map(lambda c: c[i], values), self.map(lambda c: c[i + 1], values))

            def put(c, m):
                c = c.copy()
                c[i] = m
                return c[keep]

            values = (put(values, merged) if self.components == 1
                      else tuple(put(c, m) for c, m in zip(values, merged)))
            keys = keys[keep]
        out = self.zeros((size,))
        for target, part in zip(self.components_of(out), self.components_of(values)):
            target[keys] = part
        return out

    def read(self, value: Value) -> dict[str, np.ndarray]:
        """Named arrays for the wire; `primary` names the gradient."""
        if self.components == 1:
            return {self.primary: np.asarray(value)}
        return dict(zip(self.component_names, value))

    def equal(self, a: Value, b: Value, rtol: float = 1e-9, atol: float = 1e-12) -> np.ndarray:
        """Elementwise (approximate) equality, used by the axiom checks and best paths."""
        parts = [np.isclose(x, y, rtol=rtol, atol=atol) | (x == y)
                 for x, y in zip(self.components_of(a), self.components_of(b))]
        return np.logical_and.reduce(parts)

    def sample(self, rng: np.random.Generator, shape: Sequence[int]) -> Value:
        """Random values for the axiom checks: lifted partials, some of them zero."""
        d = rng.normal(size=shape) * rng.choice([0.0, 1.0, 1.0, 1.0], size=shape)
        return self.lift(d)

    # ------------------------------------------------------------ helpers for tuple carriers
    def map(self, fn, value: Value) -> Value:
        """Apply an array function to every component."""
        if self.components == 1:
            return fn(value)
        return tuple(fn(c) for c in value)

    def components_of(self, value: Value) -> tuple[np.ndarray, ...]:
        return (value,) if self.components == 1 else tuple(value)

    def shape(self, value: Value) -> tuple[int, ...]:
        return tuple(np.shape(self.components_of(value)[0]))

    def concat(self, values: Sequence[Value], axis: int) -> Value:
        if self.components == 1:
            return np.concatenate(np.broadcast_arrays(*values), axis=axis)
        return tuple(np.concatenate(np.broadcast_arrays(*parts), axis=axis) for parts in zip(*values))


def _take(a: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * a.ndim
    index[axis] = slice(start, stop)
    return a[tuple(index)]
