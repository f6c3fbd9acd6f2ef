"""Graphs the benchmarks time, built with the client API, and their NumPy closed forms.

Importable from the bench scripts (`import workloads`: scripts run as `python bench/X.py`, so
bench/ is on sys.path) and from anywhere else once bench/ is on sys.path. Only depends on the
client package `semigrad` and NumPy.

The test suite imports these too (pytest puts bench/ on its path), so each workload and
its closed form live in one place.
"""

from __future__ import annotations

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
    """Graph with one input "A" of shape (n, n) and one output "det"."""
    g = semigrad.Graph()
    g.output("det", det_by_minors(g, g.input("A", (n, n)), n))
    return g


def det_gradient(a: np.ndarray) -> np.ndarray:
    """∂det(A)/∂A = det(A) A^{-T}, batched over leading axes (np.linalg.det / np.linalg.inv)."""
    return np.linalg.det(a)[..., None, None] * np.swapaxes(np.linalg.inv(a), -1, -2)
