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


def test_an_error_in_one_chunk_does_not_end_the_stream(server_address, client, rng):
    f = client.register(det_graph(2))
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
