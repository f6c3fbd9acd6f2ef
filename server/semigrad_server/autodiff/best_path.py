"""Best paths under a selective semiring, read by following back-pointers.

The backward pass runs under `semiring.pointers.PointerSemiring` (with `PointerContext`):
every element's accumulated adjoint carries, beside its value, the id of the consumer
element its best path steps to next (or the output's pointer, 0, where the path ends) and
the real partial of that edge. Each op's own semiring adjoint records its winners, since
every ⊕ it makes keeps the winner's pointer (tie-break: the value ⊕ returns, then the
smaller id: the output first, then consumers in graph order, then element index).

A path is then read by following pointers: O(path length) per path, no local Jacobian,
batched over batch items and requested elements (one NumPy gather per node and step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .. import ir
from ..deadline import check
from ..errors import InvalidArgument, ResourceExhausted, quoted
from ..runtime.outputs import OutputKey
from ..semiring.pointers import OUTPUT
from .reverse import BackwardGraph

ALL = "all"  # best_path="all": every element of every differentiated input


@dataclass
class BestPathResult:
    input: str
    index: tuple[int, ...]
    output: str = ""
    steps: list[tuple[str, tuple[int, ...], float]] = field(default_factory=list)  # (node, element, partial)
    value: dict[str, float] = field(default_factory=dict)


def longest_steps(cg, wrt: Sequence[str]) -> dict[str, int]:
    """Per input: the most steps a path from one of its elements can have (1 + the longest
    chain of nodes from it to an output), read from the graph's structure alone."""
    consumers = ir.consumers_of(cg.order)
    outputs = set(cg.graph.output_map.values())
    hops: dict[str, int] = {}
    for node in reversed(cg.order):
        after = [hops[c] for c, _ in consumers.get(node.id, ()) if c in hops]
        if after or node.id in outputs:
            hops[node.id] = 1 + max(after, default=0)
    out = {}
    for x in wrt:
        after = [hops[c] for c, _ in consumers.get(x, ()) if c in hops]
        out[x] = 1 + max(after, default=0)
    return out


def check_path_steps(cg, wrt: Sequence[str], requests, batch_size: int, max_steps: int) -> None:
    """RESOURCE_EXHAUSTED, before any work, unless the paths asked for can have at most
    `max_steps` steps in all (each path: 1 + the longest chain from its input to an output)."""
    longest = longest_steps(cg, wrt)
    if requests == ALL:
        per_input = {x: batch_size * cg.types[x].size for x in wrt}
    else:
        per_input = {}
        for name, _ in requests:
            per_input[name] = per_input.get(name, 0) + 1
    steps = sum(n * longest.get(x, 1) for x, n in per_input.items())
    if steps > max_steps:
        what = ", ".join(f"{quoted(x)} {n} paths of up to {longest.get(x, 1)} steps" for x, n in per_input.items())
        raise ResourceExhausted(f"the best paths asked for could return up to {steps} path steps ({what}); the limit "
                                f"is max_path_steps = {max_steps}: ask for fewer paths or a smaller batch")


def start_elements(cg, backward: BackwardGraph, batch, requests) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(input, flat batch items, flat elements) of every requested start, grouped by input in
    request order (`requests`: (input, full index) pairs, or ALL)."""
    nb = len(batch.shape)
    items = int(np.prod(batch.shape, dtype=np.int64))
    if requests == ALL:
        groups = []
        for x in backward.gradients:
            size = cg.types[x].size
            b, e = np.divmod(np.arange(items * size, dtype=np.int64), size)
            groups.append((x, b, e))
        return groups
    groups = []
    for name, index in requests:
        if name not in backward.gradients:
            raise InvalidArgument(f"best path requested from {quoted(name)}, which is not a differentiated input "
                                  f"(wrt: {', '.join(backward.gradients)})")
        shape = cg.types[name].shape
        full_shape = batch.shape + shape
        if len(index) != len(full_shape) or not all(-d <= i < d for i, d in zip(index, full_shape)):
            raise InvalidArgument(f"best path index {list(index)} does not address an element of input '{name}' "
                                  f"(shape {list(full_shape)}, batch dimensions first)")
        index = tuple(i % d for i, d in zip(index, full_shape))
        b = int(np.ravel_multi_index(index[:nb], batch.shape)) if nb else 0
        e = int(np.ravel_multi_index(index[nb:], shape)) if shape else 0
        groups.append((name, np.array([b]), np.array([e])))
    return groups


def trace_best_paths(cg, backward: BackwardGraph, s, results, batch, requests) -> list[BestPathResult]:
    """The best path from each requested start (`s`: the PointerSemiring the plan ran under;
    `results`: the plan's, with every node's adjoint under OutputKey.adjoint)."""
    offsets = backward.context.offsets
    names = list(offsets)
    starts = np.array([offsets[n] for n in names], dtype=np.float64)
    output_names: dict[str, str] = {}
    for name, ref in backward.outputs.items():
        output_names.setdefault(ref, name)
    zero = s.base.zeros(())

    def read(value, ref, b, e):
        """(value, ptr, partial) of node `ref`'s adjoint at flat batch items b, flat elements e."""
        shape = cg.types[ref].shape
        where = (np.unravel_index(b, batch.shape) if batch.shape else ()) + \
                (np.unravel_index(e, shape) if shape else ())
        return tuple(np.broadcast_to(np.broadcast_to(c, batch.shape + shape)[where], np.shape(b)) for c in value)

    paths: list[BestPathResult] = []
    for x, b, e in start_elements(cg, backward, batch, requests):
        shape = cg.types[x].shape
        first = len(paths)
        for bi, ei in zip(b.tolist(), e.tolist()):
            index = (tuple(int(i) for i in np.unravel_index(bi, batch.shape)) if batch.shape else ()) + \
                    (tuple(int(i) for i in np.unravel_index(ei, shape)) if shape else ())
            paths.append(BestPathResult(x, index))
        if backward.gradients.get(x) is None:
            for p in paths[first:]:
                p.value = {k: float(v) for k, v in s.base.read(zero).items()}
            continue
        value, ptr, partial = read(results[OutputKey.gradient(x)], x, b, e)
        base_read = s.base.read(value)
        for k, arr in base_read.items():
            for p, v in zip(paths[first:], np.asarray(arr).tolist()):
                p.value[k] = float(v)
        alive = ~np.asarray(s.base.equal(value, zero, rtol=0, atol=0)) & (ptr >= 0)
        here = np.nonzero(alive)[0]
        for i in here.tolist():
            paths[first + i].steps.append((x, paths[first + i].index[len(batch.shape):], 1.0))
        at_ref = np.full(b.shape, -1)  # index into `names` of the node each path is at (-1: the input)
        cur_b, cur_e, cur_ptr, cur_partial = b[here], e[here], ptr[here], partial[here]
        at_ref = at_ref[here]
        while here.size:
            check(f"tracing best paths from {quoted(x)}")
            ended = cur_ptr == OUTPUT
            for i, k in zip(here[ended].tolist(), at_ref[ended].tolist()):
                paths[first + i].output = output_names.get(x if k < 0 else names[k], "")
            go = ~ended & (cur_ptr > 0)
            here, cur_b, cur_ptr, cur_partial = here[go], cur_b[go], cur_ptr[go], cur_partial[go]
            k = np.searchsorted(starts, cur_ptr, side="right") - 1
            flat = (cur_ptr - starts[k]).astype(np.int64)
            nxt_ptr, nxt_partial = np.empty_like(cur_ptr), np.empty_like(cur_partial)
            for node in np.unique(k).tolist():
                sel = k == node
                ref = names[node]
                _, p, q = read(results[OutputKey.adjoint(ref)], ref, cur_b[sel], flat[sel])
                nxt_ptr[sel], nxt_partial[sel] = p, q
                shape = cg.types[ref].shape
                elems = np.stack(np.unravel_index(flat[sel], shape), axis=-1).tolist() if shape else \
                    [[]] * int(sel.sum())
                for i, el, q0 in zip(here[sel].tolist(), elems, cur_partial[sel].tolist()):
                    paths[first + i].steps.append((ref, tuple(el), q0))
            at_ref, cur_e, cur_ptr, cur_partial = k, flat, nxt_ptr, nxt_partial
    return paths
