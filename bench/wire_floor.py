"""The wire at its floor (issue 14): what a remote call costs beyond its compute and a bare gRPC
round trip of the same bytes, and in-process single-point latency against JAX, in ONE run.

    .venv/bin/python bench/wire_floor.py [--seconds 1.5] [--batch 10000] [--workloads det4,det5,poly,ode,mlp]

Three tables, every cell timed in alternation with the cells it is compared with (blocks of calls,
repeated until `--seconds` per row have passed), so that all see the same load:

1. **In-process single point**: `semigrad.Client()`'s gradient against the engine called directly
   and JAX's jit(grad) (issue 14: client ÷ JAX ≤ 2).
2. **Remote ÷ floor**: a remote call (a `semigrad serve`-like server with one worker in a child
   process, on 127.0.0.1) against its floor = the same request computed by the in-process client
   + a bare grpcio round trip of the same serialized bytes (a generic handler in the same child
   process that answers every message with one of the size the semigrad server answered; the
   sizes are those of the messages the semigrad client really sent and got, recorded once).
   Rows: a single point (unary, inline); a batch as one unary call, inline and through shared
   memory; the batch as a GradientStream of 4 chunks, inline and through shared memory (the bare
   reference is a stream of the same messages). Target (issue 14): remote ÷ floor ≤ 1.2.
3. **gradient_many's default chunks ÷ one unary call** of the same batch, inline and through shared
   memory (issue 14: ≤ 1, never slower than one call).

Every gradient is checked against the workload's reference before it is timed. Medians of the
blocks; the ratios are ratios of medians."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")

import grpc  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import semigrad  # noqa: E402
from common import machine_info, settle  # noqa: E402
from inprocess import WORKLOADS, jax_single  # noqa: E402

ECHO_SERVICE = "wirefloor.Echo"
STREAM_CHUNKS = 4


# ---------------------------------------------------------------------------- the child process: both servers
def echo_handler() -> grpc.GenericRpcHandler:
    """Raw bytes in, raw bytes out: each request's first 8 bytes say how many bytes to answer."""
    replies: dict[int, bytes] = {}

    def reply(request: bytes) -> bytes:
        n = int.from_bytes(request[:8], "little")
        if n not in replies:
            replies[n] = b"\x01" * n
        return replies[n]

    def settled(request: bytes, context) -> bytes:  # the semigrad server's background JIT compiles, done
        settle()
        return b""

    return grpc.method_handlers_generic_handler(ECHO_SERVICE, {
        "Settle": grpc.unary_unary_rpc_method_handler(settled),
        "Unary": grpc.unary_unary_rpc_method_handler(lambda request, context: reply(request)),
        "Stream": grpc.stream_stream_rpc_method_handler(
            lambda requests, context: (reply(r) for r in requests)),
    })


def serve_child() -> None:
    """Runs in the child: the semigrad server (as `semigrad serve --workers 1` builds it) and the
    echo server, each on its own ephemeral port; prints both ports, serves until stdin closes."""
    from concurrent import futures

    from semigrad_server.allocator import reuse_freed_memory
    from semigrad_server.limits import Limits
    from semigrad_server.service import build_server

    reuse_freed_memory()  # as a worker of `semigrad serve` does
    server, port, _ = build_server("127.0.0.1:0")
    server.start()
    size = Limits().max_message_bytes  # the semigrad server's message limits, its other options grpc's defaults
    echo = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[
        ("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)])
    echo.add_generic_rpc_handlers((echo_handler(),))
    echo_port = echo.add_insecure_port("127.0.0.1:0")
    echo.start()
    print(port, echo_port, flush=True)
    sys.stdin.read()
    server.stop(0).wait()
    echo.stop(0).wait()


# ---------------------------------------------------------------------------- the parent: timing
def per_call(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


class Timed(dict):
    """Median seconds per call of each (the dict), and of the least disturbed block (`best`)."""

    best: dict[str, float]


def alternate(calls: dict, seconds: float, block_seconds: float = 2e-3) -> Timed:
    """Median seconds per call of each, timed in alternating blocks of about `block_seconds`."""
    n = {k: max(1, int(block_seconds / per_call(c, 3))) for k, c in calls.items()}
    times = {k: [] for k in calls}
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or min(len(v) for v in times.values()) < 5:
        for k, c in calls.items():
            times[k].append(per_call(c, n[k]))
    timed = Timed({k: statistics.median(v) for k, v in times.items()})
    timed.best = {k: min(v) for k, v in times.items()}
    return timed


class Recorder:
    """The serialized sizes of the messages a remote client's transport sends and receives."""

    def __init__(self, transport):
        self.transport = transport
        self.sizes: list[tuple[int, int]] = []  # (request bytes, response bytes), one per message pair
        self.kind = None

    def __enter__(self):
        t = self.transport
        self._call, self._stream = t.call, t.stream

        def call(method, request, *how):
            response = self._call(method, request, *how)
            self.kind = "unary"
            self.sizes.append((request.ByteSize(), response.ByteSize()))
            return response

        def stream(method, requests, *how):
            self.kind = "stream"
            sent = []

            def recorded():
                for r in requests:
                    sent.append(r.ByteSize())
                    yield r
            for k, response in enumerate(self._stream(method, recorded(), *how)):
                self.sizes.append((sent[k], response.ByteSize()))
                yield response

        t.call, t.stream = call, stream
        return self

    def __exit__(self, *exc):
        del self.transport.call, self.transport.stream


def echo_call(channel, kind: str, sizes: list[tuple[int, int]]):
    """A bare grpcio call moving messages of `sizes` (as the recorded semigrad call did)."""
    messages = [n_out.to_bytes(8, "little") + b"\x00" * max(0, n_in - 8) for n_in, n_out in sizes]
    if kind == "unary":
        unary = channel.unary_unary(f"/{ECHO_SERVICE}/Unary")
        return lambda: unary(messages[0])
    stream = channel.stream_stream(f"/{ECHO_SERVICE}/Stream")
    return lambda: sum(1 for _ in stream(iter(messages)))


def check(got: dict, want: dict, what: str) -> None:
    for k, ref in want.items():
        np.testing.assert_allclose(np.asarray(got[k]), ref, rtol=1e-8, atol=1e-12, err_msg=f"{what}: {k}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="timing per row (default 1.5)")
    parser.add_argument("--batch", type=int, default=10_000, help="items of the batched rows (default 10000; "
                        "the MLP's a tenth)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="0.3 s per row, batch 2000")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve_child()
        return 0
    if args.quick:
        args.seconds, args.batch = 0.3, min(args.batch, 2000)
    child = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        port, echo_port = map(int, child.stdout.readline().split())
        return run(args, port, echo_port)
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def run(args, port: int, echo_port: int) -> int:
    options = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]
    local = semigrad.Client()
    engine = local.transport.engine
    inline = semigrad.Client(f"127.0.0.1:{port}", shared_memory=False)
    shared = semigrad.Client(f"127.0.0.1:{port}", shared_memory=True)
    echo = grpc.insecure_channel(f"127.0.0.1:{echo_port}", options)
    rng = np.random.default_rng(0)
    single_rows, floor_rows, chunk_rows = [], [], []
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        wrt = list(w.wrt)
        # ---- 1. in-process single point against JAX
        print(f"{name}: single point in process", file=sys.stderr, flush=True)
        f = local.register(w.graph(w.single))
        x = w.single.sample(rng, None)
        for _ in range(100):  # past the engine's hot-call threshold, then its background compile
            f.gradient(x, wrt=wrt)
        settle()
        check(f.gradient(x, wrt=wrt), w.reference_gradient(x), f"{name} single")
        calls = {"engine": lambda: engine.gradient(f.id, x, wrt=wrt).gradients, "client": lambda: f.gradient(x, wrt=wrt)}
        jax_call = jax_single(w, x)
        if jax_call is not None:
            calls["jax"] = jax_call
        t = alternate(calls, args.seconds)
        single_rows.append((name, t))

        # ---- 2. remote ÷ (in-process + bare round trip)
        remote_single = inline.register(w.graph(w.single))
        for _ in range(100):
            remote_single.gradient(x, wrt=wrt)
        echo.unary_unary(f"/{ECHO_SERVICE}/Settle")(b"", timeout=600)
        items = max(1, args.batch // 10) if name == "mlp" else args.batch
        batch = w.batched.sample(rng, items)
        want = w.reference_gradient(batch)
        fb = local.register(w.graph(w.batched))
        rows = [("single point, unary, inline", inline, lambda: remote_single.gradient(x, wrt=wrt),
                 lambda: f.gradient(x, wrt=wrt), w.reference_gradient(x))]
        for transport, client in (("inline", inline), ("shared memory", shared)):
            g = client.register(w.graph(w.batched))
            rows.append((f"batch of {items:,}, unary, {transport}", client,
                         lambda g=g: g.gradient(batch, wrt=wrt), lambda: fb.gradient(batch, wrt=wrt), want))
            rows.append((f"batch of {items:,}, stream of {STREAM_CHUNKS} chunks, {transport}", client,
                         lambda g=g: g.gradient_many(batch, -(-items // STREAM_CHUNKS), wrt=wrt, progress=False),
                         lambda: fb.gradient(batch, wrt=wrt), want))
        for label, client, remote, inproc, reference in rows:
            print(f"{name}: {label}", file=sys.stderr, flush=True)
            for _ in range(3):  # compiles (and the JIT's background compile) before timing
                remote(), inproc()
            settle()
            echo.unary_unary(f"/{ECHO_SERVICE}/Settle")(b"", timeout=600)  # the server's compiles too
            remote(), inproc()
            check(remote(), reference, f"{name} {label}")
            check(inproc(), reference, f"{name} {label} in process")
            with Recorder(client.transport) as recorded:
                remote()
            bare = echo_call(echo, recorded.kind, recorded.sizes)
            t = alternate({"remote": remote, "inproc": inproc, "bare": bare}, args.seconds)
            sizes = recorded.sizes
            floor_rows.append((name, label, t, sum(a for a, _ in sizes), sum(b for _, b in sizes), len(sizes)))

        # ---- 3. gradient_many's default chunks ÷ one unary call
        for transport, client in (("inline", inline), ("shared memory", shared)):
            g = client.register(w.graph(w.batched))
            unary = lambda g=g: g.gradient(batch, wrt=wrt)  # noqa: E731
            default = lambda g=g: g.gradient_many(batch, wrt=wrt, progress=False)  # noqa: E731
            check(default(), want, f"{name} default chunks {transport}")
            chunks = semigrad.streaming.default_chunk_size(semigrad.streaming.Batch(g, batch, {}), {"wrt": wrt})
            t = alternate({"unary": unary, "default": default}, args.seconds)
            chunk_rows.append((name, transport, items, -(-items // chunks), t))
    inline.close(), shared.close(), echo.close()
    report(args, single_rows, floor_rows, chunk_rows)
    return 0


def report(args, single_rows, floor_rows, chunk_rows) -> None:
    us = lambda s: f"{s * 1e6:,.1f}"  # noqa: E731
    cell = lambda t, k: f"{us(t[k])} ({us(t.best[k])})"  # noqa: E731
    print("# The wire at its floor (issue 14)\n")
    print("\n".join(f"- {k}: {v}" for k, v in machine_info()))
    print(f"- medians of alternated blocks of calls, {args.seconds} s per row; in parentheses the least "
          "disturbed block (the fastest), and ratios of those\n")
    print("## 1. In-process single-point gradient (target: client ÷ JAX ≤ 2)\n")
    print("| workload | engine (µs) | in-process client (µs) | JAX jit(grad) (µs) | client ÷ engine | client ÷ JAX |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, t in single_rows:
        jax = t.get("jax")
        versus_jax = f"{t['client'] / jax:.2f} ({t.best['client'] / t.best['jax']:.2f})" if jax else "—"
        print(f"| {name} | {cell(t, 'engine')} | {cell(t, 'client')} | {cell(t, 'jax') if jax else '—'} "
              f"| {t['client'] / t['engine']:.2f} | {versus_jax} |")
    print("\n## 2. Remote call ÷ (in-process compute + bare grpcio round trip of the same bytes) (target ≤ 1.2)\n")
    print("| workload | call | request / response bytes (messages) | remote (µs) | in-process (µs) | bare round trip (µs) "
          "| remote ÷ (in-process + bare) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, label, t, sent, got, n in floor_rows:
        b = t.best
        print(f"| {name} | {label} | {sent:,} / {got:,} ({n}) | {cell(t, 'remote')} | {cell(t, 'inproc')} "
              f"| {cell(t, 'bare')} | {t['remote'] / (t['inproc'] + t['bare']):.2f} "
              f"({b['remote'] / (b['inproc'] + b['bare']):.2f}) |")
    print("\n## 3. gradient_many's default chunks ÷ one unary call of the same batch (target ≤ 1)\n")
    print("| workload | transport | items | default chunks | unary (µs) | default (µs) | default ÷ unary |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, transport, items, chunks, t in chunk_rows:
        print(f"| {name} | {transport} | {items:,} | {chunks} | {cell(t, 'unary')} | {cell(t, 'default')} "
              f"| {t['default'] / t['unary']:.2f} ({t.best['default'] / t.best['unary']:.2f}) |")
    argv = " ".join(sys.argv[1:])
    print(f"\nRerun: `.venv/bin/python bench/wire_floor.py{' ' + argv if argv else ''}` (JAX from `make bench`'s extra).")


if __name__ == "__main__":
    sys.exit(main())
