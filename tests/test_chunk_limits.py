"""gradient_many's default chunks respect the server's limits on one request (max_request_elements
and the others check_work applies): the server says in a refused chunk how many items fit
(GradientStreamResponse.max_items), and the client cuts its chunks to it, then remembers it.

The graph is the case issue 14 reported: per-item gradients of an unbatched weight (every item has
a gradient of the whole weight), whose work per item is far larger than its bytes suggest. The
reference is the closed form of d sum(tanh(W x)) / dW = (1 - tanh²(W x)) xᵀ, item by item."""

from __future__ import annotations

import re

import grpc
import numpy as np
import pytest
import semigrad as sg
from semigrad import codec, wire
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from semigrad_server.limits import Limits
from semigrad_server.service import build_server

ITEMS = 600
LIMITED = 30_000  # max_request_elements of the test's server: far below ITEMS items of this graph


def layer() -> sg.Graph:
    g = sg.Graph()
    x, w = g.input("x", (8,)), g.input("W", (8, 8))
    g.output("y", sg.sum(sg.tanh(w @ x)))
    return g


def per_item_weight_gradients(xs: np.ndarray, w: np.ndarray) -> np.ndarray:
    return (1 - np.tanh(xs @ w.T) ** 2)[:, :, None] * xs[:, None, :]


@pytest.fixture(scope="module")
def limited_address():
    server, port, _ = build_server("127.0.0.1:0", limits=Limits(max_request_elements=LIMITED))
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0).wait()


@pytest.fixture(params=["inline", "shared memory", "in process"])
def limited_client(request, limited_address):
    if request.param == "in process":
        client = sg.Client(limits=Limits(max_request_elements=LIMITED))
    else:
        client = sg.Client(limited_address, shared_memory=request.param == "shared memory")
    with client:
        yield client


class Chunks:
    """The item count of every chunk a client's streams sent, and the codes of their answers."""

    def __init__(self, client, monkeypatch):
        self.sent: list[int] = []
        self.codes: list[int] = []
        self.unary = 0
        transport = client.transport
        stream, call = transport.stream, transport.call

        def counting_stream(method, requests, *how):
            def counted():
                for r in requests:
                    sent = pb.GradientStreamRequest.FromString(r.SerializeToString())  # as it goes on the wire
                    self.sent.append(len(codec.from_tensor(sent.request.inputs["x"])) if sent.request.inputs["x"].data
                                     else -1)
                    yield r
            for response in stream(method, counted(), *how):
                self.codes.append((response.message if isinstance(response, wire.Received) else response).code)
                yield response

        def counting_call(method, request, *how):
            self.unary += 1
            return call(method, request, *how)

        monkeypatch.setattr(transport, "stream", counting_stream)
        monkeypatch.setattr(transport, "call", counting_call)


def items_that_fit(client, f, xs, w) -> int:
    """The items that fit the limit by the server's own count of the elements one item of this
    request computes, and those computed once for the whole batch (what depends on the unbatched
    weight alone), from its refusal of the whole batch in one call (the figures its limit is held to)."""
    with pytest.raises(sg.ResourceExhausted) as refused:
        f.gradient({"x": xs, "W": w}, wrt=["W"])
    match = re.search(r"\((\d+) batch items × (\d+) per item(?: \+ (\d+) computed once)?", str(refused.value))
    assert match and int(match[1]) == len(xs), str(refused.value)
    assert int(match[1]) * int(match[2]) + int(match[3] or 0) > LIMITED
    return (LIMITED - int(match[3] or 0)) // int(match[2])


def test_default_chunks_fit_the_servers_element_limit(limited_client, rng, monkeypatch):
    f = limited_client.register(layer())
    xs, w = rng.normal(size=(ITEMS, 8)), rng.normal(size=(8, 8))
    fits = items_that_fit(limited_client, f, xs, w)
    assert 1 < fits < ITEMS / 2  # the case this test is about: the whole batch is over the limit
    want = per_item_weight_gradients(xs, w)
    # first job: the server's refusals say how many items fit, and the refused items go again
    np.testing.assert_allclose(f.gradient_many({"x": xs, "W": w}, wrt=["W"], progress=False)["W"], want,
                               rtol=1e-12, atol=1e-14)
    # later jobs: chunks of at most that many items from the start, none refused
    chunks = Chunks(limited_client, monkeypatch)
    got = f.gradient_many({"x": xs, "W": w}, wrt=["W"], progress=False)["W"]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert len(chunks.codes) == -(-ITEMS // fits) and set(chunks.codes) == {0} and chunks.unary == 0
    inline = [n for n in chunks.sent if n >= 0]  # (through shared memory the items are in a region)
    assert max(inline, default=0) <= fits and sum(inline) in (0, ITEMS)


def test_a_chunk_one_item_over_the_limit_is_refused_with_the_items_that_fit(limited_address, rng):
    """Both sides of the threshold, on the wire: a chunk of `fits` items is answered, one of
    `fits + 1` is refused with max_items = fits."""
    with sg.Client(limited_address, shared_memory=False) as client:
        f = client.register(layer())
        xs, w = rng.normal(size=(ITEMS, 8)), rng.normal(size=(8, 8))
        fits = items_that_fit(client, f, xs, w)
    requests = [pb.GradientStreamRequest(chunk=k, request=pb.GradientRequest(
        graph_id=f.id, wrt=["W"], inputs={"x": codec.to_tensor(xs[:n]), "W": codec.to_tensor(w)}))
        for k, n in enumerate([fits, fits + 1])]
    with grpc.insecure_channel(limited_address) as channel:
        answered, refused = pb_grpc.GraphServiceStub(channel).GradientStream(iter(requests), timeout=60)
    assert answered.code == 0 and answered.max_items == 0
    np.testing.assert_allclose(codec.from_tensor(answered.response.gradients["W"]),
                               per_item_weight_gradients(xs[:fits], w), rtol=1e-12, atol=1e-14)
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert refused.max_items == fits
    assert "max_request_elements" in refused.message or "the limit is" in refused.message


def test_an_explicit_chunk_size_over_the_limit_is_cut_too(limited_client, rng):
    f = limited_client.register(layer())
    xs, w = rng.normal(size=(ITEMS, 8)), rng.normal(size=(8, 8))
    got = f.gradient_many({"x": xs, "W": w}, chunk_size=ITEMS // 2, wrt=["W"], progress=False)["W"]
    np.testing.assert_allclose(got, per_item_weight_gradients(xs, w), rtol=1e-12, atol=1e-14)


def test_a_refusal_that_is_not_about_items_is_raised(limited_client, rng):
    """A graph whose single item is over the limit: no chunk size helps, the error names the limit."""
    g = sg.Graph()
    x = g.input("x", (300,))
    g.output("y", sg.sum(sg.tanh(sg.broadcast_to(x, (300, 300)))))
    f = limited_client.register(g)
    with pytest.raises(sg.ResourceExhausted, match="the limit is"):
        f.gradient_many({"x": rng.normal(size=(4, 300))}, progress=False)
