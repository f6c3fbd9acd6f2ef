"""Elementwise fusion for the tensor plan.

A group is a tree of elementwise nodes whose inner values have no other use: it runs as one
step. Until it is hot the step calls the members' own NumPy kernels in turn (the same results
as unfused); once it has processed HOT_ELEMENTS elements, and numba is installed, it is
compiled in the background into one ufunc that makes a single pass over memory with no
temporaries (or once it has been called HOT_CALLS times: a small group's elements add up
slowly, and node by node it is a few NumPy calls of overhead each time). Only ops declared
fusible (arithmetic, comparisons, selections: `OpDef.fusible`) fuse, so compiled results are the
same IEEE operations as NumPy's.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from ..ir import Node, Type
from ..ops import OpDef
from ..ops.base import align
from . import background
from .codegen import expression
from .jit import AVAILABLE, compile_function, numba

log = logging.getLogger("semigrad.runtime")

# Ops fuse when declared `fusible`: arithmetic, comparisons and selections only. NumPy evaluates
# exp, tanh, sin... with its own SIMD loops, several times faster than the scalar libm calls a
# fused loop makes (measured on the MLP: fusing tanh made the forward pass 2.5× slower).
FUSIBLE_DTYPES = ("float64", "bool")
HOT_ELEMENTS = 1 << 22  # elements through a group before compiling it pays (a compile: ~0.2 s)
HOT_CALLS = 64  # or calls (as the JIT's HOT_SINGLE_CALLS): a 64-element group took 17 µs a call, ~3 compiled
MAX_MEMBERS = 64


@dataclass(frozen=True)
class Group:
    root: str
    members: tuple[Node, ...]  # in evaluation order, the root last
    leaves: tuple[str, ...]  # refs read from outside the group, in first-use order
    ops: tuple[OpDef, ...]  # the members' ops


def fusion_groups(order: Sequence[Node], ops: Mapping[str, OpDef], types: Mapping[str, Type],
                  kept: set[str] = frozenset(), excluded: set[str] = frozenset()) -> dict[str, Group]:
    """Groups by root id. `ops`: the op of each node id;
    `kept`: values needed on their own (outputs): they may end a group, never sit inside one;
    `excluded`: nodes that never fuse (constants to fold, tuple-valued nodes)."""
    uses = Counter(r for node in order for r in node.inputs)
    by_id = {node.id: node for node in order}
    position = {node.id: i for i, node in enumerate(order)}

    def fusible(node: Node) -> bool:
        return (ops[node.id].fusible and node.id not in excluded and types[node.id].dtype in FUSIBLE_DTYPES
                and all(types[r].dtype in FUSIBLE_DTYPES for r in node.inputs))

    absorbed: set[str] = set()
    groups: dict[str, Group] = {}
    for node in reversed(order):
        if node.id in absorbed or not fusible(node):
            continue
        members: list[Node] = []

        def take(n: Node) -> None:
            members.append(n)
            for ref in n.inputs:
                inner = by_id.get(ref)
                if (inner is not None and ref not in absorbed and ref not in kept and uses[ref] == 1 and fusible(inner)
                        and len(members) < MAX_MEMBERS):
                    absorbed.add(ref)
                    take(inner)

        take(node)
        if len(members) < 2:
            continue
        absorbed.add(node.id)
        members.sort(key=lambda n: position[n.id])
        inside = {n.id for n in members}
        leaves = tuple(dict.fromkeys(r for n in members for r in n.inputs if r not in inside))
        groups[node.id] = Group(node.id, tuple(members), leaves, tuple(ops[n.id] for n in members))
    return groups


class FusedKernel:
    """The step of a group: `(*leaf values) -> root value`."""

    def __init__(self, group: Group, kernels: Sequence[Callable], types: Mapping[str, Type]):
        self.group = group
        self.kernels = tuple(kernels)
        self.leaf_ranks = tuple(types[r].rank for r in group.leaves)
        self.out_rank = types[group.root].rank
        self.leaf_dtypes = tuple(types[r].dtype for r in group.leaves)
        self.signature = (f"{_numba_type(types[group.root].dtype)}"
                          f"({', '.join(_numba_type(d) for d in self.leaf_dtypes)})")
        self.ufunc = None
        self._elements = 0
        self._calls = 0
        self._compiling = False
        self._lock = threading.Lock()

    def __call__(self, *leaves):
        ufunc = self.ufunc
        if ufunc is not None:
            out_rank = self.out_rank
            return ufunc(*[align(np.asarray(v), r, out_rank) for v, r in zip(leaves, self.leaf_ranks)])
        env = dict(zip(self.group.leaves, leaves))
        for node, kernel in zip(self.group.members, self.kernels):
            env[node.id] = kernel(*(env[r] for r in node.inputs))
        result = env[self.group.root]
        if AVAILABLE:
            self._elements += np.size(result)
            self._calls += 1
            if (self._elements >= HOT_ELEMENTS or self._calls >= HOT_CALLS) and not self._compiling:
                self._start_compile()
        return result

    def _start_compile(self) -> None:
        with self._lock:
            if self._compiling:
                return
            self._compiling = True
        background.thread(self._compile).start()

    def _compile(self) -> None:
        try:
            ufunc = compile_group(self.group, self.signature)
            with np.errstate(all="ignore"):  # the first call compiles the ufunc's loop; make it here
                ufunc(*(np.ones(1, dtype=d) for d in self.leaf_dtypes))
        except Exception:  # the group keeps running node by node, as before
            log.warning("fused group ending at node '%s' did not compile", self.group.root, exc_info=True)
            return
        # numba's DUFunc checks its arguments in Python (~2 µs a call); its NumPy ufunc has the one
        # loop of the group's dtypes
        self.ufunc = getattr(ufunc, "ufunc", ufunc)


def _numba_type(dtype: str) -> str:
    return "boolean" if dtype == "bool" else "float64"


def compile_group(group: Group, signature: str):
    """One numba ufunc evaluating the group's tree per element."""
    names = {ref: f"a{k}" for k, ref in enumerate(group.leaves)}
    lines = [f"def fused({', '.join(names[r] for r in group.leaves)}):"]
    for k, (node, op) in enumerate(zip(group.members, group.ops)):
        lines.append(f"    v{k} = {expression(op, [names[r] for r in node.inputs], 'compiled')}")
        names[node.id] = f"v{k}"
    lines.append(f"    return {names[group.root]}")
    return numba.vectorize([signature])(compile_function(lines, "fused group", "fused", ops=group.ops))
