"""The engine behind the service: registers graphs and answers requests with fresh forward
passes (never stale saved values), caching compiled plans per (graph, request shape).

It knows nothing of gRPC: arrays in, arrays out, errors from `errors`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from . import ir
from .autodiff import GRAD_PREFIX, SEED_PREFIX, reverse
from .autodiff.reverse import BackwardGraph, semiring_setup
from .errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from .ir import Graph, Node, Type
from .limits import Limits
from .ops import REGISTRY, Registry, node_type
from .hooks import run as hooks_run
from .hooks.loader import HookRegistry
from .hooks.loader import default_registry as default_hooks
from .hooks.run import HookRun
from .ops.hook_ops import HookSlot, hook_registry
from .runtime import Plan
from .runtime.allocation import results_in
from .runtime.compiled import BACKENDS, compile_executable
from .semiring.loader import SemiringRegistry, default_registry
from .symbolic.custom import registry_for
from .store import MemoryStore, SqliteStore

ADJOINT_PREFIX = "adjoint:"
RETAIN_PREFIX = "retain:"
SEED_VALUE_PREFIX = "seedvalue:"
VALUE_PREFIX = "value:"


@dataclass
class CompiledGraph:
    id: str
    graph: Graph
    order: list[Node]
    types: dict[str, Type]
    attrs: dict[str, dict]
    plans: OrderedDict = field(default_factory=OrderedDict)
    # Real-semiring gradient requests already validated, by (options, input signature): a
    # repeated request skips straight to its compiled plan.
    checked: dict = field(default_factory=dict)
    registry: Registry = field(default_factory=lambda: REGISTRY)  # the built-in ops plus the graph's custom ops
    lock: threading.Lock = field(default_factory=threading.Lock)

    @functools.cached_property
    def inputs(self) -> dict[str, ir.InputSpec]:
        return {s.name: s for s in self.graph.inputs}


def compile_graph(graph: Graph, limits: Limits) -> CompiledGraph:
    """Validate a graph (structure, ops, attributes, shapes, limits) and type every node."""
    if len(graph.nodes) > limits.max_nodes:
        raise ResourceExhausted(f"graph has {len(graph.nodes)} nodes; the limit is {limits.max_nodes}")
    order = ir.validate_structure(graph)
    registry = registry_for(graph.op_defs)
    types = {s.name: s.type for s in graph.inputs}
    attrs = {}
    for spec in graph.inputs:
        _check_size(spec.name, "input", spec.type, limits)
    for node in order:
        _, attrs[node.id], types[node.id] = node_type(node, [types[r] for r in node.inputs], registry)
        _check_size(node.id, "node", types[node.id], limits)
    return CompiledGraph(ir.content_hash(graph), graph, order, types, attrs, registry=registry)


def _check_size(ref: str, what: str, t: Type, limits: Limits) -> None:
    if t.size > limits.max_node_elements:
        raise ResourceExhausted(f"{what} '{ref}' has {t.size} elements (shape {list(t.shape)}); "
                                f"the limit is {limits.max_node_elements}")


@dataclass(frozen=True)
class Batch:
    arrays: dict[str, np.ndarray]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CompiledGradient:
    plan: Plan
    backward: BackwardGraph


@dataclass(frozen=True)
class CheckedGradient:
    """What validating a plain real gradient request established, for its input signature."""

    compiled: CompiledGradient
    shape: tuple[int, ...]  # the batch shape
    wrt: tuple[tuple[str, Type], ...]
    outputs: tuple[tuple[str, Type], ...]  # the forward values returned, if asked for


MAX_CHECKED_PER_GRAPH = 64


@dataclass
class GradientResult:
    gradients: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    components: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    best_paths: list = field(default_factory=list)
    retained: dict[str, np.ndarray] = field(default_factory=dict)
    records: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class HookRequest:
    """A hook attachment as a request states it."""

    node: str
    hook: str = ""
    kind: str = "post"
    params: tuple = ()  # (name, value) pairs
    client: bool = False


class Engine:
    """`persistent`: an optional shared store of serialised graphs (e.g. SqliteStore) behind
    the in-memory cache of compiled graphs."""

    def __init__(self, limits: Limits | None = None, semirings: SemiringRegistry | None = None,
                 persistent: SqliteStore | None = None, hooks: HookRegistry | None = None):
        self.limits = limits or Limits()
        self.semirings = semirings or default_registry()
        self.hooks = hooks or default_hooks()
        self.store: MemoryStore[CompiledGraph] = MemoryStore(self.limits.max_graphs)
        self.persistent = persistent

    # ------------------------------------------------------------ registration
    def register(self, graph: Graph) -> tuple[CompiledGraph, bool]:
        cg = compile_graph(graph, self.limits)
        stored, created = self.store.put_if_absent(cg.id, cg)
        if self.persistent is not None:
            created = self.persistent.put(cg.id, ir.serialize(graph))
        return stored, created

    def get(self, graph_id: str) -> CompiledGraph:
        if self.persistent is not None and graph_id not in self.store:
            data = self.persistent.get(graph_id)
            if data is not None:  # registered through another worker, or before a restart
                return self.store.put_if_absent(graph_id, compile_graph(ir.deserialize(data), self.limits))[0]
        return self.store.get(graph_id)

    # ------------------------------------------------------------ requests
    def evaluate(self, graph_id: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] = (),
                 nodes: Sequence[str] = (), deadline: float | None = None, backend: str = "auto"):
        backend = _check_backend(backend)
        cg = self.get(graph_id)
        names = self._output_names(cg, outputs)
        for ref in nodes:
            if ref not in cg.types:
                raise InvalidArgument(f"unknown node '{ref}' requested")
        batch = self._batch(cg, inputs)
        key = ("evaluate", tuple(names), tuple(nodes), _compile_kind(backend))
        plan = self._plan(cg, key, lambda: compile_executable(
            cg.graph, cg.order, cg.types,
            [(n, cg.graph.output_map[n]) for n in names] + [("node:" + r, r) for r in nodes],
            registry=cg.registry, attrs=cg.attrs, backend=backend))
        results = self._run(plan, batch, deadline, backend)
        out = {n: _full(results[n], batch.shape, cg.types[cg.graph.output_map[n]]) for n in names}
        node_values = {r: _full(results["node:" + r], batch.shape, cg.types[r]) for r in nodes}
        return out, node_values

    def gradient(self, graph_id: str, inputs: Mapping[str, np.ndarray], wrt: Sequence[str] = (),
                 seeds: Mapping[str, np.ndarray] | None = None, outputs: Sequence[str] = (),
                 return_outputs: bool = False, semiring: str = "real",
                 semiring_params: Mapping[str, object] | None = None, return_components: bool = False,
                 best_paths: Sequence[tuple[str, tuple[int, ...]]] = (), deadline: float | None = None,
                 backend: str = "auto", retain: Sequence[str] = (), hooks: Sequence[HookRequest] = (),
                 hook_run: HookRun | None = None):
        """Gradients (under `semiring`) of the outputs w.r.t. `wrt`. Returns a GradientResult.

        `retain`: intermediate nodes whose gradients come back too. `hooks`: hook attachments;
        client hooks call `hook_run.client`."""
        backend = backend or "auto"  # gRPC's default is the empty string
        plain = semiring in ("real", "") and not (seeds or semiring_params or return_components or best_paths
                                             or retain or hooks)
        if plain:
            cg = self.get(graph_id)
            memo = (tuple(wrt), tuple(outputs), return_outputs, backend, _signature(inputs))
            checked = cg.checked.get(memo) if memo[-1] is not None else None
            if checked is not None:
                return self._plain_gradient(checked, inputs, deadline, backend)
        backend = _check_backend(backend)
        s = self.semirings.get(semiring, semiring_params)
        cg = self.get(graph_id)
        for ref in retain:
            if ref not in cg.types:
                raise InvalidArgument(f"retain names unknown node '{ref}'")
        slots = self._hook_slots(cg, hooks, s, hook_run)
        seeds = dict(seeds or {})
        names = self._output_names(cg, outputs)
        for name in names:
            t = cg.types[cg.graph.output_map[name]]
            if not t.is_float:
                raise InvalidArgument(f"output '{name}' has dtype {t.dtype} and cannot be differentiated")
        wrt = self._wrt(cg, wrt)
        for name in seeds:
            if name not in names:
                raise InvalidArgument(f"seed given for '{name}', which is not a differentiated output "
                                      f"(differentiated: {', '.join(names)})")
        if best_paths and not s.selective:
            raise FailedPrecondition(f"best paths need a selective semiring (max/min-like); '{s.name}' is not")
        batch = self._batch(cg, inputs)
        seeded = tuple(sorted(seeds))
        for name in seeded:
            batch = self._with_seed(cg, batch, name, seeds[name])

        key = ("gradient", s.key, tuple(names), tuple(wrt), seeded, return_outputs, bool(best_paths),
               _compile_kind(backend), tuple(retain), tuple(_slot_key(slot) for slot in slots))
        compiled = self._plan(cg, key, lambda: self._gradient_plan(cg, s, names, wrt, seeded, return_outputs,
                                                                   bool(best_paths), backend, retain, slots))
        if plain and memo[-1] is not None:
            checked = CheckedGradient(compiled, batch.shape, tuple((x, cg.types[x]) for x in wrt),
                                      tuple((n, cg.types[cg.graph.output_map[n]]) for n in names) if return_outputs else ())
            if len(cg.checked) >= MAX_CHECKED_PER_GRAPH:
                cg.checked.clear()
            cg.checked[memo] = checked
            return self._plain_gradient(checked, batch.arrays, deadline, backend)
        run = hook_run or HookRun()
        # Best paths read every adjoint and value: scratch, not results for a caller's region.
        with results_in(None) if best_paths else contextlib.nullcontext():
            if slots:
                token = hooks_run.CURRENT.set(run)
                try:
                    results = self._run(compiled.plan, batch, deadline, backend)
                finally:
                    hooks_run.CURRENT.reset(token)
            else:
                results = self._run(compiled.plan, batch, deadline, backend)
        result = GradientResult()
        real = s.name == "real"
        for x in wrt:
            t = cg.types[x]
            ref = compiled.backward.gradients[x]
            value = results[GRAD_PREFIX + x] if ref is not None else s.zeros(())
            if real and not return_components:
                result.gradients[x] = _full(value, batch.shape, t)
                continue
            read = _read_full(s, value, batch.shape + t.shape)
            result.gradients[x] = _cast(read[s.primary], t) if real else read[s.primary]
            if return_components:
                result.components[x] = read
        if return_outputs:
            result.outputs = {n: _full(results[n], batch.shape, cg.types[cg.graph.output_map[n]]) for n in names}
        for ref in retain:
            value = results[RETAIN_PREFIX + ref] if ref in compiled.backward.adjoints else s.zeros(())
            result.retained[ref] = _readback(s, value, batch.shape + cg.types[ref].shape)
        for slot in slots:
            recorded = run.records.get(slot.key)
            if recorded:
                result.records[slot.key] = {name: _readback(s, v, batch.shape + slot.shape)
                                            for name, v in recorded.items()}
        if best_paths:
            from .autodiff.best_path import trace_best_paths

            result.best_paths = trace_best_paths(cg, compiled.backward, s, results, batch, best_paths, self)
        return result

    def _plain_gradient(self, checked: CheckedGradient, inputs: Mapping[str, np.ndarray], deadline: float | None,
                        backend: str) -> GradientResult:
        # The same signature passed the work limit before: only the time bound is left to set.
        bound = time.monotonic() + self.limits.max_request_seconds
        results = checked.compiled.plan.run(inputs, min(deadline, bound) if deadline is not None else bound,
                                            backend, checked.shape)
        gradients = checked.compiled.backward.gradients
        result = GradientResult()
        for x, t in checked.wrt:
            value = results[GRAD_PREFIX + x] if gradients[x] is not None else np.zeros(())
            result.gradients[x] = _full(value, checked.shape, t)
        for name, t in checked.outputs:
            result.outputs[name] = _full(results[name], checked.shape, t)
        return result

    def _hook_slots(self, cg: CompiledGraph, hooks: Sequence[HookRequest], s, run: HookRun | None) -> list[HookSlot]:
        slots, pre_nodes = [], set()
        for h in hooks:
            kind = h.kind or "post"
            if h.node not in cg.types:
                raise InvalidArgument(f"hook attached to unknown node '{h.node}'")
            if kind not in ("post", "pre"):
                raise InvalidArgument(f"hook on node '{h.node}': kind must be 'post' or 'pre', got '{kind}'")
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
                hook = self.hooks.get(h.hook)
                try:
                    hook.check(dict(h.params))
                except (ValueError, TypeError) as e:
                    raise InvalidArgument(f"hook '{h.hook}' on node '{h.node}': {e}") from None
            slots.append(HookSlot(h.node, kind, hook, dict(h.params), cg.types[h.node].shape))
        return slots

    def _gradient_plan(self, cg: CompiledGraph, s, names, wrt, seeded, return_outputs, keep_all: bool,
                       backend: str = "auto", retain: Sequence[str] = (), slots: Sequence[HookSlot] = ()):
        registry, context = semiring_setup(cg.registry, s)
        attached: dict[str, list[tuple[str, int]]] = {}
        if slots:
            registry = hook_registry(registry, list(slots), s)
            for index, slot in enumerate(slots):
                attached.setdefault(slot.node, []).append((slot.kind, index))
        bg = reverse(cg.graph, cg.order, cg.types, outputs=names, wrt=wrt, seeded=seeded, context=context,
                     registry=registry, hooks=attached)
        outputs = [(GRAD_PREFIX + x, ref) for x, ref in bg.gradients.items() if ref is not None]
        outputs += [(RETAIN_PREFIX + ref, bg.adjoints[ref]) for ref in retain if ref in bg.adjoints]
        if return_outputs or keep_all:
            outputs += [(n, ref) for n, ref in bg.outputs.items()]
        if keep_all:  # best paths read every adjoint, seed and forward value
            outputs += [(ADJOINT_PREFIX + ref, adj) for ref, adj in bg.adjoints.items()]
            outputs += [(SEED_VALUE_PREFIX + ref, seed) for ref, seed in bg.seeds.items()]
            outputs += [(VALUE_PREFIX + n.id, n.id) for n in cg.order]
        plan = compile_executable(
            bg.graph, bg.graph.nodes, bg.types, outputs, registry=registry, attrs=bg.context.builder.attrs,
            map_components=bg.context.structural_on_values() if s.components > 1 else frozenset(),
            semiring=None if s.name == "real" else s, backend="tensor" if keep_all else backend)
        return CompiledGradient(plan, bg)

    # ------------------------------------------------------------ helpers
    def _plan(self, cg: CompiledGraph, key, build: Callable):
        with cg.lock:
            if key in cg.plans:
                cg.plans.move_to_end(key)
                return cg.plans[key]
        built = build()
        with cg.lock:
            cg.plans[key] = built
            while len(cg.plans) > self.limits.max_plans_per_graph:
                _, evicted = cg.plans.popitem(last=False)
                # remembered requests must not keep an evicted plan alive past the limit
                cg.checked = {memo: c for memo, c in cg.checked.items() if c.compiled is not evicted}
        return built

    def _run(self, plan, batch: Batch, deadline: float | None, backend: str = "auto"):
        items = math.prod(batch.shape)
        work = items * plan.item_elements
        if work > self.limits.max_request_elements:
            raise ResourceExhausted(
                f"request would compute {work} elements ({items} batch items × {plan.item_elements} per item); "
                f"the limit is {self.limits.max_request_elements}: send smaller batches")
        bound = time.monotonic() + self.limits.max_request_seconds
        return plan.run(batch.arrays, min(deadline, bound) if deadline is not None else bound, backend, batch.shape)

    @staticmethod
    def _output_names(cg: CompiledGraph, outputs: Sequence[str]) -> list[str]:
        available = cg.graph.output_map
        for name in outputs:
            if name not in available:
                raise InvalidArgument(f"unknown output '{name}' (outputs: {', '.join(available)})")
        return list(outputs) if outputs else list(available)

    @staticmethod
    def _wrt(cg: CompiledGraph, wrt: Sequence[str]) -> list[str]:
        specs = cg.inputs
        for name in wrt:
            if name not in specs:
                raise InvalidArgument(f"wrt names unknown input '{name}' (inputs: {', '.join(specs)})")
            if not specs[name].type.is_float:
                raise InvalidArgument(f"wrt input '{name}' has dtype {specs[name].dtype}; only float inputs have gradients")
        if wrt:
            return list(dict.fromkeys(wrt))
        chosen = [s.name for s in cg.graph.inputs if s.type.is_float]
        if not chosen:
            raise InvalidArgument("the graph has no float inputs to differentiate with respect to")
        return chosen

    def _batch(self, cg: CompiledGraph, inputs: Mapping[str, np.ndarray]) -> Batch:
        specs = cg.inputs
        for name in inputs:
            if name not in specs:
                raise InvalidArgument(f"unknown input '{name}' (graph inputs: {', '.join(specs) or 'none'})")
        arrays, leads = {}, []
        for name, spec in specs.items():
            if name not in inputs:
                raise InvalidArgument(f"missing input '{name}' (shape {list(spec.shape)}, {spec.dtype})")
            a = inputs[name]
            if a.dtype != ir.DTYPES[spec.dtype]:
                raise InvalidArgument(f"input '{name}' has dtype {a.dtype.name}; the graph declares {spec.dtype}")
            lead = a.ndim - len(spec.shape)
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
        items = math.prod(shape)
        if items > self.limits.max_batch:
            raise ResourceExhausted(f"batch of {items} items; the limit is {self.limits.max_batch}")
        return Batch(arrays, shape)

    @staticmethod
    def _with_seed(cg: CompiledGraph, batch: Batch, name: str, seed: np.ndarray) -> Batch:
        t = cg.types[cg.graph.output_map[name]]
        lead = seed.ndim - t.rank
        if seed.dtype.kind != "f" or lead < 0 or tuple(seed.shape[lead:]) != t.shape:
            raise InvalidArgument(f"seed for output '{name}' must be a float tensor whose shape ends with "
                                  f"{list(t.shape)}; got {seed.dtype.name} {list(seed.shape)}")
        try:
            shape = tuple(np.broadcast_shapes(seed.shape[:lead], batch.shape))
        except ValueError:
            raise InvalidArgument(f"seed for output '{name}' has batch dimensions {list(seed.shape[:lead])}, "
                                  f"which do not broadcast with the inputs' {list(batch.shape)}") from None
        return Batch({**batch.arrays, SEED_PREFIX + name: seed.astype(t.dtype, copy=False)}, shape)


def _signature(inputs: Mapping[str, np.ndarray]) -> tuple | None:
    """Names, shapes and dtypes of a request's inputs: equal signatures pass the same checks."""
    try:
        return tuple((name, a.shape, a.dtype) for name, a in inputs.items())
    except AttributeError:  # not arrays: the full checks will say so
        return None


def _compile_kind(backend: str) -> str:
    """What a backend choice compiles to: scalar and jit share the scalar program."""
    return "scalar" if backend in ("scalar", "jit") else backend


def _check_backend(backend: str) -> str:
    backend = backend or "auto"
    if backend not in BACKENDS:
        raise InvalidArgument(f"unknown backend '{backend}' (backends: {', '.join(BACKENDS)})")
    return backend


def _slot_key(slot: HookSlot) -> tuple:
    return slot.node, slot.kind, slot.hook.name if slot.hook else "<client>", repr(sorted(slot.params.items()))


def _read_full(s, value, shape: tuple) -> dict[str, np.ndarray]:
    """A semiring value's named arrays, broadcast to the request's full shape."""
    return s.read(s.map(lambda c: c if np.shape(c) == shape else np.broadcast_to(c, shape), value))


def _readback(s, value, shape: tuple) -> np.ndarray:
    """A semiring value's primary array, broadcast to the request's full shape."""
    return _read_full(s, value, shape)[s.primary]


def _cast(value: np.ndarray, t: Type) -> np.ndarray:
    value = np.asarray(value)
    return value if value.dtype == ir.DTYPES[t.dtype] else value.astype(t.dtype)


def _full(value: np.ndarray, batch_shape: tuple, t: Type) -> np.ndarray:
    """A result with the request's full batch shape, in its declared dtype."""
    if type(value) is np.ndarray and value.dtype == ir.DTYPES[t.dtype] and value.shape == batch_shape + t.shape:
        return value  # already whole (the common case)
    value = _cast(value, t)
    target = tuple(batch_shape) + t.shape
    return value if value.shape == target else np.broadcast_to(value, target)
