"""What a request gets back: plan results, keyed by OutputKey, turned into arrays with the
request's full batch shape and the declared dtypes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ir
from ..ir import Type


@dataclass(init=False, slots=True)
class GradientResult:
    gradients: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    components: dict[str, dict[str, np.ndarray]]
    best_paths: list
    retained: dict[str, np.ndarray]
    records: dict[str, dict[str, np.ndarray]]

    # Written out (not default factories): every short-path request builds one.
    def __init__(self, gradients=None, outputs=None, components=None, best_paths=None, retained=None, records=None):
        self.gradients = {} if gradients is None else gradients
        self.outputs = {} if outputs is None else outputs
        self.components = {} if components is None else components
        self.best_paths = [] if best_paths is None else best_paths
        self.retained = {} if retained is None else retained
        self.records = {} if records is None else records


def read_full(s, value, shape: tuple) -> dict[str, np.ndarray]:
    """A semiring value's named arrays, broadcast to the request's full shape."""
    return s.read(s.map(lambda c: c if np.shape(c) == shape else np.broadcast_to(c, shape), value))


def readback(s, value, shape: tuple) -> np.ndarray:
    """A semiring value's primary array, broadcast to the request's full shape."""
    return read_full(s, value, shape)[s.primary]


def cast(value: np.ndarray, t: Type) -> np.ndarray:
    value = np.asarray(value)
    return value if value.dtype == ir.DTYPES[t.dtype] else value.astype(t.dtype)


def full(value: np.ndarray, batch_shape: tuple, t: Type) -> np.ndarray:
    """A result with the request's full batch shape, in its declared dtype."""
    if type(value) is np.ndarray and value.dtype == ir.DTYPES[t.dtype] and value.shape == batch_shape + t.shape:
        return value  # already whole (the common case)
    value = cast(value, t)
    target = tuple(batch_shape) + t.shape
    return value if value.shape == target else np.broadcast_to(value, target)
