"""semigrad: a thin client for the semigrad graph-differentiation gRPC service.

Build a :class:`Graph` with operators and the op functions, register it with a
:class:`Client`, then evaluate it or its gradients with the returned :class:`RegisteredGraph`.
"""

from .client import Client, Gradients, RegisteredGraph
from .errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SemigradError,
    Unavailable,
)
from .functions import (
    abs,
    add,
    broadcast_to,
    concat,
    cos,
    div,
    eq,
    erf,
    exp,
    expm1,
    ge,
    gt,
    index,
    le,
    log,
    log1p,
    lt,
    matmul,
    max,
    maximum,
    mean,
    minimum,
    mul,
    ne,
    neg,
    pow,
    relu,
    reshape,
    sigmoid,
    sign,
    sin,
    softplus,
    sqrt,
    square,
    stack,
    sub,
    sum,
    tan,
    tanh,
    transpose,
    where,
)
from .graph import Graph, Handle
from .specs import AttrSpec, BestPath, DerivativeRule, OpInfo, PathStep, SemiringInfo, TensorSpec

__version__ = "0.1.0"

__all__ = [
    "AttrSpec", "BestPath", "Cancelled", "Client", "DeadlineExceeded", "DerivativeRule", "FailedPrecondition",
    "Gradients", "Graph", "Handle", "Internal", "InvalidArgument", "NotFound", "OpInfo", "PathStep",
    "RegisteredGraph", "ResourceExhausted", "SemigradError", "SemiringInfo", "TensorSpec", "Unavailable",
    "abs", "add", "broadcast_to", "concat", "cos", "div", "eq", "erf", "exp", "expm1", "ge",
    "gt", "index", "le", "log", "log1p", "lt", "matmul", "max", "maximum", "mean", "minimum",
    "mul", "ne", "neg", "pow", "relu", "reshape", "sigmoid", "sign", "sin", "softplus", "sqrt",
    "square", "stack", "sub", "sum", "tan", "tanh", "transpose", "where",
]
