"""The client makes a unary call again when its stream broke in transit (gRPC's own transport
messages), up to BROKEN_STREAM_ATTEMPTS, and never when a server answered with a status."""

from __future__ import annotations

import grpc
import pytest
from semigrad import transport
from semigrad.errors import SemigradError


class Failure(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class Stub:
    """A stand-in for the generated stub: fails `failures` times with `error`, then answers."""

    def __init__(self, failures: int, error: Failure):
        self.failures, self.error, self.calls = failures, error, 0

    def ListOps(self, request, timeout=None, metadata=None):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "answer"


def make(stub) -> transport.Transport:
    t = transport.Transport("127.0.0.1:1", timeout=1, options=None, max_message_bytes=1 << 20, credentials=None,
                            shared_memory=False, shared_memory_threshold=1)
    t.stub = stub
    return t


BROKEN = Failure(grpc.StatusCode.UNKNOWN, "Stream removed (Data frame with END_STREAM flag received)")


def test_a_broken_stream_is_retried_up_to_the_limit(monkeypatch):
    monkeypatch.setattr(transport, "BROKEN_STREAM_BACKOFF", 0.0)
    stub = Stub(transport.BROKEN_STREAM_ATTEMPTS - 1, BROKEN)
    assert make(stub).call("ListOps", None) == "answer" and stub.calls == transport.BROKEN_STREAM_ATTEMPTS
    stub = Stub(transport.BROKEN_STREAM_ATTEMPTS, BROKEN)
    with pytest.raises(SemigradError, match="Stream removed"):
        make(stub).call("ListOps", None)
    assert stub.calls == transport.BROKEN_STREAM_ATTEMPTS


@pytest.mark.parametrize("error", [Failure(grpc.StatusCode.INTERNAL, "internal error (trace 1f): KeyError: 'x'"),
                                   Failure(grpc.StatusCode.UNKNOWN, "Exception calling application: boom"),
                                   Failure(grpc.StatusCode.INVALID_ARGUMENT, "Stream removed")])
def test_a_servers_status_is_not_retried(error):
    stub = Stub(1, error)
    with pytest.raises(SemigradError):
        make(stub).call("ListOps", None)
    assert stub.calls == 1


def test_targets_naming_several_servers_are_balanced():
    assert "round_robin" in transport.service_config("dns:///semigrad.example:50051")
    assert "round_robin" in transport.service_config("ipv4:127.0.0.1:1,127.0.0.1:2")
    assert "round_robin" not in transport.service_config("127.0.0.1:50051")
