"""What a compiled plan's results are keyed by when one plan computes several kinds of value.

A plan is compiled for a list of (key, node id) pairs and returns {key: value}; the runtime
treats keys as opaque. Requests that mix kinds (a graph output, a node's value, a gradient, an
adjoint, a seed) key them by `OutputKey`, so no user-chosen name can collide with another kind.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class OutputKind(enum.StrEnum):
    OUTPUT = "output"  # a graph output, by output name
    VALUE = "value"  # the forward value of a node or input, by id
    GRADIENT = "gradient"  # the gradient of a wrt input, by input name
    ADJOINT = "adjoint"  # the accumulated adjoint of a node or input, by id
    SEED = "seed"  # the cotangent an output node is seeded with, by node id


class OutputKey(NamedTuple):
    """A tuple (not a dataclass) because the short path looks results up by it: a tuple of two
    strings hashes in C."""

    kind: OutputKind
    name: str

    @classmethod
    def output(cls, name: str) -> OutputKey:
        return cls(OutputKind.OUTPUT, name)

    @classmethod
    def value(cls, ref: str) -> OutputKey:
        return cls(OutputKind.VALUE, ref)

    @classmethod
    def gradient(cls, name: str) -> OutputKey:
        return cls(OutputKind.GRADIENT, name)

    @classmethod
    def adjoint(cls, ref: str) -> OutputKey:
        return cls(OutputKind.ADJOINT, ref)

    @classmethod
    def seed(cls, ref: str) -> OutputKey:
        return cls(OutputKind.SEED, ref)
