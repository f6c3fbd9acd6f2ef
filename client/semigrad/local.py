"""The engine in this process, behind the transport interface (see transport.py): what
``semigrad.Client()`` without an address uses. Calls go to the server package's in-process
front end (semigrad_server.service.local), imported when such a client is made, never when
this package is imported, so the thin client installs and imports without the server."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from . import codec
from .transport import Tensors, fill, message_at

NEEDS_SERVER = ("semigrad.Client() without an address runs the engine in this process, which needs the "
                "server package (semigrad_server: install the full 'semigrad' distribution, e.g. "
                "`pip install -e .` in a clone); with only the thin client installed, give a server's "
                "address: semigrad.Client('host:port')")


class LocalTransport:
    """The transport of a Client without an address: the same calls as :class:`Transport`,
    answered by an engine in this process. Nothing travels, so there is no shared memory."""

    shared_memory = False
    shared_memory_threshold = 0
    shared_memory_off = "the engine runs in this process"

    def __init__(self, *, timeout: float | None, limits=None, engine=None):
        try:
            from semigrad_server.service.local import LocalService
        except ImportError as e:
            if (e.name or "").split(".")[0] != "semigrad_server":
                raise  # the server package is there but something it needs is not: say that
            raise ImportError(NEEDS_SERVER, name=e.name) from e
        self.service = LocalService(engine, limits=limits)
        self.timeout = timeout

    @property
    def engine(self):
        """The in-process engine (semigrad_server.engine.Engine)."""
        return self.service.engine

    def call(self, method: str, request):
        return self.service.unary(method, request, self.timeout)

    def stream(self, method: str, requests):
        return self.service.stream(method, requests, self.timeout)

    def tensor_call(self, method: str, request, tensors: Tensors, result_bytes: Callable[[], int], decode: Callable):
        fill(request, tensors, None)
        return decode(self.call(method, request), codec.from_tensor)

    def tensor_stream(self, method: str, requests):
        for response in self.stream(method, requests):
            yield response, codec.from_tensor

    @staticmethod
    def outgoing(message, tensors: Tensors, path: tuple[str, ...] = ()):
        fill(message_at(message, path), tensors, None)
        return message

    # ---------------------------------------------------------------- the hot path: arrays, no messages
    def gradient(self, graph_id: str, inputs: Mapping[str, np.ndarray], wrt: tuple[str, ...],
                 outputs: tuple[str, ...], return_outputs: bool, backend: str, semiring: str | tuple[str, ...] = "real"):
        """A gradient with nothing beyond these (one semiring, or several as a tuple of names) straight
        from arrays: ``(gradients, outputs)``, the gradients by semiring name for a tuple, or None to
        take the message path."""
        return self.service.gradient(graph_id, inputs, wrt, outputs, return_outputs, backend, self.timeout, semiring)

    def evaluate(self, graph_id: str, inputs: Mapping[str, np.ndarray], outputs: tuple[str, ...],
                 nodes: tuple[str, ...], backend: str):
        """``{output or node: value}`` straight from arrays, or None to take the message path."""
        return self.service.evaluate(graph_id, inputs, outputs, nodes, backend, self.timeout)

    # ---------------------------------------------------------------- no shared memory here
    def placement(self, tensors: Tensors, result_bytes: Callable[[], int]):
        return None

    def shared_memory_refused(self, error) -> bool:
        return False

    def release(self, region) -> None:  # pragma: no cover - nothing is ever lent
        region.close()

    def regions(self) -> list[str]:
        return []

    def close(self) -> None:
        pass
