"""The engine behind the service: registers graphs and answers requests with fresh forward
passes (never stale saved values), through plans compiled once per (graph, request shape).

It knows nothing of gRPC: specs and arrays in, arrays out, errors from `errors`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .. import ir, telemetry, tenancy
from ..autodiff.best_path import (MAX_TOP_PATHS, PATH_STEP_BYTES, check_path_steps, longest_steps, start_elements,
                                  trace_best_paths, trace_top_paths)
from ..deadline import interruptibly
from ..errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, quoted
from ..hooks import run as hooks_run
from ..hooks.loader import HookRegistry
from ..hooks.loader import default_registry as default_hooks
from ..hooks.run import HookRun
from ..ir import Graph
from ..limits import Limits
from ..runtime.allocation import results_in
from ..runtime.compiled import compile_executable
from ..runtime.outputs import OutputKey
from ..semiring.loader import SemiringRegistry, default_registry
from ..semiring import pruning
from ..semiring.pointers import KBestPointerSemiring, PointerSemiring
from ..store import GraphStore, LruCache, MemoryGraphStore, Quota
from .execution import MemoryBudget, check_work, checked_backend, compile_kind, run_plan
from .gradient_plans import GradientPlanKey, checked_seed, compile_gradient, hook_slots, slot_key
from .graphs import Batch, CompiledGraph, check_node_count, compile_graph
from .remembered import CheckedGradient, result_slot
from .results import GradientResult, full, gradient_result
from .specs import EvaluateSpec, GradientSpec, HookRequest


@dataclass(frozen=True)
class EvaluatePlanKey:
    """What an evaluation plan computes (the plan cache key)."""

    outputs: tuple[str, ...]
    nodes: tuple[str, ...]
    compile_kind: str


class Engine:
    """`store`: where registered graphs live (a GraphStore; default: this process's memory), behind
    this process's cache of compiled graphs. Graph ids are scoped by the current tenant
    (`tenancy.current()`): a tenant reaches only the graphs it registered."""

    def __init__(self, limits: Limits | None = None, semirings: SemiringRegistry | None = None,
                 store: GraphStore | None = None, hooks: HookRegistry | None = None):
        self.limits = limits or Limits()
        self.semirings = semirings or default_registry()
        self.hooks = hooks or default_hooks()
        # Compiled graphs by (tenant, content hash): each tenant's own, never shared with another
        # tenant that registered the same graph. A shared one would carry the plans (and remembered
        # requests) that the other tenant's calls compiled, so the first gradient of a graph would
        # answer in milliseconds where a graph no other tenant uses takes its compile (a 300-node
        # chain: 3 ms against 550 ms): a timing oracle telling a tenant whether anyone else
        # registered and used a graph it can guess (a model, its weights).
        self.compiled: LruCache[CompiledGraph] = LruCache(self.limits.max_graphs)
        self.graphs: GraphStore = store if store is not None else MemoryGraphStore()
        # A store in this process's memory keeps as many graphs per tenant as the compiled cache.
        capacity = self.limits.max_stored_graphs if self.graphs.name != "memory" else \
            min(self.limits.max_stored_graphs, self.limits.max_graphs)
        self.memory = MemoryBudget(self.limits.max_memory_bytes)  # held by the requests in flight
        self.quota = Quota(capacity=capacity, graphs=self.limits.max_tenant_graphs, bytes=self.limits.max_tenant_bytes)

    # ------------------------------------------------------------ registration
    def check_node_count(self, count: int) -> None:
        """Refuse a graph of `count` nodes over max_nodes before anything reads its nodes."""
        check_node_count(count, self.limits)

    def register(self, graph: Graph) -> tuple[CompiledGraph, bool]:
        """Validate and store `graph` for the current tenant; `created`: this call stored it (never
        whether another tenant has it)."""
        tenant = tenancy.current()
        cg = interruptibly("registering the graph", compile_graph, graph, self.limits)
        created = self.graphs.put(tenant, cg.id, ir.serialize(graph), self.quota)
        return self.compiled.put_if_absent((tenant, cg.id), cg), created

    def get(self, graph_id: str) -> CompiledGraph:
        """The current tenant's graph `graph_id`, compiled (from the stored definition when this
        process has not compiled it yet: registered through another worker or replica)."""
        tenant = tenancy.current()
        cg = self.compiled.get((tenant, graph_id))
        if cg is not None:
            if self.graphs.contains(tenant, graph_id):
                return cg
        else:
            data = self.graphs.get(tenant, graph_id)
            if data is not None:  # registered through another worker or replica, or evicted from this cache
                telemetry.event("graph_compile")
                cg = interruptibly("compiling the stored graph", compile_graph, ir.deserialize(data), self.limits)
                return self.compiled.put_if_absent((tenant, graph_id), cg)
        raise NotFound(f"unknown graph id {quoted(graph_id)} (register the graph first)")

    def delete(self, graph_id: str) -> bool:
        """Forget the current tenant's registration of `graph_id`; True when it had one."""
        return self.graphs.delete(tenancy.current(), graph_id)

    # ------------------------------------------------------------ keyword forms of the requests
    def evaluate(self, graph_id: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] = (),
                 nodes: Sequence[str] = (), deadline: float | None = None, backend: str = "auto"):
        """The outputs' values ({name: array}) and the `nodes`' values ({id: array})."""
        return self.run_evaluate(EvaluateSpec(graph_id, inputs, tuple(outputs), tuple(nodes), backend or "auto"),
                                 deadline)

    def gradient(self, graph_id: str, inputs: Mapping[str, np.ndarray], wrt: Sequence[str] = (),
                 seeds: Mapping[str, np.ndarray] | None = None, outputs: Sequence[str] = (),
                 return_outputs: bool = False, semiring: str = "real",
                 semiring_params: Mapping[str, object] | None = None, return_components: bool = False,
                 best_paths: Sequence[tuple[str, tuple[int, ...]]] = (), deadline: float | None = None,
                 backend: str = "auto", retain: Sequence[str] = (), hooks: Sequence[HookRequest] = (),
                 hook_run: HookRun | None = None, semirings: Sequence[str] = (), top_paths: int = 0) -> GradientResult:
        """Gradients (under `semiring`) of the outputs w.r.t. `wrt` (see GradientSpec).

        `retain`: intermediate nodes whose gradients come back too. `hooks`: hook attachments;
        client hooks call `hook_run.client`. `semirings`: several semirings at once (one forward
        pass, one backward walk), each result in `result.semirings[name]`. `best_paths`: (input,
        full index) pairs, or "all" (every element of every wrt input); `top_paths`: the k best
        paths of the whole graph."""
        if isinstance(best_paths, str):
            best_paths = best_paths if best_paths == "all" else (best_paths,)  # a bad value is refused by name later
        spec = GradientSpec(graph_id, inputs, tuple(wrt), tuple(outputs), seeds, return_outputs, semiring or "real",
                            semiring_params, return_components,
                            best_paths if isinstance(best_paths, str) else tuple(best_paths or ()),
                            backend or "auto", tuple(retain) if retain else (), tuple(hooks) if hooks else (),
                            tuple(semirings), int(top_paths))
        return self.run_gradient(spec, deadline, hook_run)

    # ------------------------------------------------------------ requests
    def run_evaluate(self, spec: EvaluateSpec, deadline: float | None = None):
        backend = checked_backend(spec.backend)
        cg = self.get(spec.graph_id)
        names = cg.output_names(spec.outputs)
        for ref in spec.nodes:
            if ref not in cg.types:
                raise InvalidArgument(f"unknown node {quoted(ref)} requested")
        batch = cg.batch(spec.inputs)
        key = EvaluatePlanKey(tuple(names), tuple(spec.nodes), compile_kind(backend))
        plan = cg.plans.get(key, lambda: interruptibly(
            "compiling the evaluation", compile_executable, cg.graph, cg.order, cg.types,
            [(OutputKey.output(n), cg.graph.output_map[n]) for n in names]
            + [(OutputKey.value(r), r) for r in spec.nodes],
            registry=cg.registry, attrs=cg.attrs, backend=backend))
        results = run_plan(plan, batch, deadline, backend, self.limits, self.memory)
        out = {n: full(results[OutputKey.output(n)], batch.shape, cg.types[cg.graph.output_map[n]]) for n in names}
        node_values = {r: full(results[OutputKey.value(r)], batch.shape, cg.types[r]) for r in spec.nodes}
        return out, node_values

    def remembered_gradient(self, graph_id: str, inputs: Mapping[str, np.ndarray], wrt: tuple[str, ...],
                            outputs: tuple[str, ...], return_outputs: bool, backend: str,
                            deadline: float | None = None) -> GradientResult | None:
        """A plain gradient (see GradientSpec.is_plain) whose signature passed every check before,
        answered on the short path; None when it did not (run_gradient checks it then). What the
        in-process client calls first, without building a spec."""
        cg = self.get(graph_id)
        try:  # the request's memo (see remembered.py), computed inline: this is the short path
            memo = (wrt, outputs, return_outputs, backend, tuple([(name, a.shape, a.dtype) for name, a in inputs.items()]))
        except AttributeError:  # not arrays: the full checks will say so
            return None
        checked = cg.remembered.get(memo)
        return None if checked is None else self.plain_gradient(checked, inputs, deadline, backend)

    def run_gradient(self, spec: GradientSpec, deadline: float | None = None,
                     hook_run: HookRun | None = None, semirings: Sequence[str] = (), top_paths: int = 0) -> GradientResult:
        memo = None
        if spec.is_plain:
            result = self.remembered_gradient(spec.graph_id, spec.inputs, spec.wrt, spec.outputs, spec.return_outputs,
                                              spec.backend, deadline)
            if result is not None:
                return result
            try:
                memo = (spec.wrt, spec.outputs, spec.return_outputs, spec.backend,
                        tuple([(name, a.shape, a.dtype) for name, a in spec.inputs.items()]))
            except AttributeError:  # not arrays: the full checks will say so
                memo = None
        backend = checked_backend(spec.backend)
        if spec.semirings:
            if spec.semiring not in ("", "real"):
                raise InvalidArgument(f"both semiring {quoted(spec.semiring)} and a list of semirings given: "
                                      "put every semiring in the list")
            if spec.best_paths or spec.top_paths:
                raise FailedPrecondition("best paths are traced under one semiring: ask for them in a request of their "
                                         f"own, not with several semirings ({', '.join(spec.semirings)})")
            s = self.semirings.product(spec.semirings, spec.semiring_params)
        else:
            s = self.semirings.get(spec.semiring, spec.semiring_params)
        cg = self.get(spec.graph_id)
        for ref in spec.retain:
            if ref not in cg.types:
                raise InvalidArgument(f"retain names unknown node {quoted(ref)}")
        slots = hook_slots(cg, spec.hooks, s, hook_run, self.hooks)
        seeds = dict(spec.seeds or {})
        names = cg.differentiated_outputs(spec.outputs)
        if not names:
            raise InvalidArgument("the graph has no float outputs to differentiate")
        wrt = cg.wrt_inputs(spec.wrt)
        for name in seeds:
            if name not in names:
                raise InvalidArgument(f"seed given for {quoted(name)}, which is not a differentiated output "
                                      f"(differentiated: {', '.join(names)})")
        if spec.hooks and (spec.best_paths or spec.top_paths):
            hooked = ", ".join(dict.fromkeys(quoted(h.node) for h in spec.hooks))
            raise InvalidArgument(f"hooks (on {hooked}) cannot be combined with best_path or top_paths: a path's value "
                                  "is the product of the graph's own partials along it, which a hook's change to a "
                                  "contribution is not; ask for the paths and the hooked gradients in separate requests")
        if spec.best_paths and not s.selective:
            raise FailedPrecondition(f"best paths need a selective semiring (max/min-like); '{s.name}' is not")
        batch = cg.batch(spec.inputs)
        plan_semiring, path_steps = s, 0
        if spec.top_paths:
            plan_semiring = self._top_paths_semiring(s, spec)
            longest = max(longest_steps(cg, wrt).values(), default=1)
            path_steps = spec.top_paths * longest
            if path_steps > self.limits.max_path_steps:
                raise ResourceExhausted(f"top_paths = {spec.top_paths} could return up to {path_steps} "
                                        f"path steps ({longest} a path); the limit is max_path_steps = "
                                        f"{self.limits.max_path_steps}: ask for fewer paths")
        elif spec.best_paths:
            try:
                plan_semiring = PointerSemiring(s)
            except ValueError as e:
                raise FailedPrecondition(str(e)) from None
            path_steps = check_path_steps(cg, wrt, spec.best_paths, int(np.prod(batch.shape, dtype=np.int64)),
                                          self.limits.max_path_steps)
        seeded = tuple(sorted(seeds))
        shape = batch.shape
        for name in seeded:
            seeds[name], shape = checked_seed(cg, name, seeds[name], shape)
            cg.check_rank(shape, f"the seed for output {quoted(name)}")
        starts = start_elements(cg, wrt, shape, spec.best_paths) if spec.best_paths else None

        key = GradientPlanKey(plan_semiring.key, tuple(names), tuple(wrt), seeded, spec.return_outputs, bool(spec.best_paths or spec.top_paths),
                              compile_kind(backend), spec.retain, tuple(slot_key(slot) for slot in slots))
        compiled = cg.plans.get(key, lambda: interruptibly("compiling the gradient", compile_gradient, cg, plan_semiring, key,
                                                           backend, slots))
        if seeded:
            seed_inputs = compiled.backward.seed_inputs
            batch = Batch({**batch.arrays, **{seed_inputs[n]: seeds[n] for n in seeded if n in seed_inputs}}, shape)
        if memo is not None:
            gradients = compiled.backward.gradients
            checked = CheckedGradient(
                compiled, batch.shape,
                tuple(result_slot(x, OutputKey.gradient(x) if gradients[x] is not None else None, cg.types[x],
                                  batch.shape) for x in wrt),
                tuple(result_slot(n, OutputKey.output(n), cg.types[cg.graph.output_map[n]], batch.shape)
                      for n in names) if spec.return_outputs else (),
                check_work(compiled.plan, batch.shape, self.limits, batch.arrays))  # the same for every repeat of this signature
            cg.remembered.remember(memo, checked)
            return self.plain_gradient(checked, batch.arrays, deadline, backend)
        run = hook_run or HookRun()
        # the paths' steps are memory too: reserved beside the plan's estimate, until they are returned
        owed = self.memory.hold(path_steps * PATH_STEP_BYTES) if path_steps else 0
        try:
            paths = []
            if spec.top_paths:
                results, paths = self._top_paths(cg, compiled, s, plan_semiring, batch, deadline, backend, spec)
            else:
                results = self._run(compiled, plan_semiring, batch, deadline, backend, spec, slots, run, self.memory)
            if spec.best_paths:
                paths = interruptibly("tracing best paths", trace_best_paths, cg, compiled.backward, plan_semiring,
                                      results, batch, starts)
            if spec.best_paths or spec.top_paths:
                if s.name == "kbest":  # its own gradient: its k best values, the carrier's first k ranks
                    results = {key: (v[0] if s.k == 1 else tuple(v[:s.k])) if isinstance(v, tuple) else v
                               for key, v in results.items()}
                else:
                    results = {key: plan_semiring.value_of(v) if isinstance(v, tuple) else v for key, v in results.items()}
            result = gradient_result(cg, s, spec, compiled.backward, results, batch, wrt, names, slots, run.records)
            result.best_paths = paths
            return result
        finally:
            if owed:
                self.memory.release(owed)

    def _run(self, compiled, plan_semiring, batch, deadline, backend: str, spec: GradientSpec, slots, run: HookRun,
             memory: MemoryBudget | None):
        """The plan's results for one request (best paths read every adjoint and value: scratch,
        not results for a caller's region; memory None: the caller holds the reservation)."""
        with results_in(None) if spec.best_paths or spec.top_paths else contextlib.nullcontext(), \
                _explained(plan_semiring, spec):
            if not slots:
                return run_plan(compiled.plan, batch, deadline, backend, self.limits, memory)
            token = hooks_run.CURRENT.set(run)
            try:
                return run_plan(compiled.plan, batch, deadline, backend, self.limits, memory)
            finally:
                hooks_run.CURRENT.reset(token)

    def _top_paths(self, cg, compiled, s, plan_semiring, batch, deadline, backend: str, spec: GradientSpec):
        """(results, paths) of a top_paths request: its k-best pass pruned by the plan's learnt
        guess where the semiring allows (semiring/pruning.py), run again unpruned, under one
        memory reservation for both, when the answer does not verify. kbest's own values (every
        rank) are never pruned."""
        guess = compiled.pruning
        rho = guess.rho if plan_semiring.prunable and plan_semiring.base is s else 0.0
        with contextlib.ExitStack() as reservation:
            with _explained(plan_semiring, spec):
                reservation.enter_context(self.memory.reserved_for(
                    check_work(compiled.plan, batch.shape, self.limits, batch.arrays)))
            while True:
                with pruning.pruned(rho):
                    results = self._run(compiled, plan_semiring, batch, deadline, backend, spec, (), HookRun(), None)
                paths = interruptibly("tracing best paths", trace_top_paths, cg, compiled.backward, plan_semiring,
                                      results, batch, spec.top_paths, rho, guess)
                if paths is not None:
                    return results, paths
                telemetry.event("top_paths_unpruned_rerun")
                results = paths = None  # the pruned pass's arrays go before the unpruned pass makes its own
                rho = 0.0

    def _top_paths_semiring(self, s, spec: GradientSpec):
        """The k-best back-pointer semiring of a top_paths request over the request's semiring
        (a max- or min-ordered one; "kbest" ranks by max_product, as its values do)."""
        k = spec.top_paths
        if spec.best_paths:
            raise InvalidArgument("top_paths and best_path both given: ask for one kind of path per request")
        if not 1 <= k <= MAX_TOP_PATHS:
            raise InvalidArgument(f"top_paths must be between 1 and {MAX_TOP_PATHS}, got {k}")
        if s.name == "kbest":  # its values are the first ranks of max_product's: kept as many as either needs
            base, k = self.semirings.get("max_product", None), max(k, s.k)
        else:
            base = s
        try:
            return KBestPointerSemiring(base, k)
        except ValueError as e:
            raise FailedPrecondition(str(e)) from None

    def plain_gradient(self, checked: CheckedGradient, inputs: Mapping[str, np.ndarray], deadline: float | None,
                       backend: str) -> GradientResult:
        """The short path: a plain request whose signature passed every check before. Only its
        time bound is left to set."""
        bound = time.monotonic() + self.limits.max_request_seconds  # time_bound(), inline: no call
        owed = self.memory.hold(checked.bytes)  # hold/release, not a context manager: this is the short path
        try:
            results = checked.compiled.plan.run(inputs, bound if deadline is None else min(deadline, bound), backend,
                                                checked.shape)
        finally:
            if owed:
                self.memory.release(owed)
        result = GradientResult()
        for slots, arrays in ((checked.gradients, result.gradients), (checked.outputs, result.outputs)):
            for name, key, t, shape, dtype in slots:
                value = results[key] if key is not None else np.zeros(())
                # most results are already whole: checked here, without a call
                if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
                    value = full(value, checked.shape, t)
                arrays[name] = value
        return result


@contextlib.contextmanager
def _explained(plan_semiring, spec: GradientSpec):
    """RESOURCE_EXHAUSTED for a carrier of several arrays says how many each value counts."""
    try:
        yield
    except ResourceExhausted as e:
        if plan_semiring.components == 1:
            raise
        what = (f"top_paths = {spec.top_paths}" if spec.top_paths else
                "best paths" if spec.best_paths else f"semiring {quoted(plan_semiring.name)}")
        raise ResourceExhausted(f"{e} ({what}: {plan_semiring.components} arrays per value, each counted)",
                                e.max_items) from None
