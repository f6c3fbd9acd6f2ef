"""The compose files, run for real: deploy/docker-compose.yml (3 replicas on Redis behind HAProxy)
and the top-level docker-compose.yml (one container, SQLite store), each built and brought up
with Docker Compose, used through the client, and taken down again (`down -v`).

Opt-in, never part of a plain `make test`: set SEMIGRAD_DOCKER_TESTS=1 (`make compose-test`).
Each case builds the image (about a minute of both cores and ~100 MB from PyPI when the pip layer
is not cached) and publishes the files' fixed host ports (50051, and 8404 for HAProxy), so it
should not start because a Docker daemon happens to be running. It also needs a reachable
daemon, Compose (`docker compose` or `docker-compose`), and the base images python:3.11-slim,
redis:7 and haproxy:2.6 already present (pulled, or the stand-ins of deploy/offline-base-images.sh
on a machine without Docker Hub): the test never pulls. Otherwise each case is skipped, saying
which of these is missing. Stacks run under project names of their own (sgtest-*), so a stack a
user has up under the default name is left alone; a busy port skips the case.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import semigrad as sg

ROOT = Path(__file__).resolve().parents[1]
BASE_IMAGES = ("python:3.11-slim", "redis:7", "haproxy:2.6")
TOKEN = next(line.split()[1] for line in (ROOT / "deploy/tokens.example").read_text().splitlines()
             if line.strip() and not line.startswith("#"))
UP_TIMEOUT = 600  # seconds: the build (when not cached) and the replicas' start, on a loaded machine


def _run(argv: list[str], timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return [shutil.which("docker-compose")] if shutil.which("docker-compose") else None


def _why_not() -> str | None:
    if os.environ.get("SEMIGRAD_DOCKER_TESTS") != "1":
        return "opt-in: SEMIGRAD_DOCKER_TESTS=1 (builds an image, publishes ports 50051 and 8404)"
    if not shutil.which("docker"):
        return "no docker command"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        return "no Docker daemon reachable (docker info failed)"
    if _compose_command() is None:
        return "neither `docker compose` nor `docker-compose`"
    missing = [i for i in BASE_IMAGES if subprocess.run(["docker", "image", "inspect", i], capture_output=True).returncode]
    if missing:
        return f"base images not present (never pulled here): {missing}; without Docker Hub: deploy/offline-base-images.sh"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def _port_busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Stack:
    """One compose project: `up -d --build`, then `down -v` whatever happened."""

    def __init__(self, project: str, files: list[Path], ports: tuple[int, ...]):
        self.compose = _compose_command() + ["-p", project] + [a for f in files for a in ("-f", str(f))]
        self.project = project
        busy = [p for p in ports if _port_busy(p)]
        if busy:
            pytest.skip(f"host ports in use: {busy}")

    def __call__(self, *args: str, timeout: float = 120) -> str:
        return _run(self.compose + list(args), timeout=timeout).stdout

    def containers(self, service: str) -> list[str]:
        return sorted(_run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={self.project}",
                            "--filter", f"label=com.docker.compose.service={service}"]).stdout.split())

    def down(self):
        _run(self.compose + ["down", "-v", "--remove-orphans"], timeout=180, check=False)


def _inspect(container: str, template: str) -> str:
    return _run(["docker", "inspect", "-f", template, container]).stdout.strip()


def _wait(what: str, ready, timeout: float = UP_TIMEOUT, logs=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(2)
    raise AssertionError(f"not {what} after {timeout} s" + (f"; logs:\n{logs()}" if logs else ""))


def _healthy(containers: list[str]) -> bool:
    return all(_inspect(c, "{{.State.Health.Status}}") == "healthy" for c in containers)


def _metrics(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def _gradient_calls(container: str) -> float:
    """Gradient calls this replica counted (its :9100/metrics, summed over status codes), read
    inside the container: the host may not route to containers' addresses (Docker Desktop)."""
    text = _run(["docker", "exec", container, "python", "-c",
                 "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())"]).stdout
    return sum(float(m.group(1)) for m in re.finditer(
        r'^semigrad_requests_total\{[^}]*rpc="Gradient"[^}]*\} (\S+)', text, re.M))


def _servers_up() -> int:
    text = _metrics("http://127.0.0.1:8404/metrics")
    return len(re.findall(r'^haproxy_server_status\{proxy="semigrad",server="[^"]+",state="UP"\} 1', text, re.M))


def _graph():
    g = sg.Graph()
    x = g.input("x", (5,))
    g.output("f", (sg.sin(x) * x).sum())  # gradient: cos(x) x + sin(x)
    return g


def _check(f, v) -> None:
    grad = f.gradient({"x": v})["x"]
    np.testing.assert_allclose(grad, np.cos(v) * v + np.sin(v), rtol=0, atol=1e-12)


def test_three_replicas_on_redis_behind_haproxy():
    stack = Stack("sgtest-deploy", [ROOT / "deploy/docker-compose.yml"], (50051, 8404))
    try:
        stack("up", "-d", "--build", timeout=UP_TIMEOUT)
        replicas = stack.containers("semigrad")
        assert len(replicas) == 3, replicas  # deploy.replicas, without --scale
        _wait("healthy", lambda: _healthy(replicas + stack.containers("redis")),
              logs=lambda: stack("logs", "--tail=20"))
        _wait("3 servers UP in HAProxy", lambda: _servers_up() == 3, timeout=60)
        before = {c: _gradient_calls(c) for c in replicas}

        rng = np.random.default_rng(0)
        with sg.Client("127.0.0.1:50051", token=TOKEN, timeout=30) as client:
            f = client.register(_graph())
            for _ in range(60):
                _check(f, rng.normal(size=5))
            served = {c: _gradient_calls(c) - before[c] for c in replicas}
            assert sum(n > 0 for n in served.values()) > 1, served  # calls are balanced, not pinned

            # docker kill (SIGKILL) one replica mid-load: HAProxy and the client's retries cover
            # the calls it had in flight; a graph registered before is served by the others.
            earlier = client.register(_graph())
            failures, done, lock = [], [0], threading.Lock()

            def load(seed):
                r = np.random.default_rng(seed)
                for _ in range(75):
                    try:
                        _check(f, r.normal(size=5))
                    except Exception as e:  # noqa: BLE001 -- every failure is reported below
                        with lock:
                            failures.append(repr(e))
                    with lock:
                        done[0] += 1

            threads = [threading.Thread(target=load, args=(s,)) for s in range(4)]
            for t in threads:
                t.start()
            _wait("a third of the load done", lambda: done[0] >= 100, timeout=120)
            _run(["docker", "kill", replicas[1]])
            for t in threads:
                t.join(timeout=300)
            assert not failures, failures
            _check(earlier, rng.normal(size=5))
    finally:
        stack.down()


def test_one_container_sqlite_non_root_workers_follow_the_cpu_limit(tmp_path):
    override = tmp_path / "one-cpu.yml"
    override.write_text('services:\n  semigrad:\n    deploy:\n      resources:\n        limits:\n          cpus: "1"\n')
    for files, workers in (([ROOT / "docker-compose.yml"], None), ([ROOT / "docker-compose.yml", override], 1)):
        stack = Stack("sgtest-single", files, (50051,))
        try:
            stack("up", "-d", "--build", timeout=UP_TIMEOUT)
            (container,) = stack.containers("semigrad")
            _wait("healthy", lambda: _healthy([container]), logs=lambda: stack("logs", "--tail=20"))
            assert _run(["docker", "exec", container, "id", "-u"]).stdout.strip() == "10001"
            cpus = int(_run(["docker", "exec", container, "python", "-c",
                             "from semigrad_server.cpus import available_cpus; print(available_cpus())"]).stdout)
            if workers is not None:
                assert cpus == workers
            logs = _run(["docker", "logs", container]).stderr + _run(["docker", "logs", container]).stdout
            # one worker serves in the supervisor's place; more are supervised
            assert (f"supervising {cpus} workers" in logs) == (cpus > 1), logs
            with sg.Client("127.0.0.1:50051", timeout=30) as client:
                _check(client.register(_graph()), np.linspace(-2, 2, 5))
        finally:
            stack.down()
