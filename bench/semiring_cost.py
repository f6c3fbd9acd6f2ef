"""Benchmark: the cost of a semiring backward pass relative to the real one, on an MLP.

Graph (client API), one request = one item with these shapes:

    x (rows, width) @ W1 (width, hidden) -> tanh -> @ W2 (hidden, width) -> sum  =  y

(defaults rows = 64, width = 64, hidden = 128: three 64×64×128 products forward, and in the
backward pass semiring matmuls of the same sizes). For every semiring it

  * checks the gradients w.r.t. x, W1 and W2 against closed forms of the path sums written
    with NumPy (per semiring: e.g. max_product w.r.t. x[i, m] is max_j |W1[m, j]| · |1 − h[i, j]²|
    · max_k |W2[j, k]|), so nothing is timed before it is right;
  * times Engine.gradient in-process (median of many calls) and Engine.evaluate (the forward
    pass alone), and reports the gradient and the backward part (gradient − forward) relative
    to the real semiring's;
  * measures with tracemalloc the peak memory of one gradient call.

Then it measures the peak memory (tracemalloc) of each semiring's own matmul on an n×k @ k×m
product (default 384³) against the n·k·m·8 bytes per component that materialising the full
product at once would take: the semiring matmuls are blocked, use BLAS, or use the compiled
kernels of `semigrad_server.semiring.kernels`.

The selective semirings and kbest call those kernels (`tropical_matmul`, `kbest_matmul`):
compiled with numba when it is installed, NumPy otherwise. `--kernels numpy` forces the
NumPy implementation, to measure both ways; the report says which one ran, per semiring.

Run from the repo root:  .venv/bin/python bench/semiring_cost.py [--rows 64] [--width 64] [--hidden 128] [--quick]
                         [--kernels auto|numba|numpy]
Prints a markdown report on stdout (progress goes to stderr). Exits 1 if a gradient is wrong.
Arguments meant for other benchmarks (bench/run.py passes its arguments to all) are ignored.
"""

from __future__ import annotations

import os
import sys

BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _blas_threads(argv: list[str]) -> str:
    """The value of --blas-threads (default 1): read before NumPy loads, which fixes it."""
    for i, arg in enumerate(argv):
        if arg == "--blas-threads" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--blas-threads="):
            return arg.split("=", 1)[1]
    return "1"


if __name__ == "__main__":
    # Every semiring then runs on one core (the default matmuls are single-threaded NumPy
    # loops anyway), and a multi-threaded BLAS cannot stall when the machine is busy.
    for _var in BLAS_VARS:
        os.environ[_var] = _blas_threads(sys.argv[1:])

import argparse  # noqa: E402
import gc  # noqa: E402
import inspect  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402
import semigrad  # noqa: E402
from semigrad_server.engine import Engine  # noqa: E402
from semigrad_server.semiring import kernels  # noqa: E402
from semigrad_server.semiring.base import MATMUL_BLOCK_ELEMENTS, Semiring  # noqa: E402
from semigrad_server.semiring.loader import default_registry  # noqa: E402
from semigrad_server.service.convert import graph_from_proto  # noqa: E402

from common import fmt, machine_info, markdown_table, rerun_command, section  # noqa: E402

SEMIRINGS = ["real", "max_product", "entropy", "log", "counting", "kbest", "boolean", "maxplus", "minplus",
             "bottleneck", "signed_max_product", "log_signed_max_product", "log_entropy", "log_counting"]
# Timed as one request (one forward pass, one backward walk under their product) against three.
PRODUCT = ["real", "max_product", "entropy"]
RTOL = 1e-9


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=64, help="rows of x: the MLP's batch (default 64)")
    p.add_argument("--width", type=int, default=64, help="columns of x and of the output (default 64)")
    p.add_argument("--hidden", type=int, default=128, help="hidden units (default 128)")
    p.add_argument("--semirings", nargs="+", default=SEMIRINGS, metavar="NAME",
                   help=f"semirings to time (default: {' '.join(SEMIRINGS)}); real is always included")
    p.add_argument("--matmul-size", type=int, default=None, metavar="N",
                   help="n = k = m of the matmul memory test (default 384, 256 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="0.1 s of timed calls per cell instead of 0.5 s, smaller matmul test (noisy figures)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--blas-threads", type=int, default=1,
                   help="BLAS threads (default 1: every semiring on one core; set before NumPy loads)")
    p.add_argument("--kernels", choices=["auto", *kernels.BACKENDS], default="auto",
                   help="implementation of the semiring kernels (tropical_matmul, kbest_matmul): numba, numpy, "
                        "or auto (default: numba when installed, unless SEMIGRAD_KERNELS=numpy)")
    args, ignored = p.parse_known_args(argv)
    if ignored:
        print(f"semiring_cost.py: ignoring arguments of other benchmarks: {' '.join(ignored)}", file=sys.stderr)
    if min(args.rows, args.width, args.hidden) < 1:
        p.error("sizes must be positive")
    unknown = set(args.semirings) - set(SEMIRINGS)
    if unknown:
        p.error(f"unknown semirings {sorted(unknown)} (choose from {', '.join(SEMIRINGS)})")
    args.semirings = ["real"] + [s for s in args.semirings if s != "real"]
    args.budget = 0.1 if args.quick else 0.5
    args.matmul_size = args.matmul_size or (256 if args.quick else 384)
    if args.kernels == "numba" and not kernels.numba_available():
        p.error("--kernels numba: numba is not installed (pip install 'semigrad[jit]')")
    return args


def resolved_argv(args) -> list[str]:
    argv = ["--rows", str(args.rows), "--width", str(args.width), "--hidden", str(args.hidden),
            "--semirings", *args.semirings, "--matmul-size", str(args.matmul_size), "--seed", str(args.seed),
            "--blas-threads", str(args.blas_threads), "--kernels", args.kernels]
    return argv + (["--quick"] if args.quick else [])


def mlp_graph(rows: int, width: int, hidden: int) -> semigrad.Graph:
    g = semigrad.Graph()
    x = g.input("x", (rows, width))
    w1 = g.input("W1", (width, hidden))
    w2 = g.input("W2", (hidden, width))
    g.output("y", (semigrad.tanh(x @ w1) @ w2).sum())
    return g


# ---------------------------------------------------------------- closed forms of the path sums


def expected(name: str, x, w1, w2) -> dict[str, np.ndarray]:
    """The semiring's result for x, W1, W2 from tensor formulas of the paths.

    Paths: x[i, m] → z[i, j] (∂ W1[m, j]) → h[i, j] (∂ d = 1 − h²) → o[i, k] (∂ W2[j, k]) → y (∂ 1);
    W1[m, j] → z[i, j] (∂ x[i, m]) → …;  W2[j, k] → o[i, k] (∂ h[i, j]) → y.
    """
    h = np.tanh(x @ w1)
    d = 1.0 - h**2
    if name == "real":
        gz = d * w2.sum(axis=1)[None, :]
        return {"x": gz @ w1.T, "W1": x.T @ gz, "W2": np.broadcast_to(h.sum(axis=0)[:, None], w2.shape)}
    X, A, D, B, H = (np.abs(v) for v in (x, w1, d, w2, h))
    if name in ("log", "counting"):
        if name == "counting":
            X, A, D, B, H = ((v != 0).astype(float) for v in (X, A, D, B, H))
        gz = D * B.sum(axis=1)[None, :]
        out = {"x": gz @ A.T, "W1": X.T @ gz, "W2": np.broadcast_to(H.sum(axis=0)[:, None], B.shape)}
        return {k: np.log(v) for k, v in out.items()} if name == "log" else out
    if name in ("max_product", "maxplus", "kbest", "minplus", "bottleneck"):
        pick, best_b = (np.min, B.min(axis=1)) if name == "minplus" else (np.max, B.max(axis=1))
        if name == "bottleneck":  # max over paths of the smallest |∂|, the final edge's 1 included
            via_x = np.minimum(np.minimum(A[None, :, :], D[:, None, :]), np.minimum(best_b, 1.0)).max(axis=2)
            via_w1 = np.minimum(np.minimum(X[:, :, None], D[:, None, :]), np.minimum(best_b, 1.0)).max(axis=0)
            via_w2 = np.broadcast_to(np.minimum(H, 1.0).max(axis=0)[:, None], B.shape)
            return {"x": via_x, "W1": via_w1, "W2": via_w2}
        out = {"x": pick(A[None, :, :] * D[:, None, :] * best_b, axis=2),
               "W1": pick(X[:, :, None] * D[:, None, :], axis=0) * best_b,
               "W2": np.broadcast_to(pick(H, axis=0)[:, None], B.shape)}
        return {k: np.log(v) for k, v in out.items()} if name in ("maxplus", "minplus") else out
    if name in ("log_entropy", "log_counting", "log_signed_max_product"):  # log-space forms of three above
        plain = expected({"log_entropy": "entropy", "log_counting": "counting",
                          "log_signed_max_product": "signed_max_product"}[name], x, w1, w2)
        if name == "log_entropy":
            return plain
        return {k: np.log(np.abs(v)) for k, v in plain.items()}  # log_abs_max: log|most positive product|
    if name == "signed_max_product":  # the largest signed path product ("max", the primary)
        bmax, bmin = w2.max(axis=1), w2.min(axis=1)  # over k, per j

        def best(c):  # max over the last axis j, then k, of c[..., j] · W2[j, k] (c = 0: no path)
            with np.errstate(invalid="ignore"):
                v = np.where(c > 0, c * bmax, np.where(c < 0, c * bmin, -np.inf))
            return v.max(axis=-1)

        c_w1 = x[:, :, None] * d[:, None, :]  # (i, m, j): paths from W1[m, j] through row i
        via_w1 = np.where(c_w1 > 0, c_w1 * bmax, np.where(c_w1 < 0, c_w1 * bmin, -np.inf)).max(axis=0)
        h_nz = np.where(h != 0, h, -np.inf)
        return {"x": best(w1[None, :, :] * d[:, None, :]), "W1": via_w1,
                "W2": np.broadcast_to(h_nz.max(axis=0)[:, None], w2.shape)}
    if name == "boolean":
        return {k: np.ones_like(v, dtype=bool) for k, v in (("x", x), ("W1", w1), ("W2", w2))}
    if name == "entropy":
        row_b, b_log_b = B.sum(axis=1), (B * np.log(B)).sum(axis=1)

        def h_of(a):  # paths (j, k) with weight a_j · B[j, k]: H = log Z − Σ w log w / Z
            z = (a * row_b).sum(axis=-1)
            s = (a * np.log(a) * row_b + a * b_log_b).sum(axis=-1)
            return np.log(z) - s / z

        c = X[:, :, None] * D[:, None, :]  # (i, m, j): paths from W1[m, j] over i (then k)
        z_w1 = c.sum(axis=0) * row_b
        s_w1 = (c * np.log(c)).sum(axis=0) * row_b + c.sum(axis=0) * b_log_b
        z_w2, s_w2 = H.sum(axis=0), (H * np.log(H)).sum(axis=0)
        return {"x": h_of(A[None, :, :] * D[:, None, :]), "W1": np.log(z_w1) - s_w1 / z_w1,
                "W2": np.broadcast_to((np.log(z_w2) - s_w2 / z_w2)[:, None], B.shape)}
    raise ValueError(name)


class WrongGradient(Exception):
    pass


def check(name: str, got: dict, want: dict) -> float:
    worst = 0.0
    for k, w in want.items():
        g = np.asarray(got[k])
        if g.shape != w.shape:
            raise WrongGradient(f"{name} d/d{k}: shape {g.shape}, expected {w.shape}")
        if w.dtype == bool:
            if not np.array_equal(g, w):
                raise WrongGradient(f"{name} d/d{k}: differs from the closed form")
            continue
        err = np.max(np.abs(g - w) / np.maximum(np.abs(w), 1e-300))
        worst = max(worst, float(err))
        if not np.allclose(g, w, rtol=RTOL, atol=0):
            raise WrongGradient(f"{name} d/d{k}: relative error {err:.2e} > {RTOL:g} against the closed form")
    return worst


# ---------------------------------------------------------------- measurements


def peak_bytes(call) -> int:
    """Peak traced allocation of call() above what was allocated before it."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def interleaved_medians(calls: dict, *, budget: float, min_reps: int = 10) -> tuple[dict, dict]:
    """Median wall time of each call and its number of timed calls. Calls are timed in rounds
    that call each unfinished one once (finished: ≥ min_reps calls and ≥ `budget` s), so that
    load from elsewhere on the machine spreads evenly over them."""
    for call in calls.values():
        for _ in range(3):
            call()
    gc.collect()
    samples = {name: [] for name in calls}
    pending = dict(calls)
    while pending:
        for name, call in list(pending.items()):
            t0 = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - t0)
            if len(samples[name]) >= min_reps and sum(samples[name]) >= budget:
                del pending[name]
    return ({name: statistics.median(v) for name, v in samples.items()},
            {name: len(v) for name, v in samples.items()})


def bench_mlp(args, engine: Engine) -> tuple[list[dict], dict]:
    g = mlp_graph(args.rows, args.width, args.hidden)
    gid = engine.register(graph_from_proto(g.to_proto()))[0].id
    rng = np.random.default_rng(args.seed)
    inputs = {"x": rng.normal(size=(args.rows, args.width)),
              "W1": rng.normal(size=(args.width, args.hidden)) / np.sqrt(args.width),
              "W2": rng.normal(size=(args.hidden, args.width)) / np.sqrt(args.hidden)}
    tensor = {"backend": "tensor"} if "backend" in inspect.signature(Engine.gradient).parameters else {}

    def gradient(name):
        return engine.gradient(gid, inputs, semiring=name, **tensor).gradients

    rows = []
    for name in args.semirings:
        with section(f"{name}: check against the closed form"):
            before = dict(kernels.calls)
            worst = check(name, gradient(name), expected(name, inputs["x"], inputs["W1"], inputs["W2"]))
            ran = kernels_ran(before)
        with section(f"{name}: peak memory of one gradient call"):
            peak = peak_bytes(lambda: gradient(name))
        rows.append({"name": name, "peak": peak, "err": worst, "kernels": ran})
    calls = {"forward": lambda: engine.evaluate(gid, inputs, **tensor)}
    calls.update({r["name"]: (lambda name=r["name"]: gradient(name)) for r in rows})
    product = None
    if set(PRODUCT) <= set(args.semirings):
        with section(f"{'+'.join(PRODUCT)} in one request: each equals its own request"):
            both = engine.gradient(gid, inputs, semirings=PRODUCT, **tensor).semirings
            for name in PRODUCT:
                for k, v in gradient(name).items():
                    if not np.array_equal(both[name].gradients[k], v):
                        raise WrongGradient(f"{name} d/d{k} in one request with {PRODUCT} differs from its own request")
            product = "+".join(PRODUCT)
            calls[product] = lambda: engine.gradient(gid, inputs, semirings=PRODUCT, **tensor)
    with section(f"latency: {len(calls)} calls interleaved, ≥{args.budget} s each"):
        medians, reps = interleaved_medians(calls, budget=args.budget)
    forward = medians["forward"]
    for r in rows:
        r["time"], r["reps"] = medians[r["name"]], reps[r["name"]]
    info = {"forward": forward, "backend": tensor.get("backend", "the engine's default")}
    if product:
        info["product"] = {"time": medians[product], "reps": reps[product],
                           "separate": sum(medians[name] for name in PRODUCT)}
    return rows, info


def kernels_ran(before: dict) -> str:
    """The kernels called since `before` (a copy of kernels.calls), with their implementation."""
    ran = {key: n - before.get(key, 0) for key, n in kernels.calls.items() if n > before.get(key, 0)}
    return ", ".join(f"{kernel} ({implementation}) ×{n}" for (kernel, implementation), n in sorted(ran.items())) or "–"


def kernels_info(args) -> str:
    chosen = kernels.backend()
    if chosen == "numba":
        import numba

        how = f"numba {numba.__version__}"
    else:
        how = "NumPy" + ("" if kernels.numba_available() else " (numba is not installed)")
    return (f"{how} (--kernels {args.kernels}); products under {kernels.NUMBA_MIN_WORK:,} multiply-adds always run "
            "in NumPy")


def bench_matmul_memory(args) -> list[dict]:
    n = args.matmul_size
    rng = np.random.default_rng(args.seed)
    registry = default_registry()
    rows = []
    for name in args.semirings:
        s = registry.get(name, {})
        a, b = s.lift(rng.normal(size=(n, n))), s.lift(rng.normal(size=(n, n)))
        a, b = (s.map(np.ascontiguousarray, v) for v in (a, b))
        s.matmul(a, b)  # a first call may compile (numba) or load a compiled kernel: not the matmul's memory
        with section(f"{name}: peak memory of a {n}×{n} @ {n}×{n} semiring matmul"):
            peak = peak_bytes(lambda: s.matmul(a, b))
        full = n * n * n * 8 * s.components
        rows.append({"name": name, "peak": peak, "full": full, "override": type(s).matmul is not Semiring.matmul})
    return rows


def report(mlp: list[dict], info: dict, mem: list[dict], args) -> str:
    real = next(r for r in mlp if r["name"] == "real")
    fwd = info["forward"]
    back_real = max(real["time"] - fwd, 1e-12)
    headers = ["semiring", "gradient (ms)", "× real", "backward ≈ gradient − forward (ms)", "× real backward",
               "peak memory of the call (MB)", "timed calls", "max rel. error vs closed form",
               "kernels called by one gradient"]  # noqa: E501
    table = [[r["name"], fmt(r["time"] * 1e3), fmt(r["time"] / real["time"]), fmt((r["time"] - fwd) * 1e3),
              fmt((r["time"] - fwd) / back_real), fmt(r["peak"] / 2**20), str(r["reps"]), f"{r['err']:.1e}",
              r["kernels"]]
             for r in mlp]
    n = args.matmul_size
    mem_table = [[r["name"], "own" if r["override"] else "default (blocked)", fmt(r["peak"] / 2**20),
                  fmt(r["full"] / 2**20), fmt(r["peak"] / r["full"])] for r in mem]
    lines = [
        "## Semiring backward cost on an MLP",
        "",
        *(f"- {k}: {v}" for k, v in machine_info()),
        f"- graph: y = sum(tanh(x @ W1) @ W2), x {args.rows}×{args.width}, W1 {args.width}×{args.hidden}, "
        f"W2 {args.hidden}×{args.width}; gradients w.r.t. x, W1 and W2; inputs N(0, 1), weights scaled by "
        f"1/√fan-in, seed {args.seed}",
        f"- BLAS threads: {os.environ.get('OPENBLAS_NUM_THREADS', 'default')} (--blas-threads)",
        f"- semiring kernels (semigrad_server.semiring.kernels): {kernels_info(args)}",
        f"- in-process Engine (backend: {info['backend']}); median latency, the calls of all rows interleaved "
        f"(one round calls each once), ≥{args.budget} s of calls per row; "
        f"forward pass alone (Engine.evaluate): {fmt(fwd * 1e3)} ms",
        f"- every gradient checked against NumPy closed forms of its path sums before timing (rtol {RTOL:g})"
        + ("; --quick: figures are noisy" if args.quick else ""),
        "",
        markdown_table(headers, table),
        "",
        "× real: time over the real semiring's in this same run (1 = as fast as the ordinary gradient).",
        "The backward column subtracts the forward pass, which every gradient call also runs.",
        "",
        *product_lines(info, back_real, fwd),
        f"### Peak memory of the semiring matmul, {n}×{n} @ {n}×{n}",
        "",
        markdown_table(["semiring", "matmul", "peak (MB)", "full n·k·m product (MB)", "peak / full"], mem_table),
        "",
        f"Peak: tracemalloc's peak during one `semiring.matmul(a, b)` call (after a first call, which may "
        f"compile or load a kernel). Full: n·k·m·8 bytes per component, what building every a[i, k] ⊗ b[k, j] "
        f"at once would take. The default matmul works on blocks of the contraction axis of at most "
        f"{MATMUL_BLOCK_ELEMENTS:,} elements ({MATMUL_BLOCK_ELEMENTS * 8 // 2**20} MB per component), as do the "
        f"NumPy kernels (fewer, to stay in cache); the numba kernels only copy their operands; real, log, entropy, "
        f"counting and boolean use BLAS.",
        "",
        "Rerun:",
        "",
        "```sh",
        rerun_command("bench/semiring_cost.py", resolved_argv(args)),
        "```",
    ]
    return "\n".join(lines)


def product_lines(info: dict, back_real: float, fwd: float) -> list[str]:
    p = info.get("product")
    if not p:
        return []
    name = "+".join(PRODUCT)
    table = [[f"{name}, one request (semirings=[...])", fmt(p["time"] * 1e3), fmt((p["time"] - fwd) / back_real),
              str(p["reps"])],
             [f"{name}, three requests", fmt(p["separate"] * 1e3), fmt((p["separate"] - 3 * fwd) / back_real), "–"]]
    return [f"### {name} in one request against three", "",
            markdown_table(["requests", "time (ms)", "backward × real backward", "timed calls"], table), "",
            "One request: one forward pass and one backward walk under the product semiring (each member's "
            "own kernels; each result checked equal to its own request). Three requests: the sum of the three "
            "rows above.", ""]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.kernels != "auto":
        kernels.set_backend(args.kernels)
    engine = Engine()
    try:
        mlp, info = bench_mlp(args, engine)
    except WrongGradient as e:
        print(f"\n*** CORRECTNESS CHECK FAILED, nothing timed: {e}", file=sys.stderr)
        return 1
    mem = bench_matmul_memory(args)
    print(report(mlp, info, mem, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
