"""Benchmark: how large gradient_many's chunks should be, inline and through shared memory.

For each workload of bench/workloads.py (batch of `--batch` items) and each transport (tensors
inline as protobuf bytes, or through /dev/shm), all against one real server on 127.0.0.1:0 in
this process, it checks the streamed gradient against the workload's reference once, then times
in alternation (so that every cell sees the same load): one unary Gradient call with the whole
batch, gradient_many with its default chunks, and gradient_many with chunks of a fixed number of
bytes (`--chunk-mib`). The table gives each as a ratio to the unary call of the same transport
in the same run (below 1: the stream is faster). The client's defaults
(STREAM_CHUNK_BYTES_SHARED, STREAM_CHUNK_BYTES_INLINE in client/semigrad/streaming.py) come from
this table.

Run from the repo root:  .venv/bin/python bench/stream_chunks.py [--only det7 --only mlp] [--quick]
Prints a markdown report on stdout (progress goes to stderr). Exits 1 if a gradient is wrong.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import semigrad
from semigrad import streaming
from semigrad_server.service import build_server

from common import fmt, machine_info, markdown_table, rerun_command, section, settle
from workloads import all_workloads

RTOL = 1e-8
DEFAULT_WORKLOADS = ("det5", "det7", "ode", "mlp")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", default=[], metavar="WORKLOAD",
                   help=f"workloads (default: {' '.join(DEFAULT_WORKLOADS)})")
    p.add_argument("--batch", type=int, default=10_000, help="items per job (default: 10000)")
    p.add_argument("--chunk-mib", type=float, nargs="+", default=[0.5, 2, 8, 64], metavar="MIB",
                   help="fixed chunk sizes to time, MiB of tensors per chunk (default: 0.5 2 8 64)")
    p.add_argument("--runs", type=int, default=7, help="timed rounds (default: 7; --quick: 2)")
    p.add_argument("--quick", action="store_true", help="det5 and ode, batch 2000, 2 rounds (smoke test)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.only = args.only or ["det5", "ode"]
        args.batch, args.runs = min(args.batch, 2000), 2
    args.only = args.only or list(DEFAULT_WORKLOADS)
    return args


def resolved_argv(args) -> list[str]:
    argv = [x for name in args.only for x in ("--only", name)]
    argv += ["--batch", str(args.batch), "--chunk-mib", *map(str, args.chunk_mib), "--runs", str(args.runs),
             "--seed", str(args.seed)]
    return argv + (["--quick"] if args.quick else [])


def worst_error(got: dict, want: dict) -> float:
    worst = 0.0
    for name, ref in want.items():
        g, r = np.asarray(got[name]).reshape(len(ref), -1), np.asarray(ref).reshape(len(ref), -1)
        err = np.linalg.norm(g - r, axis=1) / np.maximum(np.linalg.norm(r, axis=1), 1e-300)
        worst = max(worst, float(err.max()))
    return worst


def chunk_size(f, batch: dict, wrt: list[str], mib: float | None) -> int:
    """gradient_many's own default chunk_size for the batch, with its byte target set to `mib` MiB
    (None: the client's default for its transport)."""
    target = None if mib is None else int(mib * (1 << 20))
    return streaming.default_chunk_size(streaming.Batch(f, batch, {}), {"wrt": wrt}, target)


def bench_workload(w, transport: str, client: semigrad.Client, args) -> list[str]:
    """The table row: the unary call's time, then each gradient_many variant's ÷ it."""
    rng = np.random.default_rng(args.seed)
    batch = w.batched.sample(rng, args.batch)
    wrt = list(w.wrt)
    f = client.register(w.graph(w.batched))
    default_items = chunk_size(f, batch, wrt, None)
    calls = {"unary": lambda: f.gradient(batch, wrt=wrt),
             "default": lambda: f.gradient_many(batch, wrt=wrt, progress=False)}
    for mib in args.chunk_mib:
        items = chunk_size(f, batch, wrt, mib)
        calls[f"{mib:g} MiB"] = lambda items=items: f.gradient_many(batch, wrt=wrt, chunk_size=items, progress=False)
    with section(f"{w.name}, {transport}: check"):
        want = w.reference_gradient(batch)
        for label, call in calls.items():
            call()
        settle()  # background compiles, so that the check and the timing see the compiled kernels
        for label, call in calls.items():
            err = worst_error(call(), want)
            if not err <= RTOL:
                raise SystemExit(f"stream_chunks.py: {w.name}, {transport}, {label}: relative error {err:.2e} > {RTOL}")
    times: dict[str, list[float]] = {label: [] for label in calls}
    with section(f"{w.name}, {transport}: {args.runs} rounds"):
        for _ in range(args.runs):
            for label, call in calls.items():
                t0 = time.perf_counter()
                call()
                times[label].append(time.perf_counter() - t0)
    unary = statistics.median(times["unary"])
    ratios = [f"{statistics.median(times[label]) / unary:.2f}" for label in calls if label != "unary"]
    ratios[0] += f" ({default_items:,} items)"
    return [w.name, transport, f"{fmt(unary * 1e3)} ms", *ratios]


def main(argv=None) -> int:
    args = parse_args(argv)
    known = {w.name: w for w in all_workloads()}
    bad = [name for name in args.only if name not in known]
    if bad:
        raise SystemExit(f"stream_chunks.py: unknown workload(s) {bad}; choose from {sorted(known)}")
    server, port, _ = build_server("127.0.0.1:0")
    server.start()
    clients = {"inline": semigrad.Client(f"127.0.0.1:{port}", shared_memory=False),
               "shared memory": semigrad.Client(f"127.0.0.1:{port}", shared_memory=True)}
    headers = ["workload", "transport", "unary call", "gradient_many, default chunks ÷ unary",
               *(f"{mib:g} MiB chunks ÷ unary" for mib in args.chunk_mib)]
    rows = []
    try:
        for name in args.only:
            for transport, client in clients.items():
                rows.append(bench_workload(known[name], transport, client, args))
    finally:
        for client in clients.values():
            client.close()
        server.stop(0).wait()
    print("# gradient_many: chunk size against one unary call\n")
    print("\n".join(f"- {k}: {v}" for k, v in machine_info()))
    print(f"- batch: {args.batch:,} items; median of {args.runs} rounds, every call of a round in turn\n")
    print(markdown_table(headers, rows, "ll" + "r" * (len(headers) - 2)))
    print("\nRatios to the unary call of the same transport in the same run: below 1, the stream is faster. "
          "The default column gives the items per chunk it chose.")
    print(f"\nCommand:\n\n```sh\n{rerun_command('bench/stream_chunks.py', resolved_argv(args))}\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
