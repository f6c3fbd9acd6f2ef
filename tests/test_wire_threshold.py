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
