"""How a call ended, as its client saw it (service/call_end.py). The race it exists for cannot be
ordered from outside a real server (a client cancelling an idle stream: gRPC may end the stream's
request iterator as on a half-close, then record the cancellation a moment later), so these tests
play gRPC's side of it with a stand-in context that keeps the call state as grpc._server does
(`_state.client`: "cancelled" once the client cancelled) and runs its termination callbacks when
told. test_operations covers the same through a real server, where the race shows rarely."""

from __future__ import annotations

import contextvars
import types

import pytest

from semigrad_server.service.call_end import when_ended

SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="-")


class Call:
    """The ServicerContext methods call_end reads, and gRPC's termination."""

    def __init__(self, remaining: float = 30.0):
        self._state = types.SimpleNamespace(client="open")
        self.active, self.remaining, self.callbacks = True, remaining, []

    def is_active(self) -> bool:
        return self.active

    def time_remaining(self) -> float:
        return self.remaining

    def add_callback(self, callback) -> bool:
        if not self.active:
            return False
        self.callbacks.append(callback)
        return True

    def end(self, client: str, remaining: float | None = None) -> None:
        self._state.client, self.active = client, False
        if remaining is not None:
            self.remaining = remaining
        for callback in self.callbacks:
            callback()


def reported(call: Call) -> list:
    got = []
    when_ended(call, lambda ending: got.append((ending, SEEN.get())))
    return got


@pytest.mark.parametrize("client,remaining,ending", [
    ("cancelled", 30.0, "CANCELLED"),  # the client cancelled after its request stream had ended
    ("cancelled", 0.0, "DEADLINE_EXCEEDED"),  # gRPC ended it at its deadline
    ("closed", 30.0, None),  # it half-closed: the call ends as its handler did
])
def test_a_call_its_handler_ended_is_reported_when_grpc_has_ended_it(client, remaining, ending):
    call = Call()
    SEEN.set("the call's request id")
    got = reported(call)
    SEEN.set("another call's")
    assert got == []  # not before gRPC has decided
    call.end(client, remaining)
    assert got == [(ending, "the call's request id")]  # in the call's contextvars, once


@pytest.mark.parametrize("remaining,ending", [(30.0, "CANCELLED"), (0.01, "DEADLINE_EXCEEDED")])
def test_a_call_that_ended_before_its_handler_is_reported_at_once(remaining, ending):
    call = Call()
    call.end("cancelled", remaining)
    assert [e for e, _ in reported(call)] == [ending]
