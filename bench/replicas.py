"""Benchmark: a 1,000,000-point gradient_many job on 1 and on 2 replicas (`semigrad serve
--workers 1` processes on one Redis), the client balancing its streams over them (round_robin
over an ipv4: target; docs/deploying.md).

For each replica count it starts the replicas (`--pin`: each on a core of its own, as a replica
with a CPU quota of one core), registers the graph, warms them up with a job checked against the
gradient's closed form, then times the job (`--repeats` times, alternating the replica
counts so both see the same machine load) and reads each replica's CPU seconds from /proc, which
the machine's load does not change much: CPU seconds per million points is the per-replica figure
the scaling model of docs/deploying.md uses.

Run from the repo root:  .venv/bin/python bench/replicas.py [--points 1000000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import semigrad as sg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from redis_server import free_port, running_redis  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
INPUTS = 8
HIDDEN = 16  # --hidden: the server's work per point grows with it, the bytes moved do not


def graph() -> sg.Graph:
    """f(x) = sum(tanh(W x + b)^2) with fixed W, b: gradient 2 W^T (t (1 - t^2)), t = tanh(W x + b)."""
    rng = np.random.default_rng(0)
    g = sg.Graph()
    x = g.input("x", (INPUTS,))
    w = g.const(rng.normal(size=(HIDDEN, INPUTS)) / 3, name="W")
    b = g.const(rng.normal(size=HIDDEN), name="b")
    t = sg.tanh(sg.matmul(w, x) + b)
    g.output("y", sg.sum(t * t))
    return g


def reference(x: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(HIDDEN, INPUTS)) / 3
    b = rng.normal(size=HIDDEN)
    t = np.tanh(x @ w.T + b)
    return (2 * t * (1 - t * t)) @ w


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


@contextlib.contextmanager
def replicas(count: int, store: str, workdir: Path, pin: bool = False):
    ports = [free_port() for _ in range(count)]
    cores = sorted(os.sched_getaffinity(0))
    # --pin: replica i on core i only (its CPU quota of one core, as `limits.cpu: 1` in deploy/k8s),
    # the client on any core
    pinned = [["taskset", "-c", str(cores[i % len(cores)])] if pin else [] for i in range(count)]
    processes = [subprocess.Popen([*pinned[i], sys.executable, "-m", "semigrad_server", "serve", "--port", str(port), "--workers",
                                   "1", "--store", store, "--no-shared-memory"],
                                  stdout=open(workdir / f"replica-{port}.log", "w"), stderr=subprocess.STDOUT,
                                  start_new_session=True) for i, port in enumerate(ports)]
    try:
        for port in ports:
            with sg.Client(f"127.0.0.1:{port}", timeout=60) as client:
                for _ in range(600):
                    with contextlib.suppress(sg.SemigradError):
                        client.list_ops()
                        break
                    time.sleep(0.1)
        yield "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports), processes
    finally:
        for p in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            p.wait(30)


def main() -> int:
    global HIDDEN
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--streams-per-replica", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=300_000,
                        help="points per replica sent (and checked) before the timed job (default 300,000)")
    parser.add_argument("--pin", action="store_true",
                        help="pin replica i to core i (taskset): a replica's CPU quota of one core")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help=f"width of the hidden layer (default {HIDDEN})")
    args = parser.parse_args()
    HIDDEN = args.hidden
    x = np.random.default_rng(1).normal(size=(args.points, INPUTS))
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"semigrad-bench-replicas-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    with running_redis(workdir / "redis") as redis:
        for repeat in range(args.repeats):
            for count in (1, 2):
                with replicas(count, redis.url, workdir, args.pin) as (target, processes):
                    with sg.Client(target, timeout=600, shared_memory=False) as client:
                        f = client.register(graph())
                        # Warm-up, checked against the closed form: past fusion.HOT_ELEMENTS a replica
                        # compiles the graph's fused groups (numba, ~0.2 s of CPU, once per process),
                        # which a replica serving job after job has long done.
                        warm = x[:args.warmup * count]
                        check = f.gradient_many({"x": warm}, streams=count * args.streams_per_replica)["x"]
                        np.testing.assert_allclose(check, reference(warm), rtol=1e-9, atol=1e-12)
                        time.sleep(3.0)  # the compile runs on a thread of its own (slow on a loaded machine)
                        cpu = [cpu_seconds(p.pid) for p in processes]
                        client_cpu = time.process_time()
                        start = time.perf_counter()
                        result = f.gradient_many({"x": x}, streams=count * args.streams_per_replica)["x"]
                        wall = time.perf_counter() - start
                        client_cpu = time.process_time() - client_cpu
                        cpu = [cpu_seconds(p.pid) - c for p, c in zip(processes, cpu)]
                        assert result.shape == x.shape
                rows.append((repeat, count, wall, cpu, client_cpu))
                print(f"repeat {repeat}: {count} replica(s): {args.points / wall:,.0f} points/s ({wall:.2f} s); "
                      f"replica CPU s: {', '.join(f'{c:.2f}' for c in cpu)}; client CPU s: {client_cpu:.2f}",
                      file=sys.stderr)
    load = os.getloadavg()
    print(f"| replicas | wall s (best) | points/s | replica CPU s per 1M points | client CPU s |\n|---|---|---|---|---|")
    for count in (1, 2):
        mine = [r for r in rows if r[1] == count]
        best = min(mine, key=lambda r: r[2])
        print(f"| {count} | {best[2]:.2f} | {args.points / best[2]:,.0f} | "
              f"{sum(best[3]) * 1e6 / args.points:.2f} ({' + '.join(f'{c:.2f}' for c in best[3])}) | {best[4]:.2f} |")
    one = min(r[2] for r in rows if r[1] == 1)
    two = min(r[2] for r in rows if r[1] == 2)
    print(f"\nspeed-up 1 -> 2 replicas: {one / two:.2f}x; hidden {HIDDEN}; {os.cpu_count()} CPUs; "
          f"{'replicas pinned to a core each' if args.pin else 'replicas unpinned'}; load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
