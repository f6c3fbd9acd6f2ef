"""Engine events (plan-cache hits, plan and graph compiles) for whoever listens: the service's
metrics. Nothing listens by default, and then an event costs one global read."""

from __future__ import annotations

from typing import Callable

_listener: Callable[[str], None] | None = None


def listen(listener: Callable[[str], None] | None) -> None:
    """Send every event name to `listener` (None: stop)."""
    global _listener
    _listener = listener


def event(name: str) -> None:
    listener = _listener
    if listener is not None:
        listener(name)
