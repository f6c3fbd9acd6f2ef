"""Benchmark suite: semigrad (in-process and over gRPC) side by side with every installed peer.

For every workload of bench/workloads.py (det-by-minors n = 4..7, poly, mlp, ode) and every
implementation (semigrad's Engine in-process; semigrad over gRPC to a real server started here
on 127.0.0.1:0: unary and streaming with the tensors inline as protobuf bytes, and unary with
the client's default shared_memory="auto", tensors through /dev/shm; the peers of
bench/peers.py that are installed: PyTorch eager, torch.func, JAX, CasADi SX, CasADi generated
C, SymPy, SymEngine; and the NumPy reference), all in this one process, it:

  1. sets the implementation up (graph registration, symbolic differentiation, JIT compile,
     code generation + gcc: timed and reported, never part of a throughput figure);
  2. checks its gradients at the single point and on the whole batch, and its batched forward
     values, against the workload's reference (closed form or complex step) — a wrong row is
     reported as WRONG and not timed, and the suite exits 1;
  3. times single-point gradient latency (median of warm calls), batched gradient throughput
     (--batch items in one call; median of ≥3 runs), batched forward throughput (for the
     gradient/forward cost ratio), and the peak memory of one batched gradient call
     (tracemalloc for Python/NumPy paths, RSS high-water mark Δ for native libraries);
  4. for the gRPC rows, also the round trip of a bare grpcio echo server (generic handler,
     bytes in, bytes out) with the request and response sizes of semigrad's single request.

Run from the repo root:  .venv/bin/python bench/suite.py [--quick] [--only WORKLOAD ...] [--impl KEY ...]
Prints the markdown report on stdout (progress on stderr) and writes it to bench/RESULTS.md
(a full default run) or bench/out/RESULTS.md (any partial run: --quick, --only, --impl, ...).
"""

from __future__ import annotations

import os
import sys

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def early_threads(argv: list[str]) -> int:
    """--threads N (default 1), read before NumPy, numba, PyTorch or JAX load, which fixes them."""
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--threads="):
            return int(arg.split("=", 1)[1])
    return 1


def limit_threads(n: int) -> None:
    """Every implementation on `n` threads (0: library defaults). On a 2-core machine shared with
    other work, multi-threaded runtimes (OpenMP in PyTorch, BLAS, XLA's Eigen pool) stall whenever
    one core is busy: measured 2-20× slower and erratic, so the default is one thread each."""
    if n <= 0:
        return
    for var in THREAD_VARS:
        os.environ[var] = str(n)
    if n == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()


if __name__ == "__main__":
    limit_threads(early_threads(sys.argv[1:]))

import argparse  # noqa: E402
import faulthandler  # noqa: E402
import gc  # noqa: E402
import inspect  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import tracemalloc  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import semigrad  # noqa: E402
from semigrad_server.engine import Engine  # noqa: E402
from semigrad_server.service import build_server  # noqa: E402
from semigrad_server.service.convert import graph_from_proto  # noqa: E402

import first_call  # noqa: E402
import peers  # noqa: E402
from common import REPO, fmt, machine_info, markdown_table, median_latency, package_version, rerun_command, settle  # noqa: E402
from peers import PEERS, Prepared, Skip  # noqa: E402
from workloads import DET_SIZES, Workload, all_workloads  # noqa: E402

ROW_TIMEOUT = 600  # s: one implementation on one workload taking longer aborts the run with a traceback
RTOL = 1e-8  # per item: ‖g − g_ref‖ ≤ RTOL · max(‖g_ref‖, 1e-3 · median_items ‖g_ref‖)
TARGETS = {  # issue 6's acceptance figures, shown next to the ratios
    "vs_best": 1.0, "mlp_vs_jax": 0.8, "mlp_vs_torch": 1.0, "grpc_vs_local": 0.5,
    "single_vs_torch_det": 0.1, "single_vs_jax": 2.0, "grpc_vs_echo": 1.5, "grad_vs_fwd": 3.0,
    "first_vs_jax": 1.0,  # issue 12: first call (build + register + first batch) ≤ JAX jit(vmap(grad))'s, det
}
PACKAGES = ("semigrad", "numpy", "grpcio", "protobuf", "numba", "llvmlite", "torch", "jax", "jaxlib", "casadi",
            "sympy", "symengine", "scipy", "mpmath")


class WrongGradient(Exception):
    pass


# ------------------------------------------------------------------------------------ implementations
@dataclass
class Impl:
    key: str
    label: str
    kind: str  # "semigrad", "peer" or "reference"
    memory: str  # "tracemalloc" or "rss"
    setup: Callable[[Workload, dict, dict], Prepared]
    unavailable: str | None = None


def semigrad_in_process(engine: Engine, backend: str) -> Callable:
    kw = {} if backend == "auto" else {"backend": backend}

    def setup(w: Workload, single: dict, batch: dict) -> Prepared:
        wrt = list(w.wrt)
        gs = w.graph(w.single).to_proto()
        cs, _ = engine.register(graph_from_proto(gs))
        cb = cs if w.single == w.batched else engine.register(graph_from_proto(w.graph(w.batched).to_proto()))[0]
        notes = [f"{len(gs.nodes)} graph nodes (single point)"]
        return Prepared(
            lambda: engine.gradient(cs.id, single, wrt=wrt, **kw).gradients,
            lambda: engine.gradient(cb.id, batch, wrt=wrt, **kw).gradients,
            lambda: engine.evaluate(cb.id, batch, **kw)[0][w.output],
            dict, dict, np.asarray, notes)

    return setup


def semigrad_grpc(client: semigrad.Client, backend: str, stream: bool) -> Callable:
    kw = {} if backend == "auto" else {"backend": backend}
    if client.shared_memory is False:
        wire = "tensors inline as protobuf bytes"
    else:
        wire = (f"shared_memory={client.shared_memory!r}: tensors through /dev/shm for calls moving ≥ "
                f"{client.shared_memory_threshold // 1024} KiB (the batches), inline below")

    def setup(w: Workload, single: dict, batch: dict) -> Prepared:
        wrt = list(w.wrt)
        fs = client.register(w.graph(w.single))
        fb = fs if w.single == w.batched else client.register(w.graph(w.batched))
        if not stream:
            return Prepared(lambda: fs.gradient(single, wrt=wrt, **kw), lambda: fb.gradient(batch, wrt=wrt, **kw),
                            lambda: fb.evaluate(batch, **kw)[w.output], dict, dict, np.asarray,
                            [f"one unary Gradient call per batch; {wire}"])
        default = inspect.signature(fb.gradient_many).parameters.get("chunk_size")
        chunk = ("the client's default chunks (inline: equal chunks of ≤ 2 MiB of tensors)"
                 if default is None or default.default is None else f"chunk_size {default.default} (the client's default)")
        return Prepared(None, lambda: fb.gradient_many(batch, wrt=wrt, progress=False, **kw), None,
                        dict, dict, np.asarray,
                        [f"gradient_many: one GradientStream call, {chunk}; {wire}; "
                         "single point and forward: see the unary row"])

    return setup


def reference_setup(w: Workload, single: dict, batch: dict) -> Prepared:
    return Prepared(lambda: w.reference_gradient(single), lambda: w.reference_gradient(batch),
                    lambda: w.reference_value(w.batched, batch, True), dict, dict, np.asarray)


# ------------------------------------------------------------------------------------ measuring
def compare(what: str, got: dict, want: dict, batched: bool) -> float:
    """Worst per-item relative error of `got` against `want`; raises WrongGradient beyond RTOL."""
    if set(got) < set(want):
        raise WrongGradient(f"{what}: missing {sorted(set(want) - set(got))}")
    rows_g, rows_w = [], []
    for k, ref in want.items():
        g = np.asarray(got[k], dtype=float)
        ref = np.asarray(ref, dtype=float)
        if g.shape != ref.shape:
            raise WrongGradient(f"{what}: '{k}' has shape {g.shape}, expected {ref.shape}")
        items = ref.shape[0] if batched else 1
        rows_g.append(g.reshape(items, -1))
        rows_w.append(ref.reshape(items, -1))
    g, ref = np.concatenate(rows_g, axis=1), np.concatenate(rows_w, axis=1)
    if not np.all(np.isfinite(g)):
        raise WrongGradient(f"{what}: non-finite entries")
    den = np.linalg.norm(ref, axis=1)
    floor = max(1e-3 * float(np.median(den)), 1e-300)
    err = np.linalg.norm(g - ref, axis=1) / np.maximum(den, floor)
    worst = float(np.max(err))
    if not worst <= RTOL:
        i = int(np.argmax(err))
        raise WrongGradient(f"{what}: relative error {worst:.3e} > {RTOL:g} at item {i}\n"
                            f"  got      {g[i][:8]}\n  expected {ref[i][:8]}")
    return worst


HOT_CALLS = 100  # untimed single-point calls before timing: past every engine's "hot" threshold
def median_time(call: Callable, *, runs: int, budget: float, max_runs: int = 15) -> tuple[float, int]:
    """Median wall time of at least `runs` timed calls, more (up to `max_runs`) while less than
    `budget` seconds have been spent: short calls get more samples, which damps other load."""
    gc.collect()
    samples: list[float] = []
    while len(samples) < runs or (sum(samples) < budget and len(samples) < max_runs):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return samples[len(samples) // 2], len(samples)


def paired_median_times(calls: tuple[Callable, Callable], *, runs: int, budget: float,
                        max_runs: int = 15) -> tuple[float, float, int]:
    """Median wall times of two calls timed in alternation (one of each, repeated; at least `runs`
    pairs, more up to `max_runs` while less than `budget` seconds have been spent), so that both
    see the same machine load and their ratio means something on a noisy machine."""
    gc.collect()
    first: list[float] = []
    second: list[float] = []
    while len(first) < runs or (sum(first) + sum(second) < budget and len(first) < max_runs):
        t0 = time.perf_counter()
        calls[0]()
        t1 = time.perf_counter()
        calls[1]()
        t2 = time.perf_counter()
        first.append(t1 - t0)
        second.append(t2 - t1)
    return statistics.median(first), statistics.median(second), len(first)


def warm_up(call: Callable, calls: int) -> tuple[list[float], object]:
    """`calls` untimed calls (each followed by settle()); their wall times and the last result."""
    times, result = [], None
    for _ in range(calls):
        t0 = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - t0)
        settle()
    return times, result


def _proc_status_kb(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


class Memory:
    """Peak memory of one call, measured after all timing is done (see memory_pass).

    RSS: glibc's malloc is first told to serve every allocation ≥ 64 KiB with its own mmap and to
    give freed memory back (mallopt M_MMAP_THRESHOLD / M_TRIM_THRESHOLD, then malloc_trim before
    each call) so that memory freed by earlier calls cannot hide new use; then the RSS high-water
    mark is reset (Linux /proc/self/clear_refs) and read after the call. This changes allocation
    costs, which is why no timing runs after it.
    """

    def __init__(self):
        import ctypes

        self.libc = None
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (fixed: no dynamic raise)
            libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
            self.libc = libc
        except (OSError, AttributeError):
            pass
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.rss_ok = True
        except OSError:
            self.rss_ok = False

    def rss_delta(self, call: Callable) -> int | None:
        if not self.rss_ok:
            return None
        gc.collect()
        if self.libc is not None:
            self.libc.malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:  # VmHWM := VmRSS
            f.write("5")
        before = _proc_status_kb("VmRSS")
        result = call()  # noqa: F841 (alive while the high-water mark is read)
        return max(0, _proc_status_kb("VmHWM") - before) * 1024

    @staticmethod
    def traced_peak(call: Callable) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            result = call()  # noqa: F841
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def memory_pass(results) -> None:
    """Peak memory of one batched gradient call for every timed row (after all timing)."""
    mem = Memory()
    for w, rows, *_ in results:
        for row in rows:
            if row.prep is None or row.prep.batch is None or row.status != "ok":
                continue
            print(f"... memory: {w.name}: {row.impl.label.strip('*')}", file=sys.stderr, flush=True)
            try:
                row.memory = mem.rss_delta(row.prep.batch)
                if row.impl.memory == "tracemalloc":
                    row.traced = mem.traced_peak(row.prep.batch)
            except Exception as e:  # noqa: BLE001
                row.notes.append(f"memory measurement failed: {type(e).__name__}: {e}")
            settle()
    for _, rows, *_ in results:
        for row in rows:
            row.prep = None


@dataclass
class Row:
    impl: Impl
    status: str = "ok"  # ok, skipped, error, wrong
    message: str = ""
    setup_s: float | None = None
    first_batch_s: float | None = None
    latency: float | None = None
    latency_reps: int = 0
    batch_runs: int = 0
    throughput: float | None = None
    forward: float | None = None
    memory: int | None = None
    worst_err: float = 0.0
    notes: list[str] = field(default_factory=list)
    traced: int | None = None  # tracemalloc peak of one batched gradient call, bytes
    prep: Prepared | None = None

    @property
    def cost_ratio(self) -> float | None:
        return self.forward / self.throughput if self.throughput and self.forward else None


def measure(impl: Impl, w: Workload, single: dict, batch: dict, refs: dict, args) -> Row:
    row = Row(impl)
    B = args.batch
    if impl.unavailable:
        row.status, row.message = "skipped", impl.unavailable
        return row
    stage = "setup"
    try:
        t0 = time.perf_counter()
        prep = impl.setup(w, single, batch)
        row.setup_s = time.perf_counter() - t0
        row.notes += prep.notes
        stage = "correctness check"
        worst = 0.0
        if prep.batch is not None:
            t0 = time.perf_counter()
            res = prep.batch()
            row.first_batch_s = time.perf_counter() - t0
            waited = settle()
            worst = compare(f"{impl.label}, {w.name}, batched gradient", prep.batch_grads(res), refs["batch"], True)
            del res
            if waited > 0.01:  # the kernel the timed calls use: check it too
                t0 = time.perf_counter()
                worst = compare(f"{impl.label}, {w.name}, batched gradient (compiled)", prep.batch_grads(prep.batch()),
                                refs["batch"], True)
                row.notes.append(f"1st batched call {row.first_batch_s:.3f} s + {waited:.2f} s waiting for the "
                                 f"background JIT compile, then {time.perf_counter() - t0:.3f} s")
                row.first_batch_s += waited
        if prep.single is not None:
            worst = max(worst, compare(f"{impl.label}, {w.name}, single-point gradient",
                                       prep.single_grads(prep.single()), refs["single"], False))
            settle()
        if prep.forward is not None:
            worst = max(worst, compare(f"{impl.label}, {w.name}, batched forward",
                                       {"f": prep.values(prep.forward())}, {"f": refs["values"]}, True))
            if settle() > 0.01:
                prep.forward()
        row.worst_err = worst
        # Warm up, then check again what the timed calls will run: engines that switch to a
        # compiled tier after the first calls must be right in that tier too.
        stage = "timing"
        if prep.single is not None:
            _, res = warm_up(prep.single, 3)
            for _ in range(HOT_CALLS):  # engines that compile a graph once it is hot (semigrad: 64 calls)
                prep.single()
            settle()
            compare(f"{impl.label}, {w.name}, single-point gradient (warm)", prep.single_grads(res),
                    refs["single"], False)
            row.latency, row.latency_reps = median_latency(prep.single, budget=args.budget,
                                                           min_reps=args.min_reps)
        slow = (row.first_batch_s or 0) > 2.0  # one warm-up call is enough for slow calls
        warm_grad = warm_fwd = None
        if prep.batch is not None:
            warm_grad, res = warm_up(prep.batch, 1 if slow else 2)
            row.worst_err = max(row.worst_err, compare(f"{impl.label}, {w.name}, batched gradient (warm)",
                                                       prep.batch_grads(res), refs["batch"], True))
            del res
        if prep.forward is not None:
            warm_fwd, res = warm_up(prep.forward, 1 if slow else 2)
            compare(f"{impl.label}, {w.name}, batched forward (warm)", {"f": prep.values(res)},
                    {"f": refs["values"]}, True)
            del res
        # Gradient and forward alternate, so that grad ÷ fwd compares the two under the same load.
        if prep.batch is not None and prep.forward is not None:
            t_grad, t_fwd, row.batch_runs = paired_median_times((prep.batch, prep.forward), runs=args.runs,
                                                                budget=2 * args.batch_budget)
            row.throughput, row.forward = B / t_grad, B / t_fwd
        elif prep.batch is not None:
            t_grad, row.batch_runs = median_time(prep.batch, runs=args.runs, budget=args.batch_budget)
            row.throughput = B / t_grad
        if warm_grad and warm_grad[0] > 3 * B / row.throughput and warm_grad[0] > 0.05:
            row.notes.append(f"first warm-up call after the check took {warm_grad[0]:.3f} s (lazy compilation)")
        if warm_fwd and warm_fwd[0] > 3 * B / row.forward and warm_fwd[0] > 0.05:
            row.notes.append(f"first forward warm-up call took {warm_fwd[0]:.3f} s (lazy compilation)")
        row.prep = prep  # kept for the memory pass at the end
    except Skip as e:
        row.status, row.message = "skipped", str(e)
    except WrongGradient as e:
        row.status, row.message = "wrong", str(e)
        print(f"\n*** WRONG GRADIENT, row not timed: {e}\n", file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 — a peer's failure is that row's error, loudly
        row.status, row.message = "error", f"{stage}: {type(e).__name__}: {e}".replace("\n", " ")[:400]
        print(f"\n*** ERROR in {impl.label} on {w.name} ({stage}):", file=sys.stderr)
        traceback.print_exc()
    return row


# ------------------------------------------------------------------------------------ bare gRPC echo
class Echo:
    """A bare grpcio server in this process: one generic unary method answering preset bytes."""

    METHOD = "/bench.Echo/RoundTrip"

    def __init__(self):
        from concurrent import futures

        self.reply = b""

        def round_trip(request: bytes, context) -> bytes:
            return self.reply

        handler = grpc.method_handlers_generic_handler(
            "bench.Echo", {"RoundTrip": grpc.unary_unary_rpc_method_handler(round_trip)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        opts = [("grpc.max_send_message_length", 512 << 20), ("grpc.max_receive_message_length", 512 << 20)]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}", opts)
        self.call = self.channel.unary_unary(self.METHOD)  # no (de)serializers: bytes in, bytes out

    def close(self):
        self.channel.close()
        self.server.stop(0).wait()


def paired_with_echo(client: semigrad.Client, w: Workload, single: dict, echo_call: Callable, args) -> dict:
    """semigrad's single-point gRPC gradient (the unary row's call) and the bare echo timed in
    alternation, so both see the same machine load: {"paired": median ratio, "pairs": count}."""
    f = client.register(w.graph(w.single))
    wrt = list(w.wrt)
    kw = {} if args.backend == "auto" else {"backend": args.backend}
    for _ in range(HOT_CALLS):
        f.gradient(single, wrt=wrt, **kw)
        echo_call()
    settle()
    ours, theirs = [], []
    spent = 0.0
    while len(ours) < max(args.min_reps, 200) or spent < 2 * args.budget:
        t0 = time.perf_counter()
        f.gradient(single, wrt=wrt, **kw)
        t1 = time.perf_counter()
        echo_call()
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        theirs.append(t2 - t1)
        spent += t2 - t0
    return {"paired": statistics.median(ours) / statistics.median(theirs), "pairs": len(ours)}


def paired_with_best_peer(rows: list[Row], args) -> dict:
    """semigrad in-process and the fastest peer (by the rows' own batched figures) timed again in
    alternation, one batched call of each, repeated: {"vs_best_paired": in-process ÷ peer
    throughput, "vs_best_pairs": count}. The rows were measured one after the other, minutes
    apart on a shared machine; this ratio sees one machine load."""
    local = next((r for r in rows if r.impl.key == "semigrad" and r.status == "ok" and r.prep is not None
                  and r.prep.batch is not None), None)
    candidates = [r for r in rows if r.impl.kind == "peer" and r.status == "ok" and r.throughput
                  and r.prep is not None and r.prep.batch is not None]
    best = max(candidates, key=lambda r: r.throughput, default=None)
    if local is None or best is None:
        return {}
    for _ in range(2):
        local.prep.batch()
        best.prep.batch()
    settle()
    t_local, t_best, pairs = paired_median_times((local.prep.batch, best.prep.batch), runs=max(5, args.runs),
                                                 budget=4 * args.batch_budget, max_runs=31)
    return {"vs_best_paired": t_best / t_local, "vs_best_pairs": pairs}


def semigrad_wire_sizes(port: int, w: Workload, single: dict) -> tuple[int, int]:
    """Bytes of semigrad's single-point GradientRequest and of its GradientResponse."""
    from semigrad import codec
    from semigrad.v1 import semigrad_pb2 as pb

    with semigrad.Client(f"127.0.0.1:{port}") as client:
        f = client.register(w.graph(w.single))
        request = pb.GradientRequest(graph_id=f.id, wrt=list(w.wrt),
                                     inputs={k: codec.to_tensor(np.asarray(v)) for k, v in single.items()})
        raw = request.SerializeToString()
        reply = client.transport.channel.unary_unary("/semigrad.v1.GraphService/Gradient")(raw)
    return len(raw), len(reply)


# ------------------------------------------------------------------------------------ report
def _gcc_version() -> str:
    gcc = shutil.which("gcc")
    if not gcc:
        return "not found"
    try:
        return subprocess.run([gcc, "--version"], capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
    except Exception as e:  # noqa: BLE001
        return f"unknown ({e})"


def _threads() -> str:
    parts = [f"{v}={os.environ[v]}" for v in (*THREAD_VARS, "XLA_FLAGS") if v in os.environ]
    if "torch" in sys.modules:
        parts.append(f"torch.get_num_threads()={sys.modules['torch'].get_num_threads()}")
    return ", ".join(parts) or "library defaults"


def _us(x):
    return "—" if x is None else fmt(x * 1e6)


def _num(x):
    return "—" if x is None else fmt(x)


def _mib(x: int | None) -> str:
    return "—" if x is None else f"{x / 2**20:,.1f}"


def _check(value: float | None, target: float, higher_is_better: bool) -> str:
    if value is None:
        return "—"
    ok = value >= target if higher_is_better else value <= target
    return f"{fmt(value)} {'✓' if ok else '✗'}"


def workload_table(w: Workload, rows: list[Row], echo: dict) -> str:
    headers = ["implementation", "single latency (µs)", "batched grads/s", "batched forward evals/s",
               "grad ÷ fwd cost", "peak RSS Δ (MiB)", "tracemalloc peak (MiB)", "setup (s)", "1st batched call (s)", "max rel err",
               "notes"]
    out = []
    for r in rows:
        label = r.impl.label + (" *(reference)*" if r.impl.kind == "reference" else "")
        if r.status == "skipped":
            out.append([label, "skipped", "", "", "", "", "", "", "", "", r.message])
            continue
        if r.status in ("wrong", "error"):
            out.append([label, f"**{r.status.upper()}**", "", "", "", "", "", "", "", "",
                        r.message.replace("\n", " ").replace("|", "/")[:300]])
            continue
        out.append([label, _us(r.latency), _num(r.throughput), _num(r.forward),
                    _num(r.cost_ratio), _mib(r.memory), _mib(r.traced), "—" if r.setup_s is None else f"{r.setup_s:.2f}",
                    "—" if r.first_batch_s is None else f"{r.first_batch_s:.3f}", f"{r.worst_err:.0e}",
                    "; ".join(r.notes).replace("|", "/")])
    if "request" in echo:
        out.append([f"bare grpcio round trip ({echo['request']:,} B → {echo['response']:,} B)",
                    _us(echo["latency"]), "", "", "", "", "", "", "", "", "generic handler, bytes in/out, same sizes "
                    "as semigrad's single-point Gradient request/response; timed alternately with semigrad's "
                    f"single-point call over {echo.get('pairs', 0)} pairs: semigrad ÷ echo = {echo.get('paired', 0):.2f}"])
    return markdown_table(headers, out, "l" + "r" * 9 + "l")


def summary(results: list[tuple[Workload, list[Row], dict, dict]]) -> str:
    headers = ["workload", "semigrad in-process grads/s", "best peer (grads/s)", "in-proc ÷ best peer (alternated)",
               "in-proc ÷ JAX vmap", "in-proc ÷ PyTorch eager", "gRPC unary ÷ in-proc (best row)",
               "gRPC stream ÷ in-proc",
               "single ÷ PyTorch eager", "single ÷ JAX jit(grad)", "gRPC single ÷ bare echo", "grad ÷ fwd (semigrad)",
               "1st call ÷ JAX's (fresh processes)"]
    out = []
    for w, rows, echo, first in results:
        by = {r.impl.key: r for r in rows if r.status == "ok"}
        local = by.get("semigrad")
        peers = [r for r in rows if r.status == "ok" and r.impl.kind == "peer" and r.throughput]
        best = max(peers, key=lambda r: r.throughput, default=None)

        def ratio(a, b, attr):
            x, y = (getattr(a, attr) if a else None), (getattr(b, attr) if b else None)
            return x / y if x and y else None

        unary = [r for r in (by.get("grpc"), by.get("grpc_shm")) if r is not None and r.throughput]
        best_unary = max(unary, key=lambda r: r.throughput, default=None)
        unary_cell = _check(ratio(best_unary, local, "throughput"), TARGETS["grpc_vs_local"], True)
        if best_unary is not None and len(unary) > 1:
            unary_cell += " (shared memory)" if best_unary.impl.key == "grpc_shm" else " (inline bytes)"
        vs_best_target = TARGETS["vs_best"]
        # the alternated re-timing when there is one, else the rows' own figures (measured apart)
        vs_best = echo.get("vs_best_paired") or ratio(local, best, "throughput")
        mlp = w.name == "mlp"
        det = w.name.startswith("det")
        out.append([
            w.name,
            _num(local.throughput) if local else "—",
            f"{best.impl.label} ({fmt(best.throughput)})" if best else "—",
            _check(vs_best, vs_best_target, True) if not mlp else _num(vs_best),
            _check(ratio(local, by.get("jax"), "throughput"), TARGETS["mlp_vs_jax"], True) if mlp else
            _num(ratio(local, by.get("jax"), "throughput")),
            _check(ratio(local, by.get("torch"), "throughput"), TARGETS["mlp_vs_torch"], True) if mlp else
            _num(ratio(local, by.get("torch"), "throughput")),
            unary_cell,
            _check(ratio(by.get("grpc_stream"), local, "throughput"), TARGETS["grpc_vs_local"], True),
            _check(ratio(local, by.get("torch"), "latency"), TARGETS["single_vs_torch_det"], False) if det else
            _num(ratio(local, by.get("torch"), "latency")),
            _check(ratio(local, by.get("jax"), "latency"), TARGETS["single_vs_jax"], False),
            _check(echo["paired"], TARGETS["grpc_vs_echo"], False)
            if echo and "paired" in echo else "—",
            _check(local.cost_ratio if local else None, TARGETS["grad_vs_fwd"], False),
            ("< " if first.get("bound") else "") +
            (_check(first.get("ratio"), TARGETS["first_vs_jax"], False) if det else _num(first.get("ratio"))),
        ])
    return markdown_table(headers, out)


def report(results, impls: list[Impl], args, argv, started: float, load_before: str, load_after: str) -> str:
    versions = ", ".join(f"{p} {package_version(p)}" for p in PACKAGES)
    peers_line = "; ".join(f"{i.label}: {'**not available** — ' + i.unavailable if i.unavailable else 'ok'}"
                           for i in impls if i.kind == "peer")
    lines = [
        "# semigrad benchmark suite: semigrad vs peers, side by side in one run",
        "",
        "## Machine and run",
        "",
        *(f"- {k}: {v}" for k, v in machine_info()),
        f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after} "
        "(other processes on the machine skew every figure)",
        f"- threads: {_threads()}",
        f"- packages: {versions}",
        f"- gcc: {_gcc_version()}",
        f"- peers: {peers_line}",
        f"- batch: {args.batch:,} items per batched call; single-point latency: median of warm calls, "
        f"≥{args.budget} s and ≥{args.min_reps} calls per cell; batched gradient and forward: timed in "
        f"alternation (one gradient call, one forward call, repeated), median of ≥{args.runs} pair(s) after warm-up "
        f"(more, up to 15, until {2 * args.batch_budget:g} s are spent); semigrad backend: {args.backend}",
        f"- threads per implementation: {args.threads or 'library defaults'} (--threads; set through "
        f"{', '.join(THREAD_VARS)}, XLA_FLAGS=--xla_cpu_multi_thread_eigen=false and torch.set_num_threads)",
        f"- every gradient (single point and batch) and every batched forward was checked against the "
        f"reference before timing: per item ‖g − g_ref‖ ≤ {RTOL:g}·max(‖g_ref‖, 1e-3·median ‖g_ref‖)",
        f"- wall time of the run: {time.perf_counter() - started:.0f} s" + ("; **--quick: noisy smoke-test figures**"
                                                                              if args.quick else ""),
        "",
        "Command:",
        "",
        "```sh",
        rerun_command("bench/suite.py", argv),
        "```",
        "",
        "## Summary: ratios against issue 6's targets and issue 12's first call (✓ met, ✗ not met, in this run)",
        "",
        summary(results),
        "",
        "Targets: batched in-process ÷ best peer ≥ 1 (det, poly, ode); MLP ≥ 0.8× JAX and ≥ 1× PyTorch; gRPC "
        "÷ in-process ≥ 0.5; single-point latency ≤ 0.1× PyTorch eager (det) and ≤ 2× JAX jit(grad); gRPC "
        "single ≤ 1.5× a bare grpcio round trip of the same sizes; gradient ≤ 3× forward. Ratios of throughputs: "
        "higher is better; ratios of latencies: lower is better. *Best peer* excludes semigrad and the NumPy "
        "reference. *gRPC unary ÷ in-proc* takes the faster of the two unary rows (tensors inline as protobuf "
        "bytes, or through shared memory) and says which; both rows are in the tables below; *gRPC single ÷ "
        "bare echo* uses the inline row's call, timed alternately with the echo (one semigrad call, one echo, "
        "repeated; the ratio of the two medians), so that both see the same load. *in-proc ÷ best peer* times "
        "semigrad in-process and the fastest peer again after their rows, alternately (one batched call of "
        "each, repeated; the ratio of the medians): the rows themselves are measured one after the other. "
        "*1st call ÷ JAX's* (issue 12: ≤ 1 on det): see the first-call section below.",
        "",
    ]
    firsts = {w.name: first for w, _, _, first in results if first.get("runs")}
    if firsts:
        lines += [
            "## First call: semigrad vs JAX jit(vmap(grad)), fresh processes, alternated",
            "",
            f"From the clock's start to the first {args.batch:,} gradients, in a fresh process (imports before the "
            "clock, for both): semigrad builds the graph with the client API, registers it in an in-process Engine "
            "and runs the first batched gradient (its plan compiles; the batch runs on NumPy while numba compiles "
            "the JIT kernel in the background); JAX's is jit(vmap(grad(f)))'s first call (trace, XLA compile, "
            f"run). {args.first_call_pairs} fresh process(es) each, alternated (semigrad, JAX, JAX, semigrad, ...), "
            "every batch of fresh items; medians. Then: semigrad's second batch (right after the first), its wait "
            "for the background compile, and steady batches of both (median of five, after the compile). "
            "`bench/first_call.py` runs this alone.",
            "",
            first_call.table(firsts, args.batch),
            "",
        ]
    for w, rows, echo, first in results:
        if first.get("error"):
            lines += [f"First call of {w.name}: **ERROR** {first['error']}", ""]
        lines += [f"## {w.title}", "", w.note, "", workload_table(w, rows, echo), ""]
    lines += [
        "## How to read this",
        "",
        "- **single latency**: one gradient at the single point, inputs already in the implementation's own "
        "types (NumPy arrays for semigrad, tensors for PyTorch, device arrays for JAX, DM for CasADi), result "
        "fully computed; gRPC rows include encoding, the loopback round trip and decoding, client and server in "
        "this one process.",
        "- **batched grads/s**: per-item gradients of the whole batch in one call; **forward evals/s**: the "
        "same batch's values; **grad ÷ fwd** = time of the batched gradient ÷ time of the batched forward.",
        "- **peak memory** of one batched gradient call, measured after all timing: *RSS Δ* = the process's "
        "RSS high-water mark during the call minus its RSS before (Linux clear_refs), with glibc malloc set to "
        "mmap every allocation ≥ 64 KiB and trimmed before the call so that reused free memory cannot hide new "
        "use (allocators that keep their own pools, e.g. XLA's, can still hide some); inputs prepared before "
        "the call are not counted, outputs are. *tracemalloc peak* is given for Python/NumPy paths only "
        "(semigrad, the NumPy reference, SymPy): Python and NumPy allocations; gRPC rows count client and "
        "server together (one process).",
        "- **setup**: registration / tracing / symbolic differentiation / JIT compilation / code generation "
        "and gcc, before the first call; **1st batched call**: includes any lazy compilation (semigrad's plans, "
        "PyTorch's first dispatch). Neither is in any throughput.",
        "- Read figures as ratios within this run, never across runs or machines.",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: det n ≤ 5, batch 1000, 1 batched run, 0.05 s per latency cell")
    p.add_argument("--only", action="append", default=[], metavar="WORKLOAD",
                   help="run only these workloads (repeatable or comma-separated): det4..det7, det (all sizes), "
                        "poly, mlp, ode")
    p.add_argument("--impl", action="append", default=[], metavar="KEY",
                   help="run only these implementations (repeatable or comma-separated): semigrad, grpc, "
                        "grpc_stream, grpc_shm, reference, " + ", ".join(peer.key for peer in PEERS))
    p.add_argument("--batch", type=int, default=None, help="items per batched call (default 10000; --quick: 1000)")
    p.add_argument("--runs", type=int, default=None, help="timed batched runs per cell (default 3; --quick: 1)")
    p.add_argument("--backend", default="auto", help="semigrad execution backend to force (default: auto)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="threads per implementation: OMP/BLAS/numba/XLA/PyTorch (default 1; 0 = library defaults)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--first-call-pairs", type=int, default=None,
                   help="fresh processes per implementation for the first-call comparison of semigrad and JAX "
                        "(bench/first_call.py; default 3, --quick: 1; 0 skips it)")
    p.add_argument("--out", default=None,
                   help="report file (default: bench/RESULTS.md for a full run, bench/out/RESULTS.md otherwise)")
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"suite.py: ignoring arguments meant for other benchmarks: {' '.join(unknown)}", file=sys.stderr)
    args.only = [x for item in args.only for x in item.split(",") if x]
    args.impl = [x for item in args.impl for x in item.split(",") if x]
    args.batch = args.batch or (1000 if args.quick else 10_000)
    args.runs = args.runs or (1 if args.quick else 3)
    if args.first_call_pairs is None:
        args.first_call_pairs = 1 if args.quick else 3
    args.budget = 0.05 if args.quick else 0.3
    args.batch_budget = 0.0 if args.quick else 0.5
    args.min_reps = 5 if args.quick else 15
    partial = (args.quick or args.only or args.impl or args.batch != 10_000 or args.runs != 3 or args.backend != "auto"
               or args.threads != 1 or args.first_call_pairs != 3)
    args.out = Path(args.out) if args.out else REPO / ("bench/out/RESULTS.md" if partial else "bench/RESULTS.md")
    return args


def resolved_argv(args) -> list[str]:
    argv = ["--batch", str(args.batch), "--runs", str(args.runs), "--seed", str(args.seed)]
    argv += [x for o in args.only for x in ("--only", o)] + [x for i in args.impl for x in ("--impl", i)]
    argv += (["--quick"] if args.quick else []) + (["--threads", str(args.threads)] if args.threads != 1 else [])
    argv += (["--backend", args.backend] if args.backend != "auto" else [])
    argv += (["--first-call-pairs", str(args.first_call_pairs)] if args.first_call_pairs != (1 if args.quick else 3)
             else [])
    return argv + (["--no-memory"] if args.no_memory else [])


def select_workloads(args) -> list[Workload]:
    sizes = [n for n in DET_SIZES if n <= 5] if args.quick else list(DET_SIZES)
    chosen = all_workloads(sizes)
    if args.only:
        known = {w.name for w in all_workloads()} | {"det"}
        bad = [o for o in args.only if o not in known]
        if bad:
            raise SystemExit(f"suite.py: unknown workload(s) {bad}; choose from {sorted(known)}")
        chosen = [w for w in all_workloads() if w.name in args.only or any(t in args.only for t in w.tags)]
    return chosen


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if __name__ != "__main__":  # imported: the environment could not be set before the imports
        limit_threads(args.threads)
    peers.THREADS = args.threads
    started = time.perf_counter()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    workloads = select_workloads(args)

    engine = Engine()
    server, port, _ = build_server("127.0.0.1:0")
    server.start()
    # One client with the tensors inline (protobuf bytes), one with the default shared_memory="auto".
    client = semigrad.Client(f"127.0.0.1:{port}", shared_memory=False)
    shared_client = semigrad.Client(f"127.0.0.1:{port}")
    echo = Echo()
    impls = [
        Impl("semigrad", "**semigrad in-process**", "semigrad", "tracemalloc", semigrad_in_process(engine, args.backend)),
        Impl("grpc", "**semigrad gRPC (unary)**", "semigrad", "tracemalloc", semigrad_grpc(client, args.backend, False)),
        Impl("grpc_shm", "**semigrad gRPC (unary, shared memory)**", "semigrad", "tracemalloc",
             semigrad_grpc(shared_client, args.backend, False),
             None if shared_client.shared_memory_off is None else f"shared memory: {shared_client.shared_memory_off}"),
        Impl("grpc_stream", "**semigrad gRPC (stream)**", "semigrad", "tracemalloc",
             semigrad_grpc(client, args.backend, True),
             None if hasattr(semigrad.RegisteredGraph, "gradient_many") else "client has no gradient_many"),
        Impl("reference", "NumPy reference", "reference", "tracemalloc", reference_setup),
        *(Impl(peer.key, peer.label, "peer", peer.memory, peer.setup, peer.availability()) for peer in PEERS),
    ]
    if args.impl:
        known = {i.key for i in impls}
        bad = [k for k in args.impl if k not in known]
        if bad:
            raise SystemExit(f"suite.py: unknown implementation(s) {bad}; choose from {sorted(known)}")
        impls = [i for i in impls if i.key in args.impl]
    for i in impls:
        if i.unavailable:
            print(f"... {i.label}: {i.unavailable}", file=sys.stderr)

    results, failed = [], []
    keys = {i.key for i in impls if not i.unavailable}
    first_call_impls = {"semigrad", "jax"} <= keys
    try:
        for index, w in enumerate(workloads):
            rng = np.random.default_rng([args.seed, index])
            single = w.single.sample(rng, None)
            batch = w.batched.sample(rng, args.batch)
            refs = {"single": w.reference_gradient(single), "batch": w.reference_gradient(batch),
                    "values": w.reference_value(w.batched, batch, True)}
            rows = []
            for impl in impls:
                t0 = time.perf_counter()
                print(f"... {w.name}: {impl.label.strip('*')}", file=sys.stderr, flush=True)
                # a peer stuck in native code cannot be interrupted: give up loudly instead of hanging
                faulthandler.dump_traceback_later(ROW_TIMEOUT, exit=True)
                try:
                    row = measure(impl, w, single, batch, refs, args)
                finally:
                    faulthandler.cancel_dump_traceback_later()
                rows.append(row)
                if row.status in ("wrong", "error"):
                    failed.append(f"{w.name}/{impl.key}")
                print(f"    {row.status}{': ' + row.message[:160] if row.message else ''} "
                      f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
            echo_row = {}
            if any(r.impl.key == "grpc" and r.status == "ok" and r.latency for r in rows):
                req, resp = semigrad_wire_sizes(port, w, single)
                echo.reply = b"\x01" * resp
                payload = b"\x02" * req
                lat, _ = median_latency(lambda: echo.call(payload), budget=args.budget, min_reps=args.min_reps)
                echo_row = {"request": req, "response": resp, "latency": lat,
                            **paired_with_echo(client, w, single, lambda: echo.call(payload), args)}
            print(f"... {w.name}: in-process and the fastest peer, alternated", file=sys.stderr, flush=True)
            echo_row.update(paired_with_best_peer(rows, args))
            first = {}
            if args.first_call_pairs > 0 and first_call_impls:
                print(f"... {w.name}: first calls, fresh processes", file=sys.stderr, flush=True)
                try:
                    first = first_call.first_calls(w.name, pairs=args.first_call_pairs, batch=args.batch,
                                                   seed=args.seed, threads=args.threads,
                                                   log=lambda m: print(m, file=sys.stderr, flush=True))
                except Exception as e:  # noqa: BLE001 — that column's error, loudly
                    first = {"error": f"{type(e).__name__}: {e}".replace("\n", " ")[:400]}
                    failed.append(f"{w.name}/first_call")
                    print(f"\n*** ERROR in the first-call measurement of {w.name}: {first['error']}", file=sys.stderr)
            results.append((w, rows, echo_row, first))
        if not args.no_memory:
            memory_pass(results)
    finally:
        client.close()
        shared_client.close()
        echo.close()
        server.stop(0).wait()

    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    text = report(results, impls, args, resolved_argv(args), started, load_before, load_after)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(f"\nsuite.py: wrote {os.path.relpath(args.out, Path.cwd())}", file=sys.stderr)
    if failed:
        print(f"suite.py: FAILED rows (wrong gradient or error): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
