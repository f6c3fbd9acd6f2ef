"""What happens around every call, in one server interceptor: who is calling (authentication,
the tenant every graph id is scoped by), its request id, the tenant's concurrency quota, and the
call's metrics. Health checks pass untouched (a load balancer probes without a token)."""

from __future__ import annotations

import contextvars
import itertools
import re
import secrets
import time

import grpc

from .. import logs
from .. import tenancy
from ..errors import Unauthenticated
from .auth import Tokens
from .call_end import ended_early, when_ended
from .slots import TenantSlots

HEALTH_PREFIX = "/grpc.health.v1.Health/"
REQUEST_ID_HEADER = "x-request-id"
CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # a client's own id is kept when it looks like one


class CallInterceptor(grpc.ServerInterceptor):
    """`max_tenant_requests`: calls of one tenant in flight at once in this server (0: no bound),
    counted across the worker processes that share `slots_directory` (slots.py; None: this
    process alone). `metrics`: a Metrics to record calls in, or None."""

    def __init__(self, tokens: Tokens, max_tenant_requests: int = 0, metrics=None,
                 slots_directory: str | None = None):
        self.tokens = tokens
        self.max_tenant_requests = max_tenant_requests
        self.metrics = metrics
        self.slots = TenantSlots(max_tenant_requests, slots_directory)
        # (method, tenant) -> (the method's handler, it wrapped for the tenant): built once, not per
        # call (building it was a fifth of the server's own Python in a small call). Bounded: the
        # methods served times the tenants of the token file.
        self._wrapped: dict[tuple[str, str], tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        method = details.method
        if handler is None or method.startswith(HEALTH_PREFIX):
            return handler
        try:
            tenant = self.tokens.tenant_of(details.invocation_metadata)
        except Unauthenticated as e:
            if self.metrics is not None:
                self.metrics.call_done(method.rsplit("/", 1)[-1], None, "UNAUTHENTICATED", 0.0)
            return _refusing(handler, grpc.StatusCode.UNAUTHENTICATED, str(e))
        known = self._wrapped.get((method, tenant))
        if known is None or known[0] is not handler:
            known = self._wrapped[method, tenant] = (handler, self._wrap(handler, method.rsplit("/", 1)[-1], tenant))
        return known[1]

    def _wrap(self, handler, rpc: str, tenant: str):
        client_streaming = bool(handler.stream_unary or handler.stream_stream)
        return _wrapped(handler, lambda context: self._enter(rpc, tenant, context),
                        lambda call: self._leave(call, client_streaming))

    def _enter(self, rpc: str, tenant: str, context) -> _Call:
        """Admit a call (or abort it with RESOURCE_EXHAUSTED): its context, with tenant and request id set."""
        request_id = _request_id(context.invocation_metadata())
        slot = self.slots.take(tenant)
        if slot is None:
            if self.metrics is not None:
                self.metrics.call_done(rpc, tenant, "RESOURCE_EXHAUSTED", 0.0)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{_who(tenant)} has {self.max_tenant_requests} calls in flight on this server (all its "
                          f"worker processes); the quota is {self.max_tenant_requests} (max_tenant_requests)")
        try:
            scope = contextvars.copy_context()
            scope.run(_set, tenant, request_id)
            context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))
        except BaseException:  # the call never started: it holds no place in the quota
            self.slots.give(tenant, slot)
            raise
        if self.metrics is not None:
            self.metrics.call_started(rpc, tenant)
        return _Call(rpc, tenant, slot, scope, context, time.perf_counter())

    def _leave(self, call: _Call, client_streaming: bool) -> None:
        self.slots.give(call.tenant, call.slot)
        if self.metrics is None:
            return
        code = call.context.code() if hasattr(call.context, "code") else None
        name = _code_name(code, call.failed)

        def finished(ending: str | None) -> None:
            self.metrics.call_finished(call.rpc, call.tenant, ending or name, time.perf_counter() - call.started)

        if code is not None or call.failed:
            finished(None)
        elif client_streaming:  # no status set: the call ends as its client saw it (call_end.py)
            when_ended(call.context, finished)
        else:
            finished(ended_early(call.context))


# Request ids: 16 random hex digits per process, then a counter (unique without a random draw per call).
_ID_PREFIX = secrets.token_hex(8)
_ID_COUNTER = itertools.count(1)


def _new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


def _request_id(metadata) -> str:
    """The call's request id: the client's own (the first x-request-id given) when it looks like one, else a new one."""
    for key, value in metadata or ():
        if key == REQUEST_ID_HEADER:
            return value if isinstance(value, str) and CLIENT_REQUEST_ID.fullmatch(value) else _new_request_id()
    return _new_request_id()


def _set(tenant: str, request_id: str) -> None:
    tenancy.enter(tenant)
    logs.REQUEST_ID.set(request_id)


def _who(tenant: str) -> str:
    return f"tenant '{tenant}'" if tenant else "the anonymous tenant"


def _code_name(code, failed: bool) -> str:
    if code is None:
        return "UNKNOWN" if failed else "OK"
    if isinstance(code, grpc.StatusCode):
        return code.name
    try:
        return grpc.StatusCode(code).name
    except ValueError:
        return str(code)


class _Call:
    __slots__ = ("rpc", "tenant", "slot", "scope", "context", "started", "failed")

    def __init__(self, rpc, tenant, slot, scope, context, started):
        self.rpc, self.tenant, self.slot, self.scope, self.context = rpc, tenant, slot, scope, context
        self.started = started
        self.failed = False


def _refusing(handler, code: grpc.StatusCode, message: str):
    """A handler that ends the call with `code` without reading its request: a client-streaming
    handler whatever the method's kind (the wire is the same), that never takes a message. A
    handler of the method's own kind would have gRPC receive and parse a unary request first, so a
    caller without a token could make a worker hold and decode max_message_bytes (512 MiB) per
    request thread before being told UNAUTHENTICATED (4 such calls of 200 MB grew a worker by 1.3 GB)."""

    def refuse(requests, context):
        context.abort(code, message)

    def refuse_stream(requests, context):
        context.abort(code, message)
        yield  # pragma: no cover - abort raises

    if handler.unary_stream or handler.stream_stream:
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    return grpc.stream_unary_rpc_method_handler(refuse)


def _wrapped(handler, enter, leave):
    """`handler` with its behaviour run inside the call's context (tenant, request id), between
    `enter(context)` and `leave(call)`."""
    behaviour = handler.unary_unary or handler.stream_unary or handler.unary_stream or handler.stream_stream

    def unary(request, context):
        call = enter(context)
        try:
            return call.scope.run(behaviour, request, context)
        except BaseException:
            call.failed = True
            raise
        finally:
            leave(call)

    def streaming(request, context):
        call = enter(context)
        responses = None
        try:
            responses = call.scope.run(behaviour, request, context)
            while True:
                try:
                    item = call.scope.run(next, responses)
                except StopIteration:
                    return
                yield item
        except GeneratorExit:  # gRPC took no more responses (the call ended): not a failure of the handler's
            if responses is not None:  # its clean-up (the call's log line) runs in the call's context, as its work did
                call.scope.run(responses.close)
            raise
        except BaseException:
            call.failed = True
            raise
        finally:
            leave(call)

    return _same_kind(handler, unary, streaming)


def _same_kind(handler, unary, streaming):
    common = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **common)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **common)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, **common)
    return grpc.stream_stream_rpc_method_handler(streaming, **common)
