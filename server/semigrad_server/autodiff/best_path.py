"""Best paths under a selective semiring: from an input element to an output element.

With ⊕ selective (max/min-like), the adjoint of every element is the value of its best
path. Starting at the input element, each step follows the out-edge whose φ(partial) ⊗
adjoint(consumer element) reproduces that best value. Candidates are ordered: reaching a
differentiated output first, then consumers in graph order, operand position, and element
index, and only a strictly better candidate replaces an earlier one (tie-break: smallest index).

Local partials of each consumer come from its dense Jacobian, computed by the real reverse
mode of that node alone with one-hot seeds (one vectorised call).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import ir
from ..errors import InvalidArgument, ResourceExhausted
from ..ir import Graph, InputSpec, Node
from ..runtime import Plan
from .reverse import BackwardGraph, reverse

MAX_JACOBIAN_ELEMENTS = 50_000_000


@dataclass
class BestPathResult:
    input: str
    index: tuple[int, ...]
    output: str = ""
    steps: list[tuple[str, tuple[int, ...], float]] = field(default_factory=list)  # (node, element, partial)
    value: dict[str, float] = field(default_factory=dict)


def trace_best_paths(cg, backward: BackwardGraph, s, results, batch, requests, engine) -> list[BestPathResult]:
    from ..engine import ADJOINT_PREFIX, SEED_VALUE_PREFIX, VALUE_PREFIX

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
        value = batch.arrays[ref] if ref in batch.arrays else results[VALUE_PREFIX + ref]
        return np.broadcast_to(value, batch.shape + cg.types[ref].shape)[b]

    paths = []
    for name, index in requests:
        if name not in backward.gradients:
            raise InvalidArgument(f"best path requested from '{name}', which is not a differentiated input "
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
        start = _pick(s, item(results[ADJOINT_PREFIX + name], name, b), _flat(element, cg.types[name].shape))
        result.value = _read_scalar(s, start)
        if np.all(s.equal(start, s.zeros(()), rtol=0, atol=0)):
            continue  # no path with a non-zero product
        ref, flat = name, _flat(element, cg.types[name].shape)
        result.steps.append((ref, element, 1.0))
        while True:
            best = None  # (value, next ref, next flat index, partial); next ref None: the output itself
            if ref in output_names:
                best = (_pick(s, item(results[SEED_VALUE_PREFIX + ref], ref, b), flat), None, flat, 1.0)
            for consumer, pos in consumers.get(ref, ()):
                if consumer not in backward.adjoints:
                    continue
                node = nodes[consumer]
                operands = [forward_value(r, b) for r in node.inputs]
                column = _local_jacobian(engine, cg, node, pos, operands)[:, flat]
                hits = np.flatnonzero(column)
                if hits.size == 0:
                    continue
                adjoint = item(results[ADJOINT_PREFIX + consumer], consumer, b)
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


def _local_jacobian(engine, cg, node: Node, pos: int, operands: list[np.ndarray]) -> np.ndarray:
    """J[j, i] = ∂ node[j] / ∂ operand_pos[i] at these operand values (real partials)."""
    out_type = cg.types[node.id]
    in_type = cg.types[node.inputs[pos]]
    if out_type.size * in_type.size > MAX_JACOBIAN_ELEMENTS:
        raise ResourceExhausted(f"best path through node '{node.id}' needs a {out_type.size}×{in_type.size} "
                                f"local Jacobian; the limit is {MAX_JACOBIAN_ELEMENTS} elements")
    key = ("local-jacobian", node.id, pos)
    plan = engine._plan(cg, key, lambda: _jacobian_plan(cg, node, pos))
    inputs = {f"in{k}": np.asarray(v) for k, v in enumerate(operands)}
    inputs["seed:out"] = np.eye(out_type.size).reshape((out_type.size,) + out_type.shape)
    grad = plan.run(inputs)["grad"]
    return np.broadcast_to(grad, (out_type.size,) + in_type.shape).reshape(out_type.size, in_type.size)


def _jacobian_plan(cg, node: Node, pos: int) -> Plan:
    # Each operand position is its own input, so x*x yields the partial of one edge.
    specs = tuple(InputSpec(f"in{k}", cg.types[r].shape, cg.types[r].dtype) for k, r in enumerate(node.inputs))
    single = Node("out", node.op, tuple(s.name for s in specs), node.attrs)
    graph = Graph(specs, (single,), (("out", "out"),))
    types = {**{s.name: s.type for s in specs}, "out": cg.types[node.id]}
    bg = reverse(graph, [single], types, outputs=["out"], wrt=[f"in{pos}"], seeded=["out"], registry=cg.registry)
    ref = bg.gradients[f"in{pos}"]
    if ref is None:  # this operand does not influence the node (e.g. a comparison)
        zero = Node("zero", "const", (), {"value": np.zeros(cg.types[node.inputs[pos]].shape)})
        return Plan(Graph(specs, (zero,), ()), [zero], {**types, "zero": ir.Type(zero.attrs["value"].shape, "float64")},
                    [("grad", "zero")])
    return Plan(bg.graph, bg.graph.nodes, bg.types, [("grad", ref)], registry=cg.registry,
                attrs=bg.context.builder.attrs)
