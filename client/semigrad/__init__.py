"""semigrad: graph differentiation with a replaceable backward semiring, in this process or on a server.

Build a :class:`Graph` with operators and the op functions (or :func:`trace` a NumPy-style
function), register it with a :class:`Client` (``Client()`` runs the engine in this process,
``Client("host:port")`` talks to a server), then evaluate it or its gradients with the returned
:class:`RegisteredGraph`.
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
    argmax,
    argmin,
    broadcast_to,
    clamp,
    concat,
    cos,
    cumsum,
    div,
    dropout,
    einsum,
    elementwise,
    eq,
    erf,
    exp,
    expm1,
    gather,
    gelu,
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
    min,
    minimum,
    mul,
    ne,
    neg,
    pow,
    relu,
    reshape,
    scatter_add,
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
from .functions import (avg_pool1d, avg_pool2d, conv1d, conv2d, layer_norm, log_softmax, logsumexp, max_pool1d,
                        max_pool2d, softmax)
from .graph import CustomOp, Graph, Handle
from .hooks import Contribution, PreHook, ServerHook
from .messages import Gradients, SemiringGradients
from .reports import CrossCheckReport, Formulas, SymbolicGradient
from .trace import trace
from .paths import BestPaths
from .specs import AttrSpec, BestPath, DerivativeRule, OpInfo, PathStep, SemiringInfo, TensorSpec
from .torch_import import TorchImport, TorchImportError, from_torch
from .viz import render_dot

__version__ = "0.1.0"

__all__ = [
    "AttrSpec", "BestPath", "BestPaths", "Contribution", "PreHook", "ServerHook", "Cancelled", "Client", "CrossCheckReport", "CustomOp", "DeadlineExceeded",
    "DerivativeRule", "FailedPrecondition", "Formulas", "Gradients", "SemiringGradients", "Graph", "Handle", "Internal",
    "InvalidArgument", "NotFound", "PermissionDenied", "OpInfo", "PathStep", "RegisteredGraph", "ResourceExhausted", "SemigradError",
    "SemiringInfo", "SymbolicGradient", "TensorSpec", "Unavailable",
    "TorchImport", "TorchImportError", "from_torch",
    "BackwardGraph", "BackwardNode", "GraphDescription", "NodeDerivative", "NodeDescription", "render_dot",
    "abs", "add", "broadcast_to", "concat", "cos", "div", "elementwise", "eq", "erf", "exp", "expm1", "ge",
    "gt", "index", "le", "log", "log1p", "lt", "matmul", "max", "maximum", "mean", "minimum",
    "mul", "ne", "neg", "pow", "relu", "reshape", "sigmoid", "sign", "sin", "softplus", "sqrt",
    "square", "stack", "sub", "sum", "tan", "tanh", "transpose", "where", "trace",
    "avg_pool1d", "avg_pool2d", "conv1d", "conv2d", "layer_norm", "log_softmax", "logsumexp", "max_pool1d",
    "max_pool2d", "softmax",
    "argmax", "argmin", "clamp", "cumsum", "dropout", "einsum", "gather", "gelu", "min", "scatter_add",
]
