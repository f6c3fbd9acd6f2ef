"""A call's log line quotes what the client sent: a graph id holding a newline (or spaces, or
terminal escapes) must not forge log lines or fields of its own in the default text format."""

import logging

import grpc
import pytest
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from semigrad_server.service.server import build_server

FORGED = "x status=OK ms=0.1\n2026-01-01 00:00:00,000 ERROR 1 semigrad.server FORGED\x1b[2J"


def test_graph_id_in_the_log_line_cannot_forge_lines_or_fields(caplog):
    caplog.set_level(logging.INFO, logger="semigrad.rpc")
    server, port, _ = build_server("127.0.0.1:0", threads=2)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as raised:
                pb_grpc.GraphServiceStub(channel).GetGraph(pb.GetGraphRequest(graph_id=FORGED), timeout=10)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        server.stop(None)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rpc=GetGraph")]
    assert len(lines) == 1, lines
    line = lines[0]
    assert "\n" not in line and "\x1b" not in line, line
    assert len(FORGED) < 80
    assert line.startswith(f"rpc=GetGraph graph={FORGED!r} status=NOT_FOUND "), line  # the client's text quoted


def test_a_plain_graph_id_is_logged_as_it_is(caplog):
    caplog.set_level(logging.INFO, logger="semigrad.rpc")
    server, port, _ = build_server("127.0.0.1:0", threads=2)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError):
                pb_grpc.GraphServiceStub(channel).GetGraph(pb.GetGraphRequest(graph_id="g0123abcd"), timeout=10)
    finally:
        server.stop(None)
    assert any(r.getMessage().startswith("rpc=GetGraph graph=g0123abcd status=NOT_FOUND") for r in caplog.records)
