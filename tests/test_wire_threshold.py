"""wire.THRESHOLD crossed on both sides through a real server: a request with fewer tensor
bytes than the threshold goes through protobuf as built (a message), one at the threshold
through wire.Outgoing; responses likewise are read as views from the threshold on.
Both give the closed-form gradient, bit for bit the same as the in-process client's."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg
from semigrad import wire
from semigrad.v1 import semigrad_pb2 as pb


def graph(n: int) -> sg.Graph:
    g = sg.Graph()
    x = g.input("x", (n,))
    g.output("y", sg.sum(sg.sin(x) * x))
    return g


# Below: 64 bytes short of the threshold, so that the response (the same bytes and a header of
# under 64) is below it too. At: the request's tensor bytes are the threshold exactly.
@pytest.mark.parametrize("elements,how", [((wire.THRESHOLD - 64) // 8, "message"), (wire.THRESHOLD // 8, "wire")])
def test_the_wire_threshold_on_both_sides(server_address, monkeypatch, rng, elements, how):
    remote_client = sg.Client(server_address, shared_memory=False)  # inline (the wire is what is tested)
    transport = remote_client.transport
    sent, read = [], []
    call = transport.call

    def spying_call(method, request, *rest):
        received = call(method, request, *rest)
        if method == "Gradient":
            sent.append(type(request))
            read.append(len(received._inline))  # tensors read as views of the received bytes
        return received

    monkeypatch.setattr(transport, "call", spying_call)
    x = rng.normal(size=elements)
    got = remote_client.register(graph(elements)).gradient({"x": x}, wrt="x")["x"]
    assert sent == [wire.Outgoing if how == "wire" else pb.GradientRequest]
    assert read == [1 if how == "wire" else 0]  # the response: the same bytes as the request, plus a header
    np.testing.assert_allclose(got, np.cos(x) * x + np.sin(x), rtol=1e-13, atol=1e-15)
    with sg.Client() as local:
        assert np.array_equal(got, local.register(graph(elements)).gradient({"x": x}, wrt="x")["x"])
    remote_client.close()


def two_inputs(n: int) -> sg.Graph:
    g = sg.Graph()
    x, y = g.input("x", (n,)), g.input("y", (n,))
    g.output("z", sg.sin(x) * y)
    return g


# The server's side: a request of wire.THRESHOLD tensor bytes or more is read by wire.Reader (its
# tensors views of the received bytes), a response as large is written by wire.Outgoing.
@pytest.mark.parametrize("elements", [(wire.THRESHOLD - 256) // 16, wire.THRESHOLD // 8])
def test_evaluate_and_seeded_gradients_either_side_of_the_threshold(server_address, rng, elements):
    with sg.Client(server_address, shared_memory=False) as remote:
        g = remote.register(two_inputs(elements))
        x, y, seed = rng.normal(size=(3, elements))
        np.testing.assert_allclose(g.evaluate({"x": x, "y": y})["z"], np.sin(x) * y, rtol=1e-15)
        grads, outputs = g.gradient({"x": x, "y": y}, seeds={"z": seed}, return_outputs=True)
        np.testing.assert_allclose(grads["x"], seed * np.cos(x) * y, rtol=1e-13, atol=1e-300)
        np.testing.assert_allclose(grads["y"], seed * np.sin(x), rtol=1e-13, atol=1e-300)
        np.testing.assert_allclose(outputs["z"], np.sin(x) * y, rtol=1e-15)


def forged_request(graph_id: str, x: np.ndarray, region: str, offset_of_x: bool) -> bytes:
    """A Gradient request whose input y names the marker region of the server's reader, pointing
    at x's bytes (whose offset the sender knows: it wrote them)."""
    request = pb.GradientRequest(graph_id=graph_id, wrt=["x"])
    request.inputs["x"].CopyFrom(sg.codec.to_tensor(x))
    raw = request.SerializeToString()
    offset = raw.find(x.tobytes()) if offset_of_x else 3
    request.inputs["y"].CopyFrom(pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=x.shape,
                                           shared=pb.SharedMemoryRef(region=region, offset=offset)))
    return request.SerializeToString()


@pytest.mark.parametrize("elements", [16, wire.THRESHOLD // 8])
@pytest.mark.parametrize("region", [wire.MARK, wire.MARK + "0" * 16])
@pytest.mark.parametrize("offset_of_x", [True, False])
def test_a_client_cannot_forge_the_readers_markers(server_address, rng, elements, region, offset_of_x):
    import grpc

    with sg.Client(server_address, shared_memory=False) as remote:
        graph_id = remote.register(two_inputs(elements)).id
    x = rng.normal(size=elements)
    call = grpc.insecure_channel(server_address).unary_unary("/semigrad.v1.GraphService/Gradient")
    with pytest.raises(grpc.RpcError) as refused:
        call(forged_request(graph_id, x, region, offset_of_x), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'y'" in refused.value.details()
    assert "region" in refused.value.details()


@pytest.mark.parametrize("elements,large", [((wire.THRESHOLD - 256) // 8, False), (wire.THRESHOLD // 8, True)])
def test_the_server_decodes_and_encodes_large_messages_through_the_wire_module(rng, elements, large):
    from semigrad_server.service import convert, status

    x = rng.normal(size=elements)
    request = pb.GradientRequest(graph_id="g", wrt=["x"])
    request.inputs["x"].CopyFrom(sg.codec.to_tensor(x))
    decoded = status.decoder(pb.GradientRequest)(request.SerializeToString())
    assert isinstance(decoded, wire.Received) is large
    response = convert.with_tensors(pb.GradientResponse(), {"gradients": {"x": x}, "outputs": {}}, None, spliced=True)
    assert isinstance(response, wire.Outgoing) is large
    assert pb.GradientResponse.FromString(response.SerializeToString()) == pb.GradientResponse(
        gradients={"x": sg.codec.to_tensor(x)})


@pytest.mark.parametrize("rows", [wire.THRESHOLD // (2 * 2 * 8 * 16) - 1, wire.THRESHOLD // (2 * 2 * 8 * 16)])
def test_stream_chunks_either_side_of_the_threshold(server_address, rng, rows):
    """gradient_many in chunks of two items of 16 x rows elements (x and y: a chunk's tensors
    below, then at, the threshold; the stream's request and response messages with them)."""
    with sg.Client(server_address, shared_memory=False) as remote:
        g = remote.register(two_inputs(16 * rows))
        x, y = rng.normal(size=(2, 6, 16 * rows))
        grads = g.gradient_many({"x": x, "y": y}, chunk_size=2)
    np.testing.assert_allclose(grads["x"], np.cos(x) * y, rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(grads["y"], np.sin(x), rtol=1e-13, atol=1e-300)
