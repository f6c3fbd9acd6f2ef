"""Issue 12's throughput acceptance: gradient of det(A) by minors written as users write it (the
README's plain recursion, sub-minors recomputed), batched in-process, FRESH random items every
call, semigrad against SymEngine Lambdify (LLVM, cse), CasADi generated C (gcc -O2) and JAX
jit(vmap(grad)), timed in alternation.

For every n it sets each implementation up (semigrad: build the graph with the client API,
register it, the first batch, the wait for the background JIT compile; peers: their symbolic
differentiation, code generation and compile, or XLA's), checks each one's gradients on a fresh
batch against det(A)·A^-T, then runs `--rounds` rounds: each round draws a new batch of
`--batch` matrices (outside the clock) and calls every implementation once on it, in an order
that rotates every round, so that all see the same machine load and none sees an item twice.
A call is timed from the implementation's own input form to its own result form: the
conversion of the NumPy (batch, n, n) array into a peer's input (CasADi's DM, a JAX device array)
is made before the clock starts, which favours the peers; semigrad's `Engine.gradient` takes
the NumPy array and returns NumPy.

Reported per n: each implementation's median time per call (and min–max), and semigrad's
throughput ratio to each peer and to the best peer of each round (t_peer / t_semigrad, the
median over rounds and its min–max: ≥ 1 means semigrad is at least as fast), on the wall clock
and on the process's CPU clock (every implementation runs on one thread; CPU time leaves out the
time slices other processes take on a shared machine). Also the size of
semigrad's scalar program for the recursive graph and for the memoised one (they must be equal:
the forward graph is hash-consed before differentiation) and CasADi's instruction count.

JAX unrolls the recursion and XLA compiles it for minutes (n=6: ~2 min, n=7: not finished after
14 min; bench/first_call.py): JAX runs where the traced function has at most
`--jax-max-equations` primitive operations (default 1,000: n ≤ 5; n=6 traces to 5,867), and is listed as skipped,
with the count, elsewhere.

    .venv/bin/python bench/det_recursive.py                   # n = 5, 6, 7; 15 rounds of 10,000
    .venv/bin/python bench/det_recursive.py --sizes 5 --rounds 21
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # one thread per implementation, set before NumPy, numba or JAX load
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
    if "--xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402

import numpy as np  # noqa: E402

from common import fmt, machine_info, markdown_table, package_version, rerun_command, settle  # noqa: E402
from workloads import det_gradient, det_workload  # noqa: E402

IMPLS = ("semigrad", "symengine", "casadi_c", "jax")
LABELS = {"semigrad": "semigrad in-process (Engine)", "symengine": "SymEngine Lambdify (LLVM, cse)",
          "casadi_c": "CasADi generated C (gcc -O2)", "jax": "JAX jit(vmap(grad))"}
RTOL = 1e-8  # per item: ||g − det(A)·A^-T|| ≤ RTOL·max(||ref||, 1e-3·median ||ref||) (suite.py's check)


class Skipped(Exception):
    pass


# ------------------------------------------------------------------------------------ implementations
# Each setup returns (prepare(A) -> the implementation's input, call(input) -> native result,
# gradients(native) -> (B, n, n) array, notes). prepare runs outside the clock: a peer is timed on
# its computation alone (CasADi's DM from a NumPy array costs ~8x its map call at n=5), which
# favours the peers; semigrad takes the NumPy array as it is.
def setup_semigrad(w, n: int, first: np.ndarray):
    from semigrad_server.engine import Engine
    from semigrad_server.service.convert import graph_from_proto

    engine = Engine()
    t0 = time.perf_counter()
    cg, _ = engine.register(graph_from_proto(w.graph(w.batched).to_proto()))
    t1 = time.perf_counter()
    engine.gradient(cg.id, {"A": first}, wrt=["A"])
    t2 = time.perf_counter()
    waited = settle()
    (plan,) = [c.plan for _, c in cg.plans.items()]
    program = getattr(plan, "program", None)
    size = f"{len(program.instrs):,} instructions" if program is not None else f"tensor plan ({type(plan).__name__})"
    notes = [f"build + register {t1 - t0:.2f} s, 1st batch {t2 - t1:.2f} s, background JIT compile "
             f"{waited:.2f} s more; scalar program: {size}"]
    return (lambda a: a), (lambda a: engine.gradient(cg.id, {"A": a}, wrt=["A"]).gradients), (lambda r: r["A"]), notes


def memoised_program_size(n: int) -> int | None:
    """Instructions of semigrad's scalar program for the det with sub-minors shared by hand."""
    from semigrad_server.engine import Engine
    from semigrad_server.service.convert import graph_from_proto

    w = det_workload(n, memoise=True)
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(w.graph(w.batched).to_proto()))
    engine.gradient(cg.id, {"A": np.eye(n)[None]}, wrt=["A"], backend="scalar")
    (plan,) = [c.plan for _, c in cg.plans.items()]
    return len(plan.program.instrs)


def setup_symengine(w, n: int, first: np.ndarray):
    import symengine as se
    from peers import trace_symbolic

    if not getattr(se, "have_llvm", False):
        raise Skipped("SymEngine was built without LLVM")
    sym = trace_symbolic(w, w.batched, lambda k, m: [se.Symbol(f"{k}_{i}") for i in range(m)], se.tanh)
    grads = [sym.expr.diff(s) for s in sym.wrt_symbols]
    g = se.Lambdify(sym.symbols["A"], grads, backend="llvm", cse=True)
    return (lambda a: a.reshape(a.shape[0], n * n)), g, (lambda r: np.asarray(r).reshape(-1, n, n)), []


def setup_casadi_c(w, n: int, first: np.ndarray):
    import casadi as ca
    from peers import compile_casadi, trace_symbolic

    sym = trace_symbolic(w, w.batched, lambda k, m: [ca.SX.sym(f"{k}_{i}") for i in range(m)], ca.tanh)
    x = ca.vertcat(*sym.symbols["A"])
    # cse: CasADi's own common subexpression elimination (the recursion's repeated minors)
    grad = ca.Function("grad", [x], [ca.gradient(sym.expr, x)], {"cse": True})
    fwd = ca.Function("fwd", [x], [sym.expr], {"cse": True})
    notes = [f"{grad.n_instructions():,} SX instructions (Function option cse)"]
    grad, _ = compile_casadi(ca, grad, fwd, notes)
    mapped = {}

    def call(x):
        b = x.size2()
        if b not in mapped:
            mapped[b] = grad.map(b)
        return mapped[b](x)

    return (lambda a: ca.DM(a.reshape(a.shape[0], n * n).T)), call, (lambda r: np.asarray(r).T.reshape(-1, n, n)), notes


def setup_jax(w, n: int, first: np.ndarray, max_equations: int):
    from peers import jax_batched_gradient, jax_function

    jax, f, _, _, _ = jax_function(w)
    eqns = len(jax.make_jaxpr(f)(first[0]).jaxpr.eqns)
    if eqns > max_equations:
        raise Skipped(f"f traces to {eqns:,} primitive operations (--jax-max-equations {max_equations:,}): XLA "
                      "compiles the unrolled recursion for minutes (bench/first_call.py)")
    _, gb, _ = jax_batched_gradient(w)
    t0 = time.perf_counter()
    jax.block_until_ready(gb(jax.device_put(first)))
    notes = [f"f traces to {eqns:,} operations; first call (trace + XLA compile + run) {time.perf_counter() - t0:.2f} s"]
    return (lambda a: jax.block_until_ready(jax.device_put(a))), (lambda x: jax.block_until_ready(gb(x))[0]), \
        np.asarray, notes


def check(what: str, got: np.ndarray, a: np.ndarray) -> float:
    ref = det_gradient(a)
    got = np.asarray(got, dtype=float)
    if got.shape != ref.shape or not np.all(np.isfinite(got)):
        raise SystemExit(f"det_recursive.py: {what}: gradient of shape {got.shape} (non-finite entries: "
                         f"{not np.all(np.isfinite(got))}), expected {ref.shape}")
    den = np.linalg.norm(ref.reshape(len(a), -1), axis=1)
    err = np.linalg.norm((got - ref).reshape(len(a), -1), axis=1) / np.maximum(den, 1e-3 * np.median(den))
    if not err.max() <= RTOL:
        raise SystemExit(f"det_recursive.py: WRONG gradient from {what}: relative error {err.max():.3e} > {RTOL:g} "
                         f"at item {int(np.argmax(err))}")
    return float(err.max())


# ------------------------------------------------------------------------------------ one size
def bench_size(n: int, args, log) -> dict:
    w = det_workload(n)
    rng = np.random.default_rng([args.seed, n])
    fresh = lambda: rng.standard_normal((args.batch, n, n))  # noqa: E731
    impls, rows = {}, {}
    for key in args.impl:
        log(f"... det{n}: setting up {LABELS[key]}")
        first = fresh()
        t0 = time.perf_counter()
        try:
            if key == "jax":
                prepare, call, grads, notes = setup_jax(w, n, first, args.jax_max_equations)
            else:
                prepare, call, grads, notes = {"semigrad": setup_semigrad, "symengine": setup_symengine,
                                      "casadi_c": setup_casadi_c}[key](w, n, first)
        except Skipped as e:
            rows[key] = {"skipped": str(e)}
            continue
        except ImportError as e:
            rows[key] = {"skipped": f"not installed ({e})"}
            continue
        setup = time.perf_counter() - t0
        a = fresh()
        err = check(f"{LABELS[key]}, det{n}", grads(call(prepare(a))), a)
        impls[key] = prepare, call
        rows[key] = {"setup": setup, "err": err, "notes": notes, "times": [], "cpu": []}
    keys = list(impls)
    log(f"... det{n}: {args.rounds} rounds of {args.batch:,} fresh items, {', '.join(keys)} in rotating order")
    for key in keys:  # warm-up, on items of its own
        prepare, call = impls[key]
        call(prepare(fresh()))
    settle()
    per_round, cpu_round = [], []
    for r in range(args.rounds):
        a = fresh()
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        times, cpu = {}, {}
        for key in order:
            prepare, call = impls[key]
            x = prepare(a)  # outside the clock
            c0, t0 = time.process_time(), time.perf_counter()
            call(x)
            times[key], cpu[key] = time.perf_counter() - t0, time.process_time() - c0
            del x
        for key in keys:
            rows[key]["times"].append(times[key])
            rows[key]["cpu"].append(cpu[key])
        per_round.append(times)
        cpu_round.append(cpu)
    out = {"rows": rows, "rounds": per_round}
    if "semigrad" in keys:
        peers = [k for k in keys if k != "semigrad"]
        out["ratios"] = {p: [t[p] / t["semigrad"] for t in per_round] for p in peers}
        if peers:
            out["ratios"]["best"] = [min(t[p] for p in peers) / t["semigrad"] for t in per_round]
            out["cpu_best"] = [min(t[p] for p in peers) / t["semigrad"] for t in cpu_round]
        out["memo_instructions"] = memoised_program_size(n)
    return out


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}–{max(values):.3g})"


def report(results: dict, args, argv, started: str, load_before: str, load_after: str, wall: float) -> str:
    lines = ["# Recursive det by minors: issue 12's batched throughput acceptance", "",
             f"- date (UTC): {started}; wall time {wall:.0f} s",
             f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after} (2 cores shared with "
             "other work: read the ratios, which compare calls made under the same load)"]
    lines += [f"- {k}: {v}" for k, v in machine_info()]
    lines += ["- packages: " + ", ".join(f"{d} {package_version(d)}" for d in
                                        ("numpy", "numba", "llvmlite", "symengine", "casadi", "jax", "jaxlib")),
              f"- {args.batch:,} fresh N(0,1) matrices per call (a new batch every round, shared by the "
              f"implementations of that round), {args.rounds} rounds in rotating order after one warm-up call "
              "each; one thread per implementation",
              "- every implementation's gradients were checked against det(A)·A^-T on a fresh batch before "
              "timing", "", "```sh", rerun_command("bench/det_recursive.py", argv), "```", ""]
    summary = []
    for n, res in results.items():
        ratios = res.get("ratios", {})
        best = ratios.get("best")
        rows = res["rows"]
        sg = rows.get("semigrad", {})
        cells = [f"det{n}", fmt(args.batch / statistics.median(sg["times"])) if sg.get("times") else "—"]
        for p in ("symengine", "casadi_c", "jax"):
            cells.append(spread(ratios[p]) if p in ratios else ("skipped" if "skipped" in rows.get(p, {}) else "—"))
        cells.append((spread(best) + (" ✓" if statistics.median(best) >= 1 else " ✗")) if best else "—")
        cells.append(spread(res["cpu_best"]) if res.get("cpu_best") else "—")
        cells.append(f"{res.get('memo_instructions', 0):,}")
        summary.append(cells)
    lines += ["## Summary: semigrad's throughput ÷ each peer's (median over rounds, min–max)", "",
              markdown_table(["workload", "semigrad grads/s (median)", "÷ SymEngine", "÷ CasADi C", "÷ JAX",
                              "÷ best peer of each round (target ≥ 1)", "the same on CPU time",
                              "memoised program (instructions)"],
                             summary), ""]
    for n, res in results.items():
        table = []
        for key, row in res["rows"].items():
            if "skipped" in row:
                table.append([LABELS[key], "skipped", "", "", "", "", row["skipped"]])
                continue
            t = row["times"]
            table.append([LABELS[key], fmt(statistics.median(t) * 1e3), f"{min(t) * 1e3:.3g}–{max(t) * 1e3:.3g}",
                          fmt(statistics.median(row["cpu"]) * 1e3),
                          fmt(args.batch / statistics.median(t)), f"{row['setup']:.2f}",
                          "; ".join(row["notes"]) + f"; max rel err {row['err']:.0e}"])
        lines += [f"## det{n}", "", markdown_table(["implementation", "ms per call (median)", "min–max (ms)",
                                                    "CPU ms per call (median)", "grads/s", "setup (s)", "notes"], table), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[5, 6, 7], metavar="N")
    p.add_argument("--impl", default=",".join(IMPLS), help=f"comma-separated, from {', '.join(IMPLS)}")
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jax-max-equations", type=int, default=1_000)
    args = p.parse_args(argv)
    args.impl = [k for k in args.impl.split(",") if k]
    bad = [k for k in args.impl if k not in IMPLS]
    if bad or args.batch < 1 or args.rounds < 1:
        p.error(f"unknown implementation(s) {bad}" if bad else "batch and rounds must be positive")
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    t0 = time.perf_counter()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    results = {n: bench_size(n, args, log) for n in args.sizes}
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(report(results, args, argv, started, load_before, load_after, time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
