"""Brute-force path enumeration under a semiring: the reference for semiring backward passes.

The graph is unfolded to elements: an edge runs from element i of an operand to element j
of a node when the node's local partial ∂node[j]/∂operand[i] (from the op's rule, at the
point) is non-zero (φ(0) = 0̄ drops the others), one edge per operand position (x*x has two).
Every path from an input element to an element of an output is listed explicitly, and the
block (output, input) at input element i is ⊕ over its paths of φ(∂₁) ⊗ φ(∂₂) ⊗ ... ⊗ 1̄,
the edge nearest the input first, computed with the semiring's own zeros/ones/add/mul/lift.
Paths are counted before they are listed; past MAX_PATHS the check is refused.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Mapping, Sequence

import numpy as np

from .. import deadline
from ..autodiff.local_jacobian import local_jacobian
from ..autodiff.reverse import active_nodes
from ..errors import FailedPrecondition
from .localise import node_values

MAX_PATHS = 100_000
MAX_EDGE_ELEMENTS = 200_000  # Σ over edges' local Jacobians of their elements


def path_sums(engine, cg, point: Mapping[str, np.ndarray], wrt: Sequence[str], outputs: Sequence[str],
              s) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """{(output, input): the semiring's read() of the path sums, each shaped like the input}."""
    values = node_values(engine, cg, point)
    targets = {o: cg.graph.output_map[o] for o in outputs}
    active = active_nodes(cg.graph, cg.order, cg.types, wrt, list(targets.values()))
    edges: dict[tuple[str, int], list[tuple[str, int, float]]] = defaultdict(list)
    total = 0
    for node in cg.order:
        deadline.check(f"enumerating paths: the local Jacobians of node '{node.id}'")
        if node.id not in active:
            continue
        for pos, ref in enumerate(node.inputs):
            if ref not in active:
                continue
            total += cg.types[node.id].size * cg.types[ref].size
            if total > MAX_EDGE_ELEMENTS:
                raise FailedPrecondition(f"graph too large for brute-force path enumeration: its local Jacobians "
                                         f"have more than {MAX_EDGE_ELEMENTS} elements")
            with np.errstate(all="ignore"):
                jac = local_jacobian(cg, node, pos, [values[r] for r in node.inputs])
            for j, i in zip(*np.nonzero(jac)):
                edges[ref, int(i)].append((node.id, int(j), float(jac[j, i])))

    result = {}
    for o, target in targets.items():
        counts = _count_paths(cg, edges, target, wrt)
        n_paths = sum(counts.get((x, i), 0) for x in wrt for i in range(cg.types[x].size))
        if n_paths > MAX_PATHS:
            raise FailedPrecondition(f"graph too large for brute-force path enumeration: {n_paths} paths reach "
                                     f"output '{o}' (the limit is {MAX_PATHS})")
        for x in wrt:
            result[o, x] = _block(s, edges, target, x, cg.types[x].shape)
    return result


def _count_paths(cg, edges, target: str, wrt: Sequence[str]) -> dict[tuple[str, int], int]:
    """Paths from each element to the target node's elements (dynamic programming, exact ints)."""
    counts: dict[tuple[str, int], int] = {}
    refs = [n.id for n in reversed(cg.order)] + list(wrt)
    for ref in refs:
        for i in range(cg.types[ref].size):
            c = 1 if ref == target else 0
            for node, j, _ in edges.get((ref, i), ()):
                c += counts.get((node, j), 0)
            counts[ref, i] = c
    return counts


def _block(s, edges, target: str, x: str, shape: tuple) -> dict[str, np.ndarray]:
    n = int(np.prod(shape, dtype=np.int64))
    by_length: dict[int, tuple[list[int], list[list[float]]]] = defaultdict(lambda: ([], []))
    for i in range(n):
        deadline.check(f"enumerating the paths from {x}[{i}]")
        stack = [((x, i), [])]
        while stack:
            (ref, k), partials = stack.pop()
            if ref == target:
                starts, rows = by_length[len(partials)]
                starts.append(i)
                rows.append(partials)
            for node, j, d in edges.get((ref, k), ()):
                stack.append(((node, j), partials + [d]))
    value = s.map(lambda c: np.array(c, copy=True), s.zeros((n,)))
    for length, (starts, rows) in sorted(by_length.items()):
        starts = np.array(starts)
        partials = np.array(rows, dtype=np.float64).reshape(len(starts), length)
        path = s.ones((len(starts),))
        if length:
            path = s.lift(partials[:, 0])
            for k in range(1, length):
                path = s.mul(path, s.lift(partials[:, k]))
            path = s.mul(path, s.ones((len(starts),)))  # the seed: 1̄ at the output
        for i in np.unique(starts):
            picked = s.map(lambda c: c[starts == i][None, :], path)
            total = s.sum(picked, axis=(-1,))
            current = s.map(lambda c: c[i:i + 1], value)
            merged = s.add(current, total)
            for dst, src in zip(s.components_of(value), s.components_of(merged)):
                dst[i] = src[0]
    return s.read(s.map(lambda c: np.asarray(c).reshape(shape), value))
