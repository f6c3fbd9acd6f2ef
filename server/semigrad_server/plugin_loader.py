"""Plugins found through entry points, each loaded in isolation (as flake8's plugins/finder.py
and stevedore do).

An entry point that fails to import, names something that is not of its kind, carries another
name than the entry point's, repeats a name already loaded, or fails its kind's own checks is
recorded with the reason, its distribution and version, logged and skipped; the others load.
Semirings (`semiring.loader`) and hooks (`hooks.loader`) are both loaded here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Iterable, TypeVar

log = logging.getLogger("semigrad.plugins")


@dataclass(frozen=True)
class PluginKind:
    """What an entry point group holds."""

    name: str  # "semiring", "hook": in messages
    group: str  # the entry point group
    base: type  # every plugin is an instance of it (an entry point may name a subclass)
    base_path: str  # how plugin authors import `base`, for messages


@dataclass(frozen=True)
class PluginRecord:
    """One entry point and what became of it."""

    name: str  # the entry point's name, which a loaded plugin carries too
    entry_point: str  # "module:attr"
    distribution: str
    version: str
    status: str  # "ok" or "failed"
    error: str = ""
    plugin: Any = None  # the loaded plugin, None when it failed


Record = TypeVar("Record", bound=PluginRecord)


def load_entry_point(ep: metadata.EntryPoint) -> Any:
    """The object an entry point names, instantiated (with no arguments) when it is a class."""
    obj = ep.load()
    return obj() if isinstance(obj, type) else obj


def load_plugins(kind: PluginKind, entry_points: Iterable[metadata.EntryPoint] | None = None, *,
                 check: Callable[[Any], str] | None = None,
                 record: type[Record] = PluginRecord) -> list[Record]:
    """A record for every entry point (default: those installed in `kind.group`), by name.

    `check(plugin)` returns why a plugin that loaded may not be used ("" when it may); it runs
    after the common checks. Of two plugins with one name, the first by entry point value loads.
    """
    if entry_points is None:
        entry_points = metadata.entry_points(group=kind.group)
    records: list[Record] = []
    loaded: set[str] = set()
    for ep in sorted(entry_points, key=lambda e: (e.name, e.value)):
        distribution = ep.dist.name if ep.dist is not None else ""
        version = ep.dist.version if ep.dist is not None else ""
        plugin, error = _load(kind, ep, check)
        if not error and ep.name in loaded:
            error = f"another plugin already provides {kind.name} '{ep.name}'"
        if error:
            log.warning("%s plugin '%s' (%s %s) skipped: %s", kind.name, ep.name, distribution, version, error)
            records.append(record(ep.name, ep.value, distribution, version, "failed", error))
        else:
            loaded.add(ep.name)
            records.append(record(ep.name, ep.value, distribution, version, "ok", "", plugin))
    return records


def _load(kind: PluginKind, ep: metadata.EntryPoint, check: Callable[[Any], str] | None) -> tuple[Any, str]:
    """The plugin, or None and why it cannot be used."""
    try:
        plugin = load_entry_point(ep)
    except Exception as e:  # a plugin's import error must not take the server down
        return None, f"cannot load: {type(e).__name__}: {e}"
    if not isinstance(plugin, kind.base):
        return None, f"{ep.value} is not a {kind.base_path}"
    if plugin.name != ep.name:
        return None, f"entry point is named '{ep.name}' but the {kind.name} calls itself '{plugin.name}'"
    error = check(plugin) if check is not None else ""
    return (None, error) if error else (plugin, "")
