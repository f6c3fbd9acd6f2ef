"""Executables compiled from a graph: the scalar program when the graph is small enough,
else the tensor plan. Both answer `run(inputs, deadline) -> {output name: value}`."""

from __future__ import annotations

import time
from typing import Mapping, Sequence

import numpy as np

from ..errors import DeadlineExceeded
from ..ir import Graph, Node, Type
from ..ops import Registry
from .codegen import compile_program, const_table, functions
from .plan import Plan
from .scalarize import NotScalarizable, ScalarProgram, scalarize

BACKENDS = ("auto", "tensor", "scalar")


class ScalarExecutable:
    """Runs a scalar program: over floats for one point, over batch rows otherwise."""

    backend = "scalar"

    def __init__(self, program: ScalarProgram, semiring=None):
        self.program = program
        self.semiring = semiring
        self.consts = const_table(program)
        self.floats, self.source = compile_program(program, "floats")
        self.arrays, _ = compile_program(program, "arrays")
        self.float_fns = functions("floats", semiring)
        self.array_fns = functions("arrays", semiring)
        self.item_elements = max(1, program.value_elements)

    def run(self, inputs: Mapping[str, np.ndarray], deadline: float | None = None) -> dict:
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlineExceeded("deadline exceeded before the program ran")
        p = self.program
        leads = [inputs[name].shape[: inputs[name].ndim - len(shape)] for name, shape, _ in p.inputs]
        batch = tuple(np.broadcast_shapes(*leads)) if leads else ()
        if not batch:
            flat = [inputs[name].reshape(-1).tolist() for name, _, _ in p.inputs]
            if self.semiring is None:
                try:
                    values = self.floats(flat, self.consts, self.float_fns)
                except (ArithmeticError, ValueError):  # IEEE inf/NaN cases: rerun with NumPy semantics
                    values = None
                if values is not None:
                    return {name: np.array(vals, dtype=np.result_type(*vals) if vals else np.float64).reshape(shape)
                            for (name, shape, _), vals in zip(p.outputs, values)}
            rows = [np.asarray(inputs[name]).reshape(-1, 1) for name, _, _ in p.inputs]
            with np.errstate(all="ignore"):
                return self._assemble(self.arrays(rows, self.consts, self.array_fns), (), single=True)
        n = int(np.prod(batch))
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

    def _assemble(self, values, batch: tuple, single: bool = False) -> dict:
        out = {}
        for (name, shape, ids), vals in zip(self.program.outputs, values):
            if self.semiring is not None and self.semiring.components > 1:
                parts = zip(*(self.semiring.components_of(v) for v in vals))
                out[name] = tuple(_stack(list(c), batch, shape, single) for c in parts)
            else:
                out[name] = _stack(list(vals), batch, shape, single)
        return out


def _stack(vals: list, batch: tuple, shape: tuple, single: bool) -> np.ndarray:
    if not vals:
        return np.zeros(batch + shape)
    stacked = np.stack(np.broadcast_arrays(*vals), axis=-1)
    if single:
        return stacked.reshape(shape)
    return stacked.reshape(batch + shape) if stacked.ndim > 0 else stacked


def compile_executable(graph: Graph, nodes: Sequence[Node], types: Mapping[str, Type],
                       outputs: Sequence[tuple[str, str]], *, registry: Registry, attrs: Mapping[str, dict],
                       map_components: frozenset = frozenset(), semiring=None, backend: str = "auto"):
    """The scalar program when the graph has one (and `backend` allows), else the tensor plan."""
    if backend in ("auto", "scalar"):
        try:
            program = scalarize(graph, nodes, types, outputs, registry, attrs, semiring)
            return ScalarExecutable(program, semiring)
        except NotScalarizable:
            if backend == "scalar":
                raise
    return Plan(graph, nodes, types, outputs, registry=registry, attrs=attrs, map_components=map_components)
