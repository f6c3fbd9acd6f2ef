"""Executables compiled from a graph: the scalar program when the graph is small enough,
else the tensor plan. Both answer `run(inputs, deadline) -> {output key: value}`, keyed as the
compile asked (any hashable: a name, or an OutputKey when one plan returns several kinds)."""

from __future__ import annotations

import math
import time
from typing import Hashable, Mapping, Sequence

import numpy as np

from ..errors import DeadlineExceeded
from ..ir import Graph, Node, Type
from ..ops import Registry
from ..errors import FailedPrecondition
from .codegen import compile_program, const_table, functions
from .jit import JitProgram
from .plan import Plan
from .scalarize import NotScalarizable, ScalarProgram, scalarize

# auto: scalar program when the graph has one (JIT for batches once compiled), else tensor.
BACKENDS = ("auto", "tensor", "scalar", "jit")
JIT_MIN_BATCH = 256
HOT_SINGLE_CALLS = 64


class ScalarExecutable:
    """Runs a scalar program: over floats for one point, over batch rows otherwise."""

    backend = "scalar"

    def __init__(self, program: ScalarProgram, semiring=None):
        self.program = program
        self.semiring = semiring
        self.consts = const_table(program)
        self.floats, _ = compile_program(program, "floats")
        self.arrays, _ = compile_program(program, "arrays")
        self.float_fns = functions(program, "floats")
        self.array_fns = functions(program, "arrays")
        self.jit_refusal = "it computes in a plugin semiring" if semiring is not None else JitProgram.refusal(program)
        self.jit = JitProgram(program) if self.jit_refusal is None else None
        self.item_elements = max(1, program.n_vars)  # scalars per item: the work and memory bound
        # every variable is a row of the batch, held to the end, and the outputs are stacked into
        # arrays of their own, then copied twice into the response: the memory estimate per item
        self.item_bytes = 8 * (self.item_elements + 3 * sum(ids.size for _, _, ids in program.outputs))
        self.peak_node = ""
        self.item_operations = max(1, len(program.instrs))
        self.single_calls = 0  # counted without a lock: a lost increment only delays the JIT
        self._single_kernel = None  # the JIT kernel for a single point, once compiled

    def run(self, inputs: Mapping[str, np.ndarray], deadline: float | None = None, backend: str = "auto",
            shape: tuple[int, ...] | None = None) -> dict:
        """`shape`: the batch shape when the caller knows it (() for a single point)."""
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlineExceeded("deadline exceeded before the program ran")
        p = self.program
        if shape == ():
            if self._single_kernel is not None and backend in ("auto", "jit"):
                return self._run_single_kernel(inputs)
            leads, batch = [()] * len(p.inputs), ()
        else:
            leads = [inputs[name].shape[: inputs[name].ndim - len(item)] for name, item, _ in p.inputs]
            distinct = {lead for lead in leads if lead}
            batch = (distinct.pop() if len(distinct) == 1 else tuple(np.broadcast_shapes(*distinct))) if distinct else ()
        if backend == "jit" or (backend == "auto" and self.jit is not None and self._jit_pays(batch)):
            result = self._run_jit(inputs, leads, batch, force=backend == "jit", until=deadline)
            if result is not None:
                return result
        if not batch:
            flat = [inputs[name].reshape(-1).tolist() for name, _, _ in p.inputs]
            if self.semiring is None:
                try:
                    values = self.floats(flat, self.consts, self.float_fns)
                except (ArithmeticError, ValueError):  # IEEE inf/NaN cases: rerun with NumPy semantics
                    values = None
                if values is not None:
                    return {name: np.array(vals, dtype=np.float64 if not vals else None).reshape(shape)
                            for (name, shape, _), vals in zip(p.outputs, values)}
            rows = [np.asarray(inputs[name]).reshape(-1, 1) for name, _, _ in p.inputs]
            with np.errstate(all="ignore"):
                return self._assemble(self.arrays(rows, self.consts, self.array_fns), (), single=True)
        n = math.prod(batch)
        rows = []
        for (name, shape, ids), lead in zip(p.inputs, leads):
            value = inputs[name]
            if not lead:
                rows.append(value.reshape(-1).tolist())
            else:
                full = np.broadcast_to(value, batch + shape).reshape(n, ids.size)
                rows.append(np.ascontiguousarray(full.T))
        with np.errstate(all="ignore"):
            values = self.arrays(rows, self.consts, self.array_fns)
        return self._assemble(values, batch)

    def _jit_pays(self, batch: tuple) -> bool:
        """Batches from JIT_MIN_BATCH items; single points once the graph is hot (a compile
        costs 0.1-3 s of a core, so not for a graph evaluated a few times)."""
        if batch:
            return math.prod(batch) >= JIT_MIN_BATCH
        self.single_calls += 1
        return self.single_calls >= HOT_SINGLE_CALLS

    def _run_jit(self, inputs, leads, batch: tuple, force: bool, until: float | None = None):
        if self.jit is None:
            if force:
                raise FailedPrecondition(f"the jit backend cannot run this graph: {self.jit_refusal}")
            return None
        pattern = tuple(bool(lead) for lead in leads)
        kernel = self.jit.kernel(pattern, until) if force else self.jit.ready_kernel(pattern)
        if kernel is None:
            return None  # compiling in the background; NumPy rows serve meanwhile
        if not batch:
            self._single_kernel = kernel
            return self._run_single_kernel(inputs)
        n = math.prod(batch) or 1
        arrays = []
        for (name, shape, ids), lead in zip(self.program.inputs, leads):
            value = inputs[name]
            if lead and lead != batch:
                value = np.broadcast_to(value, batch + shape)
            if not value.flags.c_contiguous:
                value = np.ascontiguousarray(value)
            rows = value.reshape(n if lead else 1, ids.size)  # a new view: read-only for the kernel's
            rows.flags.writeable = False  # one compiled signature, leaving the caller's array alone
            arrays.append(rows)
        outs = kernel.run(arrays, n)
        return {name: out.reshape(batch + shape) for (name, shape, _), out in zip(self.program.outputs, outs)}

    def _run_single_kernel(self, inputs) -> dict:
        arrays = []
        for name, _, ids in self.program.inputs:
            row = inputs[name].reshape(1, ids.size)  # a new C-contiguous view (or copy): read-only for
            row.setflags(write=False)  # the kernel's one compiled signature, the caller's array untouched
            arrays.append(row)
        outs = self._single_kernel.run(arrays, 1)
        return {name: out.reshape(shape) for (name, shape, _), out in zip(self.program.outputs, outs)}

    def _assemble(self, values, batch: tuple, single: bool = False) -> dict:
        out = {}
        carried = self.semiring is not None and self.semiring.components > 1
        for (name, shape, ids), vals, semiring_value in zip(self.program.outputs, values,
                                                             self.program.semiring_outputs):
            if carried and semiring_value:
                parts = zip(*(self.semiring.components_of(v) for v in vals))
                out[name] = tuple(_stack(list(c), batch, shape, single) for c in parts)
            else:
                out[name] = _stack(list(vals), batch, shape, single)
        return out


def _stack(vals: list, batch: tuple, shape: tuple, single: bool) -> np.ndarray:
    """Element values (each a batch row, or a number when it does not depend on the batch)
    into one array of shape batch + shape."""
    if single:
        return np.stack(np.broadcast_arrays(*vals), axis=-1).reshape(shape) if vals else np.zeros(shape)
    n = int(np.prod(batch))
    if not vals:
        return np.zeros(batch + shape)
    rows = [np.broadcast_to(v, (n,)) for v in vals]
    return np.stack(rows, axis=-1).reshape(batch + shape)


def compile_executable(graph: Graph, nodes: Sequence[Node], types: Mapping[str, Type],
                       outputs: Sequence[tuple[Hashable, str]], *, registry: Registry, attrs: Mapping[str, dict],
                       map_components: frozenset = frozenset(), semiring_values: frozenset = frozenset(),
                       semiring=None, backend: str = "auto", scratch: frozenset = frozenset()):
    """The scalar program when the graph has one (and `backend` allows), else the tensor plan.
    `semiring_values`: the nodes holding semiring values (a tuple carrier returns them as tuples);
    `map_components`: those of them computed by structural ops, which map over the components;
    `scratch`: outputs read by the server alone, never returned (Plan)."""
    if backend != "tensor":
        try:
            program = scalarize(graph, nodes, types, outputs, registry, attrs, semiring, semiring_values,
                                only_if_narrow=backend == "auto")
            executable = ScalarExecutable(program, semiring)
            # every variable lives to the end: the largest value is what a request is refused for
            executable.peak_node = max(nodes, key=lambda n: types[n.id].size).id if nodes else ""
            return executable
        except NotScalarizable as e:
            if backend in ("scalar", "jit"):
                raise FailedPrecondition(f"the {backend} backend cannot run this graph: {e}") from None
    widths = {ref: semiring.components for ref in semiring_values} if semiring is not None else {}
    return Plan(graph, nodes, types, outputs, registry=registry, attrs=attrs, map_components=map_components,
                widths=widths, scratch=scratch)
