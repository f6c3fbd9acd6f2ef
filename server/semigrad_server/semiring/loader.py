"""Discovers semirings through the entry point group `semigrad.semirings`.

Each entry point is loaded in isolation (`plugin_loader`): one that fails to import, is not a
semiring, clashes with another's name, speaks another plugin API version or fails the axiom
self-check is recorded with its error and skipped, and the server keeps working with the rest.
"""

from __future__ import annotations

import threading
from importlib import metadata
from typing import Iterable, Mapping

from ..errors import FailedPrecondition, InvalidArgument, quoted
from ..plugin_loader import PluginKind, PluginRecord, load_plugins
from .base import API_VERSION, Semiring
from .checker import check_axioms
from .product import MAX_MEMBERS, ProductSemiring

GROUP = "semigrad.semirings"
MAX_CACHED_PRODUCTS = 256  # products of semiring lists kept for reuse (then the cache starts over)
SEMIRINGS = PluginKind("semiring", GROUP, Semiring, "semigrad_server.semiring.Semiring")


class SemiringRecord(PluginRecord):
    @property
    def semiring(self) -> Semiring | None:
        return self.plugin


def _unusable(semiring: Semiring, seed: int = 0) -> str:
    """Why a loaded semiring may not be served ("" when it may): another plugin API version,
    or axioms that do not hold."""
    if semiring.api_version != API_VERSION:
        return f"plugin API version {semiring.api_version}; this server speaks {API_VERSION}"
    try:
        problems = check_axioms(semiring, seed=seed)
    except Exception as e:
        return f"axiom self-check crashed: {type(e).__name__}: {e}"
    if problems:
        return "axiom self-check: these laws do not hold: " + "; ".join(problems)
    return ""


class SemiringRegistry:
    """The semirings a server offers, and every plugin it tried to load."""

    def __init__(self, entry_points: Iterable[metadata.EntryPoint] | None = None, seed: int = 0):
        self.records: list[SemiringRecord] = load_plugins(
            SEMIRINGS, entry_points, check=lambda semiring: _unusable(semiring, seed), record=SemiringRecord)
        self.available: dict[str, Semiring] = {r.name: r.semiring for r in self.records if r.status == "ok"}
        self._configured: dict[tuple, Semiring] = {}
        self._products: dict[tuple, ProductSemiring] = {}
        self._lock = threading.Lock()

    def get(self, name: str, params: Mapping[str, object] | None = None) -> Semiring:
        """The semiring `name` configured with `params`; FAILED_PRECONDITION if not available."""
        name = name or "real"
        if not params and name in self.available:
            return self.available[name]
        if name not in self.available:
            failed = [r.name for r in self.records if r.status != "ok" and r.name == name]
            why = " (its plugin failed to load: see ListSemirings)" if failed else ""
            raise FailedPrecondition(f"unknown semiring {quoted(name)}{why}; available: {', '.join(sorted(self.available))}")
        params = dict(params or {})
        key = (name, tuple(sorted((k, repr(v)) for k, v in params.items())))
        with self._lock:
            if key not in self._configured:
                try:
                    self._configured[key] = self.available[name].configure(params)
                except (ValueError, TypeError) as e:
                    raise InvalidArgument(f"semiring {quoted(name)}: {e}") from None
            return self._configured[key]


    def product(self, names, params: Mapping[str, object] | None = None) -> Semiring:
        """Several semirings computed in one backward walk: their `ProductSemiring` (one name:
        that semiring). `params` keys are "<semiring>.<parameter>" ("kbest.k")."""
        names = list(names)
        if "" in names:  # a single semiring="" is the default, real; an empty entry of a list is a slip
            raise InvalidArgument(f"semirings[{names.index('')}] is empty: name every semiring of the list "
                                  "('real' for the gradient itself)")
        if not names:
            raise InvalidArgument("the list of semirings is empty")
        if len(names) > MAX_MEMBERS:
            raise InvalidArgument(f"{len(names)} semirings requested; at most {MAX_MEMBERS} in one request")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidArgument(f"semiring {quoted(twice[0])} is requested twice")
        by_member: dict[str, dict[str, object]] = {}
        for key, value in (params or {}).items():
            member, dot, param = str(key).partition(".")
            if not dot or member not in names:
                raise InvalidArgument(f"semiring parameter {quoted(key)}: with several semirings a parameter is named "
                                      f"'<semiring>.<parameter>' for one of {', '.join(names)}")
            by_member.setdefault(member, {})[param] = value
        members = [self.get(n, by_member.get(n)) for n in names]
        if len(members) == 1:
            return members[0]
        key = tuple(m.key for m in members)
        with self._lock:
            product = self._products.get(key)
            if product is None:
                if len(self._products) >= MAX_CACHED_PRODUCTS:  # lists are the client's: bound what they keep
                    self._products.clear()
                product = self._products[key] = ProductSemiring(members)
            return product


_default: SemiringRegistry | None = None


def default_registry() -> SemiringRegistry:
    global _default
    if _default is None:
        _default = SemiringRegistry()
    return _default
