"""How a call ended as its client saw it, for the metrics (calls.py) and the log lines (servicer.py):
by its handler, or early, by its client (CANCELLED) or its deadline (DEADLINE_EXCEEDED)."""

from __future__ import annotations

import contextvars
from typing import Callable

DEADLINE_SKEW = 0.05  # seconds: a call that ended this close to its deadline ended by the deadline
_GRPC_CANCELLED = "cancelled"  # grpc._server's mark on a call its client cancelled


def ended_early(context) -> str | None:
    """CANCELLED or DEADLINE_EXCEEDED for a call that has ended before its handler did (the client
    cancelled or went away, or its deadline passed: gRPC stops taking a stream's responses then),
    None for one still going."""
    if not hasattr(context, "is_active") or context.is_active():
        return None
    return _early(context)


def _early(context) -> str:
    remaining = context.time_remaining()
    return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= DEADLINE_SKEW else "CANCELLED"


def _cancelled(context) -> bool:
    """Whether a call that has ended was ended by its client (or its deadline) rather than by its
    handler's status. gRPC's synchronous API has no public question for this once a call is over
    (is_active() is False either way), so this reads the call state's `client` field; False on a
    gRPC without it."""
    state = getattr(context, "_state", None)
    return getattr(state, "client", None) == _GRPC_CANCELLED


def when_ended(context, report: Callable[[str | None], None]) -> None:
    """Call `report(ending)` once the call has ended, in the caller's contextvars (tenant, request
    id): `ending` is CANCELLED or DEADLINE_EXCEEDED for a call its client or deadline ended, None for
    one its handler ended.

    For a call still open when its request stream has ended this waits for the end: a client that
    cancels a stream while sending nothing races gRPC's own bookkeeping (the stream's request
    iterator ends as when the client half-closes, and the cancellation is recorded a moment
    later), so a report made at once would call a cancelled stream OK."""
    early = ended_early(context)
    if early is not None or not hasattr(context, "add_callback"):
        report(early)
        return
    scope = contextvars.copy_context()

    def ended():
        scope.run(report, _early(context) if _cancelled(context) else None)

    if not context.add_callback(ended):  # it ended meanwhile
        ended()
