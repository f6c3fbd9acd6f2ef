"""Discovers hooks through the entry point group `semigrad.hooks`, each loaded in isolation:
one that fails to load is recorded with its error and skipped."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata
from typing import Iterable

from ..errors import FailedPrecondition
from .base import Hook

GROUP = "semigrad.hooks"
log = logging.getLogger("semigrad.plugins")


@dataclass(frozen=True)
class HookRecord:
    name: str
    entry_point: str
    distribution: str
    status: str
    error: str = ""
    hook: Hook | None = None


class HookRegistry:
    def __init__(self, entry_points: Iterable[metadata.EntryPoint] | None = None):
        if entry_points is None:
            entry_points = metadata.entry_points(group=GROUP)
        self.records: list[HookRecord] = []
        self.available: dict[str, Hook] = {}
        for ep in sorted(entry_points, key=lambda e: e.name):
            dist = ep.dist.name if ep.dist is not None else ""
            try:
                obj = ep.load()
                hook = obj() if isinstance(obj, type) else obj
                if not isinstance(hook, Hook):
                    raise TypeError(f"{ep.value} is not a semigrad_server.hooks.Hook")
                if hook.name != ep.name:
                    raise ValueError(f"entry point '{ep.name}' names a hook called '{hook.name}'")
            except Exception as e:  # a plugin's failure must not take the server down
                log.warning("hook plugin '%s' skipped: %s", ep.name, e)
                self.records.append(HookRecord(ep.name, ep.value, dist, "failed", f"{type(e).__name__}: {e}"))
                continue
            self.records.append(HookRecord(ep.name, ep.value, dist, "ok", "", hook))
            self.available.setdefault(ep.name, hook)

    def get(self, name: str) -> Hook:
        if name not in self.available:
            raise FailedPrecondition(f"unknown hook '{name}'; available: {', '.join(sorted(self.available))}")
        return self.available[name]


_default: HookRegistry | None = None


def default_registry() -> HookRegistry:
    global _default
    if _default is None:
        _default = HookRegistry()
    return _default
