"""The one place where an exception a request raised becomes a gRPC status.

* A `SemigradError` carries its own status (the client's fault, a limit, a deadline...).
* Running out of memory or recursion depth on a request's behalf is RESOURCE_EXHAUSTED.
* Anything else is a server bug: INTERNAL, with a short trace id in the message and the
  traceback logged under that id, so a client's report leads to the log line.

Every message is cut to MAX_MESSAGE_CHARS (the cut is marked): a status message travels in
an HTTP/2 header, and one past gRPC's 16 KiB header limit would reach the client as
RESOURCE_EXHAUSTED "metadata size exceeds hard limit" instead of the real error.

Requests are decoded by `decoder`, which never raises: bytes that are not a valid message
(or hold invalid UTF-8 in a string field) reach the handler as an `Undecodable`, answered
INVALID_ARGUMENT, where grpcio's own decoding would answer INTERNAL before any handler ran.
A large Gradient, Evaluate or GradientStream request is decoded as the client decodes large
responses (semigrad.wire.Reader): its inline tensors are read as views of the received bytes,
not copied into the message and out again. (With its response written by wire.Outgoing, a det4
batch of 10,000 matrices spends 0.85 ms in the server's decoding and encoding, not 1.7.)
"""

from __future__ import annotations

import contextvars
import logging
import secrets
from dataclasses import dataclass
from typing import Callable, Iterator

import grpc
from semigrad import wire

from .. import errors

log = logging.getLogger("semigrad.rpc")

MAX_MESSAGE_CHARS = 1000


def status_of(error: BaseException, where: str) -> tuple[grpc.StatusCode, str]:
    """The status code and (bounded) message answering a request that raised `error` in `where`
    (an RPC's name, for the log)."""
    if isinstance(error, errors.SemigradError):
        return getattr(grpc.StatusCode, error.status), bounded(str(error))
    trace = secrets.token_hex(4)
    if isinstance(error, (MemoryError, RecursionError)):
        log.warning("trace=%s %s ran out of %s", trace, where,
                    "memory" if isinstance(error, MemoryError) else "recursion depth", exc_info=error)
        what = "memory" if isinstance(error, MemoryError) else "stack (the request is nested too deeply)"
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"the request ran out of {what} (trace {trace})"
    log.error("trace=%s internal error in %s", trace, where, exc_info=error)
    return grpc.StatusCode.INTERNAL, bounded(f"internal error (trace {trace}): {type(error).__name__}: {error}")


def bounded(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`message`, cut to at most `limit` characters with the cut marked."""
    if len(message) <= limit:
        return message
    mark = f"... [message cut: {len(message)} characters]"
    return message[: limit - len(mark)] + mark


# ---------------------------------------------------------------- request decoding


@dataclass(frozen=True)
class Undecodable:
    """What a handler receives in place of a request whose bytes do not parse."""

    message: str  # the message type expected
    error: str

    def refusal(self) -> errors.InvalidArgument:
        return errors.InvalidArgument(f"the request is not a valid {self.message}: {self.error}")


# Requests of these types at wire.THRESHOLD bytes or more are decoded by wire.Reader: the path to
# the message whose tensor maps it reads as views. (A stream's messages are read one at a time,
# each before the next is decoded; a marker names the message it was written for.)
TENSOR_REQUESTS = {"semigrad.v1.GradientRequest": (), "semigrad.v1.EvaluateRequest": (),
                   "semigrad.v1.GradientStreamRequest": ("request",)}
# The received bytes of the request the current call decoded by wire.Reader (set by `decoded`).
RECEIVED: contextvars.ContextVar[wire.Received | None] = contextvars.ContextVar("semigrad_received", default=None)


def decoder(message_class) -> Callable[[bytes], object]:
    """A request deserializer for gRPC that returns an `Undecodable` instead of raising (and a
    wire.Received for a large request of a TENSOR_REQUESTS type)."""
    name = message_class.DESCRIPTOR.full_name
    parse = message_class.FromString
    reader = wire.Reader(message_class, TENSOR_REQUESTS[name]) if name in TENSOR_REQUESTS else None

    def decode(data: bytes):
        try:
            return parse(data) if reader is None or len(data) < wire.THRESHOLD else reader(data)
        except Exception as e:  # noqa: BLE001 - DecodeError, or whatever the protobuf runtime raises
            return Undecodable(name, bounded(str(e) or type(e).__name__, 200))

    return decode


def decoded(request):
    """The request message, or the INVALID_ARGUMENT refusal of one that did not decode. A
    wire.Received becomes the current call's RECEIVED (its tensors read by `received_array`)."""
    if isinstance(request, wire.Received):
        RECEIVED.set(request)
        return request.message
    if isinstance(request, Undecodable):
        raise request.refusal()
    return request


def received_array(tensor, what: str):
    """The array of a tensor wire.Reader marked in the current call's request (its bytes a view
    of the received bytes), or None for any other tensor."""
    received = RECEIVED.get()
    if received is None or tensor.WhichOneof("payload") != "shared" or not tensor.shared.region.startswith(wire.MARK):
        return None
    try:
        return received.read(tensor)
    except ValueError as e:
        raise errors.InvalidArgument(f"{what}: {e}") from None


def decoded_stream(requests) -> Iterator:
    """The messages of a request stream; raises INVALID_ARGUMENT at the first that did not decode,
    and CANCELLED when the client went away while the server waited for its next message (grpcio
    raises a bare RpcError there: not a server bug, so not INTERNAL)."""
    iterator = iter(requests)
    while True:
        try:
            request = next(iterator)
        except StopIteration:
            return
        except grpc.RpcError:
            raise errors.Cancelled("the client cancelled the call (or its connection closed) before it "
                                   "ended its request stream") from None
        yield decoded(request)


def add_service(servicer, server: grpc.Server, service, messages) -> None:
    """Register `servicer` for the protobuf service descriptor `service` (method handlers of the
    right streaming kinds, as generated code builds them), decoding requests with `decoder`.
    `messages`: the generated module holding the request and response classes."""
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    handlers = {}
    for method in service.methods:
        request_class = getattr(messages, method.input_type.name)
        response_class = getattr(messages, method.output_type.name)
        handlers[method.name] = kinds[method.client_streaming, method.server_streaming](
            getattr(servicer, method.name), request_deserializer=decoder(request_class),
            response_serializer=wire.serialize)  # (messages, and responses written by wire.Outgoing)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
