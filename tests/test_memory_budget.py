"""Cost before work (issue 13, item 5): a request's peak memory is estimated from shapes before
anything is allocated, and a request over max_request_bytes, or over what the worker's
requests in flight leave of max_memory_bytes, is RESOURCE_EXHAUSTED naming the node and the
budget. The issue's case: a 16 KB Evaluate (`p: [1000, 1]`, `q: [1, 1000]`, `broadcast_to
[100]`) grew a worker by 2.3 GB, within max_request_elements.

The estimate is checked against a closed form (the bytes of the values a plan holds at its
peak), and the worker's peak RSS (VmHWM of a real `semigrad serve` process) against the budget.
"""

from __future__ import annotations

import os
import re

import grpc
import numpy as np
import pytest
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from semigrad_server import errors
from semigrad_server.autodiff.best_path import PATH_STEP_BYTES
from semigrad_server.engine import Engine
from semigrad_server.limits import Limits
from semigrad_server.runtime import Plan
from semigrad_server.service import build_server, convert
from test_serve import serving
from test_status_contract import graph, inp, node

# The case: p + q broadcast over the batch, each item spread to 100 elements and returned.
AMPLIFIER = graph([inp("p", []), inp("q", [])],
                  [node("a", "add", "p", "q"), node("b", "broadcast_to", "a", shape=[100])], [("y", "b")])
# At the peak (computing b) a tensor plan holds a (8 bytes an item) and b (800; p and q are
# freed after their last use), and the response copies b twice (its bytes, the message): 2,408
# bytes an item at least, 2.4 GB for the 1,000,000 items (it grew a worker by 2.3 GB).
AMPLIFIER_ITEM_BYTES = 8 + 800 + 2 * 800
# The same summed per item: the peak is the same, the result 8 bytes (and its two copies).
SUMMED = graph([inp("p", []), inp("q", [])],
               [node("a", "add", "p", "q"), node("b", "broadcast_to", "a", shape=[100]), node("s", "sum", "b")],
               [("y", "s")])
ITEM_BYTES = 8 + 800 + 2 * 8
MIB = 1 << 20


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def amplifying_request(gid: str, rows: int, columns: int) -> pb.EvaluateRequest:
    return pb.EvaluateRequest(graph_id=gid, inputs={"p": codec.to_tensor(np.ones((rows, 1))),
                                                    "q": codec.to_tensor(np.ones((1, columns)))})


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_the_amplifying_request_is_refused_before_it_allocates_and_a_fitting_one_stays_in_its_budget():
    limits = Limits()
    with serving("--store", "memory") as (address, process):  # one process: the worker itself
        with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 256 * MIB)]) as channel:
            stub = pb_grpc.GraphServiceStub(channel)
            gid = stub.RegisterGraph(pb.RegisterGraphRequest(graph=AMPLIFIER), timeout=30).graph_id
            stub.Evaluate(amplifying_request(gid, 2, 2), timeout=30)  # compiled, warm
            before = peak_rss(process.pid)
            with pytest.raises(grpc.RpcError) as info:
                stub.Evaluate(amplifying_request(gid, 1000, 1000), timeout=60)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
            details = info.value.details()
            assert "'b'" in details and "max_request_bytes" in details
            held = int(re.search(r"would hold (\d+) bytes", details).group(1))
            assert held >= 1000 * 1000 * AMPLIFIER_ITEM_BYTES  # (a scalar program holds its rows too)
            refused_growth = peak_rss(process.pid) - before
            assert refused_growth < 64 * MIB, f"a refused request grew the worker by {refused_growth / MIB:.0f} MiB"

            # 100,000 items: 241 MB estimated, within the budget: served, and the worker grows by
            # no more than the budget
            rows, columns = 100, 1000
            estimate = rows * columns * AMPLIFIER_ITEM_BYTES
            assert estimate < limits.max_request_bytes
            before = peak_rss(process.pid)
            response = stub.Evaluate(amplifying_request(gid, rows, columns), timeout=120)
            np.testing.assert_array_equal(codec.from_tensor(response.outputs["y"]), np.full((rows, columns, 100), 2.0))
            growth = peak_rss(process.pid) - before
            assert growth <= limits.max_request_bytes, f"grew {growth / MIB:.0f} MiB, budget " \
                                                       f"{limits.max_request_bytes / MIB:.0f} MiB"


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_a_semiring_plan_allocates_nothing_of_a_requests_size_before_its_check():
    """A wide layer norm's semiring adjoint built its row length squared (δ_ij) when its plan
    was compiled, before the plan's bound could refuse the request: the first top_paths = 64
    call over 20,000-wide rows took 3.2 GB and 6 s, then was refused. At 12,000 wide the δ is
    1.15 GB; the refused call now grows the worker by far less."""
    wide = 12_000
    layer_norm = graph([inp("x", [8, wide])], [node("n", "layer_norm", "x"), node("s", "sum", "n")], [("y", "s")])
    with serving("--store", "memory") as (address, process):
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.GraphServiceStub(channel)
            gid = stub.RegisterGraph(pb.RegisterGraphRequest(graph=layer_norm), timeout=30).graph_id
            request = pb.GradientRequest(graph_id=gid, inputs={"x": codec.to_tensor(np.ones((8, wide)))},
                                         semiring="max_product", top_paths=64)
            before = peak_rss(process.pid)
            with pytest.raises(grpc.RpcError) as info:
                stub.Gradient(request, timeout=60)  # the first: its plan is compiled by it
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
            assert "top_paths = 64" in info.value.details()
            refused_growth = peak_rss(process.pid) - before
            assert refused_growth < 256 * MIB, f"a refused request grew the worker by {refused_growth / MIB:.0f} MiB"


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_a_k_best_request_admitted_under_its_budget_stays_in_it():
    """kbest at k = 64 (past its selection networks: the sort-based ⊕ and ⊗) made each ⊗'s
    ~280 candidate products an element at once: a request admitted under max_request_bytes
    grew its worker by ~3x the budget. Now they are made a block of elements at a time."""
    budget = 100_000_000
    chain = graph([inp("x", [4_000])], [node("t", "tanh", "x"), node("m", "mul", "t", "x"), node("s", "sin", "m"),
                                         node("y", "sum", "s")], [("y", "y")])
    with serving("--store", "memory", "--max-request-bytes", str(budget), "--max-memory-bytes", str(2 * budget)) \
            as (address, process):
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.GraphServiceStub(channel)
            gid = stub.RegisterGraph(pb.RegisterGraphRequest(graph=chain), timeout=30).graph_id
            params = {"k": codec.attr_value(64)}

            def request(n):
                return pb.GradientRequest(graph_id=gid, semiring="kbest", semiring_params=params,
                                          inputs={"x": codec.to_tensor(np.random.default_rng().normal(size=(n, 4_000)))})

            stub.Gradient(request(1), timeout=60)  # warm: compiled
            before = peak_rss(process.pid)
            with pytest.raises(grpc.RpcError) as info:  # the budget's items, found from the refusal's estimate
                stub.Gradient(request(64), timeout=60)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
            per_item = int(re.search(r"would hold (\d+) bytes", info.value.details()).group(1)) / 64
            items = int(0.95 * budget / per_item)
            assert items >= 1
            stub.Gradient(request(items), timeout=120)
            growth = peak_rss(process.pid) - before
            assert growth <= budget, f"grew {growth / MIB:.0f} MiB under a {budget / MIB:.0f} MiB budget"


def registered(engine: Engine) -> str:
    return engine.register(convert.graph_from_proto(SUMMED))[0].id


def items(n: int) -> dict:
    return {"p": np.ones((n, 1)), "q": np.ones((1, 1))}


def test_max_request_bytes_is_crossed_at_the_estimate():
    engine = Engine(Limits(max_request_bytes=1000 * ITEM_BYTES))
    gid = registered(engine)
    out, _ = engine.evaluate(gid, items(1000), backend="tensor")
    np.testing.assert_array_equal(out["y"], np.full((1000, 1), 200.0))
    with pytest.raises(errors.ResourceExhausted) as info:
        engine.evaluate(gid, items(1001), backend="tensor")
    assert "'b'" in str(info.value) and f"max_request_bytes = {1000 * ITEM_BYTES}" in str(info.value)


def test_an_output_only_the_server_reads_is_held_but_not_charged_response_copies():
    """Best paths follow every adjoint: a pointer plan's outputs, held to its end and never
    returned. Each was charged the two response copies of a returned result (a BERT-base top-10
    request was estimated at ~80 GB, 27 GB without them, for a 21.6 GB process peak)."""
    cg = Engine(Limits()).register(convert.graph_from_proto(AMPLIFIER))[0]
    outputs = [("y", cg.graph.output_map["y"])]
    returned = Plan(cg.graph, cg.order, cg.types, outputs, registry=cg.registry)
    read_only = Plan(cg.graph, cg.order, cg.types, outputs, registry=cg.registry, scratch=frozenset({"y"}))
    arrays = items(1000)
    held_returned, node = returned.cost(arrays).bytes_at(1000)
    held_read, same_node = read_only.cost(arrays).bytes_at(1000)
    assert node == same_node == "b"
    assert held_returned - held_read == 2 * 1000 * 800  # b's two copies: 100 float64 an item
    assert held_read >= 1000 * (8 + 800)  # b itself and a, still held


@pytest.mark.parametrize("kind", ["plain", "best paths", "top paths"])
def test_a_request_holds_its_reservation_until_its_response_is_built(kind, monkeypatch):
    """A request's estimate counts what it holds after its plan's run: its results, the
    response's copies of them, and (best paths) every adjoint while its paths are traced. The
    reservation was given back when the run ended, before any of those, so requests in flight
    could hold more than max_memory_bytes together. The paths' steps are reserved beside the
    plan's estimate. Seen from a real server's response building."""
    engine = Engine(Limits())
    reserved_then = []
    build = convert.gradient_response

    def building(result, writer, **how):
        steps = len(result.best_paths.step_node) if result.best_paths else 0
        reserved_then.append(engine.memory.reserved - steps * PATH_STEP_BYTES)  # the plan's, beside the paths'
        return build(result, writer, **how)

    monkeypatch.setattr(convert, "gradient_response", building)
    grpc_server, port, _ = build_server("127.0.0.1:0", limits=Limits(), engine=engine)
    grpc_server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GraphServiceStub(channel)
            gid = stub.RegisterGraph(pb.RegisterGraphRequest(graph=SUMMED), timeout=30).graph_id
            request = pb.GradientRequest(graph_id=gid, inputs={name: codec.to_tensor(a) for name, a in items(50).items()})
            if kind != "plain":
                request.semiring = "max_product"
                if kind == "best paths":
                    request.best_path_all = True
                else:
                    request.top_paths = 3
            for _ in range(3):  # the plain request's later calls take the short path
                stub.Gradient(request, timeout=30)
    finally:
        grpc_server.stop(0).wait()
    assert len(reserved_then) == 3 and all(r > 0 for r in reserved_then), reserved_then  # (given back: 0)
    assert engine.memory.reserved == 0


def test_max_memory_bytes_bounds_the_requests_in_flight_together():
    engine = Engine(Limits(max_memory_bytes=1500 * ITEM_BYTES))
    gid = registered(engine)
    with engine.memory.reserved_for(1000 * ITEM_BYTES):  # another request in flight
        engine.evaluate(gid, items(500), backend="tensor")  # 1,500 items' worth in all: within
        with pytest.raises(errors.ResourceExhausted) as info:
            engine.evaluate(gid, items(501), backend="tensor")
        assert "max_memory_bytes" in str(info.value)
        with pytest.raises(errors.ResourceExhausted):  # gradients too (at 8 bytes an item at least)
            engine.gradient(gid, items(100_000), backend="tensor")
    assert engine.memory.reserved == 0
    engine.evaluate(gid, items(1500), backend="tensor")  # the other request ended
    engine.gradient(gid, items(1500), backend="tensor")
    with engine.memory.reserved_for(1500 * ITEM_BYTES - 1):  # the short path (a repeat) reserves too
        with pytest.raises(errors.ResourceExhausted):
            engine.gradient(gid, items(1500), backend="tensor")
    engine.gradient(gid, items(1500), backend="tensor")


def test_the_scalar_program_is_estimated_too():
    """A scalar program holds every variable as a batch row to its end, and stacks the outputs."""
    engine = Engine(Limits(max_request_bytes=1000 * 8 * 10))
    gid = engine.register(convert.graph_from_proto(graph(
        [inp("x", [2])], [node("s", "sin", "x"), node("t", "sum", "s")], [("y", "t")])))[0].id
    engine.evaluate(gid, {"x": np.ones((100, 2))}, backend="scalar")
    with pytest.raises(errors.ResourceExhausted) as info:
        engine.evaluate(gid, {"x": np.ones((100_000, 2))}, backend="scalar")
    assert "max_request_bytes" in str(info.value)


def test_max_request_operations_counts_a_matmuls_products():
    """[20, 30] @ [30, 10] is 20 × 10 × 30 = 6,000 products an item, its sum 200 more: a request
    is refused past the limit before it runs, not for its elements (200 + 200 an item)."""
    per_item = 20 * 10 * 30 + 20 * 10
    engine = Engine(Limits(max_request_operations=10 * per_item))
    gid = engine.register(convert.graph_from_proto(graph(
        [inp("a", [20, 30]), inp("b", [30, 10])], [node("m", "matmul", "a", "b"), node("s", "sum", "m")],
        [("y", "s")])))[0].id
    out, _ = engine.evaluate(gid, {"a": np.ones((10, 20, 30)), "b": np.ones((30, 10))}, backend="tensor")
    np.testing.assert_array_equal(out["y"], np.full(10, 20 * 10 * 30.0))
    with pytest.raises(errors.ResourceExhausted) as info:
        engine.evaluate(gid, {"a": np.ones((11, 20, 30)), "b": np.ones((30, 10))}, backend="tensor")
    assert "max_request_operations" in str(info.value) and str(11 * per_item) in str(info.value)


def test_best_path_tracing_is_costed_before_it_runs():
    """Paths are read from back-pointers, so their cost is their steps: x[50] -> sin -> sum has
    paths of 3 steps (x, w, s); max_path_steps bounds the steps of all paths asked for."""
    engine = Engine(Limits(max_path_steps=100 * 3))
    gid = engine.register(convert.graph_from_proto(graph(
        [inp("x", [50])], [node("w", "sin", "x"), node("s", "sum", "w")], [("y", "s")])))[0].id
    x = {"x": np.linspace(0.1, 1, 50)}
    result = engine.gradient(gid, x, semiring="max_product", best_paths=[("x", (k % 50,)) for k in range(100)])
    assert len(result.best_paths) == 100 and all(len(p.steps) == 3 for p in result.best_paths)
    with pytest.raises(errors.ResourceExhausted) as info:
        engine.gradient(gid, x, semiring="max_product", best_paths=[("x", (k % 50,)) for k in range(101)])
    assert "max_path_steps = 300" in str(info.value) and str(101 * 3) in str(info.value)
