"""Whose request this is: the tenant every graph id of the current request is scoped by.

The service sets it once per call (from the caller's credentials); the engine reads it wherever a
request names a graph. The anonymous tenant "" is the one of a server without authentication."""

from __future__ import annotations

import contextvars

ANONYMOUS = ""

_TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("semigrad_tenant", default=ANONYMOUS)


def current() -> str:
    return _TENANT.get()


def enter(tenant: str) -> None:
    """Make `tenant` current for the rest of this context (the service runs each call in a context of its own)."""
    _TENANT.set(tenant)

