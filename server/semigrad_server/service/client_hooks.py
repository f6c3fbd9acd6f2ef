"""Client hooks over a bidirectional stream: the backward pass runs in a worker thread;
when it reaches a client hook it sends a HookCall and waits for the client's HookReply.

The worker never outlives the call: when the client disconnects, cancels or misses the
deadline, the waiting hook raises, the plan unwinds, and the thread ends."""

from __future__ import annotations

import contextvars
import itertools
import queue
import threading
import time

import numpy as np
from semigrad.v1 import semigrad_pb2 as pb

from .. import errors
from . import convert

_CLOSED = object()  # the call ended: cancelled, deadline, the client went away
_ENDED = object()  # the client closed its side of the stream: no more replies will come
NO_DEADLINE = 1e8  # seconds; longer "deadlines" mean none


class ClientHookError(errors.SemigradError):
    """The client's hook function failed; the call ends with ABORTED and its message."""

    status = "ABORTED"


class ClientHookChannel:
    def __init__(self, deadline: float | None):
        self.deadline = deadline
        self.outgoing: queue.Queue = queue.Queue()  # ("call", HookCall) | ("result", response) | ("error", exc)
        self.replies: queue.Queue = queue.Queue()  # HookReply, or _CLOSED
        self._ids = itertools.count()

    def close(self) -> None:
        self.replies.put(_CLOSED)

    def end(self) -> None:
        self.replies.put(_ENDED)

    def call(self, slot, contributions) -> np.ndarray:
        """Called by a hook_post/hook_pre kernel in the worker thread."""
        call_id = next(self._ids)
        self.outgoing.put(("call", pb.HookCall(
            call=call_id, node=slot.node, kind=slot.kind,
            contributions=[pb.HookContribution(consumer=c, operand=o, value=convert.codec.to_tensor(np.asarray(v)))
                           for c, o, v in contributions])))
        timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise errors.DeadlineExceeded(f"deadline exceeded waiting for the client hook on node '{slot.node}'") from None
        if reply is _CLOSED:
            raise errors.Cancelled(f"the client went away during its hook on node '{slot.node}'")
        if reply is _ENDED:
            raise errors.InvalidArgument(f"the client closed its stream without answering hook call {call_id} "
                                         f"(node '{slot.node}')")
        if reply.call != call_id:
            raise errors.InvalidArgument(f"hook reply {reply.call} does not answer call {call_id}")
        if reply.error:
            raise ClientHookError(f"client hook on node '{slot.node}' failed: {reply.error}")
        value = np.array(convert.tensor_to_array(reply.value, f"hook reply for node '{slot.node}'"))
        expected = np.broadcast_shapes(*(np.shape(v) for _, _, v in contributions))
        if value.shape != expected:
            raise errors.InvalidArgument(f"client hook on node '{slot.node}' returned shape {list(value.shape)}, "
                                         f"expected {list(expected)}")
        return value


def run_with_client_hooks(request_iterator, context, start_work) -> object:
    """Generator body of GradientWithHooks. `start_work(channel)` computes the GradientResponse."""
    first = next(request_iterator, None)
    if first is None or first.WhichOneof("kind") != "start":
        raise errors.InvalidArgument("GradientWithHooks must open with a `start` message")
    remaining = context.time_remaining()  # without a client deadline grpc reports a huge number
    channel = ClientHookChannel(None if remaining is None or remaining > NO_DEADLINE else time.monotonic() + remaining)

    def work():
        try:
            channel.outgoing.put(("result", start_work(first.start, channel)))
        except BaseException as e:  # noqa: BLE001 - every failure must reach the caller
            channel.outgoing.put(("error", e))

    def pump():
        try:
            for message in request_iterator:
                if message.WhichOneof("kind") == "reply":
                    channel.replies.put(message.reply)
        except Exception:  # the client went away: the reader sees _CLOSED
            channel.close()
        else:
            channel.end()

    context.add_callback(channel.close)
    # The backward pass runs as the caller (its tenant, its request id): in a copy of this context.
    threading.Thread(target=contextvars.copy_context().run, args=(work,), name="semigrad-hook-run", daemon=True).start()
    threading.Thread(target=pump, name="semigrad-hook-replies", daemon=True).start()
    while True:
        kind, item = channel.outgoing.get()
        if kind == "call":
            yield pb.HookStreamResponse(call=item)
        elif kind == "result":
            yield pb.HookStreamResponse(result=item)
            return
        else:
            raise item
