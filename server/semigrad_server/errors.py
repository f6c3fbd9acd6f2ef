"""Errors raised below the service layer; the service maps each class to a gRPC status."""


class SemigradError(Exception):
    """Base class. `status` names the gRPC status code the service returns."""

    status = "INTERNAL"


class InvalidArgument(SemigradError):
    status = "INVALID_ARGUMENT"


class NotFound(SemigradError):
    status = "NOT_FOUND"


class FailedPrecondition(SemigradError):
    status = "FAILED_PRECONDITION"


class PermissionDenied(SemigradError):
    """The requester did not prove it may use what it named (a shared-memory region's capability)."""

    status = "PERMISSION_DENIED"


class ResourceExhausted(SemigradError):
    status = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str = "", max_items: int = 0):
        super().__init__(message)
        # For a request refused for its batch size: the most batch items a request of its shape
        # may carry within the limits (0: the refusal is not about the batch size). A streaming
        # client cuts its chunks to it (GradientStreamResponse.max_items).
        self.max_items = max_items


class DeadlineExceeded(SemigradError):
    status = "DEADLINE_EXCEEDED"


class Cancelled(SemigradError):
    status = "CANCELLED"


class Unavailable(SemigradError):
    """A service the server depends on (the shared graph store) cannot be reached; clients retry."""

    status = "UNAVAILABLE"


class Unauthenticated(SemigradError):
    status = "UNAUTHENTICATED"


class GraphError(InvalidArgument):
    """A graph is malformed; the message names the node at fault."""

    def __init__(self, node_id: str, message: str):
        super().__init__(f"node '{node_id}': {message}")
        self.node_id = node_id


def quoted(name: object, limit: int = 100) -> str:
    """A name as messages quote it: 'name'. Names a request chose may be of any length; past
    `limit` characters the quote is cut and says how long the name was, so the rest of the
    message (what is wrong with it) survives the status layer's bound on message length."""
    text = str(name)
    if len(text) <= limit:
        return f"'{text}'"
    return f"'{text[:limit]}...' ({len(text)} characters)"
