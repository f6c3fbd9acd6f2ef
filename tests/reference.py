"""Independent references for gradients: central finite differences, and closed forms."""

from __future__ import annotations

import itertools

import numpy as np
import semigrad


def det_by_minors(g: semigrad.Graph, a, n: int):
    """Determinant by expansion along the first row (CppAD's det_minor), with scalar indexing."""
    memo = {}

    def det(rows: tuple, cols: tuple):
        if (rows, cols) not in memo:
            if len(rows) == 1:
                memo[rows, cols] = a[rows[0], cols[0]]
            else:
                total = None
                for k, c in enumerate(cols):
                    term = a[rows[0], c] * det(rows[1:], cols[:k] + cols[k + 1:])
                    total = term if total is None else (total + term if k % 2 == 0 else total - term)
                memo[rows, cols] = total
        return memo[rows, cols]

    return det(tuple(range(n)), tuple(range(n)))


def det_graph(n: int) -> semigrad.Graph:
    g = semigrad.Graph()
    g.output("det", det_by_minors(g, g.input("A", (n, n)), n))
    return g


def det_gradient(a: np.ndarray) -> np.ndarray:
    """∂det(A)/∂A = det(A) A^{-T}, batched over leading axes."""
    return np.linalg.det(a)[..., None, None] * np.swapaxes(np.linalg.inv(a), -1, -2)


def finite_difference_gradient(evaluate, inputs: dict, shapes: dict, seeds: dict, wrt: str, step: float = 1e-6):
    """Per-item gradient of Σ seed·output w.r.t. input `wrt`, by central differences.

    Every input is first broadcast to the common batch shape, so each perturbation touches
    one batch item; all 2·size perturbations go in one call of `evaluate(inputs)` as an
    extra leading batch axis. `seeds[name]` has shape batch + output shape.
    """
    leads = [np.shape(v)[: np.ndim(v) - len(shapes[k])] for k, v in inputs.items()]
    batch = tuple(np.broadcast_shapes(*leads))
    full = {k: np.broadcast_to(v, batch + tuple(shapes[k])).copy() for k, v in inputs.items()}
    x = full[wrt]
    n = x.size
    h = step * np.maximum(1.0, np.abs(x.reshape(-1)))
    plus = np.repeat(x.reshape(1, -1), n, axis=0)
    minus = plus.copy()
    plus[np.arange(n), np.arange(n)] += h
    minus[np.arange(n), np.arange(n)] -= h
    args = dict(full, **{wrt: np.concatenate([plus, minus]).reshape((2 * n,) + x.shape)})
    total = 0.0
    for name, value in evaluate(args).items():
        item_axes = tuple(range(1 + len(batch), value.ndim))
        total = total + np.sum(value * seeds[name], axis=item_axes)  # (2n,) + batch
    diff = (total[:n] - total[n:]).reshape(n, -1)  # perturbation × batch item
    item_of = np.arange(n) // (n // diff.shape[1])  # x is C-ordered: batch axes first
    return (diff[np.arange(n), item_of] / (2 * h)).reshape(x.shape)


def all_index_tuples(shape):
    return itertools.product(*(range(d) for d in shape))
