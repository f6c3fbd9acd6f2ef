"""A semiring matmul that multiplies only the rows of its left operand that are not 0̄.

An adjoint often has rows of 0̄: a model's output read at one position (a classifier on the
first token) gives an adjoint that is 0̄ at every other position until an op mixes the rows
(attention), and the matmuls on the way multiply those rows for nothing (in a 12-layer BERT
with such a head, the last layer's feed-forward and output projections: ~6% of the backward
pass's matmuls). Every row of 0̄ in a gives a row of 0̄ (0̄ ⊗ x = 0̄, 0̄ ⊕ 0̄ = 0̄), so only the
other rows are multiplied.
"""

from __future__ import annotations

import numpy as np

from . import kernels
from .product import ProductSemiring

# Rows of 0̄ are looked for only when the product has at least this many columns: the search
# reads the left operand once (per component, until a row that is not 0̄ is in every row), the
# product reads it once per column.
ZERO_ROWS_MIN_COLUMNS = 16


def matmul_of_rows_not_zero(s, a, b):
    """`s.matmul(a, b)`, with the rows of a that are 0̄ (in every component and batch item) left
    out of the product and 0̄ in the result. Each member of a product of semirings decides for
    itself, as it would alone (its values are then its own request's). Rows are left out only
    when b is finite: in IEEE arithmetic 0 · ∞ is NaN, not 0̄."""
    if isinstance(s, ProductSemiring):
        return s.join([matmul_of_rows_not_zero(m, x, y) for m, x, y in zip(s.members, s.split(a), s.split(b))])
    shape_a, shape_b = s.shape(a), s.shape(b)
    if len(shape_a) < 2 or len(shape_b) < 2 or shape_b[-1] < ZERO_ROWS_MIN_COLUMNS or shape_a[-2] < 2:
        return s.matmul(a, b)
    rows = shape_a[-2]
    nonzero = np.zeros(rows, dtype=bool)
    for c, zero in zip(s.components_of(a), s.components_of(s.zeros(()))):
        c = np.asarray(c)
        if c.ndim < 2 or c.shape[-2] == 1:  # one row, broadcast: every row alike
            nonzero |= bool(np.any(c != zero))
        else:
            nonzero |= np.any(c != zero, axis=tuple(i for i in range(c.ndim) if i != c.ndim - 2))
        if nonzero.all():
            return s.matmul(a, b)
    if not all(kernels.all_finite(np.asarray(c)) for c in s.components_of(b)):
        return s.matmul(a, b)
    out = s.zeros(np.broadcast_shapes(shape_a[:-2], shape_b[:-2]) + (rows, shape_b[-1]))
    keep = np.flatnonzero(nonzero)
    if keep.size == 0:
        return out
    # a run of rows is a slice: a view, which keeps a broadcast component broadcast
    taken = slice(keep[0], keep[-1] + 1) if keep[-1] - keep[0] + 1 == keep.size else keep
    part = s.matmul(s.map(lambda c: c[..., taken, :] if np.ndim(c) >= 2 and np.shape(c)[-2] == rows else c, a), b)
    for target, values in zip(s.components_of(out), s.components_of(part)):
        target[..., taken, :] = values
    return out
