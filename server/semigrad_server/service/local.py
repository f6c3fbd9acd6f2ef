"""The service in this process: what `semigrad.Client()` without an address talks to.

Every call goes through the same servicer as a remote call (the same request conversion,
status layer and messages), handed the request and response messages themselves instead of
their bytes, with a `LocalContext` in place of gRPC's. Two requests skip the messages: a
gradient with no seeds, semiring parameters, hooks, paths, retained nodes or components (under
one semiring or several) and an evaluation whose inputs are all declared, which the client's hot path sends as arrays
(`gradient`, `evaluate` below). They reach the engine through the typed specs the servicer
would build, and their errors through the same status layer, so code and message are a
remote call's.

A call answered after its deadline raises DEADLINE_EXCEEDED, as gRPC discards a late answer;
the engine also checks the deadline while it works, as it does for remote calls."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping

import grpc
import numpy as np
from semigrad import codec
from semigrad.errors import DeadlineExceeded, SemigradError, error_for_code

from .. import deadline as deadlines
from ..engine import Engine
from ..engine.specs import EvaluateSpec, GradientSpec
from ..ir import MAX_RANK
from ..limits import Limits
from . import status
from .servicer import GraphServicer
from .shared_memory import SharedMemory

GRPC_DEADLINE_MESSAGE = "Deadline Exceeded"  # what grpcio's client says when the deadline passes first


class Aborted(Exception):
    """context.abort in this process: the status the servicer chose."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class LocalContext:
    """The part of grpc.ServicerContext the servicer uses, for one call in this process."""

    def __init__(self, deadline: float | None):
        self.deadline = deadline  # time.monotonic() seconds, or None
        self.cancelled = False
        self.callbacks: list = []

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def is_active(self) -> bool:
        return not self.cancelled and (self.deadline is None or time.monotonic() < self.deadline)

    def add_callback(self, callback) -> bool:
        self.callbacks.append(callback)
        return True

    def peer(self) -> str:
        """Not a network peer: the servicer takes no shared-memory references from it (the
        in-process client hands arrays over directly)."""
        return "in-process"

    def abort(self, code: grpc.StatusCode, details: str):
        raise Aborted(code, details)

    def cancel(self) -> None:
        """The caller went away (stopped reading a stream, raised, was interrupted)."""
        if not self.cancelled:
            self.cancelled = True
            for callback in self.callbacks:
                callback()


def deadline_after(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def client_error(code: grpc.StatusCode, details: str) -> SemigradError:
    return error_for_code(code.value[0], details)


def bounded(deadline: float | None):
    """The call's deadline as the current request's bound (what `deadline.interruptibly` and
    `deadline.check` read), as the servicer sets it for a remote call; nothing without one."""
    return deadlines.serving(deadlines.Bound(deadline)) if deadline is not None else contextlib.nullcontext()


def _late(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineExceeded(GRPC_DEADLINE_MESSAGE)


class LocalService:
    """An engine and the servicer in front of it, called directly. Errors are the client's
    SemigradError classes with the status code and message a remote call would get."""

    def __init__(self, engine: Engine | None = None, *, limits: Limits | None = None):
        self.engine = engine or Engine(limits or Limits())
        self.servicer = GraphServicer(self.engine, SharedMemory(enabled=False))

    def unary(self, method: str, request, timeout: float | None):
        """The response of unary `method` to the `request` message."""
        context = LocalContext(deadline_after(timeout))
        try:
            response = getattr(self.servicer, method)(request, context)
        except Aborted as e:
            raise client_error(e.code, e.details) from None
        _late(context.deadline)
        return response

    def stream(self, method: str, requests, timeout: float | None) -> Iterator:
        """The responses of streaming `method` to the `requests` messages; closing this generator
        early cancels the call (as a remote client that stops reading)."""
        context = LocalContext(deadline_after(timeout))
        responses = getattr(self.servicer, method)(requests, context)
        try:
            for response in responses:
                _late(context.deadline)
                yield response
            _late(context.deadline)
        except Aborted as e:
            raise client_error(e.code, e.details) from None
        finally:
            context.cancel()  # stops hook workers still waiting; nothing to stop once the call is done
            responses.close()

    def gradient(self, graph_id: str, inputs: Mapping[str, np.ndarray], wrt: tuple[str, ...],
                 outputs: tuple[str, ...], return_outputs: bool, backend: str, timeout: float | None,
                 semiring: str | tuple[str, ...] = "real"):
        """A gradient with nothing beyond these, under one semiring or several (a tuple of names):
        ``(gradients, outputs)`` as {name: array} as a remote client receives them (see
        `received`; for several semirings the gradients by semiring name), or None when the inputs
        need the message path (an array the wire would change: not C-contiguous, a rank past the
        wire's limit)."""
        for a in inputs.values():
            if type(a) is not np.ndarray or a.ndim > MAX_RANK or not a.flags.c_contiguous:
                return None
        deadline = None if timeout is None else time.monotonic() + timeout
        backend = backend or "auto"
        several = not isinstance(semiring, str)
        try:  # a repeat of a signature checked before goes straight to its plan (no spec built)
            result = None if several or semiring not in ("real", "") else self.engine.remembered_gradient(
                graph_id, inputs, wrt, outputs, return_outputs, backend, deadline)
            if result is None:  # may compile: under a bound, as the servicer runs it, so compiling stops at the deadline
                with bounded(deadline):
                    result = self.engine.run_gradient(GradientSpec(
                        graph_id, inputs, wrt, outputs, None, return_outputs, "real" if several else semiring or "real", None, False,
                        (), backend, (), (), semiring if several else ()), deadline)
        except Exception as e:  # noqa: BLE001 - the status layer tells client faults from bugs
            raise client_error(*status.status_of(e, "Gradient")) from None
        if deadline is not None:
            _late(deadline)
        gradients = ({name: received(part.gradients, inputs) for name, part in result.semirings.items()} if several
                     else received(result.gradients, inputs))
        return gradients, received(result.outputs, inputs) if result.outputs else {}

    def evaluate(self, graph_id: str, inputs: Mapping[str, np.ndarray], outputs: tuple[str, ...],
                 nodes: tuple[str, ...], backend: str, timeout: float | None):
        """``{output or node: value}`` as a remote client receives them, or None when the inputs
        need the message path."""
        for a in inputs.values():
            if type(a) is not np.ndarray or a.ndim > MAX_RANK or not a.flags.c_contiguous:
                return None
        deadline = deadline_after(timeout)
        try:
            with bounded(deadline):
                values, node_values = self.engine.run_evaluate(
                    EvaluateSpec(graph_id, inputs, outputs, nodes, backend or "auto"), deadline)
        except Exception as e:  # noqa: BLE001
            raise client_error(*status.status_of(e, "Evaluate")) from None
        _late(deadline)
        return {**received(values, inputs), **received(node_values, inputs)}


def received(arrays: Mapping[str, object], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The engine's results as a remote client receives them: arrays of the wire's dtype,
    read-only (a remote result is a view of the response's bytes), and copied when they share
    memory with an input (an output that is an input, or a view of one), so later writes to the
    caller's arrays cannot change them. Results are fresh per request (or read-only constants of
    the plan), so marking them read-only touches nothing the engine or the caller holds."""
    out = {}
    for name, value in arrays.items():
        if type(value) is not np.ndarray or value.dtype.byteorder == ">":
            value = np.asarray(value, dtype=codec.wire_dtype(np.asarray(value).dtype))
        if _aliases(value, inputs):
            value = value.copy()
        value.setflags(write=False)  # (half the time of `flags.writeable = False`: this is the short path)
        out[name] = value
    return out


def _aliases(value: np.ndarray, inputs: Mapping[str, np.ndarray]) -> bool:
    """Whether `value` may share memory with an input. NumPy gives a view the array owning its
    memory as `base`, so identities decide; other owners (as_strided's) ask NumPy."""
    owner = value if value.base is None else value.base
    if type(owner) is not np.ndarray:
        return any(np.may_share_memory(value, a) for a in inputs.values())
    for a in inputs.values():
        if owner is a or owner is a.base:
            return True
    return False
