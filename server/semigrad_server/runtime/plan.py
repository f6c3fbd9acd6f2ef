"""Compiles a graph into a flat plan: topological order, dead code removed, one kernel per
step, and every buffer released after its last use. Arrays carry any number of leading
batch dimensions; every kernel broadcasts over them (vectorised, never a loop over items).
"""

from __future__ import annotations

import dataclasses
import operator
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
                 attrs: Mapping[str, dict] | None = None, map_components: frozenset = frozenset(),
                 widths: Mapping[str, int] | None = None, scratch: frozenset = frozenset()):
        """`map_components`: nodes whose first operand is a tuple of arrays; their kernel
        is applied to each component (structural ops on tuple-valued semiring values).
        `widths`: arrays per value of the nodes holding a semiring's tuple carrier (3k for
        k-best paths); the elements, operations and bytes a run is checked against count them.
        `scratch`: outputs the server reads and never returns (every adjoint best paths follow):
        held to the end like any output, but no response copies them."""
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
        self._returned_slots = frozenset(slot for name, slot in self.output_slots if name not in scratch)
        self.n_slots = len(slots)
        self.types = {ref: types[ref] for ref in slots}
        width = self._width = {ref: w for ref, w in (widths or {}).items() if w != 1 and ref in slots}
        self.item_elements = sum(t.size * width.get(ref, 1) for ref, t in self.types.items()) or 1
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
        node_operations = {
            node.id: width.get(node.id, 1) * (
                kernel_work[node.id] + types[node.id].size if node.id in kernel_work else
                max(ops[node.id].scalar_cost([types[r] for r in node.inputs], types[node.id]), types[node.id].size))
            for node in live_order if node.id not in constant}
        self.item_operations = max(1, sum(node_operations.values()))
        # What a request's cost depends on when only some inputs carry batch axes (cost()): a
        # value made from unbatched inputs alone (a shared weight, its transpose) is computed once.
        self._node_inputs = tuple((node.id, node.inputs) for node in live_order)
        self._same_as = dict(same_as)
        self._node_extra = dict(kernel_work)
        self._node_operations = node_operations
        self._costs: dict[frozenset, PlanCost] = {}
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
        # What `run` reads of each step, in its loop: the operands by one C call (itemgetter)
        self._calls = tuple((step, step.kernel, _getter(step.args), len(step.args) == 1, step.out, step.free,
                             step.into is not None and step.out in self.output_slot_set, bool(step.reuse))
                            for step in self.steps)
        self.item_bytes, self.peak_node = self._peak_bytes(types)

    def cost(self, arrays: Mapping[str, np.ndarray]) -> "PlanCost":
        """What a run with these input arrays costs as a function of its batch items: values that
        depend on no input carrying batch axes (a weight shared by the batch, and what is made
        from it alone) are computed once, not per item (a BERT-width matmul's weight counted per
        item refused batches of 57 sentences, 10-60 times the memory they took)."""
        batched_inputs = frozenset(name for name, _ in self.input_slots
                                   if name in arrays and np.ndim(arrays[name]) > self.types[name].rank)
        cost = self._costs.get(batched_inputs)
        if cost is None:
            batched = set(batched_inputs)
            for ref, inputs in self._node_inputs:
                if any(r in batched for r in inputs):
                    batched.add(ref)
            batched.update(dup for dup, original in self._same_as.items() if original in batched)
            elements, operations = [0, 0], [0, 0]  # (per item, computed once)
            for ref, t in self.types.items():
                elements[ref not in batched] += t.size * self._width.get(ref, 1) + self._node_extra.get(ref, 0)
            for ref, n in self._node_operations.items():
                operations[ref not in batched] += n
            cost = PlanCost(tuple(elements), tuple(operations),
                            *self._byte_lines(self.types, frozenset(self._slot_refs[ref] for ref in batched)))
            if len(self._costs) < 64:
                self._costs[batched_inputs] = cost
        return cost

    def _peak_bytes(self, types: Mapping[str, Type]) -> tuple[int, str]:
        """The most bytes per batch item the run holds at once when every value is per item."""
        lines = self._byte_lines(types, None)
        k = int(np.argmax(lines[0] + lines[1]))
        return max(int(lines[0][k] + lines[1][k]), 1), lines[2][k]

    def _byte_lines(self, types: Mapping[str, Type], batched: frozenset | None):
        """The bytes the run holds at each step (inputs, live values, the result being computed;
        buffers freed after their last use), plus the response's copies of the results, as lines
        `per_item[s] × items + once[s]` (values in `batched` slots, None: all, take their item's
        bytes per item; the others once), and the node computed at each step: the memory
        estimate a request is checked against before it runs is the highest line at its items."""
        size = {}
        for ref, slot in self._slot_refs.items():
            t = types[ref]
            size[slot] = max(size.get(slot, 0), t.size * np.dtype(t.dtype).itemsize * self._width.get(ref, 1))
        per_item = {slot: batched is None or slot in batched for slot in size}
        folded = {slot for slot, _ in self.constants}
        live = {slot for _, slot in self.input_slots}
        held = [0, 0]  # (per item, once)
        for slot in live:
            held[not per_item[slot]] += size[slot]
        lines, nodes = [tuple(held)], [self.steps[0].node_id if self.steps else ""]
        for step in self.steps:
            if step.out not in live and step.out not in folded:
                live.add(step.out)
                held[not per_item[step.out]] += size[step.out]
            lines.append(tuple(held))
            nodes.append(step.node_id)
            for slot in step.free:
                if slot in live:
                    live.discard(slot)
                    held[not per_item[slot]] -= size[slot]
        # results come back with the batch's axes (a constant or shared one spread over every
        # item) and are copied twice more into the response (their bytes, the message)
        results = self._returned_slots
        spread = sum(size[slot] for slot in results & folded) + 2 * sum(size[slot] for slot in results)
        b = np.array([line[0] for line in lines], dtype=np.int64) + spread
        c = np.array([line[1] for line in lines], dtype=np.int64)
        return b, c, nodes

    def run(self, inputs: Mapping[str, np.ndarray], deadline: float | None = None,
            backend: str = "tensor", shape: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
        env: list = [None] * self.n_slots
        bound = current_bound()  # the request's, whose client may cancel
        allocating = allocation.active()  # results go where the request wants them
        for slot, value in self.constants:
            env[slot] = value
        for name, slot in self.input_slots:
            env[slot] = inputs[name]
        monotonic = time.monotonic
        with np.errstate(all="ignore"):
            for i, (step, kernel, operands, single, out, free, into_output, reuse) in enumerate(self._calls):
                # every step: a clock read is nothing beside a kernel call, and one step may be long
                if deadline is not None and monotonic() > deadline:
                    raise DeadlineExceeded(f"deadline exceeded at node '{step.node_id}' ({i}/{len(self.steps)} steps)")
                if bound is not None and bound.cancelled:
                    bound.check(f"at node '{step.node_id}' ({i}/{len(self.steps)} steps)")
                try:
                    if allocating and into_output:
                        args = [env[a] for a in step.args]
                        env[out] = kernel(*args, out=result_array(_result_shape(args, step), step.dtype))
                        del args
                    elif reuse:
                        args = [env[a] for a in step.args]
                        buffer = _dead_buffer(args, step)
                        del args  # references of its own would defeat the check of the next step
                        env[out] = kernel(*[env[a] for a in step.args], **buffer)
                    elif single:
                        env[out] = kernel(operands(env))
                    else:
                        env[out] = kernel(*operands(env))
                except MemoryError:
                    raise ResourceExhausted(f"node '{step.node_id}': out of memory") from None
                except (ValueError, TypeError, IndexError, ZeroDivisionError) as e:
                    raise InvalidArgument(f"node '{step.node_id}': {e}") from None
                for slot in free:
                    env[slot] = None
        return {name: env[slot] for name, slot in self.output_slots}


REUSE_MIN_ELEMENTS = 1 << 15  # below this, allocating is cheaper than checking


@dataclasses.dataclass(frozen=True)
class PlanCost:
    """A run's cost in batch items n: elements n·per + once, operations likewise, and bytes held at
    once max over steps s of n·byte_per_item[s] + byte_once[s] (computed at node byte_nodes[s])."""
    elements: tuple[int, int]
    operations: tuple[int, int]
    byte_per_item: np.ndarray
    byte_once: np.ndarray
    byte_nodes: list

    def bytes_at(self, items: int) -> tuple[int, str]:
        held = items * self.byte_per_item + self.byte_once
        k = int(np.argmax(held))
        return max(int(held[k]), 1), self.byte_nodes[k]

    def items_within(self, elements: int, operations: int, nbytes: int) -> int:
        """The most items whose elements, operations and bytes stay within these."""
        fits = [(limit - once) // max(per, 1) for limit, (per, once) in
                ((elements, self.elements), (operations, self.operations))]
        # a step holding nothing per item fits any number of items, or none when it is over alone
        room = np.where(self.byte_per_item > 0, (nbytes - self.byte_once) // np.maximum(self.byte_per_item, 1),
                        np.where(self.byte_once <= nbytes, np.iinfo(np.int64).max, -1))
        return int(max(0, min(*fits, int(room.min()))))


def _getter(slots: tuple[int, ...]) -> Callable:
    """env -> the operands in `slots`: the value itself for one slot, else a tuple."""
    if not slots:
        return lambda env: ()
    return operator.itemgetter(*slots)


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
