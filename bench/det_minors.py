"""Benchmark: gradient of the determinant by expansion by minors (CppAD's det_minor), n × n.

For each n it builds the graph with the client API (bench/workloads.py), checks the gradient
against the closed form det(A)·A^{-T} once, then measures, all in this one process:

  * single-gradient latency (one n×n matrix per call): in-process Engine, and over gRPC to a
    real server on 127.0.0.1:0 (build_server) through semigrad.Client; median of many calls;
  * batched throughput: one call with `--batch` matrices (shape (batch, n, n)), in-process and
    over gRPC (one unary call); gradients per second from the median of the runs;
  * the NumPy closed form det(A)·inv(A)^T on the same batch, as the reference for ratios.

Run from the repo root:  .venv/bin/python bench/det_minors.py [--sizes 4 5 6] [--batch 10000] [--quick]
Prints a markdown report on stdout (progress goes to stderr). Exits 1 if a gradient is wrong.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import semigrad
from semigrad_server.engine import Engine
from semigrad_server.service import build_server
from semigrad_server.service.convert import graph_from_proto

from common import fmt, machine_info, markdown_table, median_latency, median_run, rerun_command, section, settle
from workloads import det_gradient, det_graph

RTOL = 1e-8  # per matrix: ||gradient − det(A)·A^{-T}||_F ≤ RTOL · ||det(A)·A^{-T}||_F


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 5, 6], metavar="N", help="matrix sizes n (default: 4 5 6)")
    p.add_argument("--batch", type=int, default=10_000, help="matrices per batched call (default: 10000)")
    p.add_argument("--quick", action="store_true",
                   help="fewer repetitions: 0.1 s per latency cell, 1 batched run (smoke test, noisy figures)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random matrices (default: 0)")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.sizes) or args.batch < 1:
        p.error("sizes and batch must be positive")
    args.budget = 0.1 if args.quick else 0.5  # seconds of timed calls per latency cell
    args.runs = 1 if args.quick else 3  # timed runs per batched semigrad cell (median)
    return args


def resolved_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--sizes", *map(str, args.sizes), "--batch", str(args.batch), "--seed", str(args.seed)]
    return argv + (["--quick"] if args.quick else [])


class WrongGradient(Exception):
    pass


def check(what: str, got: np.ndarray, want: np.ndarray) -> float:
    """Worst per-matrix relative error of `got` against `want`; raises WrongGradient beyond RTOL."""
    got = np.asarray(got)
    if got.shape != want.shape:
        raise WrongGradient(f"{what}: gradient has shape {got.shape}, expected {want.shape}")
    if not np.all(np.isfinite(got)):
        raise WrongGradient(f"{what}: gradient has non-finite entries")
    err = np.linalg.norm(got - want, axis=(-2, -1)) / np.linalg.norm(want, axis=(-2, -1))
    worst = float(np.max(err))
    if not worst <= RTOL:
        i = np.unravel_index(np.argmax(err), err.shape)
        where = f" (batch item {i[0] if len(i) == 1 else i})" if i else ""
        raise WrongGradient(f"{what}: relative error {worst:.3e} > {RTOL:g}{where}\n"
                            f"got:\n{got[i]}\nexpected det(A)·inv(A).T:\n{want[i]}")
    return worst


def bench_size(n: int, args, engine: Engine, client: semigrad.Client) -> dict:
    g = det_graph(n)
    proto = g.to_proto()
    compiled, _ = engine.register(graph_from_proto(proto))
    gid = compiled.id
    f = client.register(g)
    if f.id != gid:
        raise WrongGradient(f"n={n}: the server's graph id {f.id} differs from the in-process one {gid}")

    rng = np.random.default_rng([args.seed, n])
    one = rng.standard_normal((n, n))
    batch = rng.standard_normal((args.batch, n, n))

    def local(a):
        return engine.gradient(gid, {"A": a}).gradients["A"]

    def remote(a):
        return f.gradient({"A": a})["A"]

    with section(f"n={n}: correctness (also warms up every path)"):
        ref_one, ref_batch = det_gradient(one), det_gradient(batch)
        worst = max(check(f"n={n} in-process single", local(one), ref_one),
                    check(f"n={n} gRPC single", remote(one), ref_one),
                    check(f"n={n} in-process batched", local(batch), ref_batch),
                    check(f"n={n} gRPC batched", remote(batch), ref_batch))
        settle()  # kernels compiling in the background: check the compiled ones too
        worst = max(worst, check(f"n={n} in-process batched (compiled)", local(batch), ref_batch),
                    check(f"n={n} gRPC batched (compiled)", remote(batch), ref_batch))

    r = {"n": n, "nodes": len(proto.nodes), "worst_rel_err": worst}
    with section(f"n={n}: single-gradient latency, in-process"):
        r["lat_local"], r["reps_local"] = median_latency(lambda: local(one), budget=args.budget)
    with section(f"n={n}: single-gradient latency, gRPC"):
        r["lat_grpc"], r["reps_grpc"] = median_latency(lambda: remote(one), budget=args.budget)
    warm = 0 if args.quick else 1  # the correctness check already ran each batched call once
    with section(f"n={n}: batched ({args.batch}), in-process × {args.runs}"):
        r["thr_local"] = args.batch / median_run(lambda: local(batch), runs=args.runs, warmup_runs=warm)
    with section(f"n={n}: batched ({args.batch}), gRPC × {args.runs}"):
        r["thr_grpc"] = args.batch / median_run(lambda: remote(batch), runs=args.runs, warmup_runs=warm)
    with section(f"n={n}: batched ({args.batch}), NumPy closed form"):
        t, r["runs_numpy"] = median_latency(lambda: det_gradient(batch), budget=args.budget,
                                            min_reps=max(3, args.runs))
        r["thr_numpy"] = args.batch / t
    return r


def report(results: list[dict], args) -> str:
    headers = ["n", "nodes in graph", "latency in-process (µs)", "latency gRPC (µs)",
               "batched in-process (grads/s)", "batched gRPC (grads/s)", "NumPy closed form (grads/s)",
               "in-process / NumPy", "gRPC / NumPy"]
    rows = [[str(r["n"]), str(r["nodes"]), fmt(r["lat_local"] * 1e6), fmt(r["lat_grpc"] * 1e6),
             fmt(r["thr_local"]), fmt(r["thr_grpc"]), fmt(r["thr_numpy"]),
             fmt(r["thr_local"] / r["thr_numpy"]), fmt(r["thr_grpc"] / r["thr_numpy"])] for r in results]
    details = markdown_table(
        ["n", "timed calls in-process", "timed calls gRPC", "NumPy runs", "worst relative error"],
        [[str(r["n"]), str(r["reps_local"]), str(r["reps_grpc"]), str(r["runs_numpy"]),
          f"{r['worst_rel_err']:.1e}"] for r in results])
    lines = [
        "## det by minors: gradient of det(A), A n×n",
        "",
        *(f"- {k}: {v}" for k, v in machine_info()),
        f"- batch: {args.batch} matrices per batched call; entries N(0, 1), seed {args.seed}",
        f"- latency: median of single calls after warm-up, ≥{args.budget} s of timed calls per cell; "
        f"batched semigrad: median of {args.runs} run(s); NumPy: median of ≥{max(3, args.runs)} runs",
        "- gRPC: client and server (build_server on 127.0.0.1:0, 8 worker threads) in this one process; the "
        "client's defaults (shared_memory='auto': batches through /dev/shm, single matrices inline)",
        f"- gradients checked against det(A)·inv(A)^T before timing (per matrix, relative Frobenius "
        f"error ≤ {RTOL:g})" + ("" if not args.quick else "; --quick: figures are noisy"),
        "",
        markdown_table(headers, rows),
        "",
        "Ratios are semigrad throughput over NumPy closed-form throughput measured in this same run "
        "(higher is better; 1 = as fast as NumPy). Read figures as ratios, not as absolute numbers.",
        "",
        details,
        "",
        "Rerun:",
        "",
        "```sh",
        rerun_command("bench/det_minors.py", resolved_argv(args)),
        "```",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    engine = Engine()
    server, port, _ = build_server("127.0.0.1:0")
    server.start()
    try:
        with semigrad.Client(f"127.0.0.1:{port}") as client:
            results = [bench_size(n, args, engine, client) for n in args.sizes]
    except WrongGradient as e:
        print(f"\n*** CORRECTNESS CHECK FAILED, nothing timed: {e}", file=sys.stderr)
        return 1
    finally:
        server.stop(0).wait()
    print(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
