"""Client against an in-process fake GraphService (no semigrad server involved)."""

import time

import grpc
import numpy as np
import pytest
from concurrent import futures

import semigrad
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc


class FakeService(pb_grpc.GraphServiceServicer):
    """Evaluates only graphs computing ``y = x * x``; records the last request."""

    def __init__(self):
        self.graphs, self.last = {}, None
        self.list_ops_seconds = 0.0  # how long ListOps takes

    def RegisterGraph(self, request, context):
        self.graphs["g1"] = request.graph
        x = request.graph.inputs[0]
        return pb.RegisterGraphResponse(graph_id="g1", created=True, types=[
            pb.NodeType(id=x.name, shape=x.shape, dtype=x.dtype),
            pb.NodeType(id="mul_0", shape=x.shape, dtype=x.dtype)])

    def GetGraph(self, request, context):
        if request.graph_id not in self.graphs:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown graph id {request.graph_id!r}")
        return pb.GetGraphResponse(graph_id=request.graph_id, graph=self.graphs[request.graph_id])

    def Evaluate(self, request, context):
        self.last = request
        x = codec.from_tensor(request.inputs["x"])
        return pb.EvaluateResponse(outputs={"y": codec.to_tensor(x * x)},
                                   nodes={n: codec.to_tensor(x * x) for n in request.nodes})

    def Gradient(self, request, context):
        self.last = request
        x = codec.from_tensor(request.inputs["x"])
        seed = codec.from_tensor(request.seeds["y"]) if "y" in request.seeds else 1
        outputs = {"y": codec.to_tensor(x * x)} if request.return_outputs else {}
        return pb.GradientResponse(gradients={"x": codec.to_tensor(2 * x * seed)}, outputs=outputs)

    def ListOps(self, request, context):
        time.sleep(self.list_ops_seconds)
        return pb.ListOpsResponse(ops=[pb.OpInfo(
            name="sin", arity=1, operands=["x"], kind="elementwise", expression="sin(x)",
            attrs=[pb.AttrSpec(name="a", kind="int")],
            derivatives=[pb.DerivativeRule(operand="x", formula="cos(x)")])])


@pytest.fixture
def env():
    service = FakeService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_GraphServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with semigrad.Client(f"127.0.0.1:{port}", timeout=10) as client:
        yield client, service
    server.stop(None)


def square_graph(dtype="float32"):
    g = semigrad.Graph()
    x = g.input("x", (2,), dtype)
    g.output("y", x * x)
    return g


def test_register_evaluate_gradient(env):
    client, service = env
    f = client.register(square_graph())
    assert f.id == "g1" and f.created
    assert f.types == {"x": ((2,), "float32"), "mul_0": ((2,), "float32")}
    assert f.input_specs["x"] == semigrad.TensorSpec((2,), "float32")
    assert f.output_specs == {"y": ((2,), "float32")}

    out = f.evaluate({"x": [[1, 2], [3, 4]]}, nodes="mul_0")  # batch of 2, ints converted
    assert service.last.inputs["x"].dtype == pb.DTYPE_FLOAT32
    assert list(service.last.nodes) == ["mul_0"]
    np.testing.assert_array_equal(out["y"], [[1, 4], [9, 16]])
    assert out["y"].dtype == np.float32 and set(out) == {"y", "mul_0"}

    grads = f.gradient({"x": [1.0, 2.0]}, wrt="x", seeds={"y": [1, 10]})
    assert service.last.seeds["y"].dtype == pb.DTYPE_FLOAT32 and list(service.last.wrt) == ["x"]
    np.testing.assert_array_equal(grads["x"], [2, 40])
    grads, outputs = f.gradient({"x": [3.0, 1.0]}, return_outputs=True)
    np.testing.assert_array_equal(outputs["y"], [9, 1])

    with pytest.raises(ValueError):
        f.evaluate({"x": [1, 2]}, nodes=["y"])


def test_get_graph_list_ops_and_errors(env):
    client, _ = env
    with pytest.raises(semigrad.NotFound, match="unknown graph id 'g1'") as info:
        client.get_graph("g1")
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    client.register(square_graph("float64"))
    f = client.get_graph("g1")
    assert f.input_specs == {"x": ((2,), "float64")} and not f.created
    (op,) = client.list_ops()
    assert op == semigrad.OpInfo(
        "sin", 1, ("x",), (semigrad.AttrSpec("a", "int", False, ""),), "elementwise", "sin(x)",
        (semigrad.DerivativeRule("x", "cos(x)"),), "")


def test_unavailable():
    with semigrad.Client("127.0.0.1:1", timeout=2) as client:
        with pytest.raises((semigrad.Unavailable, semigrad.DeadlineExceeded)):
            client.list_ops()


def test_a_timeout_set_on_the_client_is_the_deadline_of_later_calls(env):
    client, service = env
    service.list_ops_seconds = 1.0
    client.timeout = 0.1
    assert client.timeout == 0.1
    with pytest.raises(semigrad.DeadlineExceeded):
        client.list_ops()
    client.timeout = 10
    assert [op.name for op in client.list_ops()] == ["sin"]
