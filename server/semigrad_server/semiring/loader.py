"""Discovers semirings through the entry point group `semigrad.semirings`.

Each entry point is loaded in isolation (as flake8 and stevedore do): one that fails to
import, is not a semiring, clashes with another's name or fails the axiom self-check is
recorded with its error and skipped, and the server keeps working with the rest.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Iterable, Mapping

from ..errors import FailedPrecondition, InvalidArgument
from .base import API_VERSION, Semiring
from .checker import check_axioms

GROUP = "semigrad.semirings"
log = logging.getLogger("semigrad.plugins")


@dataclass(frozen=True)
class PluginRecord:
    name: str  # the semiring's name (the entry point's name when it failed to load)
    entry_point: str  # "module:attr"
    distribution: str
    version: str
    status: str  # "ok" or "failed"
    error: str = ""
    semiring: Semiring | None = None


def _load(ep: metadata.EntryPoint, seed: int) -> PluginRecord:
    dist = ep.dist.name if ep.dist is not None else ""
    version = ep.dist.version if ep.dist is not None else ""

    def failed(message: str) -> PluginRecord:
        log.warning("semiring plugin '%s' (%s %s) skipped: %s", ep.name, dist, version, message)
        return PluginRecord(ep.name, ep.value, dist, version, "failed", message)

    try:
        obj = ep.load()
        semiring = obj() if isinstance(obj, type) else obj
    except Exception as e:  # a plugin's import error must not take the server down
        return failed(f"cannot load: {type(e).__name__}: {e}")
    if not isinstance(semiring, Semiring):
        return failed(f"{ep.value} is not a semigrad_server.semiring.Semiring")
    if semiring.api_version != API_VERSION:
        return failed(f"plugin API version {semiring.api_version}; this server speaks {API_VERSION}")
    if semiring.name != ep.name:
        return failed(f"entry point is named '{ep.name}' but the semiring calls itself '{semiring.name}'")
    try:
        problems = check_axioms(semiring, seed=seed)
    except Exception as e:
        return failed(f"axiom self-check crashed: {type(e).__name__}: {e}")
    if problems:
        return failed("axiom self-check: these laws do not hold: " + "; ".join(problems))
    return PluginRecord(semiring.name, ep.value, dist, version, "ok", "", semiring)


class SemiringRegistry:
    """The semirings a server offers, and every plugin it tried to load."""

    def __init__(self, entry_points: Iterable[metadata.EntryPoint] | None = None, seed: int = 0):
        if entry_points is None:
            entry_points = metadata.entry_points(group=GROUP)
        self.records: list[PluginRecord] = []
        self.available: dict[str, Semiring] = {}
        for ep in sorted(entry_points, key=lambda e: (e.name, e.value)):
            record = _load(ep, seed)
            if record.status == "ok" and record.name in self.available:
                record = PluginRecord(record.name, record.entry_point, record.distribution, record.version,
                                      "failed", f"another plugin already provides semiring '{record.name}'")
            self.records.append(record)
            if record.status == "ok":
                self.available[record.name] = record.semiring
        self._configured: dict[tuple, Semiring] = {}
        self._lock = threading.Lock()

    def get(self, name: str, params: Mapping[str, object] | None = None) -> Semiring:
        """The semiring `name` configured with `params`; FAILED_PRECONDITION if not available."""
        name = name or "real"
        if not params and name in self.available:
            return self.available[name]
        if name not in self.available:
            failed = [r.name for r in self.records if r.status != "ok" and r.name == name]
            why = " (its plugin failed to load: see ListSemirings)" if failed else ""
            raise FailedPrecondition(f"unknown semiring '{name}'{why}; available: {', '.join(sorted(self.available))}")
        params = dict(params or {})
        key = (name, tuple(sorted((k, repr(v)) for k, v in params.items())))
        with self._lock:
            if key not in self._configured:
                try:
                    self._configured[key] = self.available[name].configure(params)
                except (ValueError, TypeError) as e:
                    raise InvalidArgument(f"semiring '{name}': {e}") from None
            return self._configured[key]


_default: SemiringRegistry | None = None


def default_registry() -> SemiringRegistry:
    global _default
    if _default is None:
        _default = SemiringRegistry()
    return _default
