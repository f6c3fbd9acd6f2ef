"""Plain gradient requests (GradientSpec.is_plain) already checked, per registered graph: a
repeat with the same options and input signature passes the same checks, so it goes straight
to its compiled plan (the short path).

A request's memo: (wrt, outputs, return_outputs, backend, ((input name, shape, dtype), ...)),
computed by Engine.run_gradient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import ir
from ..ir import Type
from ..runtime.outputs import OutputKey

MAX_REMEMBERED_PER_GRAPH = 64


class ResultSlot(NamedTuple):
    """Where one array of a plain request's result comes from, and what it must look like."""

    name: str  # the input (gradients) or output (forward values) it is returned under
    key: OutputKey | None  # the plan result holding it; None: a gradient no path reaches (0)
    type: Type  # the declared type
    shape: tuple[int, ...]  # batch shape + the declared shape
    dtype: np.dtype


@dataclass(frozen=True)
class CheckedGradient:
    """What checking a plain request established, for its input signature."""

    compiled: object  # the CompiledGradient its plan came from
    shape: tuple[int, ...]  # the batch shape
    gradients: tuple[ResultSlot, ...]
    outputs: tuple[ResultSlot, ...]  # the forward values returned, if asked for
    bytes: int = 0  # the memory a run holds at once (check_work's estimate)


def result_slot(name: str, key: OutputKey | None, t: Type, batch_shape: tuple[int, ...]) -> ResultSlot:
    return ResultSlot(name, key, t, batch_shape + t.shape, np.dtype(ir.DTYPES[t.dtype]))


class RememberedRequests(dict):
    """{request memo: CheckedGradient}. A dict, so the short path's lookup (`get`) is one C call."""

    def __init__(self, limit: int = MAX_REMEMBERED_PER_GRAPH):
        super().__init__()
        self.limit = limit

    def remember(self, memo: tuple, checked: CheckedGradient) -> None:
        if len(self) >= self.limit:
            self.clear()
        self[memo] = checked

    def forget(self, compiled: object) -> None:
        """Drop the requests answered by `compiled` (a plan leaving the cache)."""
        for memo, checked in list(self.items()):  # a snapshot: other threads may remember meanwhile
            if checked.compiled is compiled:
                self.pop(memo, None)

