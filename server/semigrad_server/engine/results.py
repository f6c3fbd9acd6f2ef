"""What a request gets back: plan results, keyed by OutputKey, turned into arrays with the
request's full batch shape and the declared dtypes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .. import ir
from ..autodiff.reverse import BackwardGraph
from ..ir import Type
from ..ops.hook_ops import HookSlot
from ..runtime.outputs import OutputKey


@dataclass(init=False, slots=True)
class GradientResult:
    gradients: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    components: dict[str, dict[str, np.ndarray]]
    best_paths: list
    retained: dict[str, np.ndarray]
    records: dict[str, dict[str, np.ndarray]]
    semirings: dict[str, "GradientResult"]  # several semirings: each one's result, by name

    # Written out (not default factories): every short-path request builds one.
    def __init__(self, gradients=None, outputs=None, components=None, best_paths=None, retained=None, records=None,
                 semirings=None):
        self.gradients = {} if gradients is None else gradients
        self.outputs = {} if outputs is None else outputs
        self.components = {} if components is None else components
        self.best_paths = [] if best_paths is None else best_paths
        self.retained = {} if retained is None else retained
        self.records = {} if records is None else records
        self.semirings = {} if semirings is None else semirings


def gradient_result(cg, s, spec, backward: BackwardGraph, results: Mapping, batch, wrt: Sequence[str],
                    names: Sequence[str], slots: Sequence[HookSlot], records: Mapping) -> GradientResult:
    """A general gradient request's result from its plan's `results` (and the hooks' `records`):
    gradients (semiring values read back, with their components if asked), forward values,
    retained adjoints, hook records (best paths: the engine's)."""
    result = GradientResult()
    members, split = getattr(s, "members", None), getattr(s, "split", None)  # a ProductSemiring: several in one walk
    if not members and spec.semirings:  # a list of one semiring: still answered by name
        members, split = (s,), lambda value: [value]
    if members:
        result.semirings = {m.name: GradientResult() for m in members}
        parts = lambda value: zip(members, split(value), result.semirings.values())  # noqa: E731
    else:
        parts = lambda value: ((s, value, result),)  # noqa: E731
    for x in wrt:
        t = cg.types[x]
        value = results[OutputKey.gradient(x)] if backward.gradients[x] is not None else s.zeros(())
        for m, part, into in parts(value):
            if m.name == "real" and not spec.return_components:
                into.gradients[x] = full(part, batch.shape, t)
                continue
            read = read_full(m, part, batch.shape + t.shape)
            into.gradients[x] = cast(read[m.primary], t) if m.name == "real" else read[m.primary]
            if spec.return_components:
                into.components[x] = read
    if spec.return_outputs:
        result.outputs = {n: full(results[OutputKey.output(n)], batch.shape, cg.types[cg.graph.output_map[n]])
                          for n in names}
    for ref in spec.retain:
        value = results[OutputKey.adjoint(ref)] if ref in backward.adjoints else s.zeros(())
        for m, part, into in parts(value):
            into.retained[ref] = readback(m, part, batch.shape + cg.types[ref].shape)
    for slot in slots:
        recorded = records.get(slot.key)
        if recorded:
            for name, v in recorded.items():
                for m, part, into in parts(v):
                    into.records.setdefault(slot.key, {})[name] = readback(m, part, batch.shape + slot.shape)
    return result


def read_full(s, value, shape: tuple) -> dict[str, np.ndarray]:
    """A semiring value's named arrays, broadcast to the request's full shape."""
    return s.read(s.map(lambda c: c if np.shape(c) == shape else np.broadcast_to(c, shape), value))


def readback(s, value, shape: tuple) -> np.ndarray:
    """A semiring value's primary array, broadcast to the request's full shape."""
    return read_full(s, value, shape)[s.primary]


def cast(value: np.ndarray, t: Type) -> np.ndarray:
    value = np.asarray(value)
    return value if value.dtype == ir.DTYPES[t.dtype] else value.astype(t.dtype)


def full(value: np.ndarray, batch_shape: tuple, t: Type) -> np.ndarray:
    """A result with the request's full batch shape, in its declared dtype."""
    if type(value) is np.ndarray and value.dtype == ir.DTYPES[t.dtype] and value.shape == batch_shape + t.shape:
        return value  # already whole (the common case)
    value = cast(value, t)
    target = tuple(batch_shape) + t.shape
    return value if value.shape == target else np.broadcast_to(value, target)
