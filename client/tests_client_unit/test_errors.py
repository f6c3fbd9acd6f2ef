import grpc
import pytest

import semigrad
from semigrad.errors import from_rpc_error


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code, cls", [
    (grpc.StatusCode.INVALID_ARGUMENT, semigrad.InvalidArgument),
    (grpc.StatusCode.NOT_FOUND, semigrad.NotFound),
    (grpc.StatusCode.FAILED_PRECONDITION, semigrad.FailedPrecondition),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, semigrad.ResourceExhausted),
    (grpc.StatusCode.DEADLINE_EXCEEDED, semigrad.DeadlineExceeded),
    (grpc.StatusCode.CANCELLED, semigrad.Cancelled),
    (grpc.StatusCode.UNAVAILABLE, semigrad.Unavailable),
    (grpc.StatusCode.INTERNAL, semigrad.Internal),
    (grpc.StatusCode.UNIMPLEMENTED, semigrad.SemigradError),
])
def test_from_rpc_error(code, cls):
    error = from_rpc_error(FakeRpcError(code, "node 'mul_3': bad"))
    assert type(error) is cls and error.code == code and error.message == "node 'mul_3': bad"
    assert str(error) == f"{code.name}: node 'mul_3': bad"
