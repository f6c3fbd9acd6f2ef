"""Best paths under a selective semiring: from an input element to an output element.

With ⊕ selective (max/min-like), the adjoint of every element is the value of its best
path. Starting at the input element, each step follows the out-edge whose φ(partial) ⊗
adjoint(consumer element) reproduces that best value. Candidates are ordered: reaching a
differentiated output first, then consumers in graph order, operand position, and element
index, and only a strictly better candidate replaces an earlier one (tie-break: smallest index).

Local partials of each consumer come from its dense Jacobian (local_jacobian.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..deadline import check
from .. import ir
from ..errors import InvalidArgument, quoted
from ..runtime.outputs import OutputKey
from .local_jacobian import local_jacobian
from .reverse import BackwardGraph


@dataclass
class BestPathResult:
    input: str
    index: tuple[int, ...]
    output: str = ""
    steps: list[tuple[str, tuple[int, ...], float]] = field(default_factory=list)  # (node, element, partial)
    value: dict[str, float] = field(default_factory=dict)


def trace_best_paths(cg, backward: BackwardGraph, s, results, batch, requests) -> list[BestPathResult]:
    """`results`: the backward plan's, with every adjoint, seed and forward value (OutputKey)."""
    nb = len(batch.shape)
    consumers = ir.consumers_of(cg.order)
    nodes = cg.graph.node_map()
    output_names: dict[str, str] = {}
    for name, ref in backward.outputs.items():
        output_names.setdefault(ref, name)

    def item(value, ref, b):
        shape = batch.shape + cg.types[ref].shape
        return s.map(lambda c: np.broadcast_to(c, shape)[b].reshape(-1), value)

    def forward_value(ref, b):
        value = batch.arrays[ref] if ref in batch.arrays else results[OutputKey.value(ref)]
        return np.broadcast_to(value, batch.shape + cg.types[ref].shape)[b]

    paths = []
    for name, index in requests:
        if name not in backward.gradients:
            raise InvalidArgument(f"best path requested from {quoted(name)}, which is not a differentiated input "
                                  f"(wrt: {', '.join(backward.gradients)})")
        full_shape = batch.shape + cg.types[name].shape
        if len(index) != len(full_shape) or not all(-d <= i < d for i, d in zip(index, full_shape)):
            raise InvalidArgument(f"best path index {list(index)} does not address an element of input '{name}' "
                                  f"(shape {list(full_shape)}, batch dimensions first)")
        index = tuple(i % d for i, d in zip(index, full_shape))
        b, element = index[:nb], index[nb:]
        result = BestPathResult(name, index)
        paths.append(result)
        if name not in backward.adjoints:
            result.value = _read_scalar(s, s.zeros(()))
            continue
        start = _pick(s, item(results[OutputKey.adjoint(name)], name, b), _flat(element, cg.types[name].shape))
        result.value = _read_scalar(s, start)
        if np.all(s.equal(start, s.zeros(()), rtol=0, atol=0)):
            continue  # no path with a non-zero product
        ref, flat = name, _flat(element, cg.types[name].shape)
        result.steps.append((ref, element, 1.0))
        while True:
            check(f"tracing the best path from {name}{list(index)}, at node '{ref}'")
            best = None  # (value, next ref, next flat index, partial); next ref None: the output itself
            if ref in output_names:
                best = (_pick(s, item(results[OutputKey.seed(ref)], ref, b), flat), None, flat, 1.0)
            for consumer, pos in consumers.get(ref, ()):
                if consumer not in backward.adjoints:
                    continue
                node = nodes[consumer]
                operands = [forward_value(r, b) for r in node.inputs]
                column = local_jacobian(cg, node, pos, operands)[:, flat]
                hits = np.flatnonzero(column)
                if hits.size == 0:
                    continue
                adjoint = item(results[OutputKey.adjoint(consumer)], consumer, b)
                values = s.mul(s.lift(column[hits]), s.map(lambda c: c[hits], adjoint))
                top = s.sum(values, axis=(-1,), keepdims=True)
                first = int(np.argmax(s.equal(values, top)))
                candidate = (_pick(s, values, first), consumer, int(hits[first]), float(column[hits[first]]))
                if best is None or not np.all(s.equal(s.add(best[0], candidate[0]), best[0])):
                    best = candidate
            if best is None or best[1] is None:
                result.output = output_names.get(ref, "")
                break
            _, ref, flat, partial = best
            result.steps.append((ref, tuple(int(i) for i in np.unravel_index(flat, cg.types[ref].shape)), partial))
    return paths


def _flat(element: tuple, shape: tuple) -> int:
    return int(np.ravel_multi_index(element, shape)) if shape else 0


def _pick(s, value, i: int):
    return s.map(lambda c: c[..., i], value)


def _read_scalar(s, value) -> dict[str, float]:
    return {k: float(np.asarray(v).reshape(-1)[0]) for k, v in s.read(s.map(np.atleast_1d, value)).items()}
