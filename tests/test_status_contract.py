"""The status contract under hostile input (issue 13, items 3 and 4): every client fault gets
its own status code and a message naming the input at fault, INTERNAL is left for server bugs
(with a trace id the log shares), messages stay small enough for gRPC's headers, and long work
stops at the request's deadline.

Requests are raw semigrad.v1 messages through the generated stub (or raw bytes), against a real
server on loopback; each case also checks that the server goes on serving.
"""

from __future__ import annotations

import logging
import re

import grpc
import numpy as np
import pytest
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from semigrad_server.engine import Engine
from semigrad_server.limits import Limits
from semigrad_server.service import build_server
from semigrad_server.service.status import MAX_MESSAGE_CHARS

INVALID = grpc.StatusCode.INVALID_ARGUMENT
F64, BOOL = pb.DTYPE_FLOAT64, pb.DTYPE_BOOL
TIMEOUT = 20.0


def node(id, op, *inputs, **attrs):
    return pb.Node(id=id, op=op, inputs=inputs, attrs={k: codec.attr_value(v) for k, v in attrs.items()})


def graph(inputs, nodes, outputs, op_defs=()):
    return pb.Graph(inputs=inputs, nodes=nodes, outputs=[pb.GraphOutput(name=n, node=r) for n, r in outputs],
                    op_defs=op_defs)


def inp(name, shape, dtype=F64):
    return pb.GraphInput(name=name, shape=shape, dtype=dtype)


SINE = graph([inp("x", [3])], [node("wave", "sin", "x"), node("total", "sum", "wave")], [("y", "total")])
ONES = {"x": codec.to_tensor(np.ones(3))}


@pytest.fixture(scope="module")
def stub(server_address):
    with grpc.insecure_channel(server_address) as channel:
        yield pb_grpc.GraphServiceStub(channel)


@pytest.fixture(scope="module")
def sine(stub):
    return stub.RegisterGraph(pb.RegisterGraphRequest(graph=SINE), timeout=TIMEOUT).graph_id


def refused(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=kwargs.pop("timeout", TIMEOUT), **kwargs)
    return info.value


def assert_serves(stub, sine):
    response = stub.Gradient(pb.GradientRequest(graph_id=sine, inputs=ONES), timeout=TIMEOUT)
    np.testing.assert_allclose(codec.from_tensor(response.gradients["x"]), np.cos(np.ones(3)))


# ------------------------------------------------------------------ request bytes that do not decode

GARBAGE = b"\xff\xff\xff\xff"  # a field number 0 varint with no end: not a protobuf message
BAD_UTF8 = b"\x0a\x02\xc3\x28"  # field 1 holding invalid UTF-8 (RegisterGraph: a graph that does not parse)


@pytest.mark.parametrize("data", [GARBAGE, BAD_UTF8], ids=["garbage", "bad-utf8"])
@pytest.mark.parametrize("method", ["GetGraph", "Gradient", "RegisterGraph"])
def test_undecodable_unary_request_is_invalid_argument(server_address, stub, sine, method, data):
    with grpc.insecure_channel(server_address) as channel:
        call = channel.unary_unary(f"/semigrad.v1.GraphService/{method}", request_serializer=None,
                                   response_deserializer=None)
        error = refused(call, data)
    assert error.code() == INVALID, error.details()
    assert f"semigrad.v1.{method}Request" in error.details()
    assert_serves(stub, sine)


@pytest.mark.parametrize("method", ["GradientStream", "GradientWithHooks"])
def test_undecodable_stream_message_is_invalid_argument(server_address, stub, sine, method):
    with grpc.insecure_channel(server_address) as channel:
        call = channel.stream_stream(f"/semigrad.v1.GraphService/{method}", request_serializer=None,
                                     response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            list(call(iter([GARBAGE]), timeout=TIMEOUT))
    assert info.value.code() == INVALID, info.value.details()
    assert "is not a valid semigrad.v1." in info.value.details()
    assert_serves(stub, sine)


# ------------------------------------------------------------------ long names and long messages

LONG = 20_000


def long_name_requests(sine):
    name = lambda c: c * LONG  # noqa: E731
    x3 = [inp("x", [3])]
    return {
        "graph-id": (grpc.StatusCode.NOT_FOUND, "GetGraph", pb.GetGraphRequest(graph_id=name("g"))),
        "semiring": (grpc.StatusCode.FAILED_PRECONDITION, "Gradient",
                     pb.GradientRequest(graph_id=sine, inputs=ONES, semiring=name("s"))),
        "hook": (grpc.StatusCode.FAILED_PRECONDITION, "Gradient",
                 pb.GradientRequest(graph_id=sine, inputs=ONES, hooks=[pb.HookAttachment(node="wave", hook=name("h"))])),
        "op": (INVALID, "RegisterGraph",
               pb.RegisterGraphRequest(graph=graph(x3, [node("n", name("o"), "x")], [("y", "n")]))),
        "attribute": (INVALID, "RegisterGraph",
                      pb.RegisterGraphRequest(graph=graph(x3, [node("n", "neg", "x", **{name("a"): 1})], [("y", "n")]))),
        "output": (INVALID, "Gradient", pb.GradientRequest(graph_id=sine, inputs=ONES, outputs=[name("o")])),
        "input": (INVALID, "Gradient", pb.GradientRequest(graph_id=sine, inputs={**ONES, name("i"): ONES["x"]})),
        "backend": (INVALID, "Evaluate", pb.EvaluateRequest(graph_id=sine, inputs=ONES, backend=name("b"))),
    }


@pytest.mark.parametrize("what", ["graph-id", "semiring", "hook", "op", "attribute", "output", "input", "backend"])
def test_long_name_gets_the_real_error_with_the_name_cut(stub, sine, what):
    """A 20,000-character name used to be echoed whole into the status: the client saw
    RESOURCE_EXHAUSTED "metadata size exceeds hard limit" instead of the real error."""
    code, method, request = long_name_requests(sine)[what]
    error = refused(getattr(stub, method), request)
    assert error.code() == code, error.details()
    assert len(error.details()) <= MAX_MESSAGE_CHARS
    assert f"({LONG} characters)" in error.details()  # the name, cut, says how long it was
    assert_serves(stub, sine)


class ChattyEngine(Engine):
    """An engine with a bug whose message is huge."""

    def run_evaluate(self, spec, deadline=None):
        raise RuntimeError("x" * 50_000)


@pytest.fixture(scope="module")
def chatty_server():
    server, port, _ = build_server("127.0.0.1:0", limits=Limits(), engine=ChattyEngine(Limits()))
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield pb_grpc.GraphServiceStub(channel)
    server.stop(0).wait()


def test_internal_error_has_a_trace_id_the_log_shares_and_a_bounded_message(chatty_server, caplog):
    gid = chatty_server.RegisterGraph(pb.RegisterGraphRequest(graph=SINE), timeout=TIMEOUT).graph_id
    with caplog.at_level(logging.ERROR, logger="semigrad.rpc"):
        error = refused(chatty_server.Evaluate, pb.EvaluateRequest(graph_id=gid, inputs=ONES))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert len(error.details()) <= MAX_MESSAGE_CHARS and "message cut" in error.details()
    trace = re.search(r"trace ([0-9a-f]{8})", error.details())
    assert trace, error.details()
    logged = [r for r in caplog.records if f"trace={trace.group(1)}" in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # the traceback is in the log, under the id


def test_hook_parameter_errors_name_the_hook_and_node(stub, sine):
    error = refused(stub.Gradient, pb.GradientRequest(graph_id=sine, inputs=ONES, hooks=[
        pb.HookAttachment(node="wave", hook="scale", params={"factor": pb.AttrValue()})]))
    assert error.code() == INVALID
    assert "hook 'scale' on node 'wave'" in error.details() and "'factor'" in error.details()
    assert "semiring_params" not in error.details()
