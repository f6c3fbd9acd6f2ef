"""Requests as the engine takes them: typed specs, built once (from the wire by
service.convert, or from keyword arguments by Engine.evaluate/gradient).

Specs are value objects: nothing changes one after it is built. They are plain (not frozen)
slotted dataclasses because building one is on every request's path, the short path's too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np


@dataclass(frozen=True)
class HookRequest:
    """A hook attachment as a request states it."""

    node: str
    hook: str = ""
    kind: str = "post"
    params: tuple = ()  # (name, value) pairs
    client: bool = False


@dataclass(slots=True)
class EvaluateSpec:
    graph_id: str
    inputs: Mapping[str, np.ndarray]
    outputs: tuple[str, ...] = ()  # graph outputs to return; empty: all
    nodes: tuple[str, ...] = ()  # nodes (or inputs) whose values come back too
    backend: str = "auto"


@dataclass(slots=True)
class GradientSpec:
    graph_id: str
    inputs: Mapping[str, np.ndarray]
    wrt: tuple[str, ...] = ()  # empty: every float input
    outputs: tuple[str, ...] = ()  # outputs differentiated; empty: all
    seeds: Mapping[str, np.ndarray] | None = None  # cotangent per output; absent: 1̄
    return_outputs: bool = False
    semiring: str = "real"  # "" also means real (gRPC's default)
    semiring_params: Mapping[str, object] | None = None
    return_components: bool = False
    best_paths: tuple[tuple[str, tuple[int, ...]], ...] | str = ()  # (input, full element index) pairs, or "all"
    backend: str = "auto"
    retain: tuple[str, ...] = ()  # nodes whose adjoints come back too
    hooks: tuple[HookRequest, ...] = ()
    semirings: tuple[str, ...] = ()  # several semirings in one backward walk (then `semiring` is "real" or "")
    top_paths: int = 0  # the k best paths of the whole graph (k-best back-pointers)

    @property
    def is_plain(self) -> bool:
        """Real gradients with nothing beyond inputs, wrt, outputs, return_outputs and backend:
        the request most clients send, answered by the short path once its input signature
        has passed the checks (tests/test_request_specs.py holds this to the proto's fields)."""
        return self.semiring in ("real", "") and not (self.seeds or self.semiring_params or self.return_components
                                                or self.best_paths or self.retain or self.hooks
                                                or self.semirings or self.top_paths)
