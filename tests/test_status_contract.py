"""The status contract under hostile input (issue 13, items 3 and 4): every client fault gets
its own status code and a message naming the input at fault, INTERNAL is left for server bugs
(with a trace id the log shares), messages stay small enough for gRPC's headers, and long work
stops at the request's deadline.

Requests are raw semigrad.v1 messages through the generated stub (or raw bytes), against a real
server on loopback; each case also checks that the server goes on serving.
"""

from __future__ import annotations

import logging
import os
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


# ------------------------------------------------------------------ client faults that were INTERNAL

R32 = [1] * 32


def register_refusal(stub, g: pb.Graph) -> grpc.RpcError:
    return refused(stub.RegisterGraph, pb.RegisterGraphRequest(graph=g))


RANK_GRAPHS = {  # graph, the name the message must give
    "input-rank-33": (graph([inp("deep", [1] * 33)], [node("n", "neg", "deep")], [("y", "n")]), "'deep'"),
    "input-rank-64": (graph([inp("deep", [1] * 64)], [node("n", "neg", "deep")], [("y", "n")]), "'deep'"),
    "reshape-to-40": (graph([inp("x", [1])], [node("culprit", "reshape", "x", shape=[1] * 40)], [("y", "culprit")]),
                      "'culprit'"),
    "broadcast-to-33": (graph([inp("x", R32)], [node("culprit", "broadcast_to", "x", shape=[1] * 33)],
                              [("y", "culprit")]), "'culprit'"),
    "stack-past-32": (graph([inp("x", R32)], [node("culprit", "stack", "x", "x")], [("y", "culprit")]), "'culprit'"),
    "const-rank-40": (graph([inp("x", [1])], [node("culprit", "const", value=codec.to_tensor(np.zeros([1] * 40)))],
                            [("y", "culprit")]), "'culprit'"),
}


@pytest.mark.parametrize("case", RANK_GRAPHS, ids=str)
def test_a_graph_of_rank_past_32_is_invalid_argument(stub, sine, case):
    g, name = RANK_GRAPHS[case]
    error = register_refusal(stub, g)
    assert error.code() == INVALID, error.details()
    assert name in error.details() and "32" in error.details()
    assert_serves(stub, sine)


HUGE = [0, 2**62, 4]  # no element, yet larger than any NumPy array may be ("array is too big")
UNHOLDABLE_GRAPHS = {  # graph, the name the message must give (found by tests/hostile)
    "input": (graph([inp("empty", HUGE)], [node("n", "neg", "empty")], [("y", "n")]), "'empty'"),
    "input-transposed": (graph([inp("empty", [2**62, 0])], [node("n", "neg", "empty")], [("y", "n")]), "'empty'"),
    "broadcast-to": (graph([inp("x", [1, 4])], [node("culprit", "broadcast_to", "x", shape=HUGE)], [("y", "culprit")]),
                     "'culprit'"),
}


@pytest.mark.parametrize("case", UNHOLDABLE_GRAPHS, ids=str)
def test_a_graph_with_a_shape_no_array_can_have_is_invalid_argument(stub, sine, case):
    g, name = UNHOLDABLE_GRAPHS[case]
    error = register_refusal(stub, g)
    assert error.code() == INVALID, error.details()
    assert name in error.details() and "larger than any array" in error.details()
    assert_serves(stub, sine)


def test_request_tensors_and_batches_past_rank_32_are_invalid_argument(stub, sine):
    wide = stub.RegisterGraph(pb.RegisterGraphRequest(graph=graph(
        [inp("x", [1])], [node("deep", "reshape", "x", shape=[1] * 31), node("s", "sum", "deep"),
                          node("flat", "neg", "x")], [("y", "s"), ("v", "flat")])), timeout=TIMEOUT).graph_id
    requests = [  # (request, the name the message must give)
        (pb.EvaluateRequest(graph_id=sine, inputs={"x": codec.to_tensor(np.ones([1] * 32 + [3]))}), "'x'"),
        (pb.GradientRequest(graph_id=sine, inputs={"x": codec.to_tensor(np.ones([1] * 40 + [3]))}), "'x'"),
        (pb.GradientRequest(graph_id=wide, inputs={"x": codec.to_tensor(np.ones([2, 2, 1]))}), "'x'"),  # 2 + 31
        (pb.GradientRequest(graph_id=wide, outputs=["v"], inputs={"x": codec.to_tensor(np.ones([1]))},
                            seeds={"v": codec.to_tensor(np.ones([2, 2, 1]))}), "'v'"),  # 2 + 31 again
    ]
    for request, name in requests:
        method = stub.Evaluate if isinstance(request, pb.EvaluateRequest) else stub.Gradient
        error = refused(method, request)
        assert error.code() == INVALID, error.details()
        assert name in error.details() and "32" in error.details()
    assert_serves(stub, sine)


@pytest.mark.parametrize("op", ["sqrt", "exp", "sin", "log", "tanh", "pow"])
def test_bool_operands_of_float_ops_are_refused_at_registration(stub, sine, op):
    """NumPy computes sqrt(bool) in float16 and pow(bool, bool) in int8, dtypes the service does
    not carry: the graph is refused, naming the node and op, instead of failing as INTERNAL."""
    operands = ("flag", "flag") if op == "pow" else ("flag",)
    error = register_refusal(stub, graph([inp("flag", [3], BOOL)], [node("culprit", op, *operands)],
                                         [("y", "culprit")]))
    assert error.code() == INVALID, error.details()
    assert "'culprit'" in error.details() and f"'{op}'" in error.details() and "bool" in error.details()
    assert_serves(stub, sine)


def test_bool_operands_still_work_where_numpy_keeps_a_carried_dtype(stub):
    """add(bool, int64) is int64 and mul(bool, bool) bool: those stay accepted."""
    g = graph([inp("flag", [3], BOOL), inp("n", [3], pb.DTYPE_INT64)],
              [node("both", "mul", "flag", "flag"), node("count", "add", "flag", "n")], [("b", "both"), ("c", "count")])
    response = stub.RegisterGraph(pb.RegisterGraphRequest(graph=g), timeout=TIMEOUT)
    types = {t.id: t.dtype for t in response.types}
    assert types["both"] == BOOL and types["count"] == pb.DTYPE_INT64


@pytest.mark.parametrize("digits", [310, 1990])
def test_a_huge_integer_literal_in_a_custom_op_is_invalid_argument(stub, sine, digits):
    g = graph([inp("x", [3])], [node("n", "grow", "x")], [("y", "n")],
              op_defs=[pb.OpDef(name="grow", operands=["x"], expression="x * " + "9" * digits)])
    error = register_refusal(stub, g)
    assert error.code() == INVALID, error.details()
    assert "'grow'" in error.details() and "literal" in error.details()
    assert_serves(stub, sine)


@pytest.mark.parametrize("hook, param, value", [
    ("noise", "seed", float("inf")), ("noise", "seed", float("nan")), ("noise", "seed", -1), ("noise", "seed", 2.5),
    ("noise", "std", -1.0), ("noise", "std", float("inf")), ("scale", "factor", "three"), ("clip", "max", "high"),
    ("clip_norm", "max_norm", -1.0)])
def test_bad_hook_parameters_are_invalid_argument_naming_hook_node_and_parameter(stub, sine, hook, param, value):
    error = refused(stub.Gradient, pb.GradientRequest(graph_id=sine, inputs=ONES, hooks=[
        pb.HookAttachment(node="wave", hook=hook, params={param: codec.attr_value(value)})]))
    assert error.code() == INVALID, error.details()
    assert f"hook '{hook}' on node 'wave'" in error.details() and f"'{param}'" in error.details()
    assert_serves(stub, sine)


# Graphs whose node `moved` is computed by a structural op from `wave`: the adjoint of `moved`
# reaches `wave` through the structural op's own adjoint (reshape, transpose, scatter, ...).
X23 = [inp("x", [2, 3])]
MOVED = {
    "reshape": node("moved", "reshape", "wave", shape=[6]),
    "transpose": node("moved", "transpose", "wave"),
    "index": node("moved", "index", "wave", index=codec.index_list((0,))),
    "concat": node("moved", "concat", "wave", "wave"),
    "max": node("moved", "max", "wave", axes=[1]),
    "mean": node("moved", "mean", "wave"),
    "broadcast": node("moved", "broadcast_to", "wave", shape=[4, 2, 3]),
}


@pytest.mark.parametrize("semiring", ["kbest", "entropy"])
@pytest.mark.parametrize("kind", ["post", "pre"])
@pytest.mark.parametrize("moved", MOVED, ids=str)
def test_server_hooks_work_on_tuple_carriers(stub, semiring, kind, moved):
    """kbest carries k arrays, entropy two: a hook's value flowing into a structural op's adjoint
    failed with "'tuple' object has no attribute 'reshape'". An identity hook (scale 1) leaves the
    gradient as it is, and the record hook returns what it saw."""
    gid = stub.RegisterGraph(pb.RegisterGraphRequest(graph=graph(
        X23, [node("wave", "sin", "x"), MOVED[moved], node("total", "sum", "moved")], [("y", "total")])),
        timeout=TIMEOUT).graph_id
    x = {"x": codec.to_tensor(np.linspace(0.1, 1.2, 6).reshape(2, 3))}
    plain = stub.Gradient(pb.GradientRequest(graph_id=gid, inputs=x, semiring=semiring), timeout=TIMEOUT)
    for hook in ("scale", "record"):
        hooked = stub.Gradient(pb.GradientRequest(graph_id=gid, inputs=x, semiring=semiring, hooks=[
            pb.HookAttachment(node="moved", hook=hook, kind=kind)]), timeout=TIMEOUT)
        np.testing.assert_array_equal(codec.from_tensor(hooked.gradients["x"]), codec.from_tensor(plain.gradients["x"]))
        if hook == "record":
            assert hooked.records[f"moved/{kind}"].tensors


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="needs a writable /dev/shm")
@pytest.mark.parametrize("shape", [[0, 2**62, 4], [1] * 67, [1] * 33], ids=["too-big", "rank-67", "rank-33"])
def test_shared_memory_tensors_of_impossible_shapes_are_invalid_argument(stub, sine, shape):
    """Inline, these shapes were INVALID_ARGUMENT already; through shared memory they were INTERNAL."""
    from semigrad.shared_memory import Region

    region = Region(1 << 16)
    try:
        tensor = pb.Tensor(dtype=F64, shape=shape, shared=pb.SharedMemoryRef(region=region.name, offset=64,
                                                                               capability=region.capability))
        for inline in (False, True):
            if inline:
                tensor = pb.Tensor(dtype=F64, shape=shape, data=b"")
            error = refused(stub.Gradient, pb.GradientRequest(graph_id=sine, inputs={"x": tensor}))
            assert error.code() == INVALID, error.details()
            assert "'x'" in error.details()
    finally:
        region.close()
    assert_serves(stub, sine)
