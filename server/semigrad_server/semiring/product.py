"""The product of several semirings: one backward walk computes all of them.

A value of `ProductSemiring([s1, s2, ...])` is the concatenation of its members' components
(a tuple of arrays: s1's components, then s2's, ...). Every operation splits a value into the
members' values, applies each member's own method (so each member's vectorised `matmul`,
`sum` and `scatter_add` run on its own components, not a generic default) and concatenates
the results. The product of semirings is a semiring, so a backward pass under it is, member
by member, exactly the backward pass under that member: the same forward values, the same
lifted partials, the same member operations in the same order. (The real semiring alone is
differentiated by ordinary ops, not semiring ones; in a product it runs as a semiring, equal
to the plain gradient up to rounding.)

It is built by the engine from a request's list of semiring names (not a plugin): it is not
selective (⊕ picks per member, not one operand), so best paths are not offered.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .base import Semiring

MAX_MEMBERS = 16  # semirings in one request


class ProductSemiring(Semiring):
    def __init__(self, members: Sequence[Semiring]):
        if len(members) < 2:
            raise ValueError("a product of semirings needs at least two members")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError(f"semiring {sorted(n for n in names if names.count(n) > 1)[0]!r} is named twice")
        self.members = tuple(members)
        self.name = "+".join(names)
        self.description = "product of " + ", ".join(names)
        self.commutative = all(m.commutative for m in members)
        self.idempotent = all(m.idempotent for m in members)
        self.selective = False
        self.components = sum(m.components for m in members)
        self.lift_arrays = sum(m.lift_arrays or m.components for m in members)
        self.component_names = tuple(f"{m.name}.{c}" for m in members for c in m.component_names)
        self.primary = ""
        bounds, start = [], 0
        for m in members:
            bounds.append((start, start + m.components))
            start += m.components
        self._bounds = tuple(bounds)
        self._key = "product(" + ",".join(m.key for m in members) + ")"

    @property
    def key(self) -> str:
        return self._key

    # ------------------------------------------------------------ splitting and joining
    def split(self, value) -> list:
        """The members' values, in order (a bare array for a one-component member)."""
        parts = tuple(value)
        return [parts[a] if m.components == 1 else tuple(parts[a:b])
                for m, (a, b) in zip(self.members, self._bounds)]

    def join(self, values) -> tuple:
        out = []
        for m, v in zip(self.members, values):
            out.extend(m.components_of(v))
        return tuple(out)

    def _each(self, method: str, *values, **kwargs):
        split = [self.split(v) for v in values]
        return self.join([getattr(m, method)(*(s[i] for s in split), **kwargs) for i, m in enumerate(self.members)])

    # ------------------------------------------------------------ the semiring
    def zeros(self, shape):
        return self.join([m.zeros(shape) for m in self.members])

    def ones(self, shape):
        return self.join([m.ones(shape) for m in self.members])

    def lift(self, d):
        # |d| once for every member whose φ reads it alone (max_product's φ is |d| itself, and
        # entropy's Z: one array for both, not a pass and a weight-sized copy each)
        magnitude = None
        values = []
        for m in self.members:
            if m.magnitude_lift:
                if magnitude is None:  # an array (a 0-d one too), read-only: shared, no member may write into it
                    magnitude = np.asarray(np.abs(np.asarray(d, dtype=np.float64)))
                    magnitude.setflags(write=False)
                values.append(m.lift_magnitude(magnitude))
            else:
                values.append(m.lift(d))
        return self.join(values)

    def add(self, a, b):
        return self._each("add", a, b)

    def mul(self, a, b):
        return self._each("mul", a, b)

    def sum(self, a, axis, keepdims=False):
        return self._each("sum", a, axis=axis, keepdims=keepdims)

    def matmul(self, a, b):
        return self._each("matmul", a, b)

    def scatter_add(self, values, index, size):
        return self.join([m.scatter_add(v, index, size) for m, v in zip(self.members, self.split(values))])

    def equal(self, a, b, rtol=1e-9, atol=1e-12):
        return np.logical_and.reduce([m.equal(x, y, rtol=rtol, atol=atol)
                                      for m, x, y in zip(self.members, self.split(a), self.split(b))])

    def read(self, value):
        return {f"{m.name}.{k}": v for m, part in zip(self.members, self.split(value)) for k, v in m.read(part).items()}

    def read_members(self, value) -> dict[str, dict[str, np.ndarray]]:
        """Each member's named arrays, by member name."""
        return {m.name: m.read(part) for m, part in zip(self.members, self.split(value))}

    def sample(self, rng, shape):
        return self.join([m.sample(rng, shape) for m in self.members])
