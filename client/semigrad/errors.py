"""Exceptions raised by the semigrad client, one per gRPC status code."""

from __future__ import annotations

import grpc


class SemigradError(Exception):
    """A failed semigrad call: ``.code`` is the grpc.StatusCode, ``.message`` the server's text."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: grpc.StatusCode | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(SemigradError):
    """Bad graph, tensor or request."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(SemigradError):
    """Unknown graph id."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(SemigradError):
    """The request cannot be served in the current state."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(SemigradError):
    """The caller did not prove it may use what it named (a shared-memory region's capability)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(SemigradError):
    """Over a server limit (or a message size limit)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(SemigradError):
    """The call's deadline passed."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(SemigradError):
    """The call was cancelled."""

    code = grpc.StatusCode.CANCELLED


class Unavailable(SemigradError):
    """The server cannot be reached."""

    code = grpc.StatusCode.UNAVAILABLE


class Internal(SemigradError):
    """A server-side bug."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        FailedPrecondition,
        PermissionDenied,
        ResourceExhausted,
        DeadlineExceeded,
        Cancelled,
        Unavailable,
        Internal,
    )
}


def from_rpc_error(error: grpc.RpcError) -> SemigradError:
    """Convert a grpc.RpcError into the SemigradError subclass matching its status code."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = (error.details() if hasattr(error, "details") else None) or str(error)
    return _BY_CODE.get(code, SemigradError)(message, code)


def error_for_code(number: int, message: str) -> SemigradError:
    """The SemigradError subclass for a status code number (as carried inside stream messages)."""
    code = next((c for c in grpc.StatusCode if c.value[0] == number), grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(code, SemigradError)(message, code)
