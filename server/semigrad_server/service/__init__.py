"""The gRPC layer: the only part of the server that knows gRPC.

`build_server` and `serve` are imported on first use, so the in-process front end (local.py)
does not load the gRPC server, health and reflection services it never runs."""

from __future__ import annotations

__all__ = ["build_server", "serve"]


def __getattr__(name: str):
    if name in __all__:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
