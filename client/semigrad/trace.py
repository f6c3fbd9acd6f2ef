"""sg.trace: a Graph from a NumPy-style Python function, by running it once on graph Handles.

The Handles stand in for the function's array arguments; their operators and NumPy's dispatch
protocols (numpy_api.py) turn each operation into a node, so ``np.tanh(x @ W + b)``,
``np.sum(e, axis=-1, keepdims=True)``, ``a[1:, j]`` or ``np.concatenate(...)`` build the graph
the function computes. Python control flow runs at trace time: loops unroll, recursion expands,
and a branch on a value (not on a shape) fails, since a Handle has no truth value.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from . import codec
from .graph import Graph, Handle
from .specs import TensorSpec


def trace(fn: Callable, *example_args, names: Sequence[str] | None = None,
          outputs: str | Sequence[str] | None = None) -> Graph:
    """The graph ``fn`` computes, traced on arguments shaped like ``example_args``.

    Each example argument (an array, a number, or a :class:`TensorSpec`) becomes a graph input
    of its shape and dtype (float64, float32, int64 or bool; narrower ints widen to int64),
    named after ``fn``'s parameter in that position (``*args`` give ``args_0``, ``args_1``...)
    or by ``names``. ``fn`` may return a value, a tuple or list of them (outputs ``out0``,
    ``out1``...), or a dict (outputs named by its keys); ``outputs`` names them instead (one
    name for a single value, default ``out``). Returns the :class:`Graph`, ready to register.

    >>> import numpy as np
    >>> g = trace(lambda x, w: np.sum(np.tanh(x @ w)), np.ones((2, 3)), np.ones((3, 4)))
    >>> [i.name for i in g.to_proto().inputs]
    ['x', 'w']
    """
    input_names = list(names) if names is not None else _parameter_names(fn, len(example_args))
    if len(input_names) != len(example_args):
        raise ValueError(f"{len(input_names)} names for {len(example_args)} example arguments")
    graph = Graph()
    handles = [graph.input(name, *_spec(value, name)) for name, value in zip(input_names, example_args)]
    result = fn(*handles)
    for name, value in _named_outputs(result, outputs):
        if not isinstance(value, Handle):
            if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
                value = graph.const(value)
            else:
                raise TypeError(f"output {name!r}: {fn!r} returned {type(value).__name__}, not a graph value")
        elif value.graph is not graph:
            raise ValueError(f"output {name!r} belongs to another graph (a Handle captured from elsewhere)")
        graph.output(name, value)
    return graph


def _parameter_names(fn: Callable, count: int) -> list[str]:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C function without a signature
        return [f"x{k}" for k in range(count)]
    found = []
    for p in parameters:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            found.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            found.extend(f"{p.name}_{k}" for k in range(count - len(found)))
    if len(found) < count:
        raise TypeError(f"{fn!r} takes {len(found)} positional argument(s), {count} example(s) given")
    return found[:count]


def _spec(value, name: str) -> tuple[tuple[int, ...], str]:
    if isinstance(value, TensorSpec):
        return tuple(value.shape), value.dtype
    if isinstance(value, Handle):
        raise TypeError(f"example argument {name!r} is a graph value: give an array (or a TensorSpec)")
    array = np.asarray(value)
    try:
        return array.shape, codec.value_dtype_name(array.dtype)
    except TypeError as e:
        raise TypeError(f"example argument {name!r}: {e}") from None


def _named_outputs(result, outputs) -> list[tuple[str, object]]:
    if isinstance(result, Mapping):
        pairs = [(str(k), v) for k, v in result.items()]
        if outputs is not None:
            raise ValueError("outputs= names a function's results, but it returned a dict (its keys name them)")
        return pairs
    if isinstance(result, (tuple, list)):
        given = [outputs] if isinstance(outputs, str) else list(outputs) if outputs is not None else None
        names = given or [f"out{k}" for k in range(len(result))]
        if len(names) != len(result):
            raise ValueError(f"{len(names)} output names for {len(result)} results")
        return list(zip(names, result))
    if outputs is not None and not isinstance(outputs, str):
        (outputs,) = outputs
    return [(outputs or "out", result)]
