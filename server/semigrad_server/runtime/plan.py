"""Compiles a graph into a flat plan: topological order, dead code removed, one kernel per
step, and every buffer released after its last use. Arrays carry any number of leading
batch dimensions; every kernel broadcasts over them (vectorised, never a loop over items).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from ..deadline import current as current_bound
from ..errors import DeadlineExceeded, InvalidArgument, ResourceExhausted
from ..ir import Graph, Node, Type
from ..ops import REGISTRY, Registry
from . import allocation
from .allocation import result_array
from .cse import common_subexpressions
from .fusion import FusedKernel, fusion_groups

MAX_FOLDED_ELEMENTS = 1 << 20  # constant-folded values larger than this are computed per request


@dataclass(frozen=True)
class Step:
    node_id: str
    kernel: Callable
    args: tuple[int, ...]
    out: int
    free: tuple[int, ...]  # slots whose last use is this step
    reuse: tuple[int, ...] = ()  # positions of operands whose buffer may hold the result (out=)
    dtype: np.dtype | None = None  # the result's dtype, for `reuse` and output regions
    # Set for the steps of ops declared elementwise whose kernel writes its result into an array
    # given as out= (see `_writes_into`): (item rank of each operand, the result's item shape).
    # Only these steps write into an output region or into a dying operand's buffer.
    into: tuple[tuple[int, ...], tuple[int, ...]] | None = None


class Plan:
    """An executable form of `graph` producing `outputs`: (key, node or input id) pairs; `run`
    returns {key: value}."""

    def __init__(self, graph: Graph, order: Sequence[Node], types: Mapping[str, Type],
                 outputs: Sequence[tuple[Hashable, str]], registry: Registry = REGISTRY,
                 attrs: Mapping[str, dict] | None = None, map_components: frozenset = frozenset()):
        """`map_components`: nodes whose first operand is a tuple of arrays; their kernel
        is applied to each component (structural ops on tuple-valued semiring values)."""
        needed = {ref for _, ref in outputs}
        live_order = []
        for node in reversed(order):
            if node.id in needed:
                live_order.append(node)
                needed.update(node.inputs)
        live_order.reverse()
        node_attrs = {node.id: attrs[node.id] if attrs is not None else
                      registry.get(node).check_node(node, [types[r] for r in node.inputs]) for node in live_order}
        live_order, same_as = common_subexpressions(live_order, node_attrs, registry)

        slots: dict[str, int] = {}
        self.input_slots = []
        for spec in graph.inputs:
            if spec.name in needed:
                slots[spec.name] = len(slots)
                self.input_slots.append((spec.name, slots[spec.name]))
        for node in live_order:
            slots[node.id] = len(slots)
        for duplicate, original in same_as.items():
            slots[duplicate] = slots[original]
        self._slot_refs = dict(slots)
        self.output_slots = [(name, slots[ref]) for name, ref in outputs]
        self.output_slot_set = frozenset(slot for _, slot in self.output_slots)
        self.n_slots = len(slots)
        self.types = {ref: types[ref] for ref in slots}
        self.item_elements = sum(t.size for t in self.types.values()) or 1
        self.heaviest = None  # (work, node id) of the costliest kernel with work beyond its result
        kernel_work = {}  # node -> work its kernel does beyond its result (an einsum's contractions)
        for node in live_order:
            work = registry.get(node).work
            if work is not None:
                work = kernel_work[node.id] = work(node_attrs[node.id], [types[r] for r in node.inputs], types[node.id])
                self.item_elements += work
                self.heaviest = max(self.heaviest or (work, node.id), (work, node.id))

        ops = {node.id: registry.get(node) for node in live_order}
        constant = set()  # nodes that depend on constants only (candidates for folding)
        for node in live_order:
            if ops[node.id].kind not in ("hook", "semiring") and all(r in constant for r in node.inputs) \
                    and types[node.id].size <= MAX_FOLDED_ELEMENTS:
                constant.add(node.id)
        # scalar operations per batch item (a matmul's inner products counted): the work bound. An op
        # that declares its kernel's work is counted by it (an einsum's contractions), not by its
        # element-level expansion's bound, which for an einsum is the product of its operands' sizes
        self.item_operations = max(1, sum(
            kernel_work[node.id] + types[node.id].size if node.id in kernel_work else
            max(ops[node.id].scalar_cost([types[r] for r in node.inputs], types[node.id]), types[node.id].size)
            for node in live_order if node.id not in constant))
        groups = fusion_groups(live_order, ops, types, kept={ref for _, ref in outputs},
                               excluded=constant | set(map_components))
        absorbed = {n.id for g in groups.values() for n in g.members if n.id != g.root}

        def kernel_of(node: Node) -> Callable:
            kernel = registry.get(node).kernel(node_attrs[node.id], [types[r] for r in node.inputs], types[node.id])
            return _per_component(kernel) if node.id in map_components else kernel

        def into(node: Node, kernel: Callable):
            """What a step needs to write its result into a given array, or None: only an op
            declared elementwise (its result has the operands' broadcast shape, and element i
            of it reads element i of each operand alone, so it may overwrite an operand) whose
            kernel writes into out=. Any other kind (matmul, reductions, indexing...) allocates."""
            if ops[node.id].kind != "elementwise" or node.id in map_components:
                return None
            in_types = [types[r] for r in node.inputs]
            if not _writes_into(kernel, in_types, types[node.id]):
                return None
            return tuple(t.rank for t in in_types), types[node.id].shape

        steps, folded = [], {}
        for node in live_order:
            if node.id in absorbed:
                continue
            group = groups.get(node.id)
            if group is not None:
                kernel = FusedKernel(group, [kernel_of(n) for n in group.members], types)
                steps.append(Step(node.id, kernel, tuple(slots[r] for r in group.leaves), slots[node.id], ()))
                continue
            kernel = kernel_of(node)
            if node.id in constant and all(slots[r] in folded for r in node.inputs):
                # Depends on constants only: computed once here (constant folding), not per request.
                try:
                    with np.errstate(all="ignore"):
                        value = kernel(*(folded[slots[r]] for r in node.inputs))
                except Exception:  # leave it to the run, which reports it against the node
                    value = None
                if isinstance(value, np.ndarray):
                    value.flags.writeable = False  # shared by every request
                    folded[slots[node.id]] = value
                    continue
            steps.append(Step(node.id, kernel, tuple(slots[r] for r in node.inputs), slots[node.id], (),
                              into=into(node, kernel)))

        last_use: dict[int, int] = {}
        for i, step in enumerate(steps):
            for slot in step.args:
                last_use[slot] = i
        keep = {slot for _, slot in self.output_slots} | set(folded)
        frees: dict[int, list[int]] = {}
        for slot, i in last_use.items():
            if slot not in keep:
                frees.setdefault(i, []).append(slot)
        self.steps = tuple(dataclasses.replace(s, free=tuple(frees.get(i, ())),
                                               reuse=_reusable_operands(s, frees.get(i, ())),
                                               dtype=np.dtype(types[s.node_id].dtype))
                           for i, s in enumerate(steps))
        self.constants = tuple((slot, value) for slot, value in folded.items()
                               if slot in {a for step in steps for a in step.args} | keep)
        self.item_bytes, self.peak_node = self._peak_bytes(types)

    def _peak_bytes(self, types: Mapping[str, Type]) -> tuple[int, str]:
        """The most bytes per batch item the run holds at once (inputs, live values, the result
        being computed; buffers freed after their last use), and the node computed at that
        moment: the memory estimate a request is checked against before it runs (with the
        response's copies of the results)."""
        size = {}
        for ref, slot in self._slot_refs.items():
            t = types[ref]
            size[slot] = max(size.get(slot, 0), t.size * np.dtype(t.dtype).itemsize)
        folded = {slot for slot, _ in self.constants}
        live = {slot for _, slot in self.input_slots}
        held = sum(size[slot] for slot in live)
        peak, at = held, self.steps[0].node_id if self.steps else ""
        for step in self.steps:
            if step.out not in live and step.out not in folded:
                live.add(step.out)
                held += size[step.out]
            if held > peak:
                peak, at = held, step.node_id
            for slot in step.free:
                if slot in live:
                    live.discard(slot)
                    held -= size[slot]
        # results computed once (constants) are spread over the batch when returned, and every
        # result is copied twice more into the response (its bytes, the message)
        results = {slot for _, slot in self.output_slots}
        spread = sum(size[slot] for slot in results & folded) + 2 * sum(size[slot] for slot in results)
        return max(peak + spread, 1), at

    def run(self, inputs: Mapping[str, np.ndarray], deadline: float | None = None,
            backend: str = "tensor", shape: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
        env: list = [None] * self.n_slots
        bound = current_bound()  # the request's, whose client may cancel
        allocating = allocation.active()  # results go where the request wants them
        for slot, value in self.constants:
            env[slot] = value
        for name, slot in self.input_slots:
            env[slot] = inputs[name]
        with np.errstate(all="ignore"):
            for i, step in enumerate(self.steps):
                # every step: a clock read is nothing beside a kernel call, and one step may be long
                if deadline is not None and time.monotonic() > deadline:
                    raise DeadlineExceeded(f"deadline exceeded at node '{step.node_id}' ({i}/{len(self.steps)} steps)")
                if bound is not None and bound.cancelled:
                    bound.check(f"at node '{step.node_id}' ({i}/{len(self.steps)} steps)")
                try:
                    if allocating and step.into is not None and step.out in self.output_slot_set:
                        args = [env[a] for a in step.args]
                        out = result_array(_result_shape(args, step), step.dtype)
                        env[step.out] = step.kernel(*args, out=out)
                        del args
                    elif step.reuse:
                        args = [env[a] for a in step.args]
                        out = _dead_buffer(args, step)
                        del args  # references of its own would defeat the check of the next step
                        env[step.out] = step.kernel(*(env[a] for a in step.args), **out)
                    else:
                        env[step.out] = step.kernel(*(env[a] for a in step.args))
                except MemoryError:
                    raise ResourceExhausted(f"node '{step.node_id}': out of memory") from None
                except (ValueError, TypeError, IndexError, ZeroDivisionError) as e:
                    raise InvalidArgument(f"node '{step.node_id}': {e}") from None
                for slot in step.free:
                    env[slot] = None
        return {name: env[slot] for name, slot in self.output_slots}


REUSE_MIN_ELEMENTS = 1 << 15  # below this, allocating is cheaper than checking


def _writes_into(kernel: Callable, in_types: Sequence[Type], out_type: Type) -> bool:
    """Whether `kernel` follows NumPy's out= convention: asked of the kernel itself, once, on
    one-element operands of the step's ranks and dtypes. It must accept out= and return that
    very array (a kernel that ignores out= or cannot take it says no)."""
    try:
        operands = [np.ones((1,) * t.rank, dtype=t.dtype) for t in in_types]
        out = np.empty((1,) * out_type.rank, dtype=out_type.dtype)
        with np.errstate(all="ignore"):
            return kernel(*operands, out=out) is out
    except Exception:  # TypeError (no out=), a casting error...: the step allocates its result
        return False


def _result_shape(args: Sequence, step: Step) -> tuple[int, ...]:
    """The shape of an `into` step's result for these operands: the broadcast of their batch
    (leading) axes, then the result's item shape."""
    ranks, item_shape = step.into
    leads = [np.shape(x)[: np.ndim(x) - rank] for x, rank in zip(args, ranks)]
    return tuple(np.broadcast_shapes(*leads)) + item_shape


def _reusable_operands(step: Step, freed: Sequence[int]) -> tuple[int, ...]:
    """Operands of an `into` step (elementwise) that die at this step (candidates for out=)."""
    if step.into is None:
        return ()
    return tuple(k for k, slot in enumerate(step.args) if slot in freed and step.args.count(slot) == 1)


def _dead_buffer(args: list, step: Step) -> dict:
    """{"out": an operand's buffer} when nothing else can see that buffer any more: it owns its
    memory, has the result's shape and dtype, and its only references are the plan's slot, the
    `args` list, this frame and getrefcount's argument (a view of it, or a caller holding it,
    would add one). Else {}: the kernel allocates."""
    for k in step.reuse:
        a = args[k]
        if (type(a) is np.ndarray and a.size >= REUSE_MIN_ELEMENTS and a.flags.owndata and a.flags.writeable
                and a.flags.c_contiguous and a.dtype == step.dtype and sys.getrefcount(a) <= 4
                and a.shape == _result_shape(args, step)):
            return {"out": a}
    return {}


def _per_component(kernel: Callable) -> Callable:
    # The first operand is the semiring value; others (gather's indices) are plain arrays.
    return lambda value, *rest: tuple(kernel(c, *rest) for c in value)
