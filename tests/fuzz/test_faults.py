"""Faults against a real `semigrad serve` (issue 13, item 6): a worker killed with SIGKILL while
8 clients send mixed requests, a worker dead of SIGBUS, and shared-memory regions truncated by
their client while the server reads or writes them.

`make test` runs the load scaled down (8 clients x 40 requests, 8 truncations); `make fuzz` (SEMIGRAD_FUZZ=1)
runs the issue's 8 clients x 500 requests and more truncations."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import semigrad as sg
from semigrad import codec
from semigrad.shared_memory import HEADER_BYTES, SHM_DIR, Region
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_serve import EXIT_TIMEOUT, free_port, wait_for, worker_pids

FUZZ = bool(os.environ.get("SEMIGRAD_FUZZ"))
STARTUP_SECONDS = 120.0  # workers import NumPy, SymPy and numba: slow on a loaded machine
CLIENTS = 8
REQUESTS = 500 if FUZZ else 40  # per client
TRUNCATIONS = 60 if FUZZ else 8
LOAD_SECONDS = 900 if FUZZ else 240  # bound on the whole load; a hang fails the test instead of the run


def wait_until_serving(address: str, process: subprocess.Popen) -> None:
    """A health check answers SERVING (test_serve's, with a longer bound)."""
    deadline = time.monotonic() + STARTUP_SECONDS
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            assert process.poll() is None, f"server exited with {process.returncode}"
            with contextlib.suppress(grpc.RpcError):
                if health.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return
            assert time.monotonic() < deadline, f"{address} not SERVING after {STARTUP_SECONDS} s"
            time.sleep(0.1)


@contextlib.contextmanager
def serving(log: Path, *args: str):
    """A `semigrad serve` subprocess on a loopback port, logging to the file `log` (a pipe nobody
    reads while thousands of requests log a line each would fill and stall the server): yields
    (address, process)."""
    port = free_port()
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "semigrad_server", "serve", "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_serving(f"127.0.0.1:{port}", process)
        yield f"127.0.0.1:{port}", process
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def stop(process: subprocess.Popen, log: Path) -> str:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"server still running {EXIT_TIMEOUT} s after SIGTERM")
    text = log.read_text()
    assert process.returncode == 0, text[-3000:]
    return text


def scaled_square_sum(k: float) -> sg.Graph:
    """s = k * sum(x * x) over x of shape (4,): its gradient is 2 k x. Each k is its own graph id."""
    g = sg.Graph()
    x = g.input("x", (4,))
    g.output("s", sg.sum(x * x) * k)
    return g


def two_workers(process) -> set[int]:
    return wait_for(lambda: worker_pids(process.pid) if len(worker_pids(process.pid)) == 2 else None, "2 workers",
                    STARTUP_SECONDS)


def connections(pid: int, port: int) -> int:
    """Established TCP connections of process `pid` on local port `port` (from /proc)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rpartition(":")[2], 16) == port and fields[3] == "01" and fields[9] in inodes:
                    count += 1
    return count


class Load:
    """One client thread's requests, in turn: register a new graph, evaluate, gradient (inline),
    gradient_many (a GradientStream of 3 chunks), gradient of a batch through shared memory."""

    def __init__(self, address: str, index: int, progress: list[int], lock: threading.Lock):
        self.address, self.index = address, index
        self.progress, self.lock = progress, lock
        self.acknowledged: dict[str, float] = {}  # graph id -> k, once RegisterGraph answered
        self.failures: list[tuple[int, str, str]] = []  # (request, kind, status)
        self.wrong: list[str] = []
        self.rng = np.random.default_rng(index)

    def run(self) -> None:
        # a connection of its own (gRPC shares one per target between channels by default), so
        # the kernel spreads the clients over the workers
        with sg.Client(self.address, timeout=60, options=[("grpc.use_local_subchannel_pool", 1)]) as client:
            graphs = {}
            for i in range(REQUESTS):
                kind = ("register", "evaluate", "gradient", "stream", "shared")[i % 5]
                try:
                    self.one(client, graphs, i, kind)
                except sg.SemigradError as e:
                    self.failures.append((i, kind, e.code.name))
                except Exception as e:  # noqa: BLE001 - anything else is a failure the test reports
                    self.failures.append((i, kind, f"{type(e).__name__}: {e}"))
                with self.lock:
                    self.progress[0] += 1

    def one(self, client, graphs, i: int, kind: str) -> None:
        if kind == "register" or not graphs:
            k = float(self.index * 10_000 + i + 1)
            f = client.register(scaled_square_sum(k))
            graphs[f.id] = (f, k)
            self.acknowledged[f.id] = k
            return
        f, k = graphs[list(graphs)[self.rng.integers(len(graphs))]]
        if kind == "evaluate":
            x = self.rng.normal(size=(16, 4))
            self.check(f.evaluate({"x": x})["s"], k * (x * x).sum(axis=1), kind)
        elif kind == "gradient":
            x = self.rng.normal(size=(16, 4))
            self.check(f.gradient({"x": x})["x"], 2 * k * x, kind)
        elif kind == "stream":
            x = self.rng.normal(size=(300, 4))
            self.check(f.gradient_many({"x": x}, chunk_size=100, progress=False)["x"], 2 * k * x, kind)
        else:
            x = self.rng.normal(size=(6000, 4))  # 192 KB: over the client's shared-memory threshold
            self.check(f.gradient({"x": x})["x"], 2 * k * x, kind)

    def check(self, got, expected, kind: str) -> None:
        got = np.asarray(got)
        if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-12, atol=1e-12):
            self.wrong.append(f"{kind}: {got.shape} {expected.shape} {np.ravel(got)[:3]} {np.ravel(expected)[:3]}")


@pytest.fixture(scope="module")
def two_worker_server(tmp_path_factory):
    """`semigrad serve --workers 2` on a SQLite store, shared by the tests below (a start costs
    seconds): yields (address, process, log file); stopped gracefully at the end."""
    directory = tmp_path_factory.mktemp("faults")
    log = directory / "server.log"
    with serving(log, "--store", str(directory / "graphs.sqlite"), "--workers", "2") as (address, process):
        yield address, process, log
        stop(process, log)


def replaced(process, victim: int) -> set[int]:
    return wait_for(lambda: p if len(p := worker_pids(process.pid)) == 2 and victim not in p else None,
                    "a replacement worker", STARTUP_SECONDS)


def test_a_worker_killed_under_load_loses_nothing(two_worker_server):
    """kill -9 of one of 2 workers while 8 clients send mixed requests: the service keeps
    answering; only requests in flight on the dead worker may fail, with UNAVAILABLE (the client
    retries those that got no response); every graph id a client was given is still served."""
    address, process, log = two_worker_server
    before = two_workers(process)
    progress, lock = [0], threading.Lock()
    loads = [Load(address, i, progress, lock) for i in range(CLIENTS)]
    threads = [threading.Thread(target=load.run, daemon=True) for load in loads]
    start = time.monotonic()
    for t in threads:
        t.start()
    wait_for(lambda: progress[0] >= CLIENTS * REQUESTS // 3, "a third of the load done", LOAD_SECONDS)
    port = int(address.rpartition(":")[2])
    victim = max(before, key=lambda pid: (connections(pid, port), -pid))  # one serving clients now
    os.kill(victim, signal.SIGKILL)
    killed_at = progress[0]
    for t in threads:
        t.join(max(1.0, LOAD_SECONDS - (time.monotonic() - start)))
    assert not any(t.is_alive() for t in threads), f"the load did not finish in {LOAD_SECONDS} s"
    elapsed = time.monotonic() - start
    after = replaced(process, victim)
    wait_until_serving(address, process)
    failures = [f for load in loads for f in load.failures]
    wrong = [w for load in loads for w in load.wrong]
    acknowledged = {graph_id: k for load in loads for graph_id, k in load.acknowledged.items()}
    # 0 lost registrations: every acknowledged id answers, with its own function, on fresh connections
    x = np.array([[1.0, -2.0, 0.5, 3.0]])
    lost = []
    for graph_id, k in acknowledged.items():
        with sg.Client(address, timeout=30) as client:
            try:
                grads = client.get_graph(graph_id).gradient({"x": x})["x"]
            except sg.SemigradError as e:
                lost.append((graph_id, e.code.name))
                continue
            if not np.allclose(grads, 2 * k * x, rtol=1e-12):
                lost.append((graph_id, "wrong gradient"))
    print(f"{CLIENTS} clients x {REQUESTS} requests in {elapsed:.1f} s; worker {victim} killed after "
          f"{killed_at} requests; failures {failures}; {len(acknowledged)} graphs registered")
    text = log.read_text()
    assert f"(pid {victim}) exited with signal SIGKILL" in text, text[-3000:]
    assert f" {victim} semigrad.rpc rpc=" in text  # the killed worker was serving part of the load
    assert len(after & before) == 1
    assert not wrong, wrong
    assert len(failures) <= CLIENTS and all(code == "UNAVAILABLE" for _, _, code in failures), failures
    assert len(acknowledged) >= CLIENTS * (REQUESTS // 5) - len(failures)
    assert not lost, lost


def test_a_worker_dead_of_sigbus_is_replaced(two_worker_server):
    """However a worker would die of SIGBUS (the server no longer maps client memory, so no request
    can cause one), the supervisor replaces it and the other worker answers meanwhile."""
    address, process, log = two_worker_server
    with sg.Client(address, timeout=10) as client:
        f = client.register(scaled_square_sum(3.0))
    before = two_workers(process)
    victim = max(before)
    os.kill(victim, signal.SIGBUS)
    x = np.arange(4.0)
    for _ in range(10):  # fresh connections: whichever worker takes them answers
        with sg.Client(address, timeout=10) as client:
            np.testing.assert_array_equal(client.get_graph(f.id).gradient({"x": x})["x"], 6.0 * x)
    after = replaced(process, victim)
    assert len(after & before) == 1
    text = log.read_text()
    assert f"(pid {victim}) exited with signal SIGBUS" in text and "replacing it" in text, text[-3000:]


def pread_all(path: str, offset: int, nbytes: int) -> bytes:
    """Read a file's bytes without mapping it (a mapping of a shrunk file is SIGBUS in this process too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, nbytes, offset)
    finally:
        os.close(fd)


def read_result(path: str, response: pb.GradientResponse, nbytes: int) -> np.ndarray:
    tensor = response.gradients["x"]
    assert tensor.WhichOneof("payload") == "shared"
    return np.frombuffer(pread_all(path, tensor.shared.offset, nbytes), dtype="<f8")


def test_a_region_truncated_while_the_server_reads_or_writes_it_never_kills_a_worker(tmp_path):
    """The client shrinks its region to 4 KiB at a random moment of a request moving 32 MB in and
    32 MB out through it: each answer is OK (with the right gradient, when the region is whole)
    or INVALID_ARGUMENT naming the region; the server (one worker: no supervisor to hide a death)
    is the same process throughout."""
    batch = 1_000_000  # items of 4 float64: 32 MB (max_batch is 1,000,000)
    with serving(tmp_path / "server.log", "--store", str(tmp_path / "graphs.sqlite"), "--workers", "1") as (
            address, process):
        with sg.Client(address, timeout=30) as client:
            graph_id = client.register(scaled_square_sum(1.0)).id
        rng = np.random.default_rng(7)
        x = rng.normal(size=(batch, 4))
        outcomes = []
        with grpc.insecure_channel(address, options=[("grpc.enable_retries", 0)]) as channel:
            stub = pb_grpc.GraphServiceStub(channel)
            took, whole = None, 2
            for attempt in range(TRUNCATIONS + whole):  # the first two are whole; the second times a request
                region = Region(HEADER_BYTES + 2 * x.nbytes + 4096)
                path = os.path.join(SHM_DIR, region.name)
                region.array(np.dtype("<f8"), x.shape, HEADER_BYTES)[...] = x
                out = HEADER_BYTES + x.nbytes
                shared = pb.SharedMemoryRef(region=region.name, offset=HEADER_BYTES, capability=region.capability)
                request = pb.GradientRequest(
                    graph_id=graph_id, inputs={"x": pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=x.shape, shared=shared)},
                    output_region=pb.SharedMemoryRegion(region=region.name, offset=out, capacity=x.nbytes + 4096,
                                                        capability=region.capability))
                answer = {}

                def call():
                    try:
                        answer["response"] = stub.Gradient(request, timeout=60)
                    except grpc.RpcError as e:
                        answer["error"] = (e.code(), e.details())

                caller = threading.Thread(target=call)
                began = time.monotonic()
                caller.start()
                if attempt >= whole:
                    # in turn: around the copy in (the first tens of ms), anywhere up to the copy out
                    time.sleep(random.Random(attempt).uniform(0.0, 0.04 if attempt % 2 else took))
                    os.truncate(path, 4096)
                caller.join(60)
                assert not caller.is_alive()
                if attempt < whole:
                    took = time.monotonic() - began
                    np.testing.assert_array_equal(read_result(path, answer["response"], x.nbytes), 2 * x.ravel())
                    continue
                if "error" in answer:
                    code, details = answer["error"]
                    assert code == grpc.StatusCode.INVALID_ARGUMENT and region.name in details, (code, details)
                    outcomes.append("shrank" if "shrank" in details else "past the end")
                else:
                    got = read_result(path, answer["response"], x.nbytes)
                    if got.size == x.size:  # the server's write grew the file back: the result is there
                        np.testing.assert_array_equal(got, 2 * x.ravel())
                    outcomes.append("ok")
                del region  # closes it; never touched through its mapping after the truncation
            response = stub.Gradient(pb.GradientRequest(graph_id=graph_id, inputs={"x": codec.to_tensor(x[:2])}))
            np.testing.assert_array_equal(codec.from_tensor(response.gradients["x"]), 2 * x[:2])
        assert process.poll() is None  # one worker: it is the server process, alive
        with open(f"/proc/{process.pid}/maps") as f:
            assert f"{SHM_DIR}/semigrad-" not in f.read()  # it never maps a client's region
        log = stop(process, tmp_path / "server.log")
    print(f"truncations within {took * 1e3:.0f} ms of the call:", {o: outcomes.count(o) for o in set(outcomes)})
    assert "exited with" not in log, log[-3000:]
    assert len(outcomes) == TRUNCATIONS
