"""Operations: Prometheus metrics (in-process, and summed over worker processes by the
supervisor), JSON logs with request ids, graceful drain on SIGTERM (health goes NOT_SERVING
first, calls in flight finish), and worker counts from the container's CPU quota."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import numpy as np
import pytest
import semigrad as sg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from semigrad_server.cpus import available_cpus, cgroup_quota
from semigrad_server.service import build_server
from semigrad_server.service.auth import load_tokens
from semigrad_server.service.metrics import Metrics
from test_serve import free_port, read_output, stop, wait_for_workers, wait_until_serving

TOKEN = "metrics-tenant-token-0123456789"


def square_graph(n: int = 3) -> sg.Graph:
    g = sg.Graph()
    x = g.input("x", (n,))
    g.output("y", sg.sum(x * x, name="s"))
    return g


def test_metrics_count_calls_by_rpc_status_and_tenant():
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server, port, engine = build_server("127.0.0.1:0", metrics=metrics,
                                        tokens=load_tokens(environ={"SEMIGRAD_TOKENS": f"m={TOKEN}"}))
    engine.graphs = metrics.counting(engine.graphs)
    server.start()
    value = registry.get_sample_value
    try:
        with sg.Client(f"127.0.0.1:{port}", token=TOKEN) as client, sg.Client(f"127.0.0.1:{port}", token="") as anon:
            f = client.register(square_graph())
            for _ in range(5):
                f.gradient({"x": [1.0, 2.0, 3.0]})
            with pytest.raises(sg.NotFound):
                client.get_graph("g-none")
            with pytest.raises(sg.SemigradError):
                anon.list_ops()
        assert value("semigrad_requests_total", {"rpc": "Gradient", "code": "OK"}) == 5
        assert value("semigrad_requests_total", {"rpc": "RegisterGraph", "code": "OK"}) == 1
        assert value("semigrad_requests_total", {"rpc": "GetGraph", "code": "NOT_FOUND"}) == 1
        assert value("semigrad_requests_total", {"rpc": "ListOps", "code": "UNAUTHENTICATED"}) == 1
        assert value("semigrad_tenant_requests_total", {"tenant": "m", "code": "OK"}) == 6
        assert value("semigrad_tenant_requests_total", {"tenant": "unauthenticated", "code": "UNAUTHENTICATED"}) == 1
        assert value("semigrad_request_seconds_count", {"rpc": "Gradient"}) == 5
        assert value("semigrad_requests_in_flight", {"rpc": "Gradient"}) == 0
        assert value("semigrad_tenant_stored_graphs", {"tenant": "m"}) == 1
        assert value("semigrad_store_operations_total", {"store": "memory", "op": "put", "outcome": "ok"}) == 1
        # the first gradient compiles its plan; the rest take the remembered short path or hit the cache
        assert value("semigrad_engine_events_total", {"event": "plan_compile"}) >= 1
    finally:
        server.stop(0)


def test_a_stream_its_client_cancels_is_counted_cancelled_and_logged_with_its_request_id():
    """A GradientStream whose client cancels it is CANCELLED in the metrics, as in the log line: it
    was counted UNKNOWN (a server fault, to an alert) when the client cancelled while responses
    were flowing, and OK when it cancelled an idle stream; and the log line of the first had no
    request id or tenant (the stream's clean-up ran outside the call's context)."""
    import logging
    import queue

    from semigrad_server import logs
    from semigrad_server import tenancy

    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server, port, _ = build_server("127.0.0.1:0", metrics=metrics,
                                   tokens=load_tokens(environ={"SEMIGRAD_TOKENS": f"m={TOKEN}"}))
    server.start()
    seen = []

    class Fields(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("rpc=GradientStream"):
                seen.append((logs.REQUEST_ID.get(), tenancy.current()))

    handler = Fields()
    logger = logging.getLogger("semigrad.rpc")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    value = registry.get_sample_value
    auth = (("authorization", f"Bearer {TOKEN}"),)
    try:
        with sg.Client(f"127.0.0.1:{port}", token=TOKEN) as client:
            graph_id = client.register(square_graph()).id
        x = pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=[20000, 3], data=np.ones((20000, 3)).tobytes())
        chunks = [pb.GradientStreamRequest(chunk=i, request=pb.GradientRequest(graph_id=graph_id, inputs={"x": x}))
                  for i in range(40)]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GraphServiceStub(channel)
            for _ in range(3):  # cancelled while answers flow
                call = stub.GradientStream(iter(chunks), metadata=auth, timeout=30)
                next(call)
                call.cancel()
            idle: queue.Queue = queue.Queue()
            call = stub.GradientStream(iter(idle.get, None), metadata=auth, timeout=30)  # cancelled idle
            time.sleep(0.5)
            call.cancel()
            deadline = time.monotonic() + 10
            while value("semigrad_requests_in_flight", {"rpc": "GradientStream"}) != 0 or len(seen) < 4:
                assert time.monotonic() < deadline, (value("semigrad_requests_in_flight", {"rpc": "GradientStream"}), seen)
                time.sleep(0.05)
        assert value("semigrad_requests_total", {"rpc": "GradientStream", "code": "CANCELLED"}) == 4
        for code in ("OK", "UNKNOWN"):
            assert value("semigrad_requests_total", {"rpc": "GradientStream", "code": code}) is None, code
        assert value("semigrad_tenant_requests_total", {"tenant": "m", "code": "CANCELLED"}) == 4
        assert len(seen) == 4 and all(request_id and tenant == "m" for request_id, tenant in seen), seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        server.stop(0)


def test_health_checks_are_answered_while_every_request_thread_is_busy():
    """A worker whose request threads are all taken (calls waiting for a numba compile, slow
    gradients: any tenant can send enough) still answers health checks at once: they waited in
    the same queue, so load balancers and Kubernetes' probes took a busy replica for a dead one."""
    from semigrad_server.engine import Engine
    from semigrad_server.limits import Limits

    release = threading.Event()
    started = threading.Semaphore(0)

    class Stuck(Engine):
        def get(self, graph_id):
            started.release()
            release.wait(30)
            return super().get(graph_id)

    limits = Limits(max_streams=1)
    server, port, _ = build_server("127.0.0.1:0", threads=2, limits=limits, engine=Stuck(limits))
    server.start()
    calls = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GraphServiceStub(channel)
            for _ in range(2 + 1 + 2):  # every thread of the pool (threads + max_streams), and more queued
                calls.append(stub.GetGraph.future(pb.GetGraphRequest(graph_id="g0"), timeout=30))
            for _ in range(3):
                assert started.acquire(timeout=10)
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(3):
                answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
            release.set()
            for call in calls:
                assert call.exception(timeout=30).code() == grpc.StatusCode.NOT_FOUND
    finally:
        release.set()
        server.stop(0)


def test_open_health_watch_streams_are_bounded(monkeypatch):
    """Health needs no token, and an open Watch holds memory until its client goes: past
    MAX_HEALTH_WATCHES open ones a Watch is RESOURCE_EXHAUSTED; one closed makes room; Check is
    never refused."""
    from semigrad_server.service import server as server_module

    monkeypatch.setattr(server_module, "MAX_HEALTH_WATCHES", 3)
    server, port, _ = build_server("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service="")
            watches = [health.Watch(request, timeout=30) for _ in range(3)]
            for w in watches:  # each is open: its first answer came
                assert next(w).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as info:
                next(health.Watch(request, timeout=30))
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "MAX_HEALTH_WATCHES" in info.value.details()
            assert health.Check(request, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
            watches.pop().cancel()
            deadline = time.monotonic() + 10
            while True:  # the server sees the cancellation a moment later
                try:
                    again = health.Watch(request, timeout=30)
                    assert next(again).status == health_pb2.HealthCheckResponse.SERVING
                    again.cancel()
                    break
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
                    time.sleep(0.05)
            for w in watches:
                w.cancel()
    finally:
        server.stop(0)


def test_workers_metrics_are_summed_and_logs_are_json(tmp_path):
    """Two worker processes behind one port; /metrics on the supervisor's port counts every call
    of both (multiprocess mode); every log line is a JSON object, call lines with request ids."""
    port, metrics_port = free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "semigrad_server", "serve", "--port", str(port), "--workers", "2",
         "--store", str(tmp_path / "graphs.sqlite"), "--metrics-port", str(metrics_port),
         "--metrics-host", "127.0.0.1", "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    address = f"127.0.0.1:{port}"
    read_output(process)
    try:
        wait_until_serving(address, process)
        wait_for_workers(process, 2)
        with sg.Client(address, timeout=20) as client:
            graph_id = client.register(square_graph()).id
        calls = 0
        # fresh connections: the kernel spreads them over both workers, at least 12 and until both
        # have answered (on a slow host all 12 once went to one)
        while calls < 12 or (len(gradient_pids(process.lines)) < 2 and calls < 80):
            with sg.Client(address, timeout=20) as client:
                client.get_graph(graph_id).gradient({"x": [1.0, 2.0, 3.0]})
            calls += 1
            if calls >= 12:
                time.sleep(0.05)  # (the call's log line on its way through the pipe)
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    finally:
        log = stop(process)
    counts = {m.group(1): float(m.group(2)) for m in
              re.finditer(r'^semigrad_requests_total\{code="OK",rpc="(\w+)"\} (\S+)$', text, re.M)}
    assert counts.get("Gradient") == calls and counts.get("GetGraph") == calls, text
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert len(lines) >= 2 * calls + 1 and all(line.strip().startswith("{") for line in log.splitlines() if line), log
    calls_logged = [entry for entry in lines if entry["logger"] == "semigrad.rpc" and "rpc=Gradient" in entry["message"]]
    assert len(calls_logged) == calls and len({entry["pid"] for entry in calls_logged}) == 2
    assert all(re.fullmatch(r"[0-9a-f]{32}", entry["request_id"]) for entry in calls_logged)
    assert len({entry["request_id"] for entry in calls_logged}) == calls


def gradient_pids(lines) -> set:
    """The worker processes whose JSON log lines record a Gradient call."""
    return {entry["pid"] for entry in map(json.loads, (line for line in list(lines) if line.startswith("{")))
            if entry.get("logger") == "semigrad.rpc" and "rpc=Gradient" in entry.get("message", "")}


def test_sigterm_drains(tmp_path):
    """SIGTERM: health answers NOT_SERVING at once, calls keep being served during --drain-seconds,
    a call in flight finishes, and the server exits 0."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "semigrad_server", "serve", "--port", str(port), "--workers", "1", "--store", "memory",
         "--drain-seconds", "3", "--grace-seconds", "10"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    address = f"127.0.0.1:{port}"
    try:
        wait_until_serving(address, process)
        entered, result = threading.Event(), {}

        def hook(gradient):
            entered.set()
            time.sleep(2.0)  # in flight when SIGTERM arrives
            return gradient

        with sg.Client(address, timeout=30) as client:
            f = client.register(square_graph())

            def slow():
                result["x"] = f.gradient({"x": [1.0, 2.0, 3.0]}, hooks={"s": hook})["x"]

            thread = threading.Thread(target=slow)
            thread.start()
            assert entered.wait(20)
            process.send_signal(signal.SIGTERM)
            with grpc.insecure_channel(address) as channel:
                health = health_pb2_grpc.HealthStub(channel)
                deadline = time.monotonic() + 2.5
                status = None
                while time.monotonic() < deadline:
                    status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
                    if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                        break
                    time.sleep(0.05)
                assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            np.testing.assert_array_equal(f.gradient({"x": [1.0, 1.0, 1.0]})["x"], [2.0, 2.0, 2.0])  # still served
            thread.join(30)
            np.testing.assert_array_equal(result["x"], [2.0, 4.0, 6.0])
        process.wait(30)
        log = process.stdout.read()
        assert process.returncode == 0, log
        assert "draining" in log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("files, quota", [({"cpu.max": "150000 100000\n"}, 1.5), ({"cpu.max": "50000 100000\n"}, 0.5),
                                          ({"cpu.max": "max 100000\n"}, None),
                                          ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.0),
                                          ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
                                          ({}, None)])
def test_workers_follow_the_cgroup_cpu_quota(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_quota(tmp_path) == quota
    cpus = len(os.sched_getaffinity(0))
    expected = cpus if quota is None else max(1, min(cpus, -(-quota // 1)))
    assert available_cpus(tmp_path) == expected


@pytest.mark.parametrize("operator_setting", [None, "2"])
def test_a_server_process_runs_blas_on_one_thread_unless_the_operator_says(operator_setting):
    """OpenBLAS sizes its pool by the host's cores and spins while it waits; `semigrad serve`
    (cpus.limit_blas_threads) gives each server process one BLAS thread, unless the operator set
    OPENBLAS_NUM_THREADS (or OMP_/MKL_): then that stays."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                             "MKL_NUM_THREADS")}
    if operator_setting:
        env["OPENBLAS_NUM_THREADS"] = operator_setting
    before, was_set, after = printed_json(
            "import json, numpy, threadpoolctl; from semigrad_server.cpus import limit_blas_threads; "
            "before = [i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']; "
            "set_ = limit_blas_threads(); "
            "after = [i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']; "
            "print(json.dumps([before, set_, after]))", env)
    assert before, "NumPy has no BLAS threadpoolctl can see"
    if operator_setting:
        assert was_set is False and after == before == [int(operator_setting)] * len(before)
    else:
        assert was_set is True and after == [1] * len(after)


@pytest.mark.parametrize("operator_setting", [None, "131072"])
def test_a_server_process_keeps_freed_megabytes_for_the_next_request_unless_the_operator_says(operator_setting):
    """glibc maps every allocation over 128 KiB afresh and hands it back when freed, so every
    megabyte message is memory the kernel zeroes and faults in again. `semigrad serve`
    (allocator.reuse_freed_memory) keeps freed blocks up to MMAP_THRESHOLD (3 MiB freed stays
    resident for the next request) and maps larger ones afresh as before (12 MiB goes back), so
    what a worker keeps is bounded. An operator's MALLOC_MMAP_THRESHOLD_ (glibc's own tunable) is
    left as it is."""
    from semigrad_server.allocator import MMAP_THRESHOLD

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    if operator_setting:
        env["MALLOC_MMAP_THRESHOLD_"] = operator_setting
    below, above = MMAP_THRESHOLD * 3 // 4, MMAP_THRESHOLD * 3
    was_set, *blocks = printed_json(
            "import json, os; from semigrad_server.allocator import reuse_freed_memory\n"
            "set_ = reuse_freed_memory(); page = os.sysconf('SC_PAGE_SIZE')\n"
            "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * page\n"
            "def kept(size):\n"
            "    before = rss(); block = b'\\x01' * size; used = rss() - before; del block\n"
            "    return [used, rss() - before]\n"
            f"print(json.dumps([set_, kept({below}), kept({above})]))", env)
    (used_below, kept_below), (used_above, kept_above) = blocks
    assert used_below >= below * 7 // 8 and used_above >= above * 7 // 8  # the blocks were written
    assert kept_above < 1 << 20  # past the threshold: back to the kernel, tuned or not
    if operator_setting:
        assert was_set is False and kept_below < 1 << 20  # glibc's way: the mapping went back
    else:
        assert was_set is True and kept_below >= below * 7 // 8


def printed_json(code: str, env: dict):
    """What `code` prints as JSON, run by a fresh Python process with environment `env`."""
    return json.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                     text=True).stdout)
