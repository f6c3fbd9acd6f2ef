"""One node's local Jacobian with respect to one operand, by the real reverse mode of that node
alone with one-hot seeds (one vectorised call): what brute-force path enumeration and
localisation read each edge's partials from (each bounds its size first: symbolic/paths.py,
symbolic/localise.py). Best paths no longer use it: they follow back-pointers (best_path.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ir
from ..ir import Graph, InputSpec, Node
from ..runtime import Plan
from .reverse import reverse



@dataclass(frozen=True)
class LocalJacobianKey:
    """The plan cache key of a node's local Jacobian plan."""

    node: str
    position: int


@dataclass(frozen=True)
class LocalJacobianPlan:
    plan: Plan
    seed_input: str | None  # the plan's input taking the one-hot seeds (None: the partial is 0)


def local_jacobian(cg, node: Node, pos: int, operands: list[np.ndarray]) -> np.ndarray:
    """J[j, i] = ∂ node[j] / ∂ operand_pos[i] at these operand values (real partials).
    `cg`: the registered graph (its plans cache the node's plan)."""
    out_type = cg.types[node.id]
    in_type = cg.types[node.inputs[pos]]
    compiled = cg.plans.get(LocalJacobianKey(node.id, pos), lambda: _jacobian_plan(cg, node, pos))
    inputs = {f"in{k}": np.asarray(v) for k, v in enumerate(operands)}
    if compiled.seed_input is not None:
        inputs[compiled.seed_input] = np.eye(out_type.size).reshape((out_type.size,) + out_type.shape)
    grad = compiled.plan.run(inputs)["grad"]
    return np.broadcast_to(grad, (out_type.size,) + in_type.shape).reshape(out_type.size, in_type.size)


def _jacobian_plan(cg, node: Node, pos: int) -> LocalJacobianPlan:
    # Each operand position is its own input, so x*x yields the partial of one edge.
    specs = tuple(InputSpec(f"in{k}", cg.types[r].shape, cg.types[r].dtype) for k, r in enumerate(node.inputs))
    single = Node("out", node.op, tuple(s.name for s in specs), node.attrs)
    graph = Graph(specs, (single,), (("out", "out"),))
    types = {**{s.name: s.type for s in specs}, "out": cg.types[node.id]}
    bg = reverse(graph, [single], types, outputs=["out"], wrt=[f"in{pos}"], seeded=["out"], registry=cg.registry)
    ref = bg.gradients[f"in{pos}"]
    if ref is None:  # this operand does not influence the node (e.g. a comparison)
        zero = Node("zero", "const", (), {"value": np.zeros(cg.types[node.inputs[pos]].shape)})
        plan = Plan(Graph(specs, (zero,), ()), [zero], {**types, "zero": ir.Type(zero.attrs["value"].shape, "float64")},
                    [("grad", "zero")])
        return LocalJacobianPlan(plan, None)
    plan = Plan(bg.graph, bg.graph.nodes, bg.types, [("grad", ref)], registry=cg.registry,
                attrs=bg.context.builder.attrs)
    return LocalJacobianPlan(plan, bg.seed_inputs.get("out"))
