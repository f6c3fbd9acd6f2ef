"""Bad input, one table row per case: each gets its gRPC status code and a message naming the
node or input at fault, and the same server answers a valid gradient request right after.

Requests are raw semigrad.v1 messages sent through the generated stub, since the client's
graph builder refuses to build most of these. Limit cases run on a second server with small
Limits. Non-finite values are not errors: they propagate as IEEE values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import grpc
import numpy as np
import pytest
import semigrad as sg
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from semigrad_server.engine import Engine
from semigrad_server.limits import Limits
from semigrad_server.service import build_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED

F64, F32, I64, BOOL = pb.DTYPE_FLOAT64, pb.DTYPE_FLOAT32, pb.DTYPE_INT64, pb.DTYPE_BOOL

SMALL = Limits(max_nodes=8, max_node_elements=1000, max_batch=16, max_request_elements=20_000, max_path_steps=100)
TIMEOUT = 10.0


# ------------------------------------------------------------------ message builders


def inp(name, shape, dtype=F64):
    return pb.GraphInput(name=name, shape=shape, dtype=dtype)


def node(id, op, *inputs, **attrs):
    return pb.Node(id=id, op=op, inputs=inputs, attrs={k: codec.attr_value(v) for k, v in attrs.items()})


def out(name, ref):
    return pb.GraphOutput(name=name, node=ref)


def graph(inputs, nodes, outputs):
    return pb.Graph(inputs=inputs, nodes=nodes, outputs=outputs)


def register(inputs, nodes, outputs):
    return lambda ctx: ("RegisterGraph", pb.RegisterGraphRequest(graph=graph(inputs, nodes, outputs)))


def t(value, dtype=None):
    return codec.to_tensor(value, dtype)


def raw(dtype, shape, data):
    return pb.Tensor(dtype=dtype, shape=shape, data=data)


# The graph most request cases run against: total = sum(xin * xin + count), square = xin * xin.
BASE = graph(
    [inp("xin", [3]), inp("count", [3], I64)],
    [node("sq", "mul", "xin", "xin"), node("shifted", "add", "sq", "count"), node("total_node", "sum", "shifted")],
    [out("total", "total_node"), out("square", "sq")],
)
GOOD_INPUTS = {"xin": np.array([1.0, 2.0, 3.0]), "count": np.array([1, 2, 3], dtype=np.int64)}

# The graph whose gradient proves the server still works after each bad case: d/dx sum(x*x) = 2x.
PROBE = graph([inp("x", [3])], [node("xx", "mul", "x", "x"), node("s", "sum", "xx")], [out("y", "s")])


def inputs(**overrides):
    """BASE's good inputs as tensors, with some replaced (a None value drops the input)."""
    values = {**{k: t(v) for k, v in GOOD_INPUTS.items()}, **overrides}
    return {k: v for k, v in values.items() if v is not None}


def evaluate(**fields):
    return lambda ctx: ("Evaluate", pb.EvaluateRequest(graph_id=ctx.base_id, **fields))


def gradient(**fields):
    return lambda ctx: ("Gradient", pb.GradientRequest(graph_id=ctx.base_id, **fields))


@dataclass
class Server:
    stub: pb_grpc.GraphServiceStub
    base_id: str

    def register(self, g: pb.Graph) -> str:
        return self.stub.RegisterGraph(pb.RegisterGraphRequest(graph=g), timeout=TIMEOUT).graph_id

    def call(self, method: str, request):
        return getattr(self.stub, method)(request, timeout=TIMEOUT)

    def assert_serves(self):
        probe = self.register(PROBE)
        x = np.array([1.0, -2.0, 0.5])
        response = self.call("Gradient", pb.GradientRequest(graph_id=probe, inputs={"x": t(x)}))
        np.testing.assert_array_equal(codec.from_tensor(response.gradients["x"]), 2 * x)


def _connect(address):
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.GraphServiceStub(channel)
    server = Server(stub, "")
    server.base_id = server.register(BASE)
    return channel, server


@pytest.fixture(scope="module")
def default_server(server_address):
    channel, server = _connect(server_address)
    yield server
    channel.close()


@pytest.fixture(scope="module")
def small_server():
    """A second server with small limits."""
    grpc_server, port, _ = build_server("127.0.0.1:0", limits=SMALL)
    grpc_server.start()
    channel, server = _connect(f"127.0.0.1:{port}")
    yield server
    channel.close()
    grpc_server.stop(0).wait()


# ------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Case:
    id: str
    request: Callable  # Server -> (method name, request message)
    code: grpc.StatusCode
    names: tuple[str, ...]  # each must appear in the status message (the node, input, output... at fault)
    server: str = "default"  # or "small": the server with SMALL limits


def chain(length):
    return [node(f"link{i}", "neg", "x" if i == 0 else f"link{i - 1}") for i in range(length)]


def wide_graph_gradient(ctx):
    """A plain gradient within the batch limit (16 items) whose backward pass holds several
    1000-element values per item: more than 20000 elements."""
    gid = ctx.register(graph([inp("wide", [1000])], [node("n1", "sin", "wide"), node("n2", "sin", "n1")],
                             [out("y", "n2")]))
    return "Gradient", pb.GradientRequest(graph_id=gid, inputs={"wide": t(np.ones((16, 1000)))})


def probe_batch(batch):
    def make(ctx):
        gid = ctx.register(PROBE)
        return "Evaluate", pb.EvaluateRequest(graph_id=gid, inputs={"x": t(np.ones((batch, 3)))})

    return make


X3 = [inp("x", [3])]
X6 = [inp("x", [6])]

CASES = [
    # --- graph structure
    Case("cycle", register(X3, [node("loop_a", "neg", "loop_b"), node("loop_b", "neg", "loop_a")],
                           [out("y", "loop_a")]), INVALID, ("loop_a", "loop_b")),
    Case("self-loop", register(X3, [node("ouroboros", "add", "x", "ouroboros")], [out("y", "ouroboros")]),
         INVALID, ("ouroboros",)),
    Case("unknown-op", register(X3, [node("culprit", "frobnicate", "x")], [out("y", "culprit")]),
         INVALID, ("culprit", "frobnicate")),
    Case("arity-too-few", register(X3, [node("culprit", "add", "x")], [out("y", "culprit")]), INVALID, ("culprit",)),
    Case("arity-too-many", register(X3, [node("culprit", "neg", "x", "x")], [out("y", "culprit")]),
         INVALID, ("culprit",)),
    Case("arity-variadic-empty", register(X3, [node("culprit", "concat")], [out("y", "culprit")]),
         INVALID, ("culprit",)),
    Case("unknown-reference", register(X3, [node("culprit", "neg", "ghost")], [out("y", "culprit")]),
         INVALID, ("culprit", "ghost")),
    Case("duplicate-node-node", register(X3, [node("twin", "neg", "x"), node("twin", "exp", "x")], [out("y", "twin")]),
         INVALID, ("twin",)),
    Case("duplicate-node-input", register([inp("clash", [3]), inp("z", [3])], [node("clash", "neg", "z")],
                                          [out("y", "clash")]), INVALID, ("clash",)),
    Case("duplicate-input-input", register([inp("clash", [3]), inp("clash", [3])], [node("n", "neg", "clash")],
                                           [out("y", "n")]), INVALID, ("clash",)),
    Case("no-outputs", register(X3, [node("n", "neg", "x")], []), INVALID, ("output",)),
    Case("output-unknown-reference", register(X3, [node("n", "neg", "x")], [out("result", "ghost")]),
         INVALID, ("result", "ghost")),
    Case("duplicate-output", register(X3, [node("n", "neg", "x")], [out("result", "n"), out("result", "x")]),
         INVALID, ("result",)),
    Case("graph-input-bad-dtype", register([inp("weird", [3], 99)], [node("n", "neg", "weird")], [out("y", "n")]),
         INVALID, ("weird",)),
    Case("graph-input-negative-dim", register([inp("weird", [-3])], [node("n", "neg", "weird")], [out("y", "n")]),
         INVALID, ("weird",)),
    # --- shapes and dtypes
    Case("add-shape-mismatch", register([inp("p", [3]), inp("q", [4])], [node("culprit", "add", "p", "q")],
                                        [out("y", "culprit")]), INVALID, ("culprit",)),
    Case("matmul-inner-dims", register([inp("p", [2, 3]), inp("q", [4, 2])], [node("culprit", "matmul", "p", "q")],
                                       [out("y", "culprit")]), INVALID, ("culprit",)),
    Case("where-condition-not-bool", register(X3, [node("culprit", "where", "x", "x", "x")], [out("y", "culprit")]),
         INVALID, ("culprit",)),
    Case("scatter-index-mismatch",
         register([inp("x", [2])], [node("culprit", "scatter_index", "x", index=codec.index_list((slice(0, 3),)),
                                         shape=[5])], [out("y", "culprit")]), INVALID, ("culprit",)),
    Case("elementwise-op-without-bool-kernel",
         register([inp("flag", [3], BOOL)], [node("culprit", "sub", "flag", "flag")], [out("y", "culprit")]),
         INVALID, ("culprit",)),
    # --- attributes
    Case("attr-missing-required", register(X6, [node("culprit", "reshape", "x")], [out("y", "culprit")]),
         INVALID, ("culprit", "shape")),
    Case("attr-wrong-kind", register(X6, [node("culprit", "reshape", "x", shape=2.5)], [out("y", "culprit")]),
         INVALID, ("culprit", "shape")),
    Case("attr-wrong-kind-bool", register(X6, [node("culprit", "sum", "x", keepdims=1)], [out("y", "culprit")]),
         INVALID, ("culprit", "keepdims")),
    Case("attr-unknown", register(X6, [node("culprit", "neg", "x", colour=1)], [out("y", "culprit")]),
         INVALID, ("culprit", "colour")),
    Case("attr-without-value", register(X6, [pb.Node(id="culprit", op="reshape", inputs=["x"],
                                                     attrs={"shape": pb.AttrValue()})], [out("y", "culprit")]),
         INVALID, ("culprit", "shape")),
    Case("axis-out-of-range-sum", register(X6, [node("culprit", "sum", "x", axes=[3])], [out("y", "culprit")]),
         INVALID, ("culprit",)),
    Case("axis-out-of-range-concat", register(X6, [node("culprit", "concat", "x", "x", axis=1)], [out("y", "culprit")]),
         INVALID, ("culprit",)),
    Case("axis-out-of-range-stack", register(X6, [node("culprit", "stack", "x", axis=-3)], [out("y", "culprit")]),
         INVALID, ("culprit",)),
    Case("perm-not-a-permutation", register([inp("x", [3, 2])], [node("culprit", "transpose", "x", perm=[0, 0])],
                                            [out("y", "culprit")]), INVALID, ("culprit",)),
    Case("bad-reshape-size", register(X6, [node("culprit", "reshape", "x", shape=[4, 2])], [out("y", "culprit")]),
         INVALID, ("culprit",)),
    Case("bad-reshape-two-unknowns", register(X6, [node("culprit", "reshape", "x", shape=[-1, -1])],
                                              [out("y", "culprit")]), INVALID, ("culprit",)),
    Case("index-out-of-range", register(X3, [node("culprit", "index", "x", index=codec.index_list((5,)))],
                                        [out("y", "culprit")]), INVALID, ("culprit",)),
    Case("const-bytes-mismatch", register(X3, [node("konst", "const", value=raw(F64, [3], b"\0" * 16)),
                                               node("n", "add", "x", "konst")], [out("y", "n")]),
         INVALID, ("konst",)),
    Case("const-dtype-unspecified", register(X3, [node("konst", "const", value=raw(pb.DTYPE_UNSPECIFIED, [3], b"\0" * 24))],
                                             [out("y", "konst")]), INVALID, ("konst",)),
    # --- request tensors and inputs
    Case("input-bytes-mismatch", evaluate(inputs=inputs(xin=raw(F64, [3], b"\0" * 8))), INVALID, ("xin",)),
    Case("input-dtype-unspecified", evaluate(inputs=inputs(xin=raw(pb.DTYPE_UNSPECIFIED, [3], b"\0" * 24))),
         INVALID, ("xin",)),
    Case("input-missing", evaluate(inputs=inputs(count=None)), INVALID, ("count",)),
    Case("input-unknown-name", evaluate(inputs=inputs(stranger=t(np.ones(3)))), INVALID, ("stranger",)),
    Case("input-wrong-dtype-float", evaluate(inputs=inputs(xin=t(np.ones(3, np.float32)))), INVALID, ("xin",)),
    Case("input-wrong-dtype-int", gradient(inputs=inputs(count=t(np.ones(3)))), INVALID, ("count",)),
    Case("input-wrong-shape", evaluate(inputs=inputs(xin=t(np.ones(4)))), INVALID, ("xin",)),
    Case("input-too-few-dims", gradient(inputs=inputs(xin=t(np.float64(1.0)))), INVALID, ("xin",)),
    Case("batch-dims-do-not-broadcast",
         evaluate(inputs=inputs(xin=t(np.ones((2, 3))), count=t(np.ones((5, 3), np.int64)))),
         INVALID, ("xin", "count")),
    # --- request names
    Case("unknown-graph-evaluate", lambda ctx: ("Evaluate", pb.EvaluateRequest(graph_id="gnosuchgraph", inputs=inputs())),
         NOT_FOUND, ("gnosuchgraph",)),
    Case("unknown-graph-gradient", lambda ctx: ("Gradient", pb.GradientRequest(graph_id="gnosuchgraph", inputs=inputs())),
         NOT_FOUND, ("gnosuchgraph",)),
    Case("unknown-graph-get", lambda ctx: ("GetGraph", pb.GetGraphRequest(graph_id="gnosuchgraph")),
         NOT_FOUND, ("gnosuchgraph",)),
    Case("unknown-output-evaluate", evaluate(inputs=inputs(), outputs=["nonesuch"]), INVALID, ("nonesuch",)),
    Case("unknown-node-evaluate", evaluate(inputs=inputs(), nodes=["nonesuch"]), INVALID, ("nonesuch",)),
    Case("unknown-output-gradient", gradient(inputs=inputs(), outputs=["nonesuch"]), INVALID, ("nonesuch",)),
    Case("unknown-wrt", gradient(inputs=inputs(), wrt=["nonesuch"]), INVALID, ("nonesuch",)),
    Case("wrt-int-input", gradient(inputs=inputs(), wrt=["count"]), INVALID, ("count",)),
    # --- seeds
    Case("seed-wrong-shape", gradient(inputs=inputs(), outputs=["square"], seeds={"square": t(np.ones(4))}),
         INVALID, ("square",)),
    Case("seed-wrong-dtype", gradient(inputs=inputs(), outputs=["square"], seeds={"square": t(np.ones(3, np.int64))}),
         INVALID, ("square",)),
    Case("seed-bytes-mismatch", gradient(inputs=inputs(), seeds={"square": raw(F64, [3], b"")}), INVALID, ("square",)),
    Case("seed-for-undifferentiated-output",
         gradient(inputs=inputs(), outputs=["square"], seeds={"total": t(np.float64(1.0))}), INVALID, ("total",)),
    Case("seed-batch-dims-do-not-broadcast",
         gradient(inputs=inputs(xin=t(np.ones((2, 3)))), seeds={"square": t(np.ones((5, 3)))}), INVALID, ("square",)),
    # --- limits
    Case("over-node-limit", register(X3, chain(9), [out("y", "link8")]), EXHAUSTED, ("9 nodes",), "small"),
    Case("input-over-element-limit", register([inp("big", [1001])], [node("n", "neg", "big")], [out("y", "n")]),
         EXHAUSTED, ("big",), "small"),
    Case("node-over-element-limit", register([inp("p", [40]), inp("q", [40, 1])], [node("culprit", "add", "p", "q")],
                                             [out("y", "culprit")]), EXHAUSTED, ("culprit",), "small"),
    Case("const-over-element-limit", register(X3, [node("konst", "const", value=t(np.zeros(1001)))],
                                              [out("y", "konst")]), EXHAUSTED, ("konst",), "small"),
    Case("element-count-past-int64", register([inp("vast", [2**32, 2**32])], [node("n", "neg", "vast")],
                                              [out("y", "n")]), EXHAUSTED, ("vast",)),
    Case("reshape-count-wrapping-int64",  # 3486784401 * 4398639364219998291 == 3 (mod 2**64)
         register(X3, [node("culprit", "reshape", "x", shape=[3486784401, 4398639364219998291])],
                  [out("y", "culprit")]), INVALID, ("culprit",)),
    Case("batch-over-limit", probe_batch(17), EXHAUSTED, ("17",), "small"),
    Case("request-over-work-limit", wide_graph_gradient, EXHAUSTED, ("would compute", "16 batch items"), "small"),
    # lists bounded by their length before any is read (3 M `wrt` names ran 3.2 s past a deadline)
    Case("wrt-longer-than-any-graph", gradient(wrt=["x"] * 9), INVALID, ("'wrt'", "max_nodes = 8"), "small"),
    Case("outputs-longer-than-any-graph", gradient(outputs=["y"] * 9), INVALID, ("'outputs'", "max_nodes = 8"), "small"),
    Case("more-best-paths-than-steps", gradient(semiring="max_product", best_paths=[pb.ElementRef(input="x", index=[0])] * 101),
         EXHAUSTED, ("101 best paths", "max_path_steps = 100"), "small"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input(request, case):
    server = request.getfixturevalue("small_server" if case.server == "small" else "default_server")
    method, message = case.request(server)
    with pytest.raises(grpc.RpcError) as info:
        server.call(method, message)
    error = info.value
    assert error.code() == case.code, error.details()
    for name in case.names:
        assert name in error.details(), f"{name!r} not named in {error.details()!r}"
    server.assert_serves()


def test_limit_cases_pass_below_the_limits(small_server):
    """The small server's limits are what the limit rows hit: just under them, the same requests work."""
    gid = small_server.register(graph(X3, chain(8), [out("y", "link7")]))
    small_server.call("Evaluate", pb.EvaluateRequest(graph_id=gid, inputs={"x": t(np.ones((16, 3)))}))
    small_server.register(graph([inp("big", [1000])], [node("n", "neg", "big")], [out("y", "n")]))
    gid = small_server.register(graph([inp("wide", [1000])], [node("n1", "neg", "wide")], [out("y", "n1")]))
    small_server.call("Gradient", pb.GradientRequest(graph_id=gid, inputs={"wide": t(np.ones((6, 1000)))}))


def test_every_default_case_passes_on_good_input(default_server):
    """The base graph and inputs the request rows corrupt are themselves fine."""
    response = default_server.call("Gradient", pb.GradientRequest(
        graph_id=default_server.base_id, inputs=inputs(), seeds={"square": t(np.ones(3))}))
    np.testing.assert_array_equal(codec.from_tensor(response.gradients["xin"]), 2 * 2 * GOOD_INPUTS["xin"])


# ------------------------------------------------------------------ non-finite values are not errors


def test_non_finite_values_propagate(client):
    g = sg.Graph()
    x = g.input("x", (4,))
    g.output("log", sg.log(x))
    g.output("inv", 1.0 / x)
    f = client.register(g)
    x = np.array([-1.0, 0.0, np.inf, np.nan])
    values = f.evaluate({"x": x})
    np.testing.assert_array_equal(values["log"], [np.nan, -np.inf, np.inf, np.nan])  # log(-1) = nan
    np.testing.assert_array_equal(values["inv"], [-1.0, np.inf, 0.0, np.nan])  # 1/0 = inf
    # d log(x)/dx = 1/x; d (1/x)/dx = -1/x**2
    np.testing.assert_array_equal(f.gradient({"x": x}, outputs="log")["x"], [-1.0, np.inf, 0.0, np.nan])
    np.testing.assert_array_equal(f.gradient({"x": x}, outputs="inv")["x"], [-1.0, -np.inf, -0.0, np.nan])


def test_non_finite_item_does_not_spoil_the_batch(client):
    g = sg.Graph()
    x = g.input("x", (2,))
    g.output("y", sg.sum(x * x))
    f = client.register(g)
    batch = np.array([[1.0, 2.0], [np.nan, 1.0], [np.inf, -3.0]])
    grads, outputs = f.gradient({"x": batch}, return_outputs=True)
    np.testing.assert_array_equal(outputs["y"], [5.0, np.nan, np.inf])
    np.testing.assert_array_equal(grads["x"], [[2.0, 4.0], [np.nan, 2.0], [np.inf, -6.0]])


# ------------------------------------------------------------------ INTERNAL errors


class ExplodingEngine(Engine):
    """An engine with a bug: evaluating with an input named 'detonate' raises a plain exception."""

    def run_evaluate(self, spec, deadline=None):
        if "detonate" in spec.inputs:
            raise RuntimeError("injected fault")
        return super().run_evaluate(spec, deadline)


def test_unexpected_exception_is_internal_and_server_keeps_serving():
    grpc_server, port, _ = build_server("127.0.0.1:0", limits=Limits(), engine=ExplodingEngine(Limits()))
    grpc_server.start()
    try:
        channel, server = _connect(f"127.0.0.1:{port}")
        with channel:
            for _ in range(3):  # more than once: the failing call must not wedge a worker
                with pytest.raises(grpc.RpcError) as info:
                    server.call("Evaluate", pb.EvaluateRequest(graph_id=server.base_id,
                                                               inputs=inputs(detonate=t(np.ones(1)))))
                assert info.value.code() == grpc.StatusCode.INTERNAL
                assert "injected fault" in info.value.details()
                server.assert_serves()
            response = server.call("Evaluate", pb.EvaluateRequest(graph_id=server.base_id, inputs=inputs()))
            np.testing.assert_array_equal(codec.from_tensor(response.outputs["square"]), GOOD_INPUTS["xin"] ** 2)
    finally:
        grpc_server.stop(0).wait()


def test_client_raises_the_matching_error_class(client):
    """Through semigrad.Client the same failures arrive as SemigradError subclasses carrying the code."""
    g = sg.Graph()
    x = g.input("xin", (3,))
    g.output("y", sg.sum(x * x))
    f = client.register(g)
    with pytest.raises(sg.InvalidArgument) as info:
        f.evaluate({"xin": np.ones(4)})
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "xin" in info.value.message
    with pytest.raises(sg.NotFound) as info:
        client.get_graph("gnosuchgraph")
    assert info.value.code == grpc.StatusCode.NOT_FOUND and "gnosuchgraph" in info.value.message
    np.testing.assert_array_equal(f.gradient({"xin": [1.0, 2.0, 3.0]})["xin"], [2.0, 4.0, 6.0])
