"""Discovers hooks through the entry point group `semigrad.hooks`, each loaded in isolation
(`plugin_loader`): one that fails to load is recorded with its error and skipped."""

from __future__ import annotations

from importlib import metadata
from typing import Iterable

from ..errors import FailedPrecondition, quoted
from ..plugin_loader import PluginKind, PluginRecord, load_plugins
from .base import Hook

GROUP = "semigrad.hooks"
HOOKS = PluginKind("hook", GROUP, Hook, "semigrad_server.hooks.Hook")


class HookRecord(PluginRecord):
    @property
    def hook(self) -> Hook | None:
        return self.plugin


class HookRegistry:
    def __init__(self, entry_points: Iterable[metadata.EntryPoint] | None = None):
        self.records: list[HookRecord] = load_plugins(HOOKS, entry_points, record=HookRecord)
        self.available: dict[str, Hook] = {r.name: r.hook for r in self.records if r.status == "ok"}

    def get(self, name: str) -> Hook:
        if name not in self.available:
            raise FailedPrecondition(f"unknown hook {quoted(name)}; available: {', '.join(sorted(self.available))}")
        return self.available[name]


_default: HookRegistry | None = None


def default_registry() -> HookRegistry:
    global _default
    if _default is None:
        _default = HookRegistry()
    return _default
