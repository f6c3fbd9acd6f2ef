"""The one entry-point loader behind semiring and hook discovery: each entry point loads in
isolation, and whatever fails (import, kind, name, a repeated name, the kind's own checks) is
recorded with its reason while the others load."""

from __future__ import annotations

from importlib import metadata

import pytest
from semigrad_server.hooks.base import Hook
from semigrad_server.hooks.loader import GROUP as HOOK_GROUP
from semigrad_server.hooks.loader import HookRegistry
from semigrad_server.semiring.loader import GROUP as SEMIRING_GROUP
from semigrad_server.semiring.loader import SemiringRegistry
from semigrad_server.semiring.real import RealSemiring


class Halve(Hook):
    name = "halve"


class HalveAgain(Hook):
    name = "halve"


class NotAHook:
    name = "plain"


class Doubling(RealSemiring):
    name = "doubling"


class FutureDoubling(RealSemiring):
    name = "future"
    api_version = 99


def entry_points(group: str, *pairs: tuple[str, str]) -> list[metadata.EntryPoint]:
    """Entry points (name, attribute of this module or "module:attribute") of `group`."""
    return [metadata.EntryPoint(name, value if ":" in value else f"{__name__}:{value}", group)
            for name, value in pairs]


def test_hooks_load_in_isolation_and_failures_say_why():
    registry = HookRegistry(entry_points(
        HOOK_GROUP, ("halve", "HalveAgain"), ("plain", "NotAHook"), ("renamed", "Halve"),
        ("missing", "semigrad_no_such_module:Thing"), ("halve", "Halve")))
    assert [(r.name, r.entry_point, r.status) for r in registry.records] == [
        ("halve", f"{__name__}:Halve", "ok"), ("halve", f"{__name__}:HalveAgain", "failed"),
        ("missing", "semigrad_no_such_module:Thing", "failed"), ("plain", f"{__name__}:NotAHook", "failed"),
        ("renamed", f"{__name__}:Halve", "failed")]
    errors = [r.error for r in registry.records]
    assert errors[1] == "another plugin already provides hook 'halve'"
    assert errors[2].startswith("cannot load: ModuleNotFoundError") and "semigrad_no_such_module" in errors[2]
    assert errors[3] == f"{__name__}:NotAHook is not a semigrad_server.hooks.Hook"
    assert errors[4] == "entry point is named 'renamed' but the hook calls itself 'halve'"
    assert type(registry.get("halve")) is Halve and registry.records[0].hook is registry.get("halve")
    assert all(r.hook is None for r in registry.records[1:])


def test_semirings_load_in_isolation_with_their_own_checks():
    registry = SemiringRegistry(entry_points(
        SEMIRING_GROUP, ("halve", "Halve"), ("future", "FutureDoubling"), ("doubling", "Doubling")))
    assert {r.name: (r.status, r.error) for r in registry.records} == {
        "doubling": ("ok", ""),
        "future": ("failed", "plugin API version 99; this server speaks 1"),
        "halve": ("failed", f"{__name__}:Halve is not a semigrad_server.semiring.Semiring"),
    }
    assert list(registry.available) == ["doubling"] and registry.records[0].semiring is registry.available["doubling"]


def test_installed_plugins_record_their_distribution_and_version():
    hooks = {r.name: r for r in HookRegistry().records}
    assert (hooks["scale"].status, hooks["scale"].distribution) == ("ok", "semigrad")
    assert hooks["scale"].version == metadata.version("semigrad")
    semirings = {r.name: r for r in SemiringRegistry().records}
    assert (semirings["maxplus"].distribution, semirings["maxplus"].version) == (
        "semigrad-logic", metadata.version("semigrad-logic"))


@pytest.mark.parametrize("registry_type", [HookRegistry, SemiringRegistry])
def test_no_entry_points_no_plugins(registry_type):
    registry = registry_type([])
    assert registry.records == [] and registry.available == {}
