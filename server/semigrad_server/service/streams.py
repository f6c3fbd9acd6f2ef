"""Streaming calls cannot starve a worker: a bounded number run at once (per worker and per
client connection, RESOURCE_EXHAUSTED past either), on threads of their own (server.py adds
`max_streams` threads to the pool, so unary calls always find one; health checks have threads of
their own, server.HEALTH_THREADS), and a
stream waiting for its client's next message ends at the call's deadline (the server's
default when the client set none) instead of holding its thread for ever."""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

from ..deadline import Bound
from ..errors import Cancelled, DeadlineExceeded, ResourceExhausted
from ..limits import Limits


class StreamSlots:
    """Counts the streaming calls in flight, in all and per peer (one HTTP/2 connection)."""

    def __init__(self, limits: Limits):
        self.total = limits.max_streams
        self.per_connection = limits.max_streams_per_connection
        self._running = 0
        self._by_peer: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def taken(self, peer: str, method: str):
        """Hold a slot for the body; RESOURCE_EXHAUSTED at once when there is none."""
        with self._lock:
            if self._running >= self.total:
                raise ResourceExhausted(f"{method}: this worker is serving {self._running} streams already "
                                        f"(limit max_streams = {self.total}); retry later")
            mine = self._by_peer.get(peer, 0)
            if mine >= self.per_connection:
                raise ResourceExhausted(f"{method}: this connection has {mine} streams open already "
                                        f"(limit max_streams_per_connection = {self.per_connection})")
            self._running += 1
            self._by_peer[peer] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                left = self._by_peer[peer] - 1
                if left:
                    self._by_peer[peer] = left
                else:
                    del self._by_peer[peer]


_CALL_ENDED = object()  # the client's message stream failed: the call ended under it


def pumped(messages: Iterable, bound: Bound, what: str, idle: float | None = None,
           live: Callable[[], bool] | None = None) -> Iterator:
    """The client's messages, read on a thread of their own so that waiting for the next one
    ends (DeadlineExceeded) when `bound` passes, or after `idle` seconds without a message (the
    server's max_request_seconds: a client's own far deadline must not hold a stream slot idle
    for longer). The reader ends with the call. `live`: whether the call still runs (the
    context's is_active), so that messages ending because the call did (grpcio's iterator may
    just stop at the deadline) are not taken for the client's half-close."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read():
        try:
            for message in messages:
                inbox.put((True, message))
            inbox.put((False, None if live is None or live() else _CALL_ENDED))
        except Exception:  # noqa: BLE001 - gRPC's iterator raises when the call ends (cancelled, deadline)
            inbox.put((False, _CALL_ENDED))

    threading.Thread(target=read, name="semigrad-stream-reader", daemon=True).start()
    while True:
        remaining = max(0.0, bound.remaining())
        try:
            more, item = inbox.get(timeout=remaining if idle is None else min(remaining, idle))
        except queue.Empty:
            if idle is not None and idle < remaining:
                raise DeadlineExceeded(f"the client sent no message on {what} for {idle:g} s (max_request_seconds "
                                       "bounds each wait for a stream's next message)") from None
            raise bound.error(f"waiting for the client's next message on {what}") from None
        if not more:
            if item is _CALL_ENDED:  # the client's fault or choice, not the server's: never INTERNAL
                if bound.expired():
                    raise bound.error(f"reading the client's messages on {what}")
                raise Cancelled(f"the client went away while sending its messages on {what}")
            return
        yield item
