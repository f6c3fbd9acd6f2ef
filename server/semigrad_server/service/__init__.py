"""The gRPC layer: the only part of the server that knows gRPC."""

from .server import build_server, serve

__all__ = ["build_server", "serve"]
