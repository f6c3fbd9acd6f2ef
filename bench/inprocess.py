"""Single-point gradient latency of the in-process client (`semigrad.Client()`) against the
engine called directly (`Engine.gradient`) and, when JAX is installed, JAX's jit(grad): the
three timed in alternation (a block of calls each, repeated), so that all see the same load.

    .venv/bin/python bench/inprocess.py [--seconds 2] [--workloads det4,det5,poly,ode,mlp]

Prints a markdown table: median µs per call of each, client ÷ engine (the client's overhead)
and client ÷ JAX (issue 14's target: ≤ 2). Every gradient is checked against the workload's
reference before timing."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# One thread per implementation, as bench/suite.py runs them (before NumPy, numba and JAX load).
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import semigrad  # noqa: E402
from common import settle  # noqa: E402
from workloads import MLP, ODE, POLY, det_workload  # noqa: E402

WORKLOADS = {"det4": det_workload(4), "det5": det_workload(5), "poly": POLY, "ode": ODE, "mlp": MLP}


def jax_single(w, x):
    """A zero-argument call of JAX's jit(grad) at `x`, or None without JAX."""
    try:
        from peers import jax_function
        jax, f, names, argnums, _ = jax_function(w)
    except ImportError:
        return None
    g = jax.jit(jax.grad(f, argnums=argnums))
    args = [jax.device_put(x[k]) for k in names]
    jax.block_until_ready(g(*args))
    return lambda: jax.block_until_ready(g(*args))


def per_call(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per workload (default 2)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="0.5 s per workload")
    args, _ = parser.parse_known_args(argv)  # bench/run.py passes every benchmark the same arguments
    if args.quick:
        args.seconds = 0.5
    client = semigrad.Client()
    engine = client.transport.engine
    rng = np.random.default_rng(0)
    rows = []
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        f = client.register(w.graph(w.single))
        x = w.single.sample(rng, None)
        wrt = list(w.wrt)
        reference = w.reference_gradient(x)
        for _ in range(100):  # past the engine's hot-call threshold, then its background compile
            f.gradient(x, wrt=wrt)
        settle()
        got = f.gradient(x, wrt=wrt)
        for k in wrt:
            np.testing.assert_allclose(got[k], reference[k], rtol=1e-8, atol=1e-12, err_msg=f"{name}: {k}")
        calls = {"engine": lambda: engine.gradient(f.id, x, wrt=wrt).gradients,
                 "client": lambda: f.gradient(x, wrt=wrt)}
        jax_call = jax_single(w, x)
        if jax_call is not None:
            calls["jax"] = jax_call
        n = max(1, int(2e-3 / min(per_call(c, 20) for c in calls.values())))  # ~2 ms blocks
        times = {k: [] for k in calls}
        end = time.perf_counter() + args.seconds
        while time.perf_counter() < end or len(times["client"]) < 5:
            for k, c in calls.items():
                times[k].append(per_call(c, n))
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        best = {k: min(v) * 1e6 for k, v in times.items()}
        rows.append((name, med, best, len(times["client"]) * n))
    print("Median µs per call over alternated blocks of calls (best block in parentheses: on a loaded "
          "machine the least disturbed figure); ratios of the medians (of the best blocks).\n")
    print("| workload | engine (µs) | in-process client (µs) | JAX jit(grad) (µs) | client ÷ engine "
          "| client ÷ JAX |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, med, best, _ in rows:
        cell = lambda k: "—" if k not in med else f"{med[k]:.2f} ({best[k]:.2f})"  # noqa: E731
        ratio = lambda a, b: "—" if b not in med else (  # noqa: E731
            f"{med[a] / med[b]:.2f} ({best[a] / best[b]:.2f})")
        print(f"| {name} | {cell('engine')} | {cell('client')} | {cell('jax')} | {ratio('client', 'engine')} "
              f"| {ratio('client', 'jax')} |")

if __name__ == "__main__":
    main()
