"""What an ATen table entry works with: the builder of one FX node's semigrad nodes, the two ways
an entry says it cannot go on (Unsupported at once, Missing for a result nobody read yet), and
Lazy results built only when read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class Unsupported(Exception):
    """An ATen op, or one of its arguments, that the table cannot express (the message says which)."""


@dataclass(frozen=True)
class Missing:
    """A result of a multi-result op that semigrad cannot build (max_pool2d's indices, say):
    harmless until a node of the exported program reads it."""

    reason: str


@dataclass(frozen=True)
class Lazy:
    """A result of a multi-result op built only when a node of the exported program reads it
    (max.dim's indices): unread, it adds no node to the graph."""

    build: object  # () -> Handle


class NodeBuilder:
    """Builds the semigrad nodes of one FX node ``target`` whose result has ``shape`` and ``dtype``
    (from the exported program's fake values): its final node is named ``name``, helper nodes
    ``name/1``, ``name/2``... so every semigrad node id says which FX node it came from."""

    def __init__(self, graph, name: str, target: str, shape, dtype, decomposed: bool):
        self.graph = graph
        self.name = name
        self.target = target
        self.shape = shape
        self.dtype = dtype
        self.decomposed = decomposed
        self.helpers: list[str] = []

    def tmp(self) -> str:
        """A fresh node id for a helper node."""
        self.helpers.append(f"{self.name}/{len(self.helpers) + 1}")
        return self.helpers[-1]

    def const(self, value, name: str | None = None):
        """A const node holding ``value``."""
        return self.graph.const(np.asarray(value), name=name or self.tmp())
