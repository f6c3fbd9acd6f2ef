"""A gradient call with hooks that run in this process: the GradientWithHooks stream, on which
the server pauses at a hooked node, sends a HookCall, and waits for the client's HookReply."""

from __future__ import annotations

import queue
from collections.abc import Callable

import numpy as np

from . import codec
from .errors import InvalidArgument, SemigradError
from .hooks import Contribution
from .messages import Gradients, gradients_from
from .transport import Transport
from .v1 import semigrad_pb2 as pb


def gradient_with_client_hooks(transport: Transport, request: pb.GradientRequest,
                               local: dict[tuple[str, str], Callable]) -> Gradients:
    """Run `request` (its tensors inline), answering each HookCall with the function `local`
    has for its (node, kind). A hook that raises is reported to the server, and its exception
    raised here once the call ends."""
    outgoing: queue.Queue = queue.Queue()
    outgoing.put(pb.HookStreamRequest(start=request))
    failure: list[BaseException] = []

    def requests():
        while (item := outgoing.get()) is not None:
            yield item

    try:
        for message in transport.stream("GradientWithHooks", requests()):
            if message.WhichOneof("kind") == "result":
                return gradients_from(message.result)
            call = message.call
            reply = pb.HookReply(call=call.call)
            try:
                fn = local[call.node, call.kind]
                if call.kind == "post":
                    value = fn(codec.from_tensor(call.contributions[0].value))
                else:
                    value = fn([Contribution(c.consumer, c.operand, codec.from_tensor(c.value))
                                for c in call.contributions])
                reply.value.CopyFrom(codec.to_tensor(returned(value, call)))
            except Exception as e:  # the user's hook failed: tell the server, then re-raise it here
                failure.append(e)
                reply.error = f"{type(e).__name__}: {e}"
            outgoing.put(pb.HookStreamRequest(reply=reply))
    except SemigradError as error:
        if failure:
            raise failure[0] from error
        raise
    finally:
        outgoing.put(None)
    raise SemigradError("the server closed GradientWithHooks without a result")


def returned(value, call) -> np.ndarray:
    """A hook's returned gradient as float64, refused (InvalidArgument naming the hook) when the
    cast would change it: an imaginary part, strings, a number past float64."""
    try:
        return codec.cast(value, np.float64, f"the value the {call.kind} hook on node '{call.node}' returned")
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
