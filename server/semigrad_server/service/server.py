"""Builds and runs the gRPC server: graph service, standard health and reflection services."""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from semigrad.v1 import semigrad_pb2 as pb

from ..engine import Engine
from ..limits import Limits
from ..store import open_store
from . import status
from .servicer import GraphServicer
from .shared_memory import SharedMemory

log = logging.getLogger("semigrad.server")
LOG_FORMAT = "%(asctime)s %(levelname)s %(process)d %(name)s %(message)s"
SIGNAL_POLL_SECONDS = 0.2
SERVICE = pb.DESCRIPTOR.services_by_name["GraphService"]
SERVICE_NAME = SERVICE.full_name


def build_server(address: str = "127.0.0.1:0", *, limits: Limits | None = None, threads: int = 8,
                 engine: Engine | None = None, reuse_port: bool = False,
                 shared_memory: bool = True) -> tuple[grpc.Server, int, Engine]:
    """Create a server bound to `address` (port 0: an ephemeral port); return it, the port and its engine.
    `reuse_port`: let several processes bind the same port (the kernel spreads connections).
    `shared_memory`: accept tensors in shared memory from clients on this host (docs/performance.md)."""
    limits = limits or Limits()
    engine = engine or Engine(limits)
    # No HTTP/2 or TCP tuning for large messages. Measured on loopback (grpcio 1.85, 2 cores, bare
    # bytes echo, 64 B to 16 MB each way, interleaved warm channels, server in-process and in a child
    # process): max_frame_size 16 MiB, tcp_{min,max,}_read_chunk_size 1-8 MiB, bdp_probe off,
    # lookahead_bytes 16 MiB and write_buffer_size 16 MiB, alone and together, changed the round trip
    # by less than the run-to-run noise (±10-20 %; e.g. 1.3 MB each way: 1.4-1.8 ms with or without),
    # never reproducibly faster, sometimes slower. Large messages cost their copies (protobuf,
    # grpc slices, the socket, fresh pages from glibc's allocator: docs/performance.md), which only
    # shared memory avoids (see shared_memory.py).
    options = [("grpc.max_receive_message_length", limits.max_message_bytes),
               ("grpc.max_send_message_length", limits.max_message_bytes),
               ("grpc.so_reuseport", int(reuse_port))]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="semigrad"),
                         options=options)
    # The generated add_GraphServiceServicer_to_server, with request decoding that never raises (status.py).
    status.add_service(GraphServicer(engine, SharedMemory(enabled=shared_memory)), server,
                       SERVICE, pb)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return server, port, engine


def serve(host: str, port: int, *, limits: Limits | None = None, threads: int = 8, grace: float = 5.0,
          store: str | None = None, workers: int = 1, shared_memory: bool = True) -> None:
    """Serve until SIGINT or SIGTERM, then stop gracefully (in-flight calls get `grace` seconds).

    `store`: path of the embedded SQLite graph store, a redis://host:port/db URL (a store shared by
    replicas), or None to keep graphs in memory only.
    `workers` > 1 runs that many processes on the same port, so CPU-bound requests use every
    core; they need the shared store to see each other's graphs. `shared_memory`: accept
    tensors in shared memory from clients on this host."""
    if workers > 1:
        if store is None:
            raise ValueError("several workers need a shared store: give --store PATH")
        if port == 0:
            raise ValueError("several workers need a fixed --port")
        _supervise(host, port, limits=limits, threads=threads, grace=grace, store=store, workers=workers,
                   shared_memory=shared_memory)
    else:
        _serve_one(host, port, limits=limits, threads=threads, grace=grace, store=store, reuse_port=False,
                   shared_memory=shared_memory)


def _serve_one(host, port, *, limits, threads, grace, store, reuse_port, shared_memory=True) -> None:
    limits = limits or Limits()
    engine = Engine(limits, store=open_store(store))
    server, bound, _ = build_server(f"{host}:{port}", limits=limits, threads=threads, engine=engine,
                                    reuse_port=reuse_port, shared_memory=shared_memory)
    server.start()
    log.info("semigrad serving on %s:%d (store: %s; shared memory: %s)", host, bound, store or "memory",
             "on" if shared_memory else "off")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # A timed wait: when a signal lands on one of grpc's threads, CPython only flags it, and
    # the handler runs once the main thread wakes up; an untimed wait could sleep forever.
    while not stop.wait(SIGNAL_POLL_SECONDS):
        pass
    log.info("shutting down (grace %.1fs)", grace)
    server.stop(grace).wait()


# A worker that dies is replaced. Deaths in quick succession (a worker that cannot start, or a
# request that kills every worker it reaches) are spaced by a growing pause; past
# MAX_RAPID_DEATHS of them in a row the supervisor gives up and exits non-zero.
RAPID_DEATH_SECONDS = 10.0  # a worker that lived less than this died "rapidly"
MAX_RAPID_DEATHS = 5
RESTART_PAUSE_SECONDS = (0.25, 0.5, 1.0, 2.0)


class SupervisorGaveUp(RuntimeError):
    """No worker could be kept alive."""


def _supervise(host, port, *, workers, grace, **kwargs) -> None:
    """Start the worker processes and keep `workers` of them alive (replacing any that dies) until
    SIGINT/SIGTERM, which is forwarded to them; raises SupervisorGaveUp when workers keep dying."""
    context = multiprocessing.get_context("spawn")
    level = logging.getLogger().level

    def start(slot: int):
        process = context.Process(target=_worker_main, args=(host, port, level), kwargs=dict(grace=grace, **kwargs),
                                  name=f"semigrad-worker-{slot}")
        process.start()
        return process, time.monotonic()

    procs = [start(slot) for slot in range(workers)]
    log.info("semigrad supervising %d workers on %s:%d", workers, host, port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    rapid_deaths = 0
    try:
        while not stop.wait(SIGNAL_POLL_SECONDS):
            for slot, (process, started) in enumerate(procs):
                if process.is_alive() or stop.is_set():
                    continue
                lived = time.monotonic() - started
                rapid_deaths = rapid_deaths + 1 if lived < RAPID_DEATH_SECONDS else 0
                log.error("worker %d (pid %d) exited with %s after %.1f s; replacing it", slot, process.pid,
                          _exit_status(process.exitcode), lived)
                if rapid_deaths > MAX_RAPID_DEATHS:
                    raise SupervisorGaveUp(f"{rapid_deaths} workers in a row exited within "
                                           f"{RAPID_DEATH_SECONDS:.0f} s of starting")
                if stop.wait(RESTART_PAUSE_SECONDS[min(rapid_deaths, len(RESTART_PAUSE_SECONDS)) - 1]
                             if rapid_deaths else 0.0):
                    break
                procs[slot] = start(slot)
    finally:
        for process, _ in procs:
            if process.is_alive():
                process.terminate()  # SIGTERM: each worker stops gracefully
        for process, _ in procs:
            process.join(grace + 5)
            if process.is_alive():
                process.kill()


def _exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


def _worker_main(host, port, level, **kwargs) -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT)
    _serve_one(host, port, reuse_port=True, **kwargs)
