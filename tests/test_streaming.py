"""Large jobs stream in chunks: results reassemble exactly; a bad chunk does not end the stream."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import semigrad as sg
from reference import det_gradient, det_graph
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc


@pytest.mark.parametrize("count,chunk", [(1000, 128), (100, 100), (7, 3), (5, 64)])
def test_streamed_gradients_equal_one_call(client, rng, count, chunk):
    f = client.register(det_graph(3))
    batch = rng.normal(size=(count, 3, 3))
    streamed = f.gradient_many({"A": batch}, chunk_size=chunk, return_outputs=True, progress=False)
    np.testing.assert_array_equal(streamed["A"], f.gradient({"A": batch})["A"])
    np.testing.assert_allclose(streamed["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(streamed.outputs["det"], np.linalg.det(batch), rtol=1e-10, atol=1e-12)


def test_unbatched_inputs_and_batched_seeds_are_split_consistently(client, rng):
    g = sg.Graph()
    x, w = g.input("x", (3,)), g.input("w", (3,))
    g.output("y", x * w)
    f = client.register(g)
    xs, w0, seeds = rng.normal(size=(50, 3)), rng.normal(size=3), rng.normal(size=(50, 3))
    streamed = f.gradient_many({"x": xs, "w": w0}, chunk_size=8, seeds={"y": seeds}, progress=False)
    np.testing.assert_allclose(streamed["x"], seeds * w0)
    np.testing.assert_allclose(streamed["w"], seeds * xs)


def test_an_error_in_one_chunk_does_not_end_the_stream(server_address, remote_client, rng):
    f = remote_client.register(det_graph(2))
    good = codec.to_tensor(rng.normal(size=(4, 2, 2)))
    bad = codec.to_tensor(rng.normal(size=(4, 3, 3)))  # wrong item shape
    requests = [pb.GradientStreamRequest(chunk=k, request=pb.GradientRequest(graph_id=f.id, inputs={"A": t}))
                for k, t in enumerate([good, bad, good])]
    with grpc.insecure_channel(server_address) as channel:
        responses = list(pb_grpc.GraphServiceStub(channel).GradientStream(iter(requests), timeout=30))
    assert [r.chunk for r in responses] == [0, 1, 2]
    assert responses[1].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "input 'A'" in responses[1].message
    assert responses[0].code == responses[2].code == 0
    assert responses[0].response.gradients["A"].data == responses[2].response.gradients["A"].data


def test_the_client_reports_failed_chunks(client, rng):
    g = sg.Graph()
    g.output("y", sg.sum(g.input("x", (2,))))
    f = client.register(g)
    with pytest.raises(sg.InvalidArgument, match="chunk 0"):
        f.gradient_many({"x": rng.normal(size=(10, 2))}, chunk_size=4, semiring="kbest",
                        semiring_params={"k": 0}, progress=False)


# ------------------------------------------------------------------------ chunking and reassembly


class Calls:
    """What a client sent: unary calls by method, and the chunks of each stream."""

    def __init__(self, client, monkeypatch):
        self.unary: list[str] = []
        self.stream_chunks: list[int] = []
        transport = client.transport
        call, stream = transport.call, transport.stream

        def counting_call(method, request, *how):
            self.unary.append(method)
            return call(method, request, *how)

        def counting_stream(method, requests, *how):
            self.stream_chunks.append(0)

            def counted():
                for r in requests:
                    self.stream_chunks[-1] += 1
                    yield r
            return stream(method, counted(), *how)

        monkeypatch.setattr(transport, "call", counting_call)
        monkeypatch.setattr(transport, "stream", counting_stream)


@pytest.fixture(params=[False, True], ids=["inline", "shared memory"])
def any_client(request, server_address):
    with sg.Client(server_address, shared_memory=request.param) as c:
        yield c


def test_a_batch_that_fits_one_default_chunk_is_one_gradient_call(any_client, rng, monkeypatch):
    f = any_client.register(det_graph(3))
    batch = rng.normal(size=(2000, 3, 3))  # ~300 KB of tensors, far below the default chunk
    calls = Calls(any_client, monkeypatch)
    grads = f.gradient_many({"A": batch}, return_outputs=True, progress=False)
    assert calls.unary == ["Gradient"] and calls.stream_chunks == []
    np.testing.assert_allclose(grads["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(grads.outputs["det"], np.linalg.det(batch), rtol=1e-10, atol=1e-12)


def test_the_default_chunk_is_sized_by_bytes(any_client, rng, monkeypatch):
    from semigrad import streaming

    f = any_client.register(det_graph(3))
    batch = rng.normal(size=(1000, 3, 3))
    # per item: 72 B of input, 72 B of gradient and 64 B of header per result tensor
    for target in ("STREAM_CHUNK_BYTES_SHARED", "STREAM_CHUNK_BYTES_INLINE"):
        monkeypatch.setattr(streaming, target, 100 * (72 + 72 + 64))
    calls = Calls(any_client, monkeypatch)
    grads = f.gradient_many({"A": batch}, progress=False)
    assert calls.stream_chunks == [10] and calls.unary == []
    np.testing.assert_allclose(grads["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("items,unary,chunks", [(400, ["Gradient"], []), (401, [], [5])])
def test_a_batch_of_few_default_chunks_is_one_call(any_client, rng, monkeypatch, items, unary, chunks):
    """STREAM_MIN_CHUNKS (4) chunks' bytes or fewer: one Gradient call; one item more: a stream."""
    from semigrad import streaming

    assert streaming.STREAM_MIN_CHUNKS == 4
    f = any_client.register(det_graph(3))
    batch = rng.normal(size=(items, 3, 3))
    for target in ("STREAM_CHUNK_BYTES_SHARED", "STREAM_CHUNK_BYTES_INLINE"):  # 100 items a chunk
        monkeypatch.setattr(streaming, target, 100 * (72 + 72 + 64))
    calls = Calls(any_client, monkeypatch)
    grads = f.gradient_many({"A": batch}, progress=False)
    assert calls.unary == unary and calls.stream_chunks == chunks
    np.testing.assert_allclose(grads["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)


def test_outputs_retained_gradients_and_components_reassemble(any_client, rng):
    g = sg.Graph()
    x, w = g.input("x", (3,)), g.input("w", (3,))
    a = sg.tanh(x)
    g.output("y", sg.sum(a * w))
    f = any_client.register(g)
    xs, w0 = rng.normal(size=(40, 3)), rng.normal(size=3)
    grads = f.gradient_many({"x": xs, "w": w0}, chunk_size=7, return_outputs=True, retain=[a.id], progress=False)
    np.testing.assert_allclose(grads["x"], w0 * (1 - np.tanh(xs) ** 2), rtol=1e-13)
    np.testing.assert_allclose(grads["w"], np.tanh(xs), rtol=1e-13)
    np.testing.assert_allclose(grads.outputs["y"], np.tanh(xs) @ w0, rtol=1e-13)
    np.testing.assert_allclose(grads.retained[a.id], np.broadcast_to(w0, (40, 3)), rtol=1e-15)

    paths = sg.Graph()  # y = 0.5 (2x + 3x): two paths with products 1.0 and 1.5
    p = paths.input("x", ())
    paths.output("y", (p * 2.0 + p * 3.0) * 0.5)
    two = any_client.register(paths)
    entropy = two.gradient_many({"x": rng.normal(size=10)}, chunk_size=3, semiring="entropy",
                                return_components=True, progress=False)
    parts = entropy.components["x"]
    np.testing.assert_allclose(parts["Z"], np.full(10, 2.5), rtol=1e-15)
    np.testing.assert_allclose(parts["R"], np.full(10, -1.5 * np.log(1.5)), rtol=1e-14)
    p1, p2 = 1.0 / 2.5, 1.5 / 2.5
    np.testing.assert_allclose(entropy["x"], np.full(10, -(p1 * np.log(p1) + p2 * np.log(p2))), rtol=1e-13)


def test_an_empty_batch_gives_empty_gradients(client, rng):
    f = client.register(det_graph(3))
    grads = f.gradient_many({"A": np.empty((0, 3, 3))}, progress=False)
    assert grads["A"].shape == (0, 3, 3)


@pytest.mark.parametrize("option", [{"best_path": [("A", (0, 0, 0))]}, {"hooks": {"n": sg.ServerHook("scale")}}])
def test_options_gradient_many_cannot_split_are_refused(client, rng, option):
    f = client.register(det_graph(3))
    with pytest.raises(TypeError, match="use gradient"):
        f.gradient_many({"A": rng.normal(size=(5, 3, 3))}, progress=False, **option)


def test_streamed_results_in_shared_memory_outlive_later_calls(server_address, rng):
    with sg.Client(server_address, shared_memory=True) as c:
        f = c.register(det_graph(3))
        first, second = rng.normal(size=(3000, 3, 3)), rng.normal(size=(3000, 3, 3))
        kept = f.gradient_many({"A": first}, chunk_size=700, progress=False)
        for _ in range(3):  # the pool's regions get reused: never the one the kept results live in
            f.gradient_many({"A": second}, chunk_size=700, progress=False)
            f.gradient({"A": second})
        np.testing.assert_allclose(kept["A"], det_gradient(first), rtol=1e-9, atol=1e-11)
        kept["A"][:] = 0.0  # lent arrays are the caller's: writable


# ------------------------------------------------------------------------------ a stream that breaks


@pytest.fixture
def breaking_server(monkeypatch):
    """A server whose GradientStream calls, while `breaks[0]` > 0, end with UNAVAILABLE after
    answering `answer_first` chunks (as when the worker serving them dies); `calls` records the
    chunk numbers each call was sent."""
    from semigrad_server.limits import Limits
    from semigrad_server.service import build_server
    from semigrad_server.service.servicer import GraphServicer

    state = {"breaks": 0, "answer_first": 2, "calls": []}
    original = GraphServicer.GradientStream

    def GradientStream(self, request_iterator, context):
        sent = []
        state["calls"].append(sent)
        breaking = state["breaks"] > 0
        state["breaks"] -= 1

        def recorded():
            for message in request_iterator:
                sent.append(message.chunk)
                yield message

        for answered, response in enumerate(original(self, recorded(), context)):
            if breaking and answered == state["answer_first"]:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the worker went away")
            yield response

    monkeypatch.setattr(GraphServicer, "GradientStream", GradientStream)
    server, port, _ = build_server("127.0.0.1:0", limits=Limits())
    server.start()
    yield f"127.0.0.1:{port}", state
    server.stop(0).wait()


@pytest.mark.parametrize("shared_memory", [False, True])
def test_a_stream_broken_after_some_answers_is_resumed_with_the_rest(breaking_server, rng, shared_memory):
    address, state = breaking_server
    state["breaks"] = 2
    with sg.Client(address, shared_memory=shared_memory) as c:
        f = c.register(det_graph(3))
        batch = rng.normal(size=(1000, 3, 3))
        streamed = f.gradient_many({"A": batch}, chunk_size=100, return_outputs=True, progress=False)
    np.testing.assert_allclose(streamed["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(streamed.outputs["det"], np.linalg.det(batch), rtol=1e-10, atol=1e-12)
    first, second, third = state["calls"]
    assert first[:3] == [0, 1, 2] and second[0] == 2 and third[0] == 4  # answered chunks are not sent again
    assert sorted(third) == list(range(4, 10))


def test_a_stream_that_keeps_breaking_or_with_retries_off_fails_with_unavailable(breaking_server, rng):
    from semigrad import streaming

    address, state = breaking_server
    batch = rng.normal(size=(1000, 3, 3))
    state["breaks"], state["answer_first"] = 100, 1
    with sg.Client(address, shared_memory=False) as c:
        f = c.register(det_graph(3))
        with pytest.raises(sg.Unavailable, match="went away"):
            f.gradient_many({"A": batch}, chunk_size=100, progress=False)
    assert len(state["calls"]) == streaming.RESUMES + 1
    state["calls"].clear()
    with sg.Client(address, shared_memory=False, options=[("grpc.enable_retries", 0)]) as c:
        with pytest.raises(sg.Unavailable):
            c.get_graph(f.id).gradient_many({"A": batch}, chunk_size=100, progress=False)
    assert len(state["calls"]) == 1
