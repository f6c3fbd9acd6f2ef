"""A client that goes away while the server waits for its next stream message is CANCELLED, not a
server bug: no INTERNAL status, no ERROR log line with a traceback (alerts on INTERNAL must not fire
whenever a client disconnects mid-stream)."""

import logging
import threading
import time

import grpc
import pytest
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from semigrad_server.service.server import build_server


@pytest.fixture
def stub():
    server, port, _ = build_server("127.0.0.1:0", threads=4)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield pb_grpc.GraphServiceStub(channel)
    finally:
        channel.close()
        server.stop(None)


def _idle_requests(release: threading.Event):
    release.wait(10)
    return
    yield  # pragma: no cover - a stream that never sends


@pytest.mark.parametrize("method", ["GradientStream", "GradientWithHooks"])
def test_client_cancelling_an_idle_stream_is_not_an_internal_error(stub, caplog, method):
    caplog.set_level(logging.INFO, logger="semigrad.rpc")
    for attempt in range(3):  # how grpcio reports the cancellation to the handler varies with timing
        release = threading.Event()
        call = getattr(stub, method)(_idle_requests(release), timeout=30)
        time.sleep(0.5)  # the server's handler is now waiting for the first message
        call.cancel()
        release.set()
        with pytest.raises(grpc.RpcError) as raised:
            list(call)
        assert raised.value.code() == grpc.StatusCode.CANCELLED
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and \
                sum(f"rpc={method}" in r.getMessage() for r in caplog.records) <= attempt:
            time.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if r.name == "semigrad.rpc"]
    assert sum(f"rpc={method}" in line for line in lines) == 3, lines
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], lines
    assert not any("status=INTERNAL" in line for line in lines), lines
