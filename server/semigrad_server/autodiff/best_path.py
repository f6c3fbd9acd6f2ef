"""Best paths under a selective semiring, read by following back-pointers.

The backward pass runs under `semiring.pointers.PointerSemiring` (with `PointerContext`):
every element's accumulated adjoint carries, beside its value, the id of the consumer
element its best path steps to next (or the output's pointer, 0, where the path ends) and
the real partial of that edge. Each op's own semiring adjoint records its winners, since
every ⊕ it makes keeps the winner's pointer (tie-break: the value ⊕ returns, then the
smaller id: the output first, then consumers in graph order, then element index).

A path is then read by following pointers: O(path length) per path, no local Jacobian,
batched over batch items and requested elements (one NumPy gather per node and step), into
columns (semigrad.paths.BestPaths): no Python object per path or step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from semigrad.paths import BestPaths

from .. import ir
from ..deadline import check
from ..errors import InvalidArgument, ResourceExhausted, quoted
from ..runtime.outputs import OutputKey
from ..semiring import pruning
from ..semiring.pointers import OUTPUT
from .reverse import BackwardGraph

ALL = "all"  # best_path="all": every element of every differentiated input
STARTS_BETWEEN_CHECKS = 4096  # requested starts read between two deadline checks
MAX_TOP_PATHS = 64  # top_paths=k: at most this k (the k-best carrier holds 3k arrays per value)


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


PATH_STEP_BYTES = 128  # a traced step at the peak of tracing (~76: the walker's gathers, the table's chunks
#                       and columns) and in the response's two copies of its columns (2 × 24)


def check_path_steps(cg, wrt: Sequence[str], requests, batch_size: int, max_steps: int) -> int:
    """RESOURCE_EXHAUSTED, before any work, unless the paths asked for can have at most
    `max_steps` steps in all (each path: 1 + the longest chain from its input to an output);
    else that bound."""
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
    return steps


def start_elements(cg, wrt: Sequence[str], batch_shape: tuple[int, ...], requests) -> list[
        tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(input, flat batch items, flat elements, positions in the answer) of every requested start,
    one group per input (`requests`: (input, full index) pairs, or ALL: every element of every
    differentiated input, input by input in row-major order of the full index). Checked before
    any work: INVALID_ARGUMENT naming a start that is no element of a differentiated input."""
    items = int(np.prod(batch_shape, dtype=np.int64))
    if requests == ALL:
        groups, at = [], 0
        for x in wrt:
            size = cg.types[x].size
            b, e = np.divmod(np.arange(items * size, dtype=np.int64), size)
            groups.append((x, b, e, np.arange(at, at + b.size)))
            at += b.size
        return groups
    by_input: dict[str, tuple[list, list]] = {}  # input -> its starts' indices and positions
    for first in range(0, len(requests), STARTS_BETWEEN_CHECKS):
        check("reading the best paths asked for")
        for position, (name, index) in enumerate(requests[first:first + STARTS_BETWEEN_CHECKS], first):
            group = by_input.get(name)
            if group is None:
                if name not in wrt:
                    raise InvalidArgument(f"best path requested from {quoted(name)}, which is not a differentiated "
                                          f"input (wrt: {', '.join(wrt)})")
                group = by_input[name] = ([], [])
            group[0].append(index)
            group[1].append(position)
    groups = []
    for x, (indices, positions) in by_input.items():  # checked and flattened an input at a time
        check("reading the best paths asked for")
        full_shape = batch_shape + cg.types[x].shape
        if set(map(len, indices)) != {len(full_shape)}:
            raise _no_element(x, next(i for i in indices if len(i) != len(full_shape)), full_shape)
        dims = np.array(full_shape, dtype=np.int64)
        at = np.array(indices, dtype=np.int64).reshape(len(indices), len(full_shape))
        outside = np.flatnonzero(((at < -dims) | (at >= dims)).any(axis=1))
        if outside.size:
            raise _no_element(x, indices[outside[0]], full_shape)
        flat = np.ravel_multi_index(tuple((at % dims).T), full_shape) if full_shape else np.zeros(len(at), np.int64)
        b, e = np.divmod(flat.astype(np.int64), cg.types[x].size)
        groups.append((x, b, e, np.array(positions)))
    return groups


def _no_element(name: str, index, full_shape: tuple[int, ...]) -> InvalidArgument:
    return InvalidArgument(f"best path index {list(index)} does not address an element of input '{name}' "
                           f"(shape {list(full_shape)}, batch dimensions first)")


def trace_best_paths(cg, backward: BackwardGraph, s, results, batch, groups) -> BestPaths:
    """The best path from each requested start, in request order (`s`: the PointerSemiring the
    plan ran under; `results`: the plan's, with every node's adjoint under OutputKey.adjoint;
    `groups`: start_elements')."""
    walker = _Walker(cg, backward, results, batch, 1)
    zero = s.base.zeros(())
    table = _Table(walker, sum(len(g[3]) for g in groups), s.base.read(zero))
    for x, b, e, positions in groups:
        check("tracing best paths")
        table.start(positions, x, b, e)
        if backward.gradients.get(x) is None:
            table.value(positions, s.base.read(zero))
            continue
        value, ptr, partial = walker.read(results[OutputKey.gradient(x)], x, b, e)
        table.value(positions, s.base.read(value))
        alive = np.flatnonzero(~np.asarray(s.base.equal(value, zero, rtol=0, atol=0)) & (ptr >= 0))
        walker.follow(table, positions[alive], b[alive], ptr[alive], partial[alive])
    return table.paths()


def trace_top_paths(cg, backward: BackwardGraph, s, results, batch, count: int, rho: float = 0.0,
                    guess: pruning.Guess | None = None) -> BestPaths | None:
    """The `count` best paths of the whole graph, best first (`s`: the KBestPointerSemiring the
    plan ran under, with at least `count` ranks). Equal values: the earlier input (wrt order),
    batch item, element, then rank. After a pass pruned at `rho`: None unless they verify
    (semiring/pruning.py); `guess` learns from paths that do."""
    k = s.k
    walker = _Walker(cg, backward, results, batch, k)
    items = int(np.prod(batch.shape, dtype=np.int64))
    zero = s.base.zero
    found = []  # (values, ptrs, partials, input number, batch items, elements), flattened with rank last
    sign = 1.0 if s.base.addition == "max" else -1.0
    for number, (x, ref) in enumerate(backward.gradients.items()):
        if ref is None:
            continue
        size = cg.types[x].size
        b, e = np.divmod(np.arange(items * size, dtype=np.int64), size)
        value = walker.read_all(results[OutputKey.gradient(x)], x)
        parts = []
        for j in range(3):  # values, pointers, partials: (elements · k) each, rank last
            check("tracing best paths")
            parts.append(np.stack(value[j * k:(j + 1) * k], axis=-1).reshape(-1))
        v, p, q = parts
        check("tracing best paths")
        # the candidates: real ranks (a NaN product is no path's value, nor a rank's filler), and
        # of those only values as good as the count-th best (its ties kept): sorted below
        kept = np.flatnonzero((v != zero) & (v == v) & (p >= 0))
        if kept.size > count:
            key = -sign * v[kept]
            kept = kept[key <= np.partition(key, count - 1)[count - 1]]
        at, rank = np.divmod(kept, k)
        found.append((v[kept], p[kept], q[kept], np.full(kept.shape, number), b[at], e[at], rank))
    components = s.base.read(np.zeros(0))
    if not found:
        return _Table(walker, 0, components).paths() if pruning.verified(np.zeros(0), count, rho) else None
    check("tracing best paths")
    v, p, q, number, b, e, rank = (np.concatenate(parts) for parts in zip(*found))
    order = np.lexsort((rank, e, b, number, -sign * v))[:count]
    v, p, q, number, b, e = (a[order] for a in (v, p, q, number, b, e))
    if not pruning.verified(v, count, rho):
        return None
    if rho > 0.0 and not pruning.rounded_relatively(
            [results[key][0] for key in map(OutputKey.adjoint, walker.names) if key in results] +
            [results[OutputKey.gradient(x)][0] for x, ref in backward.gradients.items() if ref is not None], rho):
        return None
    if guess is not None:
        guess.learn(v, count)
    table = _Table(walker, order.size, components)
    names = list(backward.gradients)
    positions = np.arange(order.size)
    for n in np.unique(number).tolist():
        mine = number == n
        table.start(positions[mine], names[n], b[mine], e[mine])
    table.value(positions, s.base.read(v))
    walker.follow(table, positions, b, p, q)
    return table.paths()


class _Table:
    """The columns of BestPaths being filled: a path's start and value by its position, and its
    steps as the walker reaches them (step j of every path followed together)."""

    def __init__(self, walker: _Walker, size: int, components: dict):
        self.walker = walker
        self.input, self.batch, self.element = (np.zeros(size, dtype=np.int64) for _ in range(3))
        self.output = np.zeros(size, dtype=np.int64)  # 0: outputs[0], "" (no steps)
        self.values = {key: np.zeros(size) for key in components}
        self.chunks: list[tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray | float]] = []

    def start(self, positions: np.ndarray, x: str, b: np.ndarray, e: np.ndarray) -> None:
        self.input[positions] = self.walker.node_number(x)
        self.batch[positions], self.element[positions] = b, e

    def value(self, positions: np.ndarray, read: dict) -> None:
        for key, column in self.values.items():
            column[positions] = np.asarray(read[key], dtype=np.float64).reshape(-1)

    def step(self, positions: np.ndarray, j: int, nodes: np.ndarray, elements: np.ndarray, partials) -> None:
        """Step j of the paths at `positions` (each path's steps come in order j = 0, 1, ...)."""
        self.chunks.append((positions, j, nodes, elements, partials))

    def paths(self) -> BestPaths:
        """The filled columns: every path's steps made contiguous (path i's step j at
        step_start[i] + j)."""
        size = self.input.size
        lengths = np.zeros(size, dtype=np.int64)
        for positions, *_ in self.chunks:
            lengths[positions] += 1
        step_start = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(lengths, out=step_start[1:])
        total = int(step_start[-1])
        node, element, partial = np.zeros(total, dtype=np.int64), np.zeros(total, dtype=np.int64), np.zeros(total)
        for i, (positions, j, nodes, elements, partials) in enumerate(self.chunks):
            if i % 64 == 0:
                check("tracing best paths")
            rows = step_start[positions] + j
            node[rows], element[rows], partial[rows] = nodes, elements, partials
        w = self.walker
        return BestPaths(w.nodes, [w.cg.types[n].shape for n in w.nodes], w.outputs, w.batch.shape,
                         {"input": self.input, "batch": self.batch, "element": self.element, "output": self.output,
                          "step_start": step_start, "step_node": node, "step_element": element,
                          "step_partial": partial}, self.values)


class _Walker:
    """Follows back-pointers (`id · k + rank`) through the adjoints of a pointer plan's results."""

    def __init__(self, cg, backward: BackwardGraph, results, batch, k: int):
        self.cg, self.results, self.batch, self.k = cg, results, batch, k
        offsets = backward.context.offsets
        self.names = list(offsets)  # the nodes pointers name, by number
        self.starts = np.array([offsets[n] for n in self.names], dtype=np.float64)
        self.nodes = list(self.names)  # the table's nodes: these, then the inputs paths start at
        self.numbers = {n: i for i, n in enumerate(self.nodes)}
        output_names: dict[str, str] = {}
        for name, ref in backward.outputs.items():
            output_names.setdefault(ref, name)
        self.outputs = [""] + list(dict.fromkeys(output_names.values()))
        self.output_of = {ref: self.outputs.index(name) for ref, name in output_names.items()}
        self.ends = np.array([self.output_of.get(n, 0) for n in self.names] + [0], dtype=np.int64)

    def node_number(self, name: str) -> int:
        if name not in self.numbers:
            self.numbers[name] = len(self.nodes)
            self.nodes.append(name)
        return self.numbers[name]

    def read(self, value, ref: str, b: np.ndarray, e: np.ndarray) -> tuple:
        """Every component of node `ref`'s adjoint at flat batch items b, flat elements e."""
        shape, batch = self.cg.types[ref].shape, self.batch.shape
        where = (np.unravel_index(b, batch) if batch else ()) + (np.unravel_index(e, shape) if shape else ())
        return tuple(np.broadcast_to(np.broadcast_to(c, batch + shape)[where], np.shape(b)) for c in value)

    def read_all(self, value, ref: str) -> tuple:
        """Every component of node `ref`'s adjoint, flat (batch items, then elements)."""
        full = self.batch.shape + self.cg.types[ref].shape
        return tuple(np.broadcast_to(c, full).reshape(-1) for c in value)

    def follow(self, table: _Table, here: np.ndarray, b: np.ndarray, ptr: np.ndarray, partial: np.ndarray) -> None:
        """Every step of the paths at positions `here` of `table` (started at their input
        element, whose adjoint holds `ptr` and `partial` at batch item `b`), one gather per node
        and step for all paths."""
        k = self.k
        table.step(here, 0, table.input[here], table.element[here], 1.0)
        inputs = table.input[here]
        at = np.full(here.size, -1)  # the number of the node each path is at (-1: its input)
        j = 1
        while here.size:
            check("tracing best paths")
            ids, rank = np.divmod(ptr, k)
            ended = ids == OUTPUT
            if ended.any():
                last = at[ended]
                reached = self.ends[last]
                itself = last < 0  # ended at its input: an input that is an output
                if itself.any():
                    reached[itself] = [self.output_of.get(self.nodes[n], 0) for n in inputs[ended][itself].tolist()]
                table.output[here[ended]] = reached
            go = ~ended & (ptr > 0)
            here, b, ids, rank, partial, inputs = here[go], b[go], ids[go], rank[go].astype(np.int64), partial[go], \
                inputs[go]
            node = np.searchsorted(self.starts, ids, side="right") - 1
            flat = (ids - self.starts[node]).astype(np.int64)
            ptr, nxt_partial = np.empty(here.shape), np.empty(here.shape)
            for n in np.unique(node).tolist():
                check("tracing best paths")
                sel = np.flatnonzero(node == n)
                ref = self.names[n]
                comps = self.read(self.results[OutputKey.adjoint(ref)], ref, b[sel], flat[sel])
                rows, r = np.arange(sel.size), rank[sel]
                ptr[sel] = np.stack(comps[k:2 * k], axis=-1)[rows, r]
                nxt_partial[sel] = np.stack(comps[2 * k:], axis=-1)[rows, r]
            table.step(here, j, node, flat, partial)
            at, partial, j = node, nxt_partial, j + 1
