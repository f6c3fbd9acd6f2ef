"""The connection to a server: the gRPC channel and its deadline, call errors as
:class:`SemigradError`, and where a call's tensors travel: inline in the message, or through a
region of the client's shared-memory pool (see shared_memory.py and docs/performance.md)."""

from __future__ import annotations

import json
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping

import grpc
import numpy as np

from . import codec, wire
from .errors import FailedPrecondition, SemigradError, from_rpc_error
from .shared_memory import Placement, RegionPool, is_local_target, tensor_bytes
from .shared_memory import available as shared_memory_available
from .v1 import semigrad_pb2 as pb
from .v1 import semigrad_pb2_grpc as pb_grpc

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# shared_memory="auto": a call's tensors (request and expected response) from this many bytes
# on go through shared memory. Measured crossover on loopback: see docs/performance.md.
SHARED_MEMORY_THRESHOLD = 128 * 1024

Tensors = Mapping[str, Mapping[str, np.ndarray]]  # {request field: {name: array}}

# Every semigrad call is idempotent (graphs are content-addressed, requests compute pure
# functions), so a call that fails with UNAVAILABLE before any response (a server restarting, a
# replica or worker that died with the connection) is retried: up to 5 attempts, backing off
# 0.1 s, 0.2 s, 0.4 s, 0.8 s (with gRPC's jitter). Pass the channel option "grpc.service_config"
# to change it, or ("grpc.enable_retries", 0) to turn it off (docs/conventions.md).
RETRY_POLICY = {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"]}
METHOD_CONFIG = [{"name": [{"service": "semigrad.v1.GraphService"}], "retryPolicy": RETRY_POLICY}]
SERVICE_CONFIG = json.dumps({"methodConfig": METHOD_CONFIG})
# A target that may name several servers (dns:///name resolving to every replica, ipv4:a,b) is
# balanced call by call over all of them (round_robin), rather than pinned to the first (gRPC's
# default, pick_first); a failed replica leaves the rotation and its calls are retried on others.
BALANCED_SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}], "methodConfig": METHOD_CONFIG})
BALANCED_SCHEMES = ("dns:", "ipv4:", "ipv6:")
AUTHORIZATION = "authorization"

# gRPC's retry policy stops once an answer has begun. Behind an L7 load balancer a replica killed
# while answering leaves the client a stream that began and then broke: no status from any
# server, only gRPC's own transport messages with UNKNOWN or INTERNAL. Every semigrad call is
# idempotent, so such a unary call is made again (twice more at most, after 0.1 s and 0.2 s).
# Statuses a server sends are never retried here: the server's INTERNAL carries its own message.
BROKEN_STREAM = re.compile(r"^(Stream removed|Received RST_STREAM|Socket closed|Connection reset|"
                           r"Received http2 header with status: 50[234])")
BROKEN_STREAM_ATTEMPTS = 3
BROKEN_STREAM_BACKOFF = 0.1


def broken_stream(error: grpc.RpcError) -> bool:
    """Whether a failed call's stream broke in transit (see BROKEN_STREAM)."""
    code = error.code() if hasattr(error, "code") else None
    details = (error.details() if hasattr(error, "details") else "") or ""
    return code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL) and BROKEN_STREAM.match(details) is not None


def service_config(target: str) -> str:
    """The default gRPC service config of a channel to `target`: the retry policy, and
    round_robin for targets that may resolve to several servers."""
    return BALANCED_SERVICE_CONFIG if target.strip().startswith(BALANCED_SCHEMES) else SERVICE_CONFIG


def _pem(value: bytes | str | None) -> bytes | None:
    """PEM bytes, or the contents of the file a str names."""
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


def tls_credentials(root_certificates: bytes | str | None = None, private_key: bytes | str | None = None,
                    certificate_chain: bytes | str | None = None) -> grpc.ChannelCredentials:
    """Channel credentials for TLS: the CA to trust (None: the system's roots), and for mutual
    TLS the client's key and certificate chain (PEM bytes, or paths of PEM files)."""
    if (private_key is None) != (certificate_chain is None):
        raise ValueError("mutual TLS needs both a private key and a certificate chain")
    return grpc.ssl_channel_credentials(_pem(root_certificates), _pem(private_key), _pem(certificate_chain))


def bearer_token(token: str | None) -> str | None:
    """`token` without surrounding whitespace (read from a file, it often ends with a newline, which
    gRPC refuses in a header: every call failed INTERNAL "Invalid metadata", as if the server had a
    bug); ValueError for one no header can carry (not printable ASCII)."""
    if token is None:
        return None
    token = token.strip()
    if not (token.isascii() and token.isprintable()):
        raise ValueError("the token must be printable ASCII characters (a bearer token as the server's token file "
                         "holds it)")
    return token or None


class Transport:
    """A channel to `target` and the shared-memory policy of its calls (the options, and their
    defaults, are :class:`semigrad.Client`'s, which documents them)."""

    def __init__(self, target: str, *, timeout: float | None, options: Iterable[tuple[str, object]] | None,
                 max_message_bytes: int, credentials: grpc.ChannelCredentials | None, shared_memory: bool | str,
                 shared_memory_threshold: int, token: str | None = None):
        if shared_memory not in ("auto", True, False):
            raise ValueError(f"shared_memory must be 'auto', True or False, not {shared_memory!r}")
        if shared_memory is True and not shared_memory_available():
            raise ValueError("shared_memory=True needs a writable /dev/shm on this host")
        self.shared_memory = shared_memory
        self.shared_memory_threshold = shared_memory_threshold
        # Why "auto" stopped using shared memory (None while it may).
        self.shared_memory_off: str | None = None
        if shared_memory == "auto" and not (is_local_target(target) and shared_memory_available()):
            self.shared_memory_off = "the target is not on this host" if shared_memory_available() \
                else "no writable /dev/shm"
        elif shared_memory is False:
            self.shared_memory_off = "shared_memory=False"
        self._pool: RegionPool | None = None
        self._pool_lock = threading.Lock()
        # Gives a call's region back; held by lent results, so it must not keep the transport alive.
        self.release = _releaser(weakref.ref(self))
        # No HTTP/2 or TCP tuning: see build_server in semigrad_server/service/server.py for what
        # was measured (nothing beat the noise).
        channel_options = {
            "grpc.max_send_message_length": max_message_bytes,
            "grpc.max_receive_message_length": max_message_bytes,
            "grpc.service_config": service_config(target),
            **dict(options or ()),
        }
        # gradient_many resumes a broken stream as gRPC retries a call, unless retries are off
        self.retries = bool(channel_options.get("grpc.enable_retries", 1))
        channel_options = list(channel_options.items())
        if credentials is None:
            self.channel = grpc.insecure_channel(target, channel_options)
        else:
            self.channel = grpc.secure_channel(target, credentials, channel_options)
        self.stub = pb_grpc.GraphServiceStub(self.channel)
        self._tensor_calls: dict[str, Callable] = {}  # method -> its multi-callable through wire.py
        self.timeout = timeout
        # Sent with every call: the bearer token that says which tenant calls (see Client).
        token = bearer_token(token)
        self.metadata = ((AUTHORIZATION, f"Bearer {token}"),) if token else None

    def call(self, method: str, request, callable_=None):
        """The response of unary `method`, errors as SemigradError. A call whose stream broke after
        the answer began (see BROKEN_STREAM) is made again, up to BROKEN_STREAM_ATTEMPTS in all."""
        callable_ = callable_ or getattr(self.stub, method)
        for attempt in range(1, BROKEN_STREAM_ATTEMPTS + 1):
            try:
                return callable_(request, timeout=self.timeout, metadata=self.metadata)
            except grpc.RpcError as error:
                if attempt == BROKEN_STREAM_ATTEMPTS or not broken_stream(error):
                    raise from_rpc_error(error) from error
            time.sleep(BROKEN_STREAM_BACKOFF * attempt)

    def stream(self, method: str, requests, callable_=None):
        """Responses of a streaming call, errors of the call itself as SemigradError."""
        try:
            yield from (callable_ or getattr(self.stub, method))(requests, timeout=self.timeout,
                                                                 metadata=self.metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from error

    def tensor_stream(self, method: str, requests):
        """(response, read) of each response of streaming `method`, its requests made by
        :meth:`outgoing` (their inline tensors written once, read as views: wire.py)."""
        for received in self.stream(method, requests, self._tensor_callable(method, ("response",))):
            yield received.message, received.read

    @staticmethod
    def outgoing(message, tensors: Tensors, path: tuple[str, ...] = ()):
        """`message` with `tensors` inline in the message at `path` (its maps emptied first), to
        send through :meth:`_tensor_callable`: written by wire.Outgoing from wire.THRESHOLD bytes
        of tensors, filled in by protobuf below."""
        target = message_at(message, path)
        nbytes = 0
        for arrays in tensors.values():
            for a in arrays.values():
                nbytes += getattr(a, "nbytes", 0)
        if nbytes < wire.THRESHOLD:
            fill(target, tensors, None)  # (which empties the maps first)
            return message
        for field in tensors:
            target.ClearField(field)
        return wire.Outgoing(message, tensors, path)

    def _tensor_callable(self, method: str, path: tuple[str, ...] = ()):
        callable_ = self._tensor_calls.get(method)
        if callable_ is None:
            rpc = pb.DESCRIPTOR.services_by_name["GraphService"].methods_by_name[method]
            make = self.channel.stream_stream if rpc.client_streaming else self.channel.unary_unary
            callable_ = self._tensor_calls[method] = make(
                f"/{rpc.containing_service.full_name}/{method}", request_serializer=wire.serialize,
                response_deserializer=wire.Reader(getattr(pb, rpc.output_type.name), path))
        return callable_

    def tensor_call(self, method: str, request, tensors: Tensors, result_bytes: Callable[[], int],
                    decode: Callable):
        """Call unary `method` with `tensors` inline or in shared memory; `decode(response, read)`
        builds the result, shared tensors lent (see Placement.lend)."""
        placement = self.placement(tensors, result_bytes)
        if placement is not None:
            try:
                fill(request, tensors, placement)
                try:
                    return decode(self.call(method, request), placement.lend)
                except FailedPrecondition as error:
                    if not self.shared_memory_refused(error):
                        raise
            finally:
                placement.finish(self.release)
            request.ClearField("output_region")
        received = self.call(method, self.outgoing(request, tensors), self._tensor_callable(method))
        return decode(received.message, received.read)

    def placement(self, tensors: Tensors, result_bytes: Callable[[], int]) -> Placement | None:
        """A region of its own for a call moving `tensors` and about `result_bytes()` of results,
        or None to send them inline."""
        if self.shared_memory_off is not None:
            return None
        nbytes = sum(tensor_bytes(a) for a in tensors.values()) + result_bytes()
        if self.shared_memory == "auto" and nbytes < self.shared_memory_threshold:
            return None
        with self._pool_lock:
            if self._pool is None:
                self._pool = RegionPool()
            pool = self._pool
        try:
            return Placement(pool.acquire(nbytes))
        except (OSError, ValueError):  # /dev/shm full, or closed meanwhile: inline this time
            if self.shared_memory is True:
                raise
            return None

    def shared_memory_refused(self, error: SemigradError) -> bool:
        """In "auto" mode, a refusal of shared memory switches it off (True: retry inline)."""
        if (self.shared_memory == "auto" and isinstance(error, FailedPrecondition)
                and "shared memory" in error.message):
            self.shared_memory_off = f"the server refused it: {error.message}"
            return True
        return False

    def regions(self) -> list[str]:
        """Names of the shared-memory regions (files in /dev/shm) now."""
        with self._pool_lock:
            return self._pool.names() if self._pool is not None else []

    def close(self) -> None:
        """Close the channel and remove the shared-memory regions."""
        self.channel.close()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _give_back(self, region) -> None:
        """A call's region back to the pool (or removed, when the transport was closed meanwhile)."""
        with self._pool_lock:
            pool = self._pool
        if pool is not None:
            pool.release(region)
        else:
            region.close()


def _releaser(transport_ref: weakref.ref) -> Callable:
    def release(region) -> None:
        transport = transport_ref()
        if transport is None:  # the transport is gone, and its pool with it
            region.close()
        else:
            transport._give_back(region)

    return release


def message_at(message, path: tuple[str, ...]):
    """The message reached from `message` through the fields named by `path`."""
    for name in path:
        message = getattr(message, name)
    return message


def fill(request, tensors: Tensors, placement: Placement | None) -> None:
    """Put the arrays into the request's tensor maps: inline, or written into the placement's
    region (which is then also offered as the output region)."""
    for field_name, arrays in tensors.items():
        target = getattr(request, field_name)
        target.clear()
        for name, array in arrays.items():
            if placement is None or array.size == 0:
                codec.write_tensor(target[name], array)  # (to_tensor's message, written in place)
            else:
                target[name].CopyFrom(placement.tensor(array))
    if placement is not None:
        request.output_region.CopyFrom(placement.output_region())
