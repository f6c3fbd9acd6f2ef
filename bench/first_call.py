"""First call: what a user waits for before the first batch of gradients comes back, in a fresh
process, semigrad in-process against JAX's jit(vmap(grad)), timed in alternation.

From the clock's start to the first batch's gradients (imports done before, for both):

  * semigrad: building the graph with the client API (`Workload.graph`, then `to_proto`),
    registering it in an in-process `Engine` (`graph_from_proto` + `register`: validation,
    typing, the content hash), and the first batched gradient call (compiling the gradient plan:
    hash-consing of the forward graph, reverse mode, scalarisation, code generation; then the
    batch, which runs on NumPy while numba compiles the JIT kernel in the background);
  * JAX: jit(vmap(grad(f)))'s first call on the batch (tracing f, XLA compile, the run), with f
    written as peers.py's JAX row writes it.

Each measurement is a fresh process (no cache survives: semigrad's plans and numba's kernels,
XLA's compiles), and the two alternate (semigrad, JAX, JAX, semigrad, ...) so that both see the
same machine load. Every batch has fresh items (a new random batch per call). After the first
call each process also times the second batch (semigrad: right away, still on NumPy unless the
kernel is ready), the wait for semigrad's background JIT compile, and steady batches (median of
five, after the compile). Gradients are checked against the workload's reference after timing.

    .venv/bin/python bench/first_call.py --only det5 --only det6 --only det7   # 3 pairs each
    .venv/bin/python bench/first_call.py --pairs 5 --batch 10000

suite.py runs the same measurement (`first_calls`) for every workload it runs with both
semigrad and JAX selected, and puts the ratio in its summary.
"""

from __future__ import annotations

import os
import sys


def _early_threads(argv: list[str]) -> None:
    """--threads N (default 1), set before NumPy, numba or JAX load (suite.py's limit_threads)."""
    n = 1
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            n = int(argv[i + 1])
    if n > 0:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
            os.environ[var] = str(n)
        if n == 1 and "--xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()


if __name__ == "__main__":
    _early_threads(sys.argv[1:])

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
IMPLS = ("semigrad", "jax")
CHILD_TIMEOUT = 900  # s: one fresh process (imports, first call, checks, six more batches)
# JAX unrolls a recursive det: n=7's jit(vmap(grad)) first call had not finished after 14 min on a
# loaded 2-core machine (n=6: ~2 min). A JAX process still running after this many seconds is
# stopped and reported as "> LIMIT" (semigrad's ratio is then an upper bound), once per workload.
JAX_LIMIT = 180.0
STEADY_BATCHES = 5  # after the first two (and semigrad's compile): their median is the steady figure


# ------------------------------------------------------------------------------------ one process
def _batches(w, batch: int, seed: int, count: int) -> list[dict]:
    """`count` batches of fresh items (the suite's inputs are not reused: nothing can be cached)."""
    rng = np.random.default_rng([seed, 7919])
    return [w.batched.sample(rng, batch) for _ in range(count)]


def child(impl: str, workload: str, batch: int, seed: int) -> dict:
    """One first-call measurement in this (fresh) process: a dict of seconds (and notes)."""
    from workloads import all_workloads

    w = next(x for x in all_workloads() if x.name == workload)
    batches = _batches(w, batch, seed, 2 + STEADY_BATCHES)
    wrt = list(w.wrt)
    out: dict = {"impl": impl, "workload": workload, "batch": batch}
    if impl == "semigrad":
        from common import settle
        from semigrad_server.engine import Engine
        from semigrad_server.service.convert import graph_from_proto

        engine = Engine()
        t0 = time.perf_counter()
        proto = w.graph(w.batched).to_proto()
        t1 = time.perf_counter()
        cg, _ = engine.register(graph_from_proto(proto))
        t2 = time.perf_counter()
        first = engine.gradient(cg.id, batches[0], wrt=wrt).gradients
        t3 = time.perf_counter()
        out.update(first_call=t3 - t0, build=t1 - t0, register=t2 - t1, first_gradient=t3 - t2,
                   nodes=len(proto.nodes))
        call = lambda b: engine.gradient(cg.id, b, wrt=wrt).gradients  # noqa: E731
        to_numpy = dict
    elif impl == "jax":
        from peers import jax_batched_gradient

        jax, gb, names = jax_batched_gradient(w)
        device = [[jax.device_put(b[k]) for k in names] for b in batches]
        jax.block_until_ready(device)
        t0 = time.perf_counter()
        first = jax.block_until_ready(gb(*device[0]))
        out["first_call"] = time.perf_counter() - t0
        arguments = iter(device[1:])
        call = lambda b: jax.block_until_ready(gb(*next(arguments)))  # noqa: E731
        to_numpy = lambda res: {k: np.asarray(g) for k, g in zip(wrt, res)}  # noqa: E731
    else:
        raise SystemExit(f"first_call.py: unknown implementation {impl!r}; choose from {IMPLS}")
    t = time.perf_counter()
    call(batches[1])
    out["second_batch"] = time.perf_counter() - t
    out["jit_wait"] = settle() if impl == "semigrad" else 0.0
    steady = []
    for b in batches[2:]:
        t = time.perf_counter()
        call(b)
        steady.append(time.perf_counter() - t)
    out["steady_batch"] = statistics.median(steady)
    from suite import compare  # after timing: the suite's correctness check

    out["max_rel_err"] = compare(f"{impl}, {workload}, first batched call", to_numpy(first),
                                 w.reference_gradient(batches[0]), True)
    return out


# ------------------------------------------------------------------------------------ alternation
def run_child(impl: str, workload: str, batch: int, seed: int, threads: int, limit: float | None = None) -> dict:
    """One fresh process; with `limit`, a process still running after `limit` s is stopped and
    reported as {"first_call": None, "over": limit}."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", impl, "--only", workload,
           "--batch", str(batch), "--seed", str(seed), "--threads", str(threads)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit or CHILD_TIMEOUT, cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        if limit is None:
            raise
        return {"impl": impl, "workload": workload, "batch": batch, "first_call": None, "over": limit}
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} first call on {workload} failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-600:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def first_calls(workload: str, *, pairs: int = 3, batch: int = 10_000, seed: int = 0, threads: int = 1,
                impls: tuple[str, ...] = IMPLS, jax_limit: float = JAX_LIMIT, log=None) -> dict:
    """`pairs` fresh processes per implementation, alternated (ABBA...): {"runs": {impl: [dict]},
    "ratio": median over pairs of semigrad's first call ÷ JAX's, "ratios": [...], "bound": True
    when JAX ran past `jax_limit` (then once only, and the ratios are upper bounds)}."""
    runs: dict[str, list[dict]] = {impl: [] for impl in impls}
    for p in range(pairs):
        for impl in (impls if p % 2 == 0 else impls[::-1]):
            if impl == "jax" and runs["jax"] and runs["jax"][-1].get("over"):
                continue  # past the limit once: not again
            run = run_child(impl, workload, batch, seed + p, threads, jax_limit if impl == "jax" else None)
            runs[impl].append(run)
            if log:
                took = f"> {run['over']:g}" if run.get("over") else f"{run['first_call']:.2f}"
                log(f"    first call, {workload}, {impl}: {took} s")
    out: dict = {"runs": runs}
    if set(IMPLS) <= set(impls):
        over = [j["over"] for j in runs["jax"] if j.get("over")]
        if over:
            out["bound"] = True
            out["ratios"] = [s["first_call"] / over[0] for s in runs["semigrad"]]
        else:
            out["ratios"] = [s["first_call"] / j["first_call"] for s, j in zip(runs["semigrad"], runs["jax"])]
        out["ratio"] = statistics.median(out["ratios"])
    return out


def median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def table(results: dict[str, dict], batch: int) -> str:
    """Markdown: one row per workload, medians over the fresh processes."""
    from common import fmt, markdown_table

    headers = ["workload", "semigrad 1st call (s)", "of which build / register / 1st gradient (s)",
               "JAX jit(vmap(grad)) 1st call (s)", "semigrad ÷ JAX (median of pairs, min–max)",
               "semigrad 2nd batch (s)", "semigrad JIT wait after 1st call (s)", "semigrad steady batch (ms)",
               "JAX steady batch (ms)", "processes"]
    rows = []
    for name, res in results.items():
        s, j = res["runs"].get("semigrad", []), res["runs"].get("jax", [])
        phases = " / ".join(f"{median_of(s, k):.3f}" for k in ("build", "register", "first_gradient")) if s else "—"

        def sec(runs, key, scale=1.0):
            v = median_of(runs, key)
            return "—" if v is None else fmt(v * scale)

        ratio = (f"{'< ' if res.get('bound') else ''}{res['ratio']:.3g} "
                 f"({min(res['ratios']):.3g}–{max(res['ratios']):.3g})" if "ratio" in res else "—")
        over = [r["over"] for r in j if r.get("over")]
        jax_first = f"> {over[0]:g} (stopped)" if over else sec(j, "first_call")
        rows.append([name, sec(s, "first_call"), phases, jax_first, ratio, sec(s, "second_batch"),
                     sec(s, "jit_wait"), sec(s, "steady_batch", 1e3), sec(j, "steady_batch", 1e3),
                     f"{len(s)} + {len(j)}"])
    return markdown_table(headers, rows)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="WORKLOAD",
                   help="workloads (repeatable or comma-separated; default det5, det6, det7)")
    p.add_argument("--pairs", type=int, default=3, help="fresh processes per implementation (default 3)")
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="threads per implementation (default 1; 0 = defaults)")
    p.add_argument("--jax-limit", type=float, default=JAX_LIMIT,
                   help=f"seconds after which a JAX process is stopped and reported as over (default {JAX_LIMIT:g})")
    p.add_argument("--child", choices=IMPLS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    only = [x for item in args.only for x in item.split(",") if x] or ["det5", "det6", "det7"]
    sys.path.insert(0, str(HERE))
    if args.child:
        print(json.dumps(child(args.child, only[0], args.batch, args.seed)))
        return 0
    from common import rerun_command

    results = {}
    for name in only:
        print(f"... {name}", file=sys.stderr, flush=True)
        results[name] = first_calls(name, pairs=args.pairs, batch=args.batch, seed=args.seed, threads=args.threads,
                                    jax_limit=args.jax_limit, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(table(results, args.batch))
    print()
    print("```sh\n" + rerun_command("bench/first_call.py", argv) + "\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
