"""Builds and runs the gRPC server: graph service, standard health and reflection services."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import gc
import logging
import multiprocessing
import os
import signal
import socket
import sqlite3
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from semigrad.v1 import semigrad_pb2 as pb

from .. import errors, logs
from ..allocator import reuse_freed_memory
from ..cpus import BLAS_THREAD_VARIABLES, limit_blas_threads
from ..engine import Engine
from ..limits import Limits
from ..store import open_store
from . import status
from .auth import Tokens
from .calls import CallInterceptor
from .metrics import Metrics, metrics_exposed, process_dead
from .servicer import GraphServicer
from .slots import make_directory, remove_directory
from .shared_memory import SharedMemory
from .tls import TlsFiles

log = logging.getLogger("semigrad.server")
SIGNAL_POLL_SECONDS = 0.2
SERVICE = pb.DESCRIPTOR.services_by_name["GraphService"]
SERVICE_NAME = SERVICE.full_name


def build_server(address: str = "127.0.0.1:0", *, limits: Limits | None = None, threads: int = 8,
                 engine: Engine | None = None, reuse_port: bool = False,
                 shared_memory: bool = True, tokens: Tokens | None = None, tls: TlsFiles | None = None,
                 metrics=None, health_out: list | None = None,
                 slots_directory: str | None = None) -> tuple[grpc.Server, int, Engine]:
    """Create a server bound to `address` (port 0: an ephemeral port); return it, the port and its engine.
    `reuse_port`: let several processes bind the same port (the kernel spreads connections).
    `shared_memory`: accept tensors in shared memory from clients on this host (docs/performance.md).
    `tokens`: bearer tokens of the tenants (none: authentication off, every caller anonymous).
    `tls`: serve TLS (mutual TLS with a client CA). `metrics`: a Metrics recording the calls.
    `health_out`: when a list, the health servicer is appended to it (to go NOT_SERVING on shutdown).
    `slots_directory`: where the worker processes of one server count each tenant's calls in
    flight (slots.py; None: this process alone)."""
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
    # Streaming calls (at most limits.max_streams at once, streams.py) get threads of their own, so
    # that `threads` are always left for unary calls (health checks have threads of their own: HEALTH_THREADS).
    interceptor = CallInterceptor(tokens or Tokens(), limits.max_tenant_requests, metrics, slots_directory)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads + limits.max_streams,
                                                    thread_name_prefix="semigrad"),
                         options=options, interceptors=(interceptor,))
    # The generated add_GraphServiceServicer_to_server, with request decoding that never raises (status.py).
    shared = SharedMemory(enabled=shared_memory, max_elements=limits.max_request_elements)
    status.add_service(GraphServicer(engine, shared, spliced=True), server, SERVICE, pb)
    health_servicer = _health_servicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    if health_out is not None:
        health_out.append(health_servicer)
    port = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return server, port, engine


# Health checks run on threads of their own: on the request threads they waited behind every call
# in flight, so a worker whose threads were all busy (calls waiting for a numba compile, slow
# gradients: any tenant can send them) failed its load balancer's checks and Kubernetes' probes,
# and was taken out of rotation or restarted with every call on it. A check is a dictionary read.
HEALTH_THREADS = 2
_health_pool: futures.ThreadPoolExecutor | None = None
_health_pool_lock = threading.Lock()


# Open health Watch streams per server: health needs no token, and each open Watch holds ~21 KB
# until its client goes (5,000 on one connection grew a worker by 106 MB: an attacker's count).
# Load balancers and Kubernetes' probes use Check; a few monitors may Watch.
MAX_HEALTH_WATCHES = 64


def _health_servicer() -> health.HealthServicer:
    """The standard health servicer, its Check served on HEALTH_THREADS threads of this process's
    own (Watch answers from callbacks, on no thread), at most MAX_HEALTH_WATCHES Watch streams
    open at once (RESOURCE_EXHAUSTED past them)."""
    global _health_pool
    with _health_pool_lock:
        if _health_pool is None:
            _health_pool = futures.ThreadPoolExecutor(max_workers=HEALTH_THREADS, thread_name_prefix="semigrad-health")
    servicer = health.HealthServicer()
    check, watch = servicer.Check, servicer.Watch
    watching = [0]
    watching_lock = threading.Lock()

    def Check(request, context):  # noqa: N802 - the gRPC method's name
        return check(request, context)

    def Watch(request, context, send_response_callback=None):  # noqa: N802
        with watching_lock:
            full = watching[0] >= MAX_HEALTH_WATCHES
            if not full:
                watching[0] += 1
        if full:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{MAX_HEALTH_WATCHES} health Watch streams are open on this server (MAX_HEALTH_WATCHES); "
                          "use Check, or close one")

        def closed():
            with watching_lock:
                watching[0] -= 1

        context.add_callback(closed)
        return watch(request, context, send_response_callback)

    Check.experimental_thread_pool = _health_pool  # grpcio runs a handler with this attribute on that pool
    Watch.experimental_non_blocking = watch.experimental_non_blocking  # answered from callbacks, as the original
    Watch.experimental_thread_pool = watch.experimental_thread_pool
    servicer.Check, servicer.Watch = Check, Watch
    return servicer


@dataclass(frozen=True)
class Serving:
    """How `semigrad serve` serves (every worker process gets a copy). `store`: a SQLite path,
    redis://host:port/db, or None (memory). `drain`: seconds between health going NOT_SERVING and
    refusing new calls on SIGTERM (so load balancers stop routing first); in-flight calls then get
    `grace` seconds to finish. `metrics_port`: serve Prometheus metrics there (None: off)."""

    limits: Limits = field(default_factory=Limits)
    threads: int = 8
    grace: float = 5.0
    drain: float = 0.0
    store: str | None = None
    shared_memory: bool = True
    tokens: Tokens = field(default_factory=Tokens)
    tls: TlsFiles | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"  # the metrics name the tenants: loopback unless the operator says otherwise
    log_format: str = "text"
    slots_directory: str | None = None  # set by the supervisor for its workers (slots.py)


def serve(host: str, port: int, *, workers: int = 1, config: Serving | None = None, **options) -> None:
    """Serve until SIGINT or SIGTERM, then drain and stop gracefully (see Serving; `options` are
    Serving's fields, for callers without one).

    `workers` > 1 runs that many processes on the same port, so CPU-bound requests use every
    core; they need a shared store (SQLite or Redis) to see each other's graphs."""
    config = config or Serving(**options)
    _check_store(config.store)
    if not config.tokens.enabled and not _is_loopback(host):
        log.warning("serving %s without authentication: any client that reaches it may use it "
                    "(give --tokens FILE or $SEMIGRAD_TOKENS; docs/deploying.md)", host)
    with metrics_exposed(config, workers):
        if workers > 1:
            if config.store is None:
                raise ValueError("several workers need a shared store: give --store PATH or redis://...")
            if port == 0:
                raise ValueError("several workers need a fixed --port")
            _check_port_free(host, port)
            _supervise(host, port, workers=workers, config=config)
        else:
            limit_blas_threads()  # the workers of _supervise get theirs through the environment
            _serve_one(host, port, config=config, reuse_port=False)


def _check_store(spec: str | None) -> None:
    """ValueError now, in the one process, for a store that cannot be opened (an unknown scheme, a
    SQLite file that cannot be created), rather than a traceback or worker after worker dying of it.
    (A Redis that cannot be reached is not refused: replicas keep running and answer UNAVAILABLE.)"""
    try:
        open_store(spec).close()
    except errors.SemigradError as e:
        raise ValueError(str(e)) from None
    except sqlite3.Error as e:
        raise ValueError(f"--store {spec}: {e}") from None


def _check_port_free(host: str, port: int) -> None:
    """OSError unless `host:port` is free. The workers bind it with SO_REUSEPORT, which the kernel
    grants beside any other process of this user that bound it so too: a second `semigrad serve
    --workers N` on a port another one serves started without a word and took a share of its
    connections (with other tokens, or none: 12 of 20 token-less clients were served beside a
    server with tokens). A bind without SO_REUSEPORT fails beside any listener."""
    try:
        addresses = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # gRPC reports a host it cannot resolve
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: a closed socket's TIME_WAIT is no user
            try:
                probe.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise OSError(f"{host}:{port} is in use (another server listens there): stop it first, or give "
                                  f"another --port") from None
                # anything else (an address family this host lacks...) is gRPC's to report, or to skip


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", "::1", "[::1]") or host.startswith("127.")


def _serve_one(host, port, *, config: Serving, reuse_port: bool, ready=None) -> None:
    """Serve until SIGINT/SIGTERM; `ready` (an event) is set once the server has started."""
    reuse_freed_memory()
    metrics = Metrics.for_process() if config.metrics_port is not None else None
    store = open_store(config.store)
    engine = Engine(config.limits, store=metrics.counting(store) if metrics else store)
    health: list = []
    server, bound, _ = build_server(f"{host}:{port}", limits=config.limits, threads=config.threads, engine=engine,
                                    reuse_port=reuse_port, shared_memory=config.shared_memory, tokens=config.tokens,
                                    tls=config.tls, metrics=metrics, health_out=health,
                                    slots_directory=config.slots_directory)
    # What is here now (modules, plugins, the store) lives as long as the worker: out of the
    # collector's generations, so that a full collection during a request scans only what requests
    # made (one collection is one C call that no deadline interrupts).
    gc.collect()
    gc.freeze()
    server.start()
    if ready is not None:
        ready.set()
    log.info("semigrad serving on %s:%d (store: %s; shared memory: %s; auth: %s; tls: %s)", host, bound,
             store.name, "on" if config.shared_memory else "off",
             f"{len(set(config.tokens.tenants.values()))} tenants" if config.tokens.enabled else "off",
             ("mutual" if config.tls.client_ca else "on") if config.tls else "off")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # A timed wait: when a signal lands on one of grpc's threads, CPython only flags it, and
    # the handler runs once the main thread wakes up; an untimed wait could sleep forever.
    while not stop.wait(SIGNAL_POLL_SECONDS):
        pass
    # Readiness first: health checks now answer NOT_SERVING, so load balancers take this
    # process out of rotation; calls keep being served for `drain` seconds, then new ones are
    # refused and the ones in flight get `grace` seconds to finish.
    health[0].enter_graceful_shutdown()
    log.info("draining: health NOT_SERVING; refusing new calls in %.1fs, then %.1fs for calls in flight",
             config.drain, config.grace)
    time.sleep(config.drain)
    server.stop(config.grace).wait()
    store.close()
    log.info("stopped")


# A worker that dies is replaced. Deaths in quick succession (a worker that cannot start, or a
# request that kills every worker it reaches) are spaced by a growing pause; past
# MAX_RAPID_DEATHS of them in a row the supervisor gives up and exits non-zero.
RAPID_DEATH_SECONDS = 10.0  # a worker that died before serving, or served less than this, died "rapidly"
MAX_RAPID_DEATHS = 5
RESTART_PAUSE_SECONDS = (0.25, 0.5, 1.0, 2.0)




class SupervisorGaveUp(RuntimeError):
    """No worker could be kept alive."""


def _supervise(host, port, *, workers, config: Serving) -> None:
    """Start the worker processes and keep `workers` of them alive (replacing any that dies) until
    SIGINT/SIGTERM, which is forwarded to them; raises SupervisorGaveUp when workers keep dying."""
    context = multiprocessing.get_context("spawn")
    level = logging.getLogger().level
    # One worker per CPU, so each one's BLAS runs on one thread: N workers × N BLAS threads
    # oversubscribe the CPUs (a batched matmul measured 0.4-1.8 s against 6-9 ms on one thread).
    # The spawned workers read these when NumPy loads; a setting of the operator's own wins.
    for variable in BLAS_THREAD_VARIABLES:
        os.environ.setdefault(variable, "1")
    # Every worker counts each tenant's calls in flight in the same files, so the quota holds for
    # the server, not per worker (slots.py).
    slots_directory = make_directory() if config.limits.max_tenant_requests else None
    config = dataclasses.replace(config, slots_directory=slots_directory)

    def start(slot: int) -> _Worker:
        ready = context.Event()
        process = context.Process(target=_worker_main, args=(host, port, level, config, ready),
                                  name=f"semigrad-worker-{slot}")
        process.start()
        return _Worker(process, ready)

    procs = [start(slot) for slot in range(workers)]
    log.info("semigrad supervising %d workers on %s:%d", workers, host, port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    rapid_deaths = 0
    try:
        while not stop.wait(SIGNAL_POLL_SECONDS):
            for slot, worker in enumerate(procs):
                process = worker.process
                if process.is_alive() or stop.is_set():
                    worker.notice_ready()
                    continue
                served = worker.served_seconds()
                rapid_deaths = rapid_deaths + 1 if served is None or served < RAPID_DEATH_SECONDS else 0
                log.error("worker %d (pid %d) exited with %s %s; replacing it", slot, process.pid,
                          _exit_status(process.exitcode),
                          "before it could serve" if served is None else f"after serving {served:.1f} s")
                process_dead(process.pid)
                if rapid_deaths > MAX_RAPID_DEATHS:
                    raise SupervisorGaveUp(f"{rapid_deaths} workers in a row exited before serving or within "
                                           f"{RAPID_DEATH_SECONDS:.0f} s of it")
                if stop.wait(RESTART_PAUSE_SECONDS[min(rapid_deaths, len(RESTART_PAUSE_SECONDS)) - 1]
                             if rapid_deaths else 0.0):
                    break
                procs[slot] = start(slot)
    finally:
        for worker in procs:
            if worker.process.is_alive():
                worker.process.terminate()  # SIGTERM: each worker stops gracefully
        for worker in procs:
            worker.process.join(config.drain + config.grace + 5)
            if worker.process.is_alive():
                worker.process.kill()
        if slots_directory is not None:
            remove_directory(slots_directory)


class _Worker:
    """A worker process and when it began serving (its `ready` event, set once its server started)."""

    def __init__(self, process, ready):
        self.process, self.ready = process, ready
        self.serving_since: float | None = None

    def notice_ready(self) -> None:
        if self.serving_since is None and self.ready.is_set():
            self.serving_since = time.monotonic()

    def served_seconds(self) -> float | None:
        """How long it served before it died (None: it never started serving)."""
        self.notice_ready()
        return None if self.serving_since is None else time.monotonic() - self.serving_since


def _exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


def _worker_main(host, port, level, config: Serving, ready=None) -> None:
    logs.configure(level, config.log_format)
    _stop_with_supervisor()
    _serve_one(host, port, config=config, reuse_port=True, ready=ready)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _stop_with_supervisor() -> None:
    """SIGTERM this worker (a graceful stop) when its supervisor dies, however it dies: a
    supervisor killed with SIGKILL left its workers serving as orphans, holding the port and
    answering calls nobody supervised (found by an attacker). Linux only (prctl's parent-death
    signal); elsewhere the orphans remain."""
    supervisor = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError, TypeError):
        return
    if os.getppid() != supervisor:  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)
