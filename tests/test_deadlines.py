"""Deadlines everywhere (issue 13, item 4): every long phase stops within OVERRUN of the call's
deadline or of the client's cancellation, and a call without a deadline gets the server's
default (max_request_seconds).

Each case is one the issue measured running on far past its deadline (a custom-op expression,
a 30,000-operand concat's gradient compiling for 15.6 s, a 58-matmul chain checked every 64
steps, 30,000 best paths, a symbolic gradient of a 40-node sin/cos chain). The client's own
view ends at its deadline whatever the server does, so the tests read the server's: its log
line for the call says how long its work went on past the deadline (`overrun_ms`), measured
by the server's clock where the work stops, not through a loaded machine's scheduling of the
client.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from semigrad_server.limits import Limits
from semigrad_server.service import build_server
from test_status_contract import graph, inp, node

OVERRUN = 0.1  # seconds: work stops within this of the deadline or the cancellation ...


def allowed_overrun() -> float:
    """... on a machine with a core for each runnable thread. On an oversubscribed one (a CI
    machine running benchmarks beside the tests) the interrupted thread waits its turn for a
    core: the bound grows with the measured load per core (load 10 on 2 cores: 0.5 s), still
    far below the seconds to minutes the old code went on."""
    return OVERRUN * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))

LOG_WAIT = 60.0  # seconds to wait for the server's log line (the old code ran on for 15-30 s)
DEFAULT_SECONDS = 1.0  # max_request_seconds of the server whose default deadline is tested
TIMEOUT = 20.0
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # a channel of its own connection (not shared)


def start(limits: Limits):
    server, port, _ = build_server("127.0.0.1:0", limits=limits)
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture(scope="module", autouse=True)
def heap_as_a_server_has_it():
    """The servers here share the pytest worker's heap (every earlier module's objects): one full
    collection of it took 370-420 ms, a C call no interruption reaches, and landed on a deadline
    in a CI run (887 ms past it). `semigrad serve` moves what it holds at start out of the
    collector's generations (gc.freeze, service/server.py); the module does the same with what
    the worker holds before it, so a collection scans what the calls made, as in a server."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="module")
def address():
    server, address = start(Limits())
    yield address
    server.stop(0).wait()


@pytest.fixture(scope="module")
def stub(address):
    with grpc.insecure_channel(address) as channel:
        yield pb_grpc.GraphServiceStub(channel)


@pytest.fixture(scope="module")
def impatient_server():
    """A server whose default deadline (for calls without one) is DEFAULT_SECONDS."""
    server, address = start(Limits(max_request_seconds=DEFAULT_SECONDS))
    yield address
    server.stop(0).wait()


@pytest.fixture
def rpc_log(caplog):
    caplog.set_level(logging.INFO, logger="semigrad.rpc")
    return caplog


def server_line(caplog, rpc: str, seen: int = 0) -> str:
    """The server's log line for the next call of `rpc` (after the first `seen` ones) once its
    work has ended."""
    stop = time.monotonic() + LOG_WAIT
    while time.monotonic() < stop:
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"rpc={rpc} ")]
        if len(lines) > seen:
            return lines[seen]
        time.sleep(0.02)
    raise AssertionError(f"the server's work on {rpc} did not end within {LOG_WAIT} s")


def assert_stopped_in_time(line: str, status: str = "DEADLINE_EXCEEDED", within: float = OVERRUN) -> float:
    assert f"status={status}" in line, line
    overrun = re.search(r"overrun_ms=([0-9.]+)", line)
    assert overrun, line
    allowed = allowed_overrun() * within / OVERRUN
    assert float(overrun.group(1)) <= allowed * 1e3, \
        f"work went on {overrun.group(1)} ms past the deadline (allowed {allowed * 1e3:.0f} ms): {line}"
    return float(overrun.group(1))


def call_with_deadline(method, request, seconds: float) -> grpc.StatusCode:
    try:
        method(request, timeout=seconds)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def register(stub, g) -> str:
    return stub.RegisterGraph(pb.RegisterGraphRequest(graph=g), timeout=120).graph_id


# ------------------------------------------------------------------ the cases


def concat_graph(n: int) -> pb.Graph:
    return graph([inp("x", [1])], [node("c", "concat", *(["x"] * n)), node("s", "sum", "c")], [("y", "s")])


def test_a_30000_operand_concat_gradient_stops_compiling_at_the_deadline(stub, rpc_log):
    gid = register(stub, concat_graph(30_000))
    request = pb.GradientRequest(graph_id=gid, inputs={"x": codec.to_tensor(np.ones(1))})
    assert call_with_deadline(stub.Gradient, request, 1.0) == grpc.StatusCode.DEADLINE_EXCEEDED
    line = server_line(rpc_log, "Gradient")
    assert_stopped_in_time(line)
    assert "compiling the gradient" in line


def test_describing_a_30000_operand_concat_stops_at_the_deadline(stub, rpc_log):
    """Found by the hostile runs: DescribeGraph of this graph ran 16 s past a 1 s deadline."""
    gid = register(stub, concat_graph(30_003))
    assert call_with_deadline(stub.DescribeGraph, pb.DescribeGraphRequest(graph_id=gid), 1.0) \
        == grpc.StatusCode.DEADLINE_EXCEEDED
    line = server_line(rpc_log, "DescribeGraph")
    assert_stopped_in_time(line)
    assert "describing the graph" in line


def test_a_cancelled_compile_stops_within_the_bound(stub, rpc_log):
    gid = register(stub, concat_graph(30_001))
    future = stub.Gradient.future(pb.GradientRequest(graph_id=gid, inputs={"x": codec.to_tensor(np.ones(1))}),
                                  timeout=TIMEOUT)
    time.sleep(0.5)
    future.cancel()
    line = server_line(rpc_log, "Gradient")
    assert_stopped_in_time(line, status="CANCELLED")


def test_a_matmul_chain_is_checked_at_every_step(stub, rpc_log):
    """58 matmuls, each some tens of ms: checked every 64 steps, the chain ran to its end."""
    n, steps = 120, 58
    nodes, prev = [], "x"
    for i in range(steps):
        nodes.append(node(f"m{i}", "matmul", prev, "w"))
        prev = f"m{i}"
    gid = register(stub, graph([inp("x", [n, n]), inp("w", [n, n])], nodes + [node("s", "sum", prev)], [("y", "s")]))
    rng = np.random.default_rng(0)
    inputs = {"x": codec.to_tensor(rng.random((64, n, n)) / n), "w": codec.to_tensor(rng.random((n, n)) / n)}
    stub.Evaluate(pb.EvaluateRequest(graph_id=gid, inputs=inputs), timeout=120)  # compiles it
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        stub.Evaluate(pb.EvaluateRequest(graph_id=gid, inputs=inputs), timeout=120)
        runs.append(time.perf_counter() - started)
    assert call_with_deadline(stub.Evaluate, pb.EvaluateRequest(graph_id=gid, inputs=inputs), min(runs) / 5) \
        == grpc.StatusCode.DEADLINE_EXCEEDED
    line = server_line(rpc_log, "Evaluate", seen=4)
    # Checked before every step, the work stops within the step running at the deadline: a
    # matmul of the batch is one NumPy call (~35 ms idle, over 100 ms in a loaded CI run, which
    # went 122.9 ms past against 120 allowed; others 195 and 363 ms while their timed runs took
    # 7-8 ms a step, the last stopping after its first step: the step at the deadline is allowed
    # four times this call's own mean step, or three times the slowest timed run's: a fresh-clone
    # CI run's step at the deadline took 533 ms, 3.5 times its call's mean of 154); checked every
    # 64 steps, it ran the whole chain, ~45 steps past the deadline.
    done = re.search(r"\((\d+)/(\d+) steps\)", line)
    assert done and int(done.group(1)) < int(done.group(2)), line
    this_call = float(re.search(r" ms=([0-9.]+)", line).group(1)) / 1e3 / max(1, int(done.group(1)))
    assert_stopped_in_time(line, within=max(OVERRUN, 3 * max(runs) / (steps + 1), 4 * this_call))
    assert "at node 'm" in line


def test_every_elements_best_path_stops_at_the_deadline(address, rpc_log):
    """best_path="all" over 70,000 elements of a 12-op chain: 980,000 path steps (the default
    max_path_steps is 1,000,000), most of the request's time following pointers and writing the
    columns (the plan itself ~10%). The deadline falls halfway through a warm run."""
    nodes, prev = [], "x"
    for i in range(12):
        nodes.append(node(f"n{i}", "sin" if i % 2 else "exp", prev))
        prev = f"n{i}"
    with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        stub = pb_grpc.GraphServiceStub(channel)  # (the paths' columns: ~24 MB)
        gid = register(stub, graph([inp("x", [200])], nodes + [node("s", "sum", prev)], [("y", "s")]))
        request = pb.GradientRequest(graph_id=gid, semiring="max_product", best_path_all=True,
                                     inputs={"x": codec.to_tensor(np.linspace(0, 1, 350 * 200).reshape(350, 200))})
        assert call_with_deadline(stub.Gradient, request, 60.0) == grpc.StatusCode.OK  # compiled
        start = time.perf_counter()
        assert call_with_deadline(stub.Gradient, request, 60.0) == grpc.StatusCode.OK
        whole = time.perf_counter() - start
        assert call_with_deadline(stub.Gradient, request, whole / 2) == grpc.StatusCode.DEADLINE_EXCEEDED
    line = server_line(rpc_log, "Gradient", seen=2)
    assert_stopped_in_time(line)  # (as objects, 30,000 paths had needed 500 ms: 104-146 ms past it)
    assert "best path" in line


def test_top_paths_stop_at_the_deadline_within_a_k_best_step(stub, rpc_log):
    """top_paths = 64 carries 192 arrays per value: one plan step over 40,000 elements (stacking
    them, keeping the 64 best of 128 candidates) took 0.4-0.65 s, checked only between steps.
    The deadline is now checked between its passes and between chunks of its kernels' rows
    (one k-best ⊕ kernel call ran 155 ms past a deadline). Deadlines at fractions of this
    machine's whole call land in different phases."""
    n = 40_000
    gid = register(stub, graph([inp("x", [n])], [node("d", "mul", "x", "x"), node("t", "tanh", "d"),
                                                 node("s", "sum", "t")], [("y", "s")]))
    request = pb.GradientRequest(graph_id=gid, inputs={"x": codec.to_tensor(np.linspace(-1, 1, n))},
                                 semiring="max_product", top_paths=64)
    assert call_with_deadline(stub.Gradient, request, 60.0) == grpc.StatusCode.OK  # compiled
    whole = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        assert call_with_deadline(stub.Gradient, request, 60.0) == grpc.StatusCode.OK
        whole = min(whole, time.perf_counter() - started)
    seen = 3
    for fraction in (0.2, 0.35, 0.5):  # (0.7 once finished in time: this host's calls vary by a third)
        assert call_with_deadline(stub.Gradient, request, fraction * whole) == grpc.StatusCode.DEADLINE_EXCEEDED
        assert_stopped_in_time(server_line(rpc_log, "Gradient", seen=seen), within=2 * OVERRUN)
        seen += 1


def test_a_wide_row_ops_semiring_adjoint_stops_at_the_deadline(stub, rpc_log):
    """One 8,192-wide softmax row under max_product: its Jacobian (67 M elements) was built and
    multiplied in a few uninterruptible passes, 0.4-2.3 s past a 0.3 s deadline. It now goes
    by blocks of columns (ROW_BLOCK_ELEMENTS), checked between."""
    width = 8192
    gid = register(stub, graph([inp("x", [1, width])], [node("p", "softmax", "x", axis=-1), node("m", "mul", "p", "x"),
                                                        node("s", "sum", "m")], [("y", "s")]))
    request = pb.GradientRequest(graph_id=gid, inputs={"x": codec.to_tensor(np.random.default_rng().normal(size=(1, width)))},
                                 semiring="max_product")
    for seen in range(2):  # (the first call also loads the semiring's kernels)
        assert call_with_deadline(stub.Gradient, request, 0.3) == grpc.StatusCode.DEADLINE_EXCEEDED
        line = server_line(rpc_log, "Gradient", seen=seen)
        if seen:
            assert_stopped_in_time(line)
            assert "at a softmax adjoint" in line


def sin_cos_chain(length: int) -> pb.Graph:
    nodes, prev = [], "x"
    for i in range(length):
        nodes.append(node(f"n{i}", "sin" if i % 2 else "cos", prev))
        prev = f"n{i}"
    return graph([inp("x", [])], nodes, [("y", prev)])


def test_a_symbolic_gradient_stops_at_the_deadline(stub, rpc_log):
    gid = register(stub, sin_cos_chain(40))
    assert call_with_deadline(stub.SymbolicGradient, pb.SymbolicGradientRequest(graph_id=gid), 1.0) \
        == grpc.StatusCode.DEADLINE_EXCEEDED
    line = server_line(rpc_log, "SymbolicGradient")
    assert_stopped_in_time(line)
    assert "symbolic gradient" in line


def test_a_request_waits_for_a_jit_compile_only_until_its_deadline(stub, rpc_log):
    """backend="jit" compiled on the request's thread for as long as numba took (7 ms an
    instruction: minutes for large programs); now the compile runs in the background and the
    request waits for it until its deadline."""
    nodes, prev = [], "x"
    for i in range(10):
        nodes.append(node(f"n{i}", "sin" if i % 2 else "cos", prev))
        prev = f"n{i}"
    gid = register(stub, graph([inp("x", [30])], nodes + [node("s", "sum", prev)], [("y", "s")]))
    request = pb.GradientRequest(graph_id=gid, inputs={"x": codec.to_tensor(np.linspace(0, 1, 30))}, backend="jit")
    assert call_with_deadline(stub.Gradient, request, 0.5) == grpc.StatusCode.DEADLINE_EXCEEDED
    line = server_line(rpc_log, "Gradient")
    assert_stopped_in_time(line)
    assert "JIT compile" in line


def test_a_nested_custom_op_expression_registers_within_its_deadline(stub, rpc_log):
    """About 30 nested calls in a 200-character expression made RegisterGraph run 43-120 s."""
    for fn in ("sin", "exp", "tanh", "sigmoid", "log1p", "erf"):
        expression = (fn + "(") * 30 + "x" + ")" * 30
        g = graph([inp("x", [3])], [node("n", "nested", "x")], [("y", "n")],
                  op_defs=[pb.OpDef(name="nested", operands=["x"], expression=expression)])
        code = call_with_deadline(stub.RegisterGraph, pb.RegisterGraphRequest(graph=g), 1.0)
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED)
    for k in range(6):
        line = server_line(rpc_log, "RegisterGraph", seen=k)
        assert "status=INTERNAL" not in line
        if "overrun_ms" in line:
            assert_stopped_in_time(line)


def test_registering_a_large_graph_stops_at_the_deadline(stub, rpc_log):
    """Reading, validating and typing 40,000 nodes takes most of a second: registration is
    interruptible. (Its content hash sorts and JSON-encodes the nodes in single C calls, ~0.2 s
    for max_nodes = 100,000 on an idle core, which cannot be interrupted: docs/limits.md.)"""
    nodes = [node("n0", "sin", "x")] + [node(f"n{i}", "add", f"n{i - 1}", "x") for i in range(1, 40_000)]
    g = graph([inp("x", [4])], nodes, [("y", "n39999")])
    code = call_with_deadline(stub.RegisterGraph, pb.RegisterGraphRequest(graph=g), 0.1)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert_stopped_in_time(server_line(rpc_log, "RegisterGraph"))


# ------------------------------------------------------------------ the server's default deadline


def test_a_call_without_a_deadline_gets_the_servers_default(impatient_server, rpc_log):
    with grpc.insecure_channel(impatient_server) as channel:
        stub = pb_grpc.GraphServiceStub(channel)
        gid = register(stub, concat_graph(30_002))
        with pytest.raises(grpc.RpcError) as info:
            stub.Gradient(pb.GradientRequest(graph_id=gid, inputs={"x": codec.to_tensor(np.ones(1))}))  # no timeout
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The server's own clock says when its work stopped (the old code: 15-20 s); the client's
        # wall clock adds a loaded machine's scheduling (12 s once in CI) and proves nothing more.
        assert_stopped_in_time(server_line(rpc_log, "Gradient"))


def sends_nothing(never: threading.Event):
    """A request stream that sends no message (until `never` is set, or 30 s)."""
    never.wait(30)
    yield from ()


def test_an_idle_gradient_stream_without_a_deadline_ends_at_the_servers_default(impatient_server, rpc_log):
    with grpc.insecure_channel(impatient_server) as channel:
        never = threading.Event()
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            list(pb_grpc.GraphServiceStub(channel).GradientStream(sends_nothing(never)))
        never.set()
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, info.value.details()
        assert time.monotonic() - started < DEFAULT_SECONDS + 5
        assert_stopped_in_time(server_line(rpc_log, "GradientStream"))


@pytest.mark.parametrize("rpc", ["GradientStream", "GradientWithHooks"])
def test_a_stream_idle_past_the_servers_bound_ends_whatever_the_clients_deadline(impatient_server, rpc_log, rpc):
    """A client's far deadline (an hour) does not hold a stream slot idle past the server's
    max_request_seconds: each wait for the stream's next message is bounded by it (an attacker
    held every stream slot of a worker this way)."""
    with grpc.insecure_channel(impatient_server) as channel:
        never = threading.Event()
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            list(getattr(pb_grpc.GraphServiceStub(channel), rpc)(sends_nothing(never), timeout=3600))
        never.set()
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, info.value.details()
        assert "sent no message" in info.value.details()
        assert time.monotonic() - started < DEFAULT_SECONDS + 5
    line = server_line(rpc_log, rpc)  # its own deadline never came: the call ended by its idle bound
    assert "status=DEADLINE_EXCEEDED" in line, line
    # ended at the idle bound, not the client's hour (a slowed host's full run: 176 ms past it)
    assert float(re.search(r" ms=([0-9.]+)", line).group(1)) <= (DEFAULT_SECONDS + max(0.5, allowed_overrun())) * 1e3, \
        line


def test_an_idle_hook_stream_ends_at_the_servers_default(impatient_server, rpc_log):
    """Without `start`, and after `start` with a hook call never answered."""
    with grpc.insecure_channel(impatient_server) as channel:
        stub = pb_grpc.GraphServiceStub(channel)
        gid = register(stub, graph([inp("x", [3])], [node("s", "sin", "x"), node("t", "sum", "s")], [("y", "t")]))
        start_message = pb.HookStreamRequest(start=pb.GradientRequest(
            graph_id=gid, inputs={"x": codec.to_tensor(np.ones(3))},
            hooks=[pb.HookAttachment(node="s", client=True)]))
        for opening in ([], [start_message]):
            never = threading.Event()

            def idle(opening=opening, never=never):
                yield from opening
                never.wait(30)

            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                list(stub.GradientWithHooks(idle()))
            never.set()
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, info.value.details()
            assert time.monotonic() - started < DEFAULT_SECONDS + 5
    for k in range(2):
        assert_stopped_in_time(server_line(rpc_log, "GradientWithHooks", seen=k))


# ------------------------------------------------------------------ hook stream protocol faults


@pytest.mark.parametrize("wrong", ["start", "empty"])
def test_a_hook_stream_given_something_else_than_a_reply_fails_at_once(stub, wrong):
    gid = register(stub, graph([inp("x", [3])], [node("s", "sin", "x"), node("t", "sum", "s")], [("y", "t")]))
    start_message = pb.HookStreamRequest(start=pb.GradientRequest(
        graph_id=gid, inputs={"x": codec.to_tensor(np.ones(3))}, hooks=[pb.HookAttachment(node="s", client=True)]))
    done = threading.Event()

    def messages():
        yield start_message
        yield start_message if wrong == "start" else pb.HookStreamRequest()
        done.wait(TIMEOUT)

    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        for _ in stub.GradientWithHooks(messages(), timeout=TIMEOUT):
            pass
    done.set()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert ("'start'" if wrong == "start" else "empty message") in info.value.details()
    assert time.monotonic() - started < 5.0  # at once, not at the 20 s deadline


# ------------------------------------------------------------------ starvation


def idle_stream(channel, release: threading.Event):
    def idle():
        release.wait(TIMEOUT)
        yield from ()

    return pb_grpc.GraphServiceStub(channel).GradientStream(idle(), timeout=TIMEOUT)


def test_idle_streams_cannot_starve_health_checks_or_requests(address, stub):
    """8 idle GradientStream calls took every request thread of a worker, and 3-5 of 10 health
    checks from new connections timed out. Now streams run on threads of their own, streams past max_streams (or past
    max_streams_per_connection on one connection) are RESOURCE_EXHAUSTED at once, and health
    checks and unary calls always find a thread."""
    limits = Limits()
    release = threading.Event()
    opened = limits.max_streams + 4
    channels = [grpc.insecure_channel(address, options=OWN_CONNECTION) for _ in range(opened)]
    calls = [idle_stream(channel, release) for channel in channels]
    try:
        refused = []

        def drain(call):
            try:
                list(call)
            except grpc.RpcError as e:
                refused.append(e)

        readers = [threading.Thread(target=drain, args=(call,)) for call in calls]
        for reader in readers:
            reader.start()
        time.sleep(1.0)  # every stream has reached the server
        assert len(refused) == opened - limits.max_streams
        assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_streams" in e.details() for e in refused)
        for _ in range(10):
            with grpc.insecure_channel(address, options=OWN_CONNECTION) as fresh:
                answer = health_pb2_grpc.HealthStub(fresh).Check(health_pb2.HealthCheckRequest(service=""),
                                                                 timeout=2.0)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
        gid = register(stub, graph([inp("x", [3])], [node("s", "sin", "x"), node("t", "sum", "s")], [("y", "t")]))
        response = stub.Gradient(pb.GradientRequest(graph_id=gid, inputs={"x": codec.to_tensor(np.ones(3))}),
                                 timeout=2.0)
        np.testing.assert_allclose(codec.from_tensor(response.gradients["x"]), np.cos(np.ones(3)))
    finally:
        release.set()
        for reader in readers:
            reader.join(TIMEOUT)
        for channel in channels:
            channel.close()


def test_one_connection_gets_at_most_its_share_of_streams(address):
    limits = Limits()
    release = threading.Event()
    with grpc.insecure_channel(address) as channel:
        calls = [idle_stream(channel, release) for _ in range(limits.max_streams_per_connection + 1)]
        errors = []

        def drain(call):
            try:
                list(call)
            except grpc.RpcError as e:
                errors.append(e)

        readers = [threading.Thread(target=drain, args=(call,)) for call in calls]
        for reader in readers:
            reader.start()
        time.sleep(1.0)
        assert len(errors) == 1, [e.details() for e in errors]
        assert errors[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_streams_per_connection" in errors[0].details()
        release.set()
        for reader in readers:
            reader.join(TIMEOUT)


@pytest.mark.parametrize("method", ["GradientStream", "GradientWithHooks"])
@pytest.mark.parametrize("ending", ["cancel", "deadline"])
def test_a_stream_ended_while_the_server_reads_it_is_not_internal(stub, rpc_log, method, ending):
    """Found by tests/fuzz/test_hostile_requests.py: gRPC's request iterator raises when the call
    ends under it, and that was answered (and logged) as INTERNAL."""
    release = threading.Event()

    def idle():
        release.wait(TIMEOUT)
        yield from ()

    call = getattr(stub, method)(idle(), timeout=0.3 if ending == "deadline" else TIMEOUT)
    if ending == "cancel":
        time.sleep(0.3)
        call.cancel()
    with pytest.raises(grpc.RpcError):
        list(call)
    release.set()
    line = server_line(rpc_log, method)
    assert "INTERNAL" not in line and "internal error" not in line, line
    if ending == "deadline":
        assert_stopped_in_time(line)
