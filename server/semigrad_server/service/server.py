"""Builds and runs the gRPC server: graph service, standard health and reflection services."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc

from ..engine import Engine
from ..limits import Limits
from .servicer import GraphServicer

log = logging.getLogger("semigrad.server")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GraphService"].full_name


def build_server(address: str = "127.0.0.1:0", *, limits: Limits | None = None, threads: int = 8,
                 engine: Engine | None = None) -> tuple[grpc.Server, int, Engine]:
    """Create a server bound to `address` (port 0: an ephemeral port); return it, the port and its engine."""
    limits = limits or Limits()
    engine = engine or Engine(limits)
    options = [("grpc.max_receive_message_length", limits.max_message_bytes),
               ("grpc.max_send_message_length", limits.max_message_bytes),
               ("grpc.so_reuseport", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="semigrad"),
                         options=options)
    pb_grpc.add_GraphServiceServicer_to_server(GraphServicer(engine), server)
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


def serve(host: str, port: int, *, limits: Limits | None = None, threads: int = 8, grace: float = 5.0) -> None:
    """Serve until SIGINT or SIGTERM, then stop gracefully (in-flight calls get `grace` seconds)."""
    server, bound, _ = build_server(f"{host}:{port}", limits=limits, threads=threads)
    server.start()
    log.info("semigrad serving on %s:%d", host, bound)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("shutting down (grace %.1fs)", grace)
    server.stop(grace).wait()
