"""Compiling a gradient request: its backward graph under the request's semiring (with hooks
attached), compiled to one plan whose results are keyed by OutputKey."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..autodiff.reverse import BackwardGraph, reverse, semiring_setup
from ..errors import FailedPrecondition, InvalidArgument, quoted
from ..hooks.loader import HookRegistry
from ..hooks.run import HookRun
from ..ops.hook_ops import HookSlot, hook_registry
from ..ir import Graph
from ..runtime.compiled import compile_executable
from ..runtime.cse import common_subexpressions
from ..runtime.outputs import OutputKey
from ..semiring.pruning import Guess
from .graphs import CompiledGraph
from .specs import HookRequest


@dataclass(frozen=True)
class GradientPlanKey:
    """What a gradient plan computes (the plan cache key)."""

    semiring: tuple  # the configured semiring's key
    outputs: tuple[str, ...]
    wrt: tuple[str, ...]
    seeded: tuple[str, ...]  # outputs whose cotangent the request gives
    return_outputs: bool
    pointers: bool  # under semiring.pointers.PointerSemiring, with every node's adjoint (best paths read them)
    compile_kind: str
    retain: tuple[str, ...]
    hooks: tuple[tuple, ...]  # slot_key of each hook slot


@dataclass(frozen=True)
class CompiledGradient:
    plan: object  # a runtime executable: Plan or ScalarExecutable
    backward: BackwardGraph
    pruning: Guess = field(default_factory=Guess, compare=False)  # top_paths: the ρ its next pass tries


def compile_gradient(cg: CompiledGraph, s, key: GradientPlanKey, backend: str,
                     slots: Sequence[HookSlot] = ()) -> CompiledGradient:
    registry, context = semiring_setup(cg.registry, s)
    attached: dict[str, list[tuple[str, int]]] = {}
    if slots:
        registry = hook_registry(registry, list(slots), s)
        for index, slot in enumerate(slots):
            attached.setdefault(slot.node, []).append((slot.kind, index))
    graph, order = cg.graph, cg.order
    if not key.pointers:  # best paths name the user's own nodes: they see the graph as written
        graph, order = computed_graph(cg, pinned=frozenset(key.retain) | {slot.node for slot in slots})
    bg = reverse(graph, order, cg.types, outputs=key.outputs, wrt=key.wrt, seeded=key.seeded, context=context,
                 registry=registry, hooks=attached)
    outputs = [(OutputKey.gradient(x), ref) for x, ref in bg.gradients.items() if ref is not None]
    outputs += [(OutputKey.adjoint(ref), bg.adjoints[ref]) for ref in key.retain if ref in bg.adjoints]
    if key.return_outputs:
        outputs += [(OutputKey.output(n), ref) for n, ref in bg.outputs.items()]
    scratch = frozenset()
    if key.pointers:  # every adjoint, for the walker: not returned (unless asked for otherwise)
        returned = {name for name, _ in outputs}
        followed = [(OutputKey.adjoint(ref), adj) for ref, adj in bg.adjoints.items()]
        scratch = frozenset(name for name, _ in followed if name not in returned)
        outputs += followed
    plan = compile_executable(
        bg.graph, bg.graph.nodes, bg.types, list(dict.fromkeys(outputs)), registry=registry,
        attrs=bg.context.builder.attrs,
        map_components=bg.context.structural_on_values() if s.components > 1 else frozenset(),
        semiring_values=frozenset(bg.context.valued),
        semiring=None if s.name == "real" else s, backend="tensor" if key.pointers else backend, scratch=scratch)
    return CompiledGradient(plan, bg)


def computed_graph(cg: CompiledGraph, pinned: frozenset[str]) -> tuple[Graph, list]:
    """The graph of what `cg` computes, each value once (runtime.cse): reverse mode then builds
    the same backward pass however the user wrote the forward one (a recursive determinant
    and a memoised one alike). Nodes the request names (`pinned`) keep their own adjoints."""
    order, same_as = common_subexpressions(cg.order, cg.attrs, cg.registry, pinned)
    if not same_as:
        return cg.graph, cg.order
    outputs = tuple((name, same_as.get(ref, ref)) for name, ref in cg.graph.outputs)
    return Graph(cg.graph.inputs, tuple(order), outputs, cg.graph.op_defs), order


def hook_slots(cg: CompiledGraph, hooks: Sequence[HookRequest], s, run: HookRun | None,
               registry: HookRegistry) -> list[HookSlot]:
    """The request's hook attachments checked and resolved (server hooks from `registry`)."""
    slots, pre_nodes = [], set()
    for h in hooks:
        kind = h.kind or "post"
        if h.node not in cg.types:
            raise InvalidArgument(f"hook attached to unknown node {quoted(h.node)}")
        if kind not in ("post", "pre"):
            raise InvalidArgument(f"hook on node '{h.node}': kind must be 'post' or 'pre', got {quoted(kind)}")
        if kind == "pre":
            if h.node in pre_nodes:
                raise InvalidArgument(f"node '{h.node}' has more than one pre-accumulate hook")
            pre_nodes.add(h.node)
        if h.client:
            if run is None or run.client is None:
                raise InvalidArgument(f"the client hook on node '{h.node}' needs the GradientWithHooks stream")
            if s.components != 1:
                raise FailedPrecondition(f"client hooks need a semiring with one array per value; "
                                         f"'{s.name}' has {s.components}")
            hook = None
        else:
            hook = registry.get(h.hook)
            try:
                hook.check(dict(h.params))
            except (ValueError, TypeError) as e:
                raise InvalidArgument(f"hook '{h.hook}' on node '{h.node}': {e}") from None
        slots.append(HookSlot(h.node, kind, hook, dict(h.params), cg.types[h.node].shape))
    return slots


def slot_key(slot: HookSlot) -> tuple:
    return slot.node, slot.kind, slot.hook.name if slot.hook else "<client>", repr(sorted(slot.params.items()))


def checked_seed(cg: CompiledGraph, name: str, seed: np.ndarray, batch_shape: tuple) -> tuple[np.ndarray, tuple]:
    """The cotangent a request gives output `name`, in the output's dtype, and the batch shape
    once its leading dimensions are broadcast in."""
    t = cg.types[cg.graph.output_map[name]]
    lead = seed.ndim - t.rank
    if seed.dtype.kind != "f" or lead < 0 or tuple(seed.shape[lead:]) != t.shape:
        raise InvalidArgument(f"seed for output '{name}' must be a float tensor whose shape ends with "
                              f"{list(t.shape)}; got {seed.dtype.name} {list(seed.shape)}")
    try:
        shape = tuple(np.broadcast_shapes(seed.shape[:lead], batch_shape))
    except ValueError:
        raise InvalidArgument(f"seed for output '{name}' has batch dimensions {list(seed.shape[:lead])}, "
                              f"which do not broadcast with the inputs' {list(batch_shape)}") from None
    return seed.astype(t.dtype, copy=False), shape
