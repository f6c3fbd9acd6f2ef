"""Tensors through POSIX shared memory between a client and a server on the same host: results
bit-equal to the inline path and to independent references, the inline fallbacks, and the
server's checks on region names, bounds, ownership and sizes (it keeps serving after each)."""

from __future__ import annotations

import os
import re
import threading

import grpc
import numpy as np
import pytest
import semigrad as sg
from reference import det_gradient, det_graph
from semigrad import codec, messages
from semigrad import shared_memory as sm
from semigrad.shared_memory import SHM_DIR, Region, is_local_target
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from semigrad_server.errors import InvalidArgument, ResourceExhausted
from semigrad_server.limits import Limits
from semigrad_server.service import build_server
from semigrad_server.service.shared_memory import SharedMemory

pytestmark = pytest.mark.skipif(not os.access(SHM_DIR, os.W_OK), reason="needs a writable /dev/shm")


@pytest.fixture(scope="module")
def disabled_address():
    server, port, _ = build_server("127.0.0.1:0", limits=Limits(), shared_memory=False)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0).wait()


@pytest.fixture
def shared_client(server_address):
    with sg.Client(server_address, shared_memory=True) as c:
        yield c


@pytest.fixture
def inline_client(server_address):
    with sg.Client(server_address, shared_memory=False) as c:
        yield c


@pytest.fixture
def client(remote_client):
    """Shared memory is a remote client's; these tests also talk to the server through `stub`."""
    return remote_client


@pytest.fixture
def stub(server_address):
    with grpc.insecure_channel(server_address) as channel:
        yield pb_grpc.GraphServiceStub(channel)


@pytest.fixture
def region():
    r = Region(1 << 20)
    yield r
    r.close()


def put(region: Region, array: np.ndarray, offset: int) -> pb.Tensor:
    """Write `array` (float64) into the region at `offset`; the Tensor referencing it."""
    region.array(np.dtype("<f8"), array.shape, offset)[...] = array
    return pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=array.shape,
                     shared=pb.SharedMemoryRef(region=region.name, offset=offset, capability=region.capability))


def room(region: Region, offset: int, capacity: int) -> pb.SharedMemoryRegion:
    """An output region of `capacity` bytes at `offset`, with the region's capability."""
    return pb.SharedMemoryRegion(region=region.name, offset=offset, capacity=capacity, capability=region.capability)


def read(region: Region, tensor: pb.Tensor) -> np.ndarray:
    if tensor.WhichOneof("payload") == "shared":
        assert tensor.shared.region == region.name
        return region.array(codec.wire_dtype(tensor.dtype), tuple(tensor.shape), tensor.shared.offset).copy()
    return codec.from_tensor(tensor)


def rpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def still_serving(client, rng):
    a = rng.normal(size=(5, 3, 3))
    np.testing.assert_allclose(client.register(det_graph(3)).gradient({"A": a})["A"], det_gradient(a),
                               rtol=1e-9, atol=1e-11)


# ------------------------------------------------------------------------------ same results


def test_gradients_through_shared_memory_equal_inline_and_the_closed_form(shared_client, inline_client, rng):
    f = shared_client.register(det_graph(4))
    f_inline = inline_client.get_graph(f.id)
    batch = rng.normal(size=(1000, 4, 4))
    grads, outputs = f.gradient({"A": batch}, return_outputs=True)
    assert shared_client.shared_memory_regions()  # it did go through shared memory
    inline, inline_outputs = f_inline.gradient({"A": batch}, return_outputs=True)
    np.testing.assert_array_equal(grads["A"], inline["A"])
    np.testing.assert_array_equal(outputs["det"], inline_outputs["det"])
    np.testing.assert_allclose(grads["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(outputs["det"], np.linalg.det(batch), rtol=1e-10, atol=1e-12)
    assert grads["A"].flags.writeable  # the caller's own arrays (lent regions: see below)


def test_results_are_never_overwritten_by_later_calls(server_address, rng):
    """Results come back as views of the call's region, lent: the region returns to the pool only
    when they are garbage-collected, so later calls never overwrite what the caller holds."""
    c = sg.Client(server_address, shared_memory=True)
    f = c.register(det_graph(3))
    first = rng.normal(size=(2000, 3, 3))
    kept = f.gradient({"A": first})["A"]
    kept_det = f.evaluate({"A": first})["det"]
    view = kept[10:20]  # a view of a result keeps the region too
    del kept
    for _ in range(5):
        f.gradient({"A": rng.normal(size=(2000, 3, 3))})
        f.evaluate({"A": rng.normal(size=(2000, 3, 3))})
    regions = c.shared_memory_regions()
    assert 3 <= len(regions) <= 5  # two held by `view` and `kept_det`; the rest reused
    c.close()  # removes the files; what the caller holds stays readable
    assert not any(os.path.exists(os.path.join(SHM_DIR, n)) for n in regions)
    np.testing.assert_allclose(view, det_gradient(first)[10:20], rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(kept_det, np.linalg.det(first), rtol=1e-10, atol=1e-12)
    view += 1.0  # writable, and nobody else's memory


def test_a_region_goes_back_to_the_pool_when_its_results_are_collected(shared_client, rng):
    f = shared_client.register(det_graph(3))
    batch = rng.normal(size=(2000, 3, 3))
    for _ in range(10):
        np.testing.assert_allclose(f.gradient({"A": batch})["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)
    assert len(shared_client.shared_memory_regions()) == 1


def test_forward_values_and_node_values_through_shared_memory(shared_client, inline_client, rng):
    g = sg.Graph()
    x = g.input("x", (3,))
    h = sg.tanh(x) * x
    g.output("y", sg.sum(h))
    f = shared_client.register(g)
    node = h.id  # the product, an intermediate node
    xs = rng.normal(size=(20_000, 3))
    got = f.evaluate({"x": xs}, nodes=[node])
    want = inline_client.get_graph(f.id).evaluate({"x": xs}, nodes=[node])
    np.testing.assert_array_equal(got["y"], want["y"])
    np.testing.assert_array_equal(got[node], want[node])
    np.testing.assert_allclose(got["y"], np.sum(np.tanh(xs) * xs, axis=-1), rtol=1e-13)
    np.testing.assert_allclose(got[node], np.tanh(xs) * xs, rtol=1e-13)


def test_seeds_and_several_inputs_through_shared_memory(shared_client, rng):
    g = sg.Graph()
    x, w = g.input("x", (3,)), g.input("w", (3,))
    g.output("y", x * w)
    f = shared_client.register(g)
    xs, w0, seeds = rng.normal(size=(5000, 3)), rng.normal(size=3), rng.normal(size=(5000, 3))
    grads = f.gradient({"x": xs, "w": w0}, seeds={"y": seeds})
    np.testing.assert_allclose(grads["x"], seeds * w0, rtol=1e-15)
    np.testing.assert_allclose(grads["w"], seeds * xs, rtol=1e-15)


def test_streamed_chunks_through_shared_memory(shared_client, inline_client, rng):
    f = shared_client.register(det_graph(3))
    batch = rng.normal(size=(3000, 3, 3))
    streamed = f.gradient_many({"A": batch}, chunk_size=256, return_outputs=True, progress=False)
    np.testing.assert_array_equal(streamed["A"], inline_client.get_graph(f.id).gradient({"A": batch})["A"])
    np.testing.assert_allclose(streamed["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(streamed.outputs["det"], np.linalg.det(batch), rtol=1e-10, atol=1e-12)


def test_concurrent_calls_from_threads_use_separate_regions(shared_client, rng):
    f = shared_client.register(det_graph(3))
    batches = [rng.normal(size=(2000, 3, 3)) for _ in range(6)]
    results: list = [None] * len(batches)

    def work(i):
        for _ in range(3):
            results[i] = f.gradient({"A": batches[i]})["A"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for batch, got in zip(batches, results):
        np.testing.assert_allclose(got, det_gradient(batch), rtol=1e-9, atol=1e-11)


def test_auto_mode_uses_shared_memory_for_large_calls_only(server_address, rng):
    with sg.Client(server_address) as c:
        assert c.shared_memory_off is None
        f = c.register(det_graph(3))
        f.gradient({"A": rng.normal(size=(3, 3))})
        assert c.shared_memory_regions() == []
        batch = rng.normal(size=(5000, 3, 3))
        np.testing.assert_allclose(f.gradient({"A": batch})["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)
        assert len(c.shared_memory_regions()) == 1


# ------------------------------------------------------------------------------ the wire, by hand


def test_the_server_answers_with_references_into_the_output_region(server_address, stub, region, rng):
    f = sg.Client(server_address).register(det_graph(4))
    batch = rng.normal(size=(100, 4, 4))
    request = pb.GradientRequest(graph_id=f.id, inputs={"A": put(region, batch, 64)}, return_outputs=True,
                                 output_region=room(region, 64 + batch.nbytes, region.size - 64 - batch.nbytes))
    response = stub.Gradient(request)
    tensors = [response.gradients["A"], response.outputs["det"]]
    assert [t.WhichOneof("payload") for t in tensors] == ["shared", "shared"]
    offsets = [t.shared.offset for t in tensors]
    assert all(o % 64 == 0 and o >= 64 + batch.nbytes for o in offsets)
    assert offsets[1] >= offsets[0] + batch.nbytes  # one after another, no overlap
    np.testing.assert_allclose(read(region, tensors[0]), det_gradient(batch), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(read(region, tensors[1]), np.linalg.det(batch), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("capacity", [0, 100, 16 * 4 * 4 * 8 + 64])
def test_an_output_region_too_small_sends_the_rest_inline(server_address, stub, region, rng, capacity):
    f = sg.Client(server_address).register(det_graph(4))
    batch = rng.normal(size=(16, 4, 4))
    start = 4096
    request = pb.GradientRequest(graph_id=f.id, inputs={"A": put(region, batch, 64)}, return_outputs=True,
                                 output_region=room(region, start, capacity))
    response = stub.Gradient(request)
    grads, det = response.gradients["A"], response.outputs["det"]
    for t in (grads, det):
        if t.WhichOneof("payload") == "shared":
            end = t.shared.offset + np.prod(t.shape) * 8
            assert start <= t.shared.offset and end <= start + capacity
    assert grads.WhichOneof("payload") == ("shared" if capacity >= batch.nbytes else "data")
    np.testing.assert_allclose(read(region, grads), det_gradient(batch), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(read(region, det), np.linalg.det(batch), rtol=1e-10, atol=1e-12)


def test_the_client_offers_too_little_room_and_still_gets_everything(shared_client, rng, monkeypatch):
    """The client sizes the output region from the declared shapes; when that is too small (here:
    room for the gradient only), the rest comes back inline and the client reads both kinds."""
    g = sg.Graph()
    x = g.input("x", (4,))
    g.output("outer", sg.reshape(x, (4, 1)) * sg.reshape(x, (1, 4)))  # 4× the input's size
    f = shared_client.register(g)
    xs = rng.normal(size=(50_000, 4))
    monkeypatch.setattr(messages, "gradient_result_bytes", lambda graph, request, arrays: xs.nbytes + 64)
    seen = []
    original = sm.Placement.lend
    monkeypatch.setattr(sm.Placement, "lend", lambda self, t: seen.append(t.WhichOneof("payload")) or original(self, t))
    grads, outputs = f.gradient({"x": xs}, return_outputs=True)
    assert sorted(seen) == ["data", "shared"]
    np.testing.assert_allclose(outputs["outer"], xs[:, :, None] * xs[:, None, :], rtol=1e-15)
    np.testing.assert_allclose(grads["x"], np.repeat(2 * xs.sum(axis=1, keepdims=True), 4, axis=1), rtol=1e-13)


def test_the_server_does_not_modify_input_regions(server_address, stub, region, rng):
    f = sg.Client(server_address).register(det_graph(3))
    batch = rng.normal(size=(500, 3, 3))
    tensor = put(region, batch, 128)
    before = region.array(np.dtype("u1"), (region.size - 64,), 64).copy()
    request = pb.GradientRequest(graph_id=f.id, inputs={"A": tensor}, return_outputs=True,
                                 output_region=room(region, 65536, region.size - 65536))
    response = stub.Gradient(request)
    after = region.array(np.dtype("u1"), (region.size - 64,), 64)
    np.testing.assert_array_equal(after[:65536 - 64], before[:65536 - 64])  # the inputs' bytes and all before
    np.testing.assert_allclose(read(region, response.gradients["A"]), det_gradient(batch), rtol=1e-9, atol=1e-11)


def test_the_server_reads_inputs_as_read_only_copies(region):
    shared = SharedMemory()
    tensor = put(region, np.arange(6.0).reshape(2, 3), 64)
    with shared.session("unix:") as session:
        array = session.array(tensor, "input 'x'")
        np.testing.assert_array_equal(array, np.arange(6.0).reshape(2, 3))
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array[0, 0] = 1.0
        region.array(np.dtype("<f8"), (6,), 64)[:] = -1.0  # the client writes on: the server's copy stays
        np.testing.assert_array_equal(array, np.arange(6.0).reshape(2, 3))
    shared.close()


# ------------------------------------------------------------------------------ bad requests


@pytest.mark.parametrize("name", ["../etc/passwd", "semigrad-zz", "semigrad-" + "A" * 16, "semigrad-0123",
                                  "/dev/shm/semigrad-0123456789abcdef", "semigrad-" + "0" * 65, ""])
def test_a_bad_region_name_is_invalid_argument(server_address, stub, client, rng, name):
    f = client.register(det_graph(2))
    tensor = pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=[2, 2], shared=pb.SharedMemoryRef(region=name, offset=0))
    error = rpc_error(lambda: stub.Gradient(pb.GradientRequest(graph_id=f.id, inputs={"A": tensor})))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'A'" in error.details() and repr(name) in error.details()
    still_serving(client, rng)


def test_a_bad_output_region_name_is_invalid_argument(stub, client, rng):
    f = client.register(det_graph(2))
    request = pb.GradientRequest(graph_id=f.id, inputs={"A": codec.to_tensor(rng.normal(size=(2, 2)))},
                                 output_region=pb.SharedMemoryRegion(region="../../tmp/x", capacity=8))
    error = rpc_error(lambda: stub.Gradient(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "output_region" in error.details() and "'../../tmp/x'" in error.details()
    still_serving(client, rng)


@pytest.mark.parametrize("offset,shape", [((1 << 20) - 8, (2, 2)), (1 << 40, (1,)), (64, (1 << 17 + 1, 2)),
                                          (68, (2, 2)), (0, (2, 2)), (56, (1,))])
def test_a_tensor_outside_its_region_is_invalid_argument(stub, client, region, rng, offset, shape):
    """Past the end, misaligned, or in the region's header (bytes 0..64)."""
    f = client.register(det_graph(2))
    tensor = pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=shape, shared=pb.SharedMemoryRef(
        region=region.name, offset=offset, capability=region.capability))
    error = rpc_error(lambda: stub.Gradient(pb.GradientRequest(graph_id=f.id, inputs={"A": tensor})))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'A'" in error.details() and region.name in error.details()
    still_serving(client, rng)


def test_an_output_region_past_the_end_or_over_the_inputs_is_invalid_argument(stub, client, region, rng):
    f = client.register(det_graph(2))
    tensor = put(region, rng.normal(size=(10, 2, 2)), 64)
    for output_region, expected in [
            (room(region, 4096, region.size), "past the end"),
            (room(region, 128, 4096), "overlap input 'A'"),
            (room(region, 0, 4096), "header")]:
        request = pb.GradientRequest(graph_id=f.id, inputs={"A": tensor}, output_region=output_region)
        error = rpc_error(lambda: stub.Gradient(request))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "output_region" in error.details() and expected in error.details()
    still_serving(client, rng)


def test_a_missing_region_is_failed_precondition(stub, client, rng):
    f = client.register(det_graph(2))
    name = "semigrad-" + os.urandom(16).hex()
    tensor = pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=[2, 2], shared=pb.SharedMemoryRef(region=name, offset=0))
    error = rpc_error(lambda: stub.Gradient(pb.GradientRequest(graph_id=f.id, inputs={"A": tensor})))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert name in error.details() and "same host" in error.details()
    still_serving(client, rng)


def test_a_symlink_or_a_directory_is_not_followed(stub, client, rng, tmp_path):
    f = client.register(det_graph(2))
    target = tmp_path / "secret"
    target.write_bytes(b"\0" * 4096)
    for make in (lambda p: os.symlink(target, p), os.mkdir):
        name = "semigrad-" + os.urandom(16).hex()
        path = os.path.join(SHM_DIR, name)
        make(path)
        try:
            tensor = pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=[2, 2], shared=pb.SharedMemoryRef(region=name))
            error = rpc_error(lambda: stub.Gradient(pb.GradientRequest(graph_id=f.id, inputs={"A": tensor})))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert name in error.details() and "regular file" in error.details()
        finally:
            os.rmdir(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    still_serving(client, rng)


def test_a_region_shrunk_after_use_is_checked_again(stub, client, rng):
    """The server re-checks a region's size on every request: reading past a shrunk file would
    kill it with SIGBUS; it answers INVALID_ARGUMENT instead."""
    f = client.register(det_graph(2))
    region = Region(1 << 20)
    try:
        a = rng.normal(size=(2, 2))
        far = put(region, a, (1 << 20) - 4096)
        np.testing.assert_allclose(codec.from_tensor(stub.Gradient(pb.GradientRequest(
            graph_id=f.id, inputs={"A": far})).gradients["A"]), det_gradient(a))
        os.truncate(os.path.join(SHM_DIR, region.name), 4096)
        error = rpc_error(lambda: stub.Gradient(pb.GradientRequest(graph_id=f.id, inputs={"A": far})))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "input 'A'" in error.details() and "(4096 bytes)" in error.details()
    finally:
        region.close()
    still_serving(client, rng)


def test_shared_tensors_are_refused_where_they_are_not_accepted(stub, client, region, rng):
    f = client.register(det_graph(2))
    tensor = put(region, rng.normal(size=(2, 2)), 64)
    error = rpc_error(lambda: stub.CrossCheck(pb.CrossCheckRequest(graph_id=f.id, inputs={"A": tensor})))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'A'" in error.details() and "only accepted" in error.details()
    still_serving(client, rng)


def test_element_limits_still_apply(region):
    shared = SharedMemory()
    big = pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=[1 << 62], shared=pb.SharedMemoryRef(
        region=region.name, offset=64, capability=region.capability))
    with shared.session("unix:") as session, pytest.raises(InvalidArgument, match="past the end"):
        session.array(big, "input 'x'")
    shared.close()


def test_the_elements_copied_out_of_regions_are_bounded_per_request(region):
    """max_request_elements bounds the copies out of shared memory before they are allocated:
    at the limit the request reads, one element past it is RESOURCE_EXHAUSTED naming the input."""
    shared = SharedMemory(max_elements=100)
    values = np.arange(100.0)
    with shared.session("unix:") as session:
        np.testing.assert_array_equal(session.array(put(region, values[:60], 64), "input 'a'"), values[:60])
        np.testing.assert_array_equal(session.array(put(region, values[60:], 1024), "input 'b'"), values[60:])
    with shared.session("unix:") as session:
        session.array(put(region, values[:60], 64), "input 'a'")
        with pytest.raises(ResourceExhausted, match="input 'b'.*100 elements"):
            session.array(put(region, np.arange(41.0), 1024), "input 'b'")
    shared.close()


# ------------------------------------------------------------------------------ a server that refuses


def test_auto_mode_falls_back_inline_when_the_server_refuses(disabled_address, rng):
    batch = rng.normal(size=(4000, 3, 3))
    with sg.Client(disabled_address) as c:
        f = c.register(det_graph(3))
        assert c.shared_memory_off is None
        np.testing.assert_allclose(f.gradient({"A": batch})["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)
        assert "disabled" in c.shared_memory_off
        np.testing.assert_allclose(f.evaluate({"A": batch})["det"], np.linalg.det(batch), rtol=1e-10, atol=1e-12)
    with sg.Client(disabled_address) as c:  # the first refusal can come inside a stream's chunks
        f = c.get_graph(f.id)
        streamed = f.gradient_many({"A": batch}, chunk_size=1000, progress=False)
        np.testing.assert_allclose(streamed["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)
        assert "disabled" in c.shared_memory_off


def test_shared_memory_true_against_a_refusing_server_is_a_clear_error(disabled_address, rng):
    with sg.Client(disabled_address, shared_memory=True) as c:
        f = c.register(det_graph(3))
        with pytest.raises(sg.FailedPrecondition, match="shared memory is disabled on this server"):
            f.gradient({"A": rng.normal(size=(3, 3))})
    with sg.Client(disabled_address, shared_memory=False) as c:
        np.testing.assert_allclose(c.get_graph(f.id).gradient({"A": np.eye(3)})["A"], np.eye(3))


def test_a_disabled_server_refuses_output_regions_too(disabled_address, region, rng):
    with grpc.insecure_channel(disabled_address) as channel:
        stub = pb_grpc.GraphServiceStub(channel)
        f = sg.Client(disabled_address).register(det_graph(2))
        request = pb.EvaluateRequest(graph_id=f.id, inputs={"A": codec.to_tensor(rng.normal(size=(2, 2)))},
                                     output_region=room(region, 64, 4096))
        error = rpc_error(lambda: stub.Evaluate(request))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "disabled" in error.details()


# ------------------------------------------------------------------------------ the client's regions


def test_the_clients_regions_are_removed_on_close(server_address, rng):
    c = sg.Client(server_address, shared_memory=True)
    f = c.register(det_graph(3))
    f.gradient({"A": rng.normal(size=(1000, 3, 3))})
    f.gradient_many({"A": rng.normal(size=(1000, 3, 3))}, chunk_size=100, progress=False)
    names = c.shared_memory_regions()
    assert names and all(os.path.isfile(os.path.join(SHM_DIR, n)) for n in names)
    for n in names:
        st = os.stat(os.path.join(SHM_DIR, n))
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid()
    c.close()
    assert c.shared_memory_regions() == []
    assert not any(os.path.exists(os.path.join(SHM_DIR, n)) for n in names)


def test_a_region_is_removed_when_garbage_collected():
    r = Region(4096)
    path = os.path.join(SHM_DIR, r.name)
    assert os.path.exists(path)
    del r
    assert not os.path.exists(path)


@pytest.mark.parametrize("target,local", [
    ("127.0.0.1:50051", True), ("localhost:1", True), ("[::1]:50051", True), ("unix:/tmp/s.sock", True),
    ("unix:///tmp/s.sock", True), ("ipv4:127.0.0.1:1,127.0.0.2:2", True), ("dns:///localhost:50051", True),
    ("10.0.0.5:50051", False), ("example.com:443", False), ("dns:///example.com:443", False),
    ("ipv4:127.0.0.1:1,10.0.0.1:2", False), ("[2001:db8::1]:50051", False)])
def test_which_targets_are_on_this_host(target, local):
    assert is_local_target(target) is local


def test_auto_mode_is_off_for_remote_targets():
    with sg.Client("10.255.255.1:50051") as c:
        assert c.shared_memory_off == "the target is not on this host"
    with pytest.raises(ValueError):
        sg.Client("127.0.0.1:1", shared_memory="yes")


# ------------------------------------------------------------------------------ `semigrad serve` processes


def test_every_worker_process_opens_the_clients_regions(tmp_path, rng):
    from test_serve import serving, stop

    with serving("--store", str(tmp_path / "graphs.sqlite"), "--workers", "2") as (address, process):
        batch = rng.normal(size=(1000, 3, 3))
        with sg.Client(address, timeout=10, shared_memory=True) as client:
            graph_id = client.register(det_graph(3)).id
        for _ in range(16):  # fresh connections: the kernel spreads them over the workers
            with sg.Client(address, timeout=10, shared_memory=True) as client:
                grads = client.get_graph(graph_id).gradient({"A": batch})["A"]
                np.testing.assert_allclose(grads, det_gradient(batch), rtol=1e-9, atol=1e-11)
        log = stop(process)
    assert "shared memory: on" in log
    pids = {m.group(1) for m in re.finditer(r" (\d+) semigrad\.rpc rpc=Gradient .*status=OK", log)}
    assert len(pids) == 2, log


def test_serve_no_shared_memory_refuses_it(rng):
    from test_serve import serving, stop

    with serving("--store", "memory", "--workers", "1", "--no-shared-memory") as (address, process):
        batch = rng.normal(size=(1000, 3, 3))
        with sg.Client(address, timeout=10, shared_memory=True) as client:
            f = client.register(det_graph(3))
            with pytest.raises(sg.FailedPrecondition, match="disabled"):
                f.gradient({"A": batch})
        with sg.Client(address, timeout=10) as client:  # "auto" falls back
            grads = client.get_graph(f.id).gradient({"A": batch})["A"]
            np.testing.assert_allclose(grads, det_gradient(batch), rtol=1e-9, atol=1e-11)
        log = stop(process)
    assert "shared memory: off" in log


def test_results_held_after_the_client_is_dropped_stay_valid_and_free_their_region(server_address, rng):
    import gc
    import weakref

    c = sg.Client(server_address, shared_memory=True)
    f = c.register(det_graph(3))
    batch = rng.normal(size=(2000, 3, 3))
    grads = f.gradient({"A": batch})["A"]
    names = c.shared_memory_regions()
    alive = weakref.ref(c)
    c.transport.channel.close()
    del c, f
    gc.collect()
    assert alive() is None  # lent results do not keep the client (and its channel) alive
    np.testing.assert_allclose(grads, det_gradient(batch), rtol=1e-9, atol=1e-11)
    del grads
    gc.collect()
    assert not any(os.path.exists(os.path.join(SHM_DIR, n)) for n in names)


def test_the_server_keeps_a_bounded_cache_of_open_regions_and_drops_removed_ones(monkeypatch):
    from semigrad_server.service import shared_memory as server_shm

    monkeypatch.setattr(server_shm, "SWEEP_SECONDS", 0.0)
    shared = SharedMemory(max_open=2)
    regions = [Region(4096) for _ in range(3)]
    values = [np.full(4, float(i)) for i in range(3)]
    tensors = [put(r, v, 64) for r, v in zip(regions, values)]
    with shared.session("unix:") as first:
        held = first.array(tensors[0], "input 'x'")
        for t in tensors[1:]:  # evicts the first region's mapping, which this session still uses
            with shared.session("unix:") as other:
                other.array(t, "input 'x'")
        assert shared.opened() == [r.name for r in regions[1:]]
        np.testing.assert_array_equal(held, values[0])
    regions[1].close()  # its client removed it: the next request drops the mapping
    with shared.session("unix:") as session:
        np.testing.assert_array_equal(session.array(tensors[2], "input 'x'"), values[2])
    assert shared.opened() == [regions[2].name]
    shared.close()
    for r in regions:
        r.close()


@pytest.mark.parametrize("io_bytes", [64, 800, 1 << 30])
def test_copies_larger_than_one_system_call_are_split(region, monkeypatch, io_bytes):
    """Tensors of 800 bytes read and written in calls of MAX_IO_BYTES: 64 (13 calls), 800 (one),
    the default (one)."""
    from semigrad_server.service import shared_memory as server_shm

    monkeypatch.setattr(server_shm, "MAX_IO_BYTES", io_bytes)
    values = np.arange(100.0) - 7.5
    shared = SharedMemory()
    with shared.session("unix:") as session:
        array = session.array(put(region, values, 64), "input 'x'")
        np.testing.assert_array_equal(array, values)
        tensor = session.writer(room(region, 4096, 4096)).place(array * 2)
    np.testing.assert_array_equal(read(region, tensor), values * 2)
    shared.close()
