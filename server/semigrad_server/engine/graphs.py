"""Registered graphs: validated, typed and hashed once (`compile_graph`), with the request
checks that depend only on the graph, and the cache of plans compiled for it."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .. import ir
from ..errors import GraphError, InvalidArgument, ResourceExhausted, quoted
from ..ir import Graph, Node, Type
from ..limits import Limits
from ..ops import Registry, node_type
from ..runtime.plan_cache import PlanCache
from ..symbolic.custom import registry_for
from .remembered import RememberedRequests


@dataclass(frozen=True)
class Batch:
    """A request's inputs, checked, and the batch shape they broadcast to."""

    arrays: dict[str, np.ndarray]
    shape: tuple[int, ...]


@dataclass
class CompiledGraph:
    id: str
    graph: Graph
    order: list[Node]
    types: dict[str, Type]
    attrs: dict[str, dict]
    registry: Registry  # the built-in ops plus the graph's custom ops
    limits: Limits
    plans: PlanCache  # every plan compiled for this graph, by what it computes
    remembered: RememberedRequests  # plain gradient requests already checked, for the short path

    @functools.cached_property
    def inputs(self) -> dict[str, ir.InputSpec]:
        return {s.name: s for s in self.graph.inputs}

    def output_names(self, requested: Sequence[str]) -> list[str]:
        """The outputs a request names (checked), or by default every output."""
        available = self.graph.output_map
        for name in requested:
            if name not in available:
                raise InvalidArgument(f"unknown output {quoted(name)} (outputs: {', '.join(available)})")
        return list(requested) if requested else list(available)

    def differentiated_outputs(self, requested: Sequence[str]) -> list[str]:
        """The outputs a request differentiates: those it names (each a float output), or by
        default every float output (an argmax or a mask beside a loss is left out)."""
        names = self.output_names(requested)
        floats = [n for n in names if self.types[self.graph.output_map[n]].is_float]
        if requested and len(floats) != len(names):
            bad = next(n for n in names if n not in floats)
            raise InvalidArgument(f"output '{bad}' has dtype {self.types[self.graph.output_map[bad]].dtype} "
                                  f"and cannot be differentiated")
        return floats

    def wrt_inputs(self, requested: Sequence[str]) -> list[str]:
        """The inputs a request differentiates with respect to (checked, each once), or by
        default every float input."""
        specs = self.inputs
        for name in requested:
            if name not in specs:
                raise InvalidArgument(f"wrt names unknown input {quoted(name)} (inputs: {', '.join(specs)})")
            if not specs[name].type.is_float:
                raise InvalidArgument(f"wrt input '{name}' has dtype {specs[name].dtype}; only float inputs have gradients")
        if requested:
            return list(dict.fromkeys(requested))
        chosen = [s.name for s in self.graph.inputs if s.type.is_float]
        if not chosen:
            raise InvalidArgument("the graph has no float inputs to differentiate with respect to")
        return chosen

    @functools.cached_property
    def max_rank(self) -> int:
        """The largest rank of the graph's values (per item)."""
        return max((t.rank for t in self.types.values()), default=0)

    def check_rank(self, batch_shape: tuple[int, ...], what: str) -> None:
        """INVALID_ARGUMENT, naming `what` (the input or seed that brought the batch dimensions),
        unless every value, with the request's batch dimensions, is within MAX_RANK."""
        if len(batch_shape) + self.max_rank > ir.MAX_RANK:
            raise InvalidArgument(f"{what} brings the batch to {len(batch_shape)} dimensions, and the graph has values "
                                  f"of rank {self.max_rank}: values have at most {ir.MAX_RANK} dimensions in all")

    def batch(self, inputs: Mapping[str, np.ndarray]) -> Batch:
        """A request's inputs checked against the declared ones (names, dtypes, item shapes),
        and their leading dimensions broadcast into the batch shape (within the batch limit)."""
        specs = self.inputs
        for name in inputs:
            if name not in specs:
                raise InvalidArgument(f"unknown input {quoted(name)} (graph inputs: {', '.join(specs) or 'none'})")
        arrays, leads = {}, []
        for name, spec in specs.items():
            if name not in inputs:
                raise InvalidArgument(f"missing input '{name}' (shape {list(spec.shape)}, {spec.dtype})")
            a = inputs[name]
            if a.dtype != ir.DTYPES[spec.dtype]:
                raise InvalidArgument(f"input '{name}' has dtype {a.dtype.name}; the graph declares {spec.dtype}")
            lead = a.ndim - len(spec.shape)
            if a.ndim > ir.MAX_RANK:
                raise InvalidArgument(f"input '{name}' has {a.ndim} dimensions; values have at most {ir.MAX_RANK}, "
                                      f"batch dimensions included")
            if lead < 0 or tuple(a.shape[lead:]) != spec.shape:
                raise InvalidArgument(f"input '{name}' has shape {list(a.shape)}, which does not end with "
                                      f"the declared shape {list(spec.shape)}")
            arrays[name] = a
            leads.append((name, a.shape[:lead]))
        try:
            distinct = {lead for _, lead in leads if lead}
            shape = (distinct.pop() if len(distinct) == 1 else tuple(np.broadcast_shapes(*distinct))) if distinct else ()
        except ValueError:
            described = ", ".join(f"{n}: {list(s)}" for n, s in leads)
            raise InvalidArgument(f"batch dimensions of the inputs do not broadcast ({described})") from None
        if shape:
            self.check_rank(shape, "input " + quoted(max(leads, key=lambda lead: len(lead[1]))[0]))
        items = math.prod(shape)
        if items > self.limits.max_batch:
            raise ResourceExhausted(f"batch of {items} items; the limit is {self.limits.max_batch}",
                                    max_items=self.limits.max_batch)
        return Batch(arrays, shape)


def check_node_count(count: int, limits: Limits) -> None:
    """RESOURCE_EXHAUSTED for a graph of `count` nodes over `max_nodes`: asked of a registration's
    message before its nodes are read (reading the 219,199 nodes of a recursive det n=8 took
    seconds), and of every graph compiled."""
    if count > limits.max_nodes:
        raise ResourceExhausted(f"graph has {count} nodes; the limit is {limits.max_nodes}")


def compile_graph(graph: Graph, limits: Limits) -> CompiledGraph:
    """Validate a graph (structure, ops, attributes, shapes, limits) and type every node."""
    check_node_count(len(graph.nodes), limits)
    order = ir.validate_structure(graph)
    registry = registry_for(graph.op_defs)
    types = {s.name: s.type for s in graph.inputs}
    attrs = {}
    for spec in graph.inputs:
        _check_size(spec.name, "input", spec.type, limits)
    for node in order:
        op, attrs[node.id], types[node.id] = node_type(node, [types[r] for r in node.inputs], registry)
        _check_type(node, op.name, types[node.id])
        _check_size(node.id, "node", types[node.id], limits)
    remembered = RememberedRequests()
    # remembered requests must not keep an evicted plan alive past the limit
    plans = PlanCache(limits.max_plans_per_graph, on_evict=remembered.forget)
    return CompiledGraph(ir.content_hash(graph), graph, order, types, attrs, registry, limits, plans, remembered)


def _check_type(node: Node, op: str, t: Type) -> None:
    """A node's value must be of a dtype and rank the service carries."""
    if t.dtype not in ir.DTYPES:
        raise GraphError(node.id, f"op '{op}' would give a {t.dtype} value, which semigrad does not carry "
                                  f"(dtypes: {', '.join(ir.DTYPES)})")
    if t.rank > ir.MAX_RANK:
        raise GraphError(node.id, f"op '{op}' would give a value of rank {t.rank}; values have at most "
                                  f"{ir.MAX_RANK} dimensions, batch dimensions included")
    if ir.unholdable(t.shape):
        raise GraphError(node.id, f"op '{op}' would give a value of shape {list(t.shape)}, larger than any "
                                  f"array can be")


def _check_size(ref: str, what: str, t: Type, limits: Limits) -> None:
    if t.size > limits.max_node_elements:
        raise ResourceExhausted(f"{what} '{ref}' has {t.size} elements (shape {list(t.shape)}); "
                                f"the limit is {limits.max_node_elements}")
