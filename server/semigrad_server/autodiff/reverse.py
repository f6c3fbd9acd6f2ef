"""Reverse mode as a graph → graph transformation, under any semiring context.

For each input element the result is ⊕ over all paths to the differentiated outputs of
the ⊗-product of lifted local partials along the path (edge first: the adjoint of a node
is ⊕ over consumers of φ(edge) ⊗ adjoint(consumer)). Only nodes that both depend on a
`wrt` input and feed a differentiated output are visited.
"""

from __future__ import annotations

from dataclasses import dataclass
import functools
import json
from typing import Callable, Mapping, Sequence

from ..errors import FailedPrecondition
from ..ir import Graph, Node, Type
from ..ops import REGISTRY, Registry
from .builder import GraphBuilder
from ..ops.semiring_ops import semiring_registry
from .context import AdjointContext, PointerContext, RealContext, SemiringContext

@dataclass
class BackwardGraph:
    graph: Graph
    types: dict[str, Type]
    gradients: dict[str, str | None]  # wrt input -> adjoint node id (None: no path, 0̄)
    outputs: dict[str, str]  # differentiated output name -> node id
    context: AdjointContext
    adjoints: dict[str, str]  # every visited node -> its accumulated adjoint
    seeds: dict[str, str]  # differentiated output node -> its seed value node
    seed_inputs: dict[str, str]  # seeded output name -> the input of `graph` carrying its cotangent


def semiring_setup(base: Registry, semiring) -> tuple[Registry, Callable[[GraphBuilder], AdjointContext]]:
    """The op registry and adjoint context of a backward pass under `semiring`: ordinary ops
    for the real semiring (so the result can be differentiated again), semiring ops otherwise."""
    if semiring.name == "real":
        return base, RealContext
    context = PointerContext if hasattr(semiring, "tag") else SemiringContext  # back-pointers (best paths)
    return semiring_registry(base, semiring), functools.partial(context, semiring=semiring)


def active_nodes(graph: Graph, order: Sequence[Node], types: dict[str, Type],
                 wrt: Sequence[str], targets: Sequence[str]) -> set[str]:
    """Float nodes on some path from a wrt input to a target."""
    depends = set(wrt)
    for node in order:
        if types[node.id].is_float and node.op != "const" and any(r in depends for r in node.inputs):
            depends.add(node.id)
    feeds = set(targets)
    for node in reversed(order):
        if node.id in feeds:
            feeds.update(node.inputs)
    return depends & feeds


def reverse(graph: Graph, order: Sequence[Node], types: dict[str, Type], *, outputs: Sequence[str],
            wrt: Sequence[str], seeded: Sequence[str] = (),
            context: Callable[[GraphBuilder], AdjointContext] = RealContext,
            registry: Registry = REGISTRY, hooks: Mapping[str, Sequence[tuple[str, int]]] | None = None
            ) -> BackwardGraph:
    """Build the backward graph. Outputs in `seeded` get their cotangent from an extra input
    (`seed_inputs` of the result names it); the others are seeded with the semiring's one.

    `hooks` maps a node (or input) id to its hook attachments, (kind, slot) pairs: "pre"
    replaces the accumulation of its incoming contributions by a `hook_pre` op, "post"
    passes the accumulated gradient through a `hook_post` op (see ops.hook_ops)."""
    hooks = hooks or {}
    builder = GraphBuilder(graph, order, types, registry)
    ctx = context(builder)
    output_nodes = {name: graph.output_map[name] for name in outputs}
    active = active_nodes(graph, order, types, wrt, list(output_nodes.values()))

    pending: dict[str, list[tuple[tuple[str, int], str]]] = {}  # node -> [(edge, contribution)]
    seeds: dict[str, str] = {}
    seed_inputs: dict[str, str] = {}
    for name, ref in output_nodes.items():
        if ref not in active:
            continue
        t = types[ref]
        if name in seeded:
            seed_inputs[name] = builder.fresh_input("seed", t)
            seed = ctx.seed(seed_inputs[name])
        else:
            seed = ctx.one(t)
        seed = ctx.at_output(ref, seed)
        pending.setdefault(ref, []).append((("output:" + name, 0), seed))
        seeds[ref] = seed if ref not in seeds else ctx.add(seeds[ref], seed)

    adjoints: dict[str, str] = {}
    for node in reversed(order):
        if node.id not in active or node.id not in pending:
            continue
        g = adjoints[node.id] = _finish(ctx, node.id, pending.pop(node.id), hooks.get(node.id, ()))
        positions = [pos for pos, ref in enumerate(node.inputs) if ref in active]
        if not positions:
            continue
        g = ctx.passed_on(node.id, g)
        op = builder.ops[node.id]
        if op.vjp is None:
            semiring = getattr(getattr(ctx, "semiring", None), "name", "real")
            raise FailedPrecondition(f"op '{op.name}' (node '{node.id}') has no adjoint rule, so it cannot be "
                                     f"differentiated under the '{semiring}' semiring")
        for pos, contribution in op.vjp(ctx, node, g, positions).items():
            if contribution is not None:
                pending.setdefault(node.inputs[pos], []).append(((node.id, pos), contribution))

    gradients = {x: _finish(ctx, x, pending[x], hooks.get(x, ())) if x in pending else None for x in wrt}
    adjoints.update({x: g for x, g in gradients.items() if g is not None})
    return BackwardGraph(builder.graph([]), builder.types, gradients, output_nodes, ctx, adjoints, seeds, seed_inputs)


def _finish(ctx: AdjointContext, ref: str, entries: list[tuple[tuple[str, int], str]],
            attached: Sequence[tuple[str, int]]) -> str:
    """The adjoint of `ref`: its contributions accumulated (or handed to a pre hook), then
    passed through its post hooks."""
    pre = [slot for kind, slot in attached if kind == "pre"]
    if pre:
        value = ctx.emit_adjoint("hook_pre", [c for _, c in entries], slot=pre[0],
                         edges=json.dumps([list(edge) for edge, _ in entries]))
    else:
        value = entries[0][1]
        for _, c in entries[1:]:
            value = ctx.add(value, c)
    for kind, slot in attached:
        if kind == "post":
            value = ctx.emit_adjoint("hook_post", [value], slot=slot)
    return value
