"""`semigrad serve` as a real process: health, reflection, a gradient through semigrad.Client,
one log line per request, graceful exit on SIGTERM; and the command line's --version and --help."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import semigrad as sg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from semigrad_server import __version__ as server_version
from semigrad_server.limits import Limits

STARTUP_TIMEOUT = 30.0
EXIT_TIMEOUT = 30  # seconds; generous: CI machines are loaded
RPC_LINE = re.compile(r"\brpc=(\w+)\b.*\bstatus=(\w+)\b")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "semigrad_server", *args], capture_output=True, text=True,
                          timeout=60)


def wait_until_serving(address: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.poll() is not None:
                output = "".join(process.lines) if hasattr(process, "lines") else process.communicate()
                raise AssertionError(f"server exited early with {process.returncode}: {output}")
            try:
                response = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{address} not SERVING after {STARTUP_TIMEOUT} s")
            time.sleep(0.1)


def list_services(address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                              timeout=10)
        return [s.name for r in responses for s in r.list_services_response.service]


@contextlib.contextmanager
def serving(*args: str, port: int | None = None):
    """A `semigrad serve` subprocess on a loopback port: yields (address, process) once every worker
    it starts (`--workers`) serves, its output read as it comes (stop() returns all of it)."""
    port = port or free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "semigrad_server", "serve", "--host", "127.0.0.1", "--port", str(port), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    read_output(process)
    try:
        wait_until_serving(f"127.0.0.1:{port}", process)
        wait_for_workers(process, int(args[args.index("--workers") + 1]) if "--workers" in args else 1)
        yield f"127.0.0.1:{port}", process
    finally:
        if process.poll() is None:  # the supervisor and its workers: they all hold the output pipe
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        process.reader.join(timeout=EXIT_TIMEOUT)


def read_output(process: subprocess.Popen) -> None:
    """Read `process`'s output as it comes, into process.lines, on a thread of its own (process.reader)."""
    process.lines = []

    def read():
        for line in iter(process.stdout.readline, ""):
            process.lines.append(line)

    process.reader = threading.Thread(target=read, daemon=True)
    process.reader.start()


def wait_for_workers(process: subprocess.Popen, workers: int) -> None:
    """Until `workers` worker processes have logged that they serve. A health check answers as soon
    as one does, and connections made before the others listen all go to it (fresh-clone CI runs:
    16 of 16 calls on one of two workers)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while sum("semigrad serving on" in line for line in process.lines) < workers:
        assert process.poll() is None, f"server exited early with {process.returncode}: {''.join(process.lines)}"
        assert time.monotonic() < deadline, f"not {workers} workers serving after {STARTUP_TIMEOUT} s: " \
                                            f"{''.join(process.lines)}"
        time.sleep(0.05)


def stop(process: subprocess.Popen) -> str:
    """SIGTERM; the server's whole output once it has exited (0)."""
    process.send_signal(signal.SIGTERM)
    try:
        if hasattr(process, "reader"):  # (read_output)
            process.wait(timeout=EXIT_TIMEOUT)
            process.reader.join(timeout=EXIT_TIMEOUT)
            log = "".join(process.lines)
        else:
            log, _ = process.communicate(timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"server still running {EXIT_TIMEOUT} s after SIGTERM")
    assert process.returncode == 0, log
    return log


@pytest.fixture
def served(tmp_path):
    with serving("--store", str(tmp_path / "graphs.sqlite"), "--workers", "1") as running:
        yield running


def square_sum_graph() -> sg.Graph:
    g = sg.Graph()
    a = g.input("A", (2, 2))
    g.output("trace_sq", sg.sum(a * a))
    return g


MATRIX = np.array([[1.0, 2.0], [3.0, 4.0]])


def test_workers_share_the_port_and_the_store(tmp_path):
    store = str(tmp_path / "graphs.sqlite")
    with serving("--store", store, "--workers", "2") as (address, process):
        with sg.Client(address, timeout=10) as client:
            graph_id = client.register(square_sum_graph()).id
        for _ in range(16):  # fresh connections: the kernel spreads them over the workers
            with sg.Client(address, timeout=10) as client:
                np.testing.assert_array_equal(client.get_graph(graph_id).gradient({"A": MATRIX})["A"], 2 * MATRIX)
        log = stop(process)
    pids = {m.group(1) for m in re.finditer(r" (\d+) semigrad\.rpc rpc=Gradient .*status=OK", log)}
    assert len(pids) == 2, log


def test_registered_graphs_survive_a_restart(tmp_path):
    store = str(tmp_path / "graphs.sqlite")
    port = free_port()
    with serving("--store", store, "--workers", "1", port=port) as (address, process):
        with sg.Client(address, timeout=10) as client:
            graph_id = client.register(square_sum_graph()).id
        stop(process)
    with serving("--store", store, "--workers", "1", port=port) as (address, process):
        with sg.Client(address, timeout=10) as client:
            f = client.get_graph(graph_id)
            np.testing.assert_array_equal(f.gradient({"A": MATRIX})["A"], 2 * MATRIX)
            assert not client.register(square_sum_graph()).created
        stop(process)


def test_several_workers_need_a_shared_store():
    result = run_cli("serve", "--port", str(free_port()), "--workers", "2", "--store", "memory")
    assert result.returncode == 2
    assert "shared store" in result.stderr


def test_serve_answers_health_reflection_and_gradients_then_stops_gracefully(served):
    address, process = served

    services = list_services(address)
    assert "semigrad.v1.GraphService" in services
    assert "grpc.health.v1.Health" in services

    with sg.Client(address, timeout=10) as client:
        f = client.register(square_sum_graph())
        np.testing.assert_array_equal(f.gradient({"A": MATRIX})["A"], 2 * MATRIX)
        with pytest.raises(sg.NotFound):
            client.get_graph("gnosuchgraph")
    expected = [("RegisterGraph", "OK"), ("Gradient", "OK"), ("GetGraph", "NOT_FOUND")]

    log = stop(process)
    rpc_lines = [m.groups() for m in map(RPC_LINE.search, log.splitlines()) if m]
    assert rpc_lines == expected, log


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"semigrad {server_version}"


def test_serve_help_lists_the_limit_flags():
    result = run_cli("serve", "--help")
    assert result.returncode == 0, result.stderr
    flags = {"--" + name.replace("_", "-") for name in Limits.names()}
    assert {"--max-nodes", "--max-node-elements", "--max-batch", "--max-request-elements"} <= flags
    for flag in sorted(flags | {"--host", "--port"}):
        assert flag in result.stdout, f"{flag} missing from `serve --help`"


def worker_pids(supervisor: int) -> set[int]:
    """The supervisor's worker processes (not multiprocessing's resource tracker)."""
    pids = set()
    with open(f"/proc/{supervisor}/task/{supervisor}/children") as f:
        for pid in map(int, f.read().split()):
            with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/cmdline", "rb") as cmd:
                if b"resource_tracker" not in cmd.read():
                    pids.add(pid)
    return pids


def wait_for(condition, what: str, timeout: float = STARTUP_TIMEOUT):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout} s")
        time.sleep(0.1)
    return value


def test_a_killed_worker_is_replaced_and_the_service_keeps_answering(tmp_path):
    with serving("--store", str(tmp_path / "graphs.sqlite"), "--workers", "2") as (address, process):
        with sg.Client(address, timeout=10) as client:
            graph_id = client.register(square_sum_graph()).id
        before = wait_for(lambda: worker_pids(process.pid) if len(worker_pids(process.pid)) == 2 else None,
                          "2 workers")
        victim = min(before)
        with open(f"/proc/{victim}/environ", "rb") as f:  # one worker per CPU: BLAS on one thread each
            assert b"OPENBLAS_NUM_THREADS=1" in f.read().split(b"\0")
        os.kill(victim, signal.SIGKILL)
        for _ in range(20):  # fresh connections while the worker is gone and after: the survivor answers
            with sg.Client(address, timeout=10) as client:
                np.testing.assert_array_equal(client.get_graph(graph_id).gradient({"A": MATRIX})["A"], 2 * MATRIX)
        def replaced():
            pids = worker_pids(process.pid)
            return pids if len(pids) == 2 and victim not in pids else None

        after = wait_for(replaced, "a replacement worker")
        wait_until_serving(address, process)
        for _ in range(8):
            with sg.Client(address, timeout=10) as client:  # the graph is still served, by either worker
                np.testing.assert_array_equal(client.get_graph(graph_id).gradient({"A": MATRIX})["A"], 2 * MATRIX)
        log = stop(process)
    assert victim not in after and len(after & before) == 1
    assert f"(pid {victim}) exited with signal SIGKILL" in log and "replacing it" in log, log


def test_workers_stop_when_their_supervisor_is_killed(tmp_path):
    """A supervisor killed with SIGKILL (no chance to stop its workers) left them serving as
    orphans, holding the port: each worker now gets SIGTERM when its supervisor dies, and stops."""
    with serving("--store", str(tmp_path / "graphs.sqlite"), "--workers", "2") as (address, process):
        workers = wait_for(lambda: worker_pids(process.pid) if len(worker_pids(process.pid)) == 2 else None,
                           "2 workers")
        os.kill(process.pid, signal.SIGKILL)

        def gone():
            alive = set()
            for pid in workers:
                with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":  # a zombie has stopped
                        alive.add(pid)
            return not alive

        wait_for(gone, "workers stopped after their supervisor was killed", timeout=EXIT_TIMEOUT)


def test_the_supervisor_gives_up_when_no_worker_can_stay_up(tmp_path):
    """Workers that die before they serve (here every spawned worker exits at start-up, by a
    sitecustomize) are replaced a few times, then the supervisor exits non-zero. (A port another
    server holds, or a store it cannot open, is refused before any worker starts:
    tests/test_serve_refuses_bad_config.py.)"""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os, sys\n"
                                           "if sys.argv[-1:] == ['--multiprocessing-fork']:  # a spawned worker\n"
                                           "    os._exit(3)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    result = subprocess.run([sys.executable, "-m", "semigrad_server", "serve", "--host", "127.0.0.1", "--port",
                             str(free_port()), "--workers", "2", "--store", str(tmp_path / "graphs.sqlite")],
                            capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 1, result.stderr
    assert "gave up" in result.stderr and result.stderr.count("before it could serve; replacing it") >= 5, \
        result.stderr
