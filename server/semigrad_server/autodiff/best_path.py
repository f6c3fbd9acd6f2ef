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

from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Sequence

import numpy as np

from .. import collector, ir
from ..deadline import check
from ..errors import InvalidArgument, ResourceExhausted, quoted
from ..runtime.outputs import OutputKey
from ..semiring.pointers import OUTPUT
from .reverse import BackwardGraph

STEPS_BETWEEN_CHECKS = 1 << 16  # path steps appended between two deadline checks (~20 ms)
STARTS_BETWEEN_CHECKS = 1 << 14  # paths made between two deadline checks

ALL = "all"  # best_path="all": every element of every differentiated input
MAX_TOP_PATHS = 64  # top_paths=k: at most this k (the k-best carrier holds 3k arrays per value)


@dataclass(slots=True)
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


def start_elements(cg, backward: BackwardGraph, batch, requests) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(input, flat batch items, flat elements, positions in the answer) of every requested start,
    one group per input (`requests`: (input, full index) pairs, or ALL: every element of every
    differentiated input, input by input in row-major order of the full index)."""
    nb = len(batch.shape)
    items = int(np.prod(batch.shape, dtype=np.int64))
    if requests == ALL:
        groups, at = [], 0
        for x in backward.gradients:
            size = cg.types[x].size
            b, e = np.divmod(np.arange(items * size, dtype=np.int64), size)
            groups.append((x, b, e, np.arange(at, at + b.size)))
            at += b.size
        return groups
    by_input: dict[str, tuple[list, list, list]] = {}
    for position, (name, index) in enumerate(requests):
        if position % 4096 == 0:
            check("reading the best paths asked for")
        if name not in backward.gradients:
            raise InvalidArgument(f"best path requested from {quoted(name)}, which is not a differentiated input "
                                  f"(wrt: {', '.join(backward.gradients)})")
        shape = cg.types[name].shape
        full_shape = batch.shape + shape
        if len(index) != len(full_shape) or not all(-d <= i < d for i, d in zip(index, full_shape)):
            raise InvalidArgument(f"best path index {list(index)} does not address an element of input '{name}' "
                                  f"(shape {list(full_shape)}, batch dimensions first)")
        index = tuple(i % d for i, d in zip(index, full_shape))
        bs, es, ps = by_input.setdefault(name, ([], [], []))
        bs.append(int(np.ravel_multi_index(index[:nb], batch.shape)) if nb else 0)
        es.append(int(np.ravel_multi_index(index[nb:], shape)) if shape else 0)
        ps.append(position)
    return [(x, np.array(bs, dtype=np.int64), np.array(es, dtype=np.int64), np.array(ps))
            for x, (bs, es, ps) in by_input.items()]


def trace_best_paths(cg, backward: BackwardGraph, s, results, batch, requests) -> list[BestPathResult]:
    """The best path from each requested start, in request order (`s`: the PointerSemiring the
    plan ran under; `results`: the plan's, with every node's adjoint under OutputKey.adjoint)."""
    with collector.paused():  # a path and a tuple per step: no cycles to collect
        return _trace_best_paths(cg, backward, s, results, batch, requests)


def _trace_best_paths(cg, backward: BackwardGraph, s, results, batch, requests) -> list[BestPathResult]:
    walker = _Walker(cg, backward, s, results, batch, 1)
    groups = start_elements(cg, backward, batch, requests)
    paths: list = [None] * sum(len(g[3]) for g in groups)
    zero = s.base.zeros(())
    for x, b, e, positions in groups:
        check("tracing best paths")
        indices = walker.full_indices(x, b, e)
        if backward.gradients.get(x) is None:
            nothing = {key: float(v) for key, v in s.base.read(zero).items()}
            for position, index in zip(positions.tolist(), indices):
                paths[position] = BestPathResult(x, index, "", [], dict(nothing))
            continue
        value, ptr, partial = walker.read(results[OutputKey.gradient(x)], x, b, e)
        read = {key: np.asarray(arr, dtype=np.float64).reshape(-1).tolist() for key, arr in s.base.read(value).items()}
        if len(read) == 1:
            (key, column), = read.items()
            values = [{key: v} for v in column]
        else:
            values = [dict(zip(read, row)) for row in zip(*read.values())]
        mine = []
        for start in range(0, len(indices), STARTS_BETWEEN_CHECKS):  # one call per path, no default factories
            stop = start + STARTS_BETWEEN_CHECKS
            mine += map(BestPathResult, repeat(x), indices[start:stop], repeat(""), ([] for _ in range(start, stop)),
                        values[start:stop])
            check("tracing best paths")
        for position, p in zip(positions.tolist(), mine):
            paths[position] = p
        alive = ~np.asarray(s.base.equal(value, zero, rtol=0, atol=0)) & (ptr >= 0)
        here = np.nonzero(alive)[0]
        walker.follow([mine[i] for i in here.tolist()], b[here], ptr[here], partial[here])
    return paths


def trace_top_paths(cg, backward: BackwardGraph, s, results, batch, k: int) -> list[BestPathResult]:
    """The k best paths of the whole graph, best first (`s`: the KBestPointerSemiring the plan
    ran under). Equal values: the earlier input (wrt order), batch item, element, then rank."""
    walker = _Walker(cg, backward, s, results, batch, k)
    items = int(np.prod(batch.shape, dtype=np.int64))
    zero = s.base.zero
    found = []  # (values, ptrs, partials, input number, batch items, elements), flattened with rank last
    for number, (x, ref) in enumerate(backward.gradients.items()):
        if ref is None:
            continue
        size = cg.types[x].size
        b, e = np.divmod(np.arange(items * size, dtype=np.int64), size)
        value = walker.read(results[OutputKey.gradient(x)], x, b, e)
        v, p, q = (np.stack(value[j * k:(j + 1) * k], axis=-1).reshape(-1) for j in range(3))
        found.append((v, p, q, np.full(v.shape, number), np.repeat(b, k), np.repeat(e, k)))
    if not found:
        return []
    v, p, q, number, b, e = (np.concatenate(parts) for parts in zip(*found))
    rank = np.tile(np.arange(k), v.size // k)
    real = (v != zero) & (v == v) & (p >= 0)  # a NaN product is no path's value (nor a rank's filler)
    sign = 1.0 if s.base.addition == "max" else -1.0
    order = np.flatnonzero(real)[np.lexsort((rank[real], e[real], b[real], number[real], -sign * v[real]))][:k]
    names = list(backward.gradients)
    paths = [BestPathResult(names[number[i]], walker.full_index(names[number[i]], int(b[i]), int(e[i])),
                            value={key: float(np.asarray(val).reshape(-1)[0])
                                   for key, val in s.base.read(np.array([v[i]])).items()})
             for i in order.tolist()]
    walker.follow(paths, b[order], p[order], q[order])
    return paths


class _Walker:
    """Follows back-pointers (`id · k + rank`) through the adjoints of a pointer plan's results."""

    def __init__(self, cg, backward: BackwardGraph, s, results, batch, k: int):
        self.cg, self.s, self.results, self.batch, self.k = cg, s, results, batch, k
        offsets = backward.context.offsets
        self.names = list(offsets)
        self.starts = np.array([offsets[n] for n in self.names], dtype=np.float64)
        self.output_names: dict[str, str] = {}
        for name, ref in backward.outputs.items():
            self.output_names.setdefault(ref, name)

    def full_indices(self, ref: str, b: np.ndarray, e: np.ndarray) -> list[tuple[int, ...]]:
        """Full indices (batch dimensions first) of flat batch items b, flat elements e (vectorised)."""
        shape, batch = self.cg.types[ref].shape, self.batch.shape
        parts = (list(np.unravel_index(b, batch)) if batch else []) + (list(np.unravel_index(e, shape)) if shape else [])
        if not parts:
            return [()] * len(b)
        return list(zip(*(part.tolist() for part in parts)))

    def full_index(self, ref: str, b: int, e: int) -> tuple[int, ...]:
        shape, batch = self.cg.types[ref].shape, self.batch.shape
        return (tuple(int(i) for i in np.unravel_index(b, batch)) if batch else ()) + \
            (tuple(int(i) for i in np.unravel_index(e, shape)) if shape else ())

    def read(self, value, ref: str, b: np.ndarray, e: np.ndarray) -> tuple:
        """Every component of node `ref`'s adjoint at flat batch items b, flat elements e."""
        shape, batch = self.cg.types[ref].shape, self.batch.shape
        where = (np.unravel_index(b, batch) if batch else ()) + (np.unravel_index(e, shape) if shape else ())
        return tuple(np.broadcast_to(np.broadcast_to(c, batch + shape)[where], np.shape(b)) for c in value)

    def follow(self, paths: list[BestPathResult], b: np.ndarray, ptr: np.ndarray, partial: np.ndarray) -> None:
        """Append every step of each path (started at its input element, whose adjoint holds
        `ptr` and `partial` at batch item `b`), one gather per node and step for all paths."""
        k, nb = self.k, len(self.batch.shape)
        steps = [p.steps for p in paths]
        # (calls mapped over the paths, as below: no Python frame per path or step)
        deque(map(list.append, steps, zip(map(attrgetter("input"), paths),
                                          map(itemgetter(slice(nb, None)), map(attrgetter("index"), paths)),
                                          repeat(1.0))), maxlen=0)
        here = np.arange(len(paths))
        at = np.full(len(paths), -1)  # index into names of the node each path is at (-1: its input)
        while here.size:
            check("tracing best paths")
            ids, rank = np.divmod(ptr, k)
            ended = ids == OUTPUT
            self._name_outputs(paths, here[ended], at[ended])
            go = ~ended & (ptr > 0)
            here, b, ids, rank, partial = here[go], b[go], ids[go], rank[go].astype(np.int64), partial[go]
            node = np.searchsorted(self.starts, ids, side="right") - 1
            flat = (ids - self.starts[node]).astype(np.int64)
            ptr, nxt_partial = np.empty(here.shape), np.empty(here.shape)
            for n in np.unique(node).tolist():
                check("tracing best paths")
                sel = np.flatnonzero(node == n)
                ref = self.names[n]
                comps = self.read(self.results[OutputKey.adjoint(ref)], ref, b[sel], flat[sel])
                r = rank[sel]
                rows = np.arange(sel.size)
                ptr[sel] = np.stack(comps[k:2 * k], axis=-1)[rows, r]
                nxt_partial[sel] = np.stack(comps[2 * k:], axis=-1)[rows, r]
                shape = self.cg.types[ref].shape
                elems = list(zip(*(c.tolist() for c in np.unravel_index(flat[sel], shape)))) if shape \
                    else [()] * sel.size
                owners = list(map(steps.__getitem__, here[sel].tolist()))
                partials = partial[sel].tolist()
                for start in range(0, sel.size, STEPS_BETWEEN_CHECKS):  # list.append mapped: no Python frame per step
                    stop = start + STEPS_BETWEEN_CHECKS
                    deque(map(list.append, owners[start:stop], zip(repeat(ref), elems[start:stop], partials[start:stop])),
                          maxlen=0)
                    check("tracing best paths")
            at, partial = node, nxt_partial

    def _name_outputs(self, paths: list[BestPathResult], ended: np.ndarray, at: np.ndarray) -> None:
        """Each ended path's output: the output of the node it ended at (at -1: its input is one)."""
        for n in np.unique(at).tolist():
            ending = list(map(paths.__getitem__, ended[at == n].tolist()))
            if n < 0:
                for p in ending:
                    p.output = self.output_names.get(p.input, "")
            else:
                deque(map(setattr, ending, repeat("output"), repeat(self.output_names.get(self.names[n], ""))), maxlen=0)
