"""What hooks share during one request: records to return, and the client's hook channel."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

CURRENT: contextvars.ContextVar["HookRun"] = contextvars.ContextVar("semigrad_hook_run")


@dataclass
class HookRun:
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # "<node>/<kind>" -> name -> value
    client: Any = None  # has call(slot, payload) -> value, for hooks that run in the client


def current() -> HookRun:
    run = CURRENT.get(None)
    return run if run is not None else HookRun()
