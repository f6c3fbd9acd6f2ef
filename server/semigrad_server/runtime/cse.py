"""Common subexpressions: nodes computing what an earlier node computes (same op, attributes
and operands, operands of commutative ops in either order) merge into the earlier one.

Run on a forward graph before reverse mode builds its backward pass, this makes the program
depend on what is computed, not on how it was written: a determinant by minors written
recursively (sub-minors recomputed) and one that memoises them become the same graph, so
their backward passes are the same too. Merging identical subgraphs keeps every path of the
graph (each path through a duplicate is a path through the node it merged into), so path
sums under every semiring are unchanged; only a node's own adjoint becomes the sum over all
the copies' consumers, which is why nodes a request names (retained gradients, hooks) are
`pinned`: they never merge with another node, either way.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from ..ir import Node
from ..ops import Registry

# Ops without effects, whose values are plain arrays: hooks have effects (they run code per
# request), semiring values may be tuples of arrays.
MERGEABLE_KINDS = frozenset({"elementwise", "pointwise", "comparison", "structural", "reduction", "linalg", "nn",
                             "source"})


def common_subexpressions(order: Sequence[Node], attrs: Mapping[str, dict], registry: Registry,
                          pinned: frozenset[str] = frozenset()) -> tuple[list[Node], dict[str, str]]:
    """The order without duplicate nodes (operands renamed to the ids kept), and {dropped id:
    the id whose value it is}. Values are bit-identical."""
    seen: dict[tuple, str] = {}
    same_as: dict[str, str] = {}
    kept = []
    for node in order:
        inputs = tuple(same_as.get(r, r) for r in node.inputs)
        op = registry.get(node)
        key = None
        if op.kind in MERGEABLE_KINDS and node.id not in pinned:
            operands = tuple(sorted(inputs)) if op.commutative else inputs
            try:
                key = (node.op, operands, hashable(attrs[node.id]))
                hash(key)
            except TypeError:
                key = None
        if key is not None and key in seen:
            same_as[node.id] = seen[key]
            continue
        if key is not None and key not in seen:
            seen[key] = node.id
        kept.append(node if inputs == node.inputs else dataclasses.replace(node, inputs=inputs))
    return kept, same_as


def hashable(value):
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    if isinstance(value, float) and value != value:
        return ("nan",)  # NaN != NaN would defeat the lookup, not the equality of results
    return value
