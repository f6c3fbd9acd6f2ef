"""Three real `semigrad serve` replicas on one real Redis behind a real HAProxy (the backend
settings of deploy/haproxy.cfg, its gRPC health check included), all on loopback:

- 8 clients x N mixed calls (register, gradient, evaluate, get) through the load balancer: 0
  errors, every result checked against its closed form, and the replicas' /metrics count exactly
  the calls the clients made;
- a graph registered through one replica is served by the others;
- kill -9 of one replica mid-load: no client call fails (calls in flight on it are retried by
  HAProxy's retry-on and the client's retry policy), and 0 acknowledged registrations are lost;
- SIGTERM of a replica: its health check fails (NOT_SERVING) and HAProxy takes it out of rotation.

N is SEMIGRAD_REPLICA_CALLS (default 24 in `make test`; `make loadtest` runs 1,000).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import semigrad as sg
from redis_server import RedisServer, free_port, require_redis
from test_serve import wait_until_serving

ROOT = Path(__file__).resolve().parent.parent
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
CALLS = int(os.environ.get("SEMIGRAD_REPLICA_CALLS", "24"))
CLIENTS = 8
DRAIN_SECONDS = 5  # as deploy/docker-compose.yml: longer than HAProxy takes to see NOT_SERVING (haproxy.cfg)
REPLICAS = 3


def haproxy_config(front: int, replicas: list[int], stats: Path) -> str:
    """deploy/haproxy.cfg with loopback ports: the same defaults and backend check, local servers."""
    text = (ROOT / "deploy" / "haproxy.cfg").read_text()
    replaced = []

    def sub(pattern, repl, flags=0):
        nonlocal text
        text, count = re.subn(pattern, repl, text, flags=flags)
        replaced.append((pattern, count))

    sub(r"^global\n", f"global\n    stats socket {stats} mode 600 level admin\n", re.M)
    sub(r"bind :50051 proto h2", f"bind 127.0.0.1:{front} proto h2")
    sub(r"^    server-template .*\n", "".join(f"    server r{i} 127.0.0.1:{port} check\n"
                                            for i, port in enumerate(replicas)), re.M)
    sub(r"^resolvers docker\n(    .*\n)+", "", re.M)
    sub(r"^frontend stats\n(    .*\n)+", "", re.M)
    assert all(count == 1 for _, count in replaced), replaced
    return text


def server_states(stats: Path) -> dict[str, int]:
    """HAProxy's operational state of each server (2: running, 0: down)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(stats))
        s.sendall(b"show servers state semigrad\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    rows = [line.split() for line in data.decode().splitlines() if line and line[0].isdigit() and " " in line]
    return {row[3]: int(row[5]) for row in rows if len(row) > 5}


def backend_stats(stats: Path) -> dict[str, str]:
    """HAProxy's counters of the semigrad backend (`show stat`: wretr retries, wredis redispatches...)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(stats))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    lines = data.decode().splitlines()
    header = lines[0].lstrip("# ").split(",")
    for line in lines[1:]:
        row = dict(zip(header, line.split(",")))
        if row.get("pxname") == "semigrad" and row.get("svname") == "BACKEND":
            return row
    return {}


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


class Cluster:
    def __init__(self, directory: Path):
        self.directory = directory
        self.redis = RedisServer(directory / "redis")
        self.ports = [free_port() for _ in range(REPLICAS)]
        self.metrics_ports = [free_port() for _ in range(REPLICAS)]
        self.front = free_port()
        self.stats = directory / "haproxy.sock"
        self.replicas: list[subprocess.Popen | None] = [None] * REPLICAS
        self.haproxy: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.front}"

    def start(self) -> Cluster:
        self.redis.start()
        for i in range(REPLICAS):
            self.start_replica(i)
        for i in range(REPLICAS):
            wait_until_serving(f"127.0.0.1:{self.ports[i]}", self.replicas[i])
        config = self.directory / "haproxy.cfg"
        config.write_text(haproxy_config(self.front, self.ports, self.stats))
        self.haproxy = subprocess.Popen([HAPROXY, "-f", str(config), "-db"], stdout=open(self.directory / "haproxy.log", "w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        def up() -> bool:
            if self.haproxy.poll() is not None:
                raise AssertionError(f"haproxy exited: {(self.directory / 'haproxy.log').read_text()}")
            return self.stats.exists() and set(server_states(self.stats).values()) == {2}

        wait_for(up, 30, "HAProxy sees every replica up")
        return self

    def start_replica(self, i: int) -> None:
        self.replicas[i] = subprocess.Popen(
            [sys.executable, "-m", "semigrad_server", "serve", "--host", "127.0.0.1", "--port", str(self.ports[i]),
             "--workers", "1", "--store", self.redis.url, "--metrics-port", str(self.metrics_ports[i]),
             "--metrics-host", "127.0.0.1", "--drain-seconds", str(DRAIN_SECONDS), "--no-shared-memory"],
            stdout=open(self.directory / f"replica-{i}.log", "a"), stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, i: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.replicas[i].pid, signal.SIGKILL)
        self.replicas[i].wait()

    def metrics(self, i: int) -> Counter:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_ports[i]}/metrics", timeout=10).read().decode()
        return Counter({(m.group(2), m.group(1)): float(m.group(3)) for m in
                        re.finditer(r'^semigrad_requests_total\{code="(\w+)",rpc="(\w+)"\} (\S+)$', text, re.M)})

    def stop(self) -> None:
        for process in [self.haproxy, *self.replicas]:
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.redis.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_redis()
    if HAPROXY is None:
        pytest.skip("haproxy is not installed (make venv installs Debian's haproxy)")
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def weighted_graph(c: float) -> sg.Graph:
    """y = sum(c x^2): gradient 2 c x, value c |x|^2."""
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("y", sg.sum(g.const(np.float64(c), name="c") * x * x))
    return g


class Load:
    """8 clients, each making `calls` mixed calls through the load balancer."""

    def __init__(self, address: str, calls: int, phase: int):
        self.address, self.calls, self.phase = address, calls, phase
        self.sent: Counter = Counter()  # successful calls by RPC
        self.errors: list[str] = []
        self.acknowledged: dict[str, float] = {}  # graph id -> its constant, once RegisterGraph answered
        self.done = 0
        self.lock = threading.Lock()

    def client(self, k: int) -> None:
        rng = np.random.default_rng(1000 * self.phase + k)
        mine: list[tuple[sg.RegisteredGraph, float]] = []
        with sg.Client(self.address, timeout=30, shared_memory=False) as client:
            for j in range(self.calls):
                kind = "RegisterGraph" if not mine or j % 4 == 0 else ("Gradient", "Evaluate", "GetGraph")[j % 4 - 1]
                try:
                    if kind == "RegisterGraph":
                        c = float(self.phase * 100_000 + k * 1000 + j + 1)
                        f = client.register(weighted_graph(c))
                        mine.append((f, c))
                        with self.lock:
                            self.acknowledged[f.id] = c
                    else:
                        f, c = mine[rng.integers(len(mine))]
                        x = rng.normal(size=3)
                        if kind == "Gradient":
                            np.testing.assert_allclose(f.gradient({"x": x})["x"], 2 * c * x, rtol=1e-12)
                        elif kind == "Evaluate":
                            np.testing.assert_allclose(f.evaluate({"x": x})["y"], c * (x @ x), rtol=1e-12)
                        else:
                            assert client.get_graph(f.id).id == f.id
                    with self.lock:
                        self.sent[kind] += 1
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    with self.lock:
                        self.errors.append(f"client {k} call {j} {kind}: {type(e).__name__}: {e}")
                with self.lock:
                    self.done += 1

    def run(self, during=None) -> None:
        threads = [threading.Thread(target=self.client, args=(k,)) for k in range(CLIENTS)]
        for t in threads:
            t.start()
        if during is not None:
            during(self)
        for t in threads:
            t.join(600)


def check_all_served(cluster: Cluster, graphs: dict[str, float], replicas) -> None:
    x = np.array([0.5, -1.0, 2.0])
    for i in replicas:
        with sg.Client(f"127.0.0.1:{cluster.ports[i]}", timeout=30, shared_memory=False) as client:
            for graph_id, c in graphs.items():
                np.testing.assert_allclose(client.get_graph(graph_id).gradient({"x": x})["x"], 2 * c * x, rtol=1e-12)


def test_load_through_the_balancer_is_served_and_counted(cluster):
    load = Load(cluster.address, CALLS, phase=1)
    load.run()
    assert not load.errors, load.errors[:5]
    assert sum(load.sent.values()) == CLIENTS * CALLS
    served = sum((cluster.metrics(i) for i in range(REPLICAS)), Counter())
    for rpc, count in load.sent.items():
        assert served[rpc, "OK"] == count, (rpc, served)
    assert sum(v for (rpc, code), v in served.items() if code != "OK") == 0, served
    # the balancer spread the calls: every replica served some
    assert all(sum(cluster.metrics(i).values()) > 0 for i in range(REPLICAS))
    check_all_served(cluster, load.acknowledged, range(REPLICAS))


def test_a_graph_registered_through_one_replica_is_served_by_the_others(cluster):
    with sg.Client(f"127.0.0.1:{cluster.ports[0]}", shared_memory=False) as client:
        graph_id = client.register(weighted_graph(-3.5)).id
    check_all_served(cluster, {graph_id: -3.5}, [1, 2])


def test_kill_9_of_a_replica_mid_load_loses_nothing(cluster):
    victim = 0

    def kill_mid_load(load: Load) -> None:
        wait_for(lambda: load.done >= CLIENTS * CALLS // 3, 300, "a third of the calls done")
        cluster.kill(victim)

    before = backend_stats(cluster.stats)
    load = Load(cluster.address, CALLS, phase=2)
    load.run(during=kill_mid_load)
    after = backend_stats(cluster.stats)
    print(f"HAProxy during the kill: {int(after['wretr']) - int(before['wretr'])} retries, "
          f"{int(after['wredis']) - int(before['wredis'])} redispatches, "
          f"{int(after['eresp']) - int(before['eresp'])} response errors")
    assert not load.errors, load.errors[:5]
    assert sum(load.sent.values()) == CLIENTS * CALLS
    wait_for(lambda: server_states(cluster.stats)[f"r{victim}"] == 0, 10, "HAProxy marks the killed replica down")
    check_all_served(cluster, load.acknowledged, [1, 2])  # 0 acknowledged registrations lost
    cluster.start_replica(victim)
    wait_until_serving(f"127.0.0.1:{cluster.ports[victim]}", cluster.replicas[victim])
    wait_for(lambda: server_states(cluster.stats)[f"r{victim}"] == 2, 15, "the restarted replica is back in rotation")
    check_all_served(cluster, load.acknowledged, [victim])


def test_a_draining_replica_leaves_the_rotation(cluster):
    """SIGTERM: the replica answers NOT_SERVING for --drain-seconds while still serving; HAProxy's
    gRPC health check takes it out before it stops."""
    victim = 2
    cluster.replicas[victim].send_signal(signal.SIGTERM)
    started = time.monotonic()
    wait_for(lambda: server_states(cluster.stats)[f"r{victim}"] == 0, DRAIN_SECONDS,
             "HAProxy takes the draining replica out")
    assert time.monotonic() - started < DRAIN_SECONDS
    assert cluster.replicas[victim].poll() is None  # still draining: out of rotation before it stops
    cluster.replicas[victim].wait(30)
    assert cluster.replicas[victim].returncode == 0
    cluster.start_replica(victim)
    wait_until_serving(f"127.0.0.1:{cluster.ports[victim]}", cluster.replicas[victim])


def test_the_health_probe_bytes_ask_grpc_health():
    """deploy/haproxy.cfg sends deploy/grpc_health_probe.py's bytes; sent by hand to a real server
    they get SERVING (08 01), and NOT_SERVING (08 02) once the server drains."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("grpc_health_probe", ROOT / "deploy" / "grpc_health_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    config = (ROOT / "deploy" / "haproxy.cfg").read_text()
    assert f"tcp-check send-binary {probe.probe().hex()}\n" in config
    assert f"tcp-check expect rbinary {probe.SERVING_MESSAGE.hex()}\n" in config

    from semigrad_server.service import build_server

    health: list = []
    server, port, _ = build_server("127.0.0.1:0", health_out=health)
    server.start()

    def ask() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(probe.probe())
            data = b""
            while b"\x00\x00\x00\x00\x02\x08" not in data:
                chunk = s.recv(65536)
                assert chunk, data
                data += chunk
            return data

    try:
        assert probe.SERVING_MESSAGE in ask()
        health[0].enter_graceful_shutdown()
        answer = ask()
        assert bytes.fromhex("00000000020802") in answer and probe.SERVING_MESSAGE not in answer
    finally:
        server.stop(0)
