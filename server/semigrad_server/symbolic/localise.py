"""Localisation: each node's local rule against finite differences of that node alone.

For a node and one of its float operands, the rule's local Jacobian ∂node/∂operand is what
the server's backward rule of the node's op computes at the node's operand values (real
reverse mode of the node alone, one-hot seeds); the reference is central differences of the
node's own forward kernel. A node whose rule disagrees is a suspect: its op's derivative
rule (e.g. a custom op's hand-written derivative) is wrong there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .. import deadline
from ..autodiff.local_jacobian import local_jacobian
from ..autodiff.reverse import active_nodes
from ..ir import Graph, InputSpec, Node
from ..runtime import Plan
from .compare import within, worst
from .finite_diff import perturbations, relative_steps

MAX_LOCAL_JACOBIAN = 1_000_000  # elements of one node's local Jacobian (larger ones are skipped)


@dataclass(frozen=True)
class LocalForwardKey:
    """The plan cache key of a node's forward kernel on its own."""

    node: str


@dataclass
class NodeCheck:
    node: str
    op: str
    position: int
    operand: str  # the op's name for the operand
    source: str  # the node or input feeding it
    rule: str
    checked: bool = True
    passed: bool = True
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    detail: str = ""


def check_nodes(engine, cg, point: Mapping[str, np.ndarray], wrt: Sequence[str], outputs: Sequence[str],
                atol: float, rtol: float, step: float) -> list[NodeCheck]:
    """One check per (active node, float operand on a path from `wrt` to `outputs`)."""
    values = node_values(engine, cg, point)
    targets = [cg.graph.output_map[o] for o in outputs]
    active = active_nodes(cg.graph, cg.order, cg.types, wrt, targets)
    checks = []
    for node in cg.order:
        if node.id not in active:
            continue
        op = cg.registry.get(node)
        for pos, ref in enumerate(node.inputs):
            if ref not in active:
                continue
            rule = _rule_text(op, pos)
            check = NodeCheck(node.id, node.op, pos, _operand_name(op, pos), ref, rule)
            checks.append(check)
            out_t, in_t = cg.types[node.id], cg.types[ref]
            if out_t.size * in_t.size > MAX_LOCAL_JACOBIAN:
                check.checked, check.detail = False, (f"skipped: local Jacobian of {out_t.size}×{in_t.size} "
                                                      f"elements (limit {MAX_LOCAL_JACOBIAN})")
                continue
            deadline.check(f"localising the disagreement, at node '{node.id}'")
            operands = [values[r] for r in node.inputs]
            with np.errstate(all="ignore"):
                analytic = local_jacobian(cg, node, pos, operands)
                numeric = _fd_local_jacobian(cg, node, pos, operands, step)
            ok, abs_err, rel_err = within(analytic, numeric, atol, rtol)
            check.passed = bool(np.all(ok))
            check.max_abs_error = float(np.max(abs_err, initial=0.0))
            check.max_rel_error = float(np.max(rel_err, initial=0.0))
            if not check.passed:
                j, i = np.unravel_index(worst(ok, abs_err, numeric, atol, rtol), analytic.shape)
                check.detail = (f"at output element {_index(j, out_t.shape)}, operand element "
                                f"{_index(i, in_t.shape)}: rule gives {analytic[j, i]:.6g}, finite differences "
                                f"{numeric[j, i]:.6g}")
    return checks


def node_values(engine, cg, point: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every input's and node's value at `point` (one item)."""
    ids = [n.id for n in cg.order]
    _, nodes = engine.evaluate(cg.id, point, nodes=ids, backend="tensor")
    return {**{k: np.asarray(v) for k, v in point.items()}, **{k: np.asarray(v) for k, v in nodes.items()}}


def _fd_local_jacobian(cg, node: Node, pos: int, operands: list[np.ndarray], step: float) -> np.ndarray:
    """J[j, i] ≈ ∂ node[j] / ∂ operand_pos[i] by central differences of the node's kernel."""
    plan = cg.plans.get(LocalForwardKey(node.id), lambda: _forward_plan(cg, node))
    x = np.asarray(operands[pos], dtype=np.float64)
    h = relative_steps(x, step)
    batch = np.concatenate([perturbations(x, h, 1.0), perturbations(x, h, -1.0)])
    inputs = {f"in{k}": np.asarray(v) for k, v in enumerate(operands)}
    inputs[f"in{pos}"] = batch
    out = np.asarray(plan.run(inputs)["out"], dtype=np.float64)
    n, out_shape = x.size, cg.types[node.id].shape
    out = np.broadcast_to(out, (2 * n,) + out_shape).reshape(2, n, -1)
    return ((out[0] - out[1]) / (2 * h[:, None])).T


def _forward_plan(cg, node: Node) -> Plan:
    specs = tuple(InputSpec(f"in{k}", cg.types[r].shape, cg.types[r].dtype) for k, r in enumerate(node.inputs))
    single = Node("out", node.op, tuple(s.name for s in specs), node.attrs)
    types = {**{s.name: s.type for s in specs}, "out": cg.types[node.id]}
    return Plan(Graph(specs, (single,), (("out", "out"),)), [single], types, [("out", "out")],
                registry=cg.registry)


def _rule_text(op, pos: int) -> str:
    if not op.derivatives:
        return ""
    operand, formula = op.derivatives[min(pos, len(op.derivatives) - 1)]
    return formula


def _operand_name(op, pos: int) -> str:
    return op.operands[min(pos, len(op.operands) - 1)] if op.operands else str(pos)


def _index(flat: int, shape: tuple) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)] if shape else []
