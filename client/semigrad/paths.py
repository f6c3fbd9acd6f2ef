"""Best paths as columns: what a ``best_path`` or ``top_paths`` request returns.

A request for every element's best path at BERT size returns ~100,000 paths and tens of
millions of steps: a Python object per step would cost more than the backward pass that found
them. The engine, the wire (``PathTable``) and the client keep them as arrays, one row per
path and one per step; :class:`BestPaths` reads a path as a :class:`BestPath` when it is asked
for (``paths[i]``, iteration), and hands the columns to code that works on arrays.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from typing import Mapping

import numpy as np

from . import collector
from .specs import BestPath, PathStep

# Per path: its input (position in `nodes`), flat batch item, flat element of the input, the
# output it reaches (position in `outputs`), and where its steps start (one more entry: the end).
PATH_COLUMNS = ("input", "batch", "element", "output", "step_start")
# Per step: its node (position in `nodes`), flat element of that node, and the real partial of
# the edge into it (1 at the path's start).
STEP_COLUMNS = ("step_node", "step_element", "step_partial")


class BestPaths(Sequence):
    """Paths ``0 .. len - 1`` (best first for ``top_paths``; in request order for ``best_path``).

    Path i starts at element ``element[i]`` of input ``nodes[input[i]]`` in batch item
    ``batch[i]`` (flat indices), reaches output ``outputs[output[i]]`` ("" if none: a path of
    value 0̄ has no steps), has value ``values[component][i]``, and its steps are rows
    ``step_start[i]`` to ``step_start[i + 1] - 1`` of ``step_node``, ``step_element`` (flat in
    ``shapes[step_node]``) and ``step_partial``: its input element first, then each element it
    passes through, up to the output's.
    """

    def __init__(self, nodes: Sequence[str], shapes: Sequence[tuple[int, ...]], outputs: Sequence[str],
                 batch_shape: tuple[int, ...], columns: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray]):
        self.nodes, self.shapes, self.outputs = list(nodes), [tuple(s) for s in shapes], list(outputs)
        self.batch_shape = tuple(batch_shape)
        for name in PATH_COLUMNS + STEP_COLUMNS:
            if name not in columns:
                raise ValueError(f"best paths without their column {name!r}")
            setattr(self, name, np.asarray(columns[name]))
        self.values = {key: np.asarray(v) for key, v in values.items()}
        self._read: list[BestPath] | None = None
        self._check()

    def _check(self) -> None:
        """ValueError naming the first column that does not describe paths (a response from a
        server is read only once it does: every index in range, every length agreeing)."""
        paths, steps = len(self.input), len(self.step_node)
        if len(self.shapes) != len(self.nodes) or not self.outputs:
            raise ValueError(f"best paths with {len(self.nodes)} nodes, {len(self.shapes)} shapes and "
                             f"{len(self.outputs)} outputs")
        if any(d < 0 for shape in [self.batch_shape, *self.shapes] for d in shape):
            raise ValueError("best paths with a negative dimension in their shapes")
        sizes = np.array([np.prod(shape, dtype=np.int64) for shape in self.shapes], dtype=np.int64)
        items = np.prod(self.batch_shape, dtype=np.int64)
        expected = [(name, getattr(self, name), paths, "i") for name in PATH_COLUMNS[:-1]] + [
            ("step_start", self.step_start, paths + 1, "i"), ("step_node", self.step_node, steps, "i"),
            ("step_element", self.step_element, steps, "i"), ("step_partial", self.step_partial, steps, "f")] + [
            (f"values[{key!r}]", column, paths, "f") for key, column in self.values.items()]
        for name, column, length, kind in expected:
            if column.ndim != 1 or len(column) != length or column.dtype.kind != kind:
                raise ValueError(f"best paths' column {name} holds {column.dtype} of shape {column.shape}: "
                                 f"{'integers' if kind == 'i' else 'floats'} of shape ({length},) expected")
        start = self.step_start
        if start[0] != 0 or start[-1] != steps or np.any(start[1:] < start[:-1]):
            raise ValueError(f"best paths' column step_start does not split their {steps} steps in order")
        for name, column, bound in (("input", self.input, len(self.nodes)), ("step_node", self.step_node, len(self.nodes)),
                                    ("output", self.output, len(self.outputs)), ("batch", self.batch, items)):
            if column.size and (column.min() < 0 or column.max() >= bound):
                raise ValueError(f"best paths' column {name} holds a value outside 0..{bound - 1}")
        for name, column, of in (("element", self.element, self.input), ("step_element", self.step_element,
                                                                         self.step_node)):
            if column.size and (column.min() < 0 or np.any(column >= sizes[of])):
                raise ValueError(f"best paths' column {name} holds an element outside its node's shape")

    @property
    def columns(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in PATH_COLUMNS + STEP_COLUMNS}

    def __len__(self) -> int:
        return len(self.input)

    def __getitem__(self, i):
        if self._read is not None:
            if not isinstance(i, slice):
                i = _path_number(i)
            return self._read[i]
        if isinstance(i, slice):
            return self._paths(np.arange(len(self))[i])
        n = len(self)
        i = _path_number(i)
        if not -n <= i < n:
            raise IndexError(f"path {i} of {n}")
        return self._paths(np.array([i % n]))[0]

    def __iter__(self):
        if self._read is None:
            with collector.paused():  # a tuple per step: no cycles to collect
                self._read = self._paths(np.arange(len(self)))
        return iter(self._read)

    def __eq__(self, other) -> bool:
        if isinstance(other, (BestPaths, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # equal to a list of the same paths, and mutable as lists are

    def __repr__(self) -> str:
        return f"BestPaths({len(self)} paths, {len(self.step_node)} steps)"

    def steps_of(self, i: int) -> slice:
        """Path i's rows of the step columns."""
        return slice(int(self.step_start[i]), int(self.step_start[i + 1]))

    def _paths(self, which: np.ndarray) -> list[BestPath]:
        """Paths `which` as objects, their indices unravelled node by node (vectorised) rather
        than step by step."""
        first, lengths = self.step_start[which], np.diff(self.step_start)[which]
        bounds = np.zeros(len(which) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        rows = np.repeat(first - bounds[:-1], lengths) + np.arange(bounds[-1])  # their steps, path by path
        node = self.step_node[rows]
        indices = _indices(node, self.step_element[rows], self.shapes)
        names = list(map(self.nodes.__getitem__, node.tolist()))
        # (tuple.__new__ mapped: PathStep's own __new__ is a Python call, half the time of this)
        steps = list(map(tuple.__new__, repeat(PathStep), zip(names, indices, self.step_partial[rows].tolist())))
        inputs = self.input[which]
        starts = [b + e for b, e in zip(_indices(np.zeros_like(inputs), self.batch[which], [self.batch_shape]),
                                        _indices(inputs, self.element[which], self.shapes))]
        values = [dict(zip(self.values, row)) for row in zip(*(v[which].tolist() for v in self.values.values()))] \
            if self.values else [{} for _ in range(len(which))]
        bounds = bounds.tolist()
        return [BestPath((self.nodes[n], start), self.outputs[o], tuple(steps[bounds[i]:bounds[i + 1]]), value)
                for i, (n, start, o, value) in enumerate(zip(inputs.tolist(), starts, self.output[which].tolist(),
                                                             values))]


def _path_number(i) -> int:
    try:
        return operator.index(i)
    except TypeError:
        raise TypeError(f"paths are indexed by integers or slices, not {type(i).__name__}") from None


def _indices(which: np.ndarray, flat: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The full index of each flat[r] in shapes[which[r]], as tuples (one unravel per shape)."""
    out: list = [()] * len(flat)
    for n in np.unique(which).tolist():
        shape = shapes[n]
        if not shape:
            continue
        rows = np.flatnonzero(which == n)
        parts = np.unravel_index(flat[rows], shape)
        deque(map(out.__setitem__, rows.tolist(), zip(*(p.tolist() for p in parts))), maxlen=0)  # no frame per row
    return out
