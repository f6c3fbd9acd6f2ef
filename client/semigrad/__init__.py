"""semigrad: a thin client for the semigrad graph-differentiation gRPC service.

Build a :class:`Graph` with operators and the op functions, register it with a
:class:`Client`, then evaluate it or its gradients with the returned :class:`RegisteredGraph`.
"""

from .client import Client, RegisteredGraph
from .description import BackwardGraph, BackwardNode, GraphDescription, NodeDerivative, NodeDescription
from .errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
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
    elementwise,
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
from .graph import CustomOp, Graph, Handle
from .hooks import Contribution, PreHook, ServerHook
from .messages import Gradients
from .reports import CrossCheckReport, Formulas, SymbolicGradient
from .specs import AttrSpec, BestPath, DerivativeRule, OpInfo, PathStep, SemiringInfo, TensorSpec
from .viz import render_dot

__version__ = "0.1.0"

__all__ = [
    "AttrSpec", "BestPath", "Contribution", "PreHook", "ServerHook", "Cancelled", "Client", "CrossCheckReport", "CustomOp", "DeadlineExceeded",
    "DerivativeRule", "FailedPrecondition", "Formulas", "Gradients", "Graph", "Handle", "Internal",
    "InvalidArgument", "NotFound", "PermissionDenied", "OpInfo", "PathStep", "RegisteredGraph", "ResourceExhausted", "SemigradError",
    "SemiringInfo", "SymbolicGradient", "TensorSpec", "Unavailable",
    "BackwardGraph", "BackwardNode", "GraphDescription", "NodeDerivative", "NodeDescription", "render_dot",
    "abs", "add", "broadcast_to", "concat", "cos", "div", "elementwise", "eq", "erf", "exp", "expm1", "ge",
    "gt", "index", "le", "log", "log1p", "lt", "matmul", "max", "maximum", "mean", "minimum",
    "mul", "ne", "neg", "pow", "relu", "reshape", "sigmoid", "sign", "sin", "softplus", "sqrt",
    "square", "stack", "sub", "sum", "tan", "tanh", "transpose", "where",
]
