"""Short texts for attribute values and arrays, as shown by DescribeGraph and in pictures."""

from __future__ import annotations

import numpy as np

SMALL = 4  # arrays with at most this many elements are shown whole


def attr_text(value: object) -> str:
    """An attribute value as one short line: [0, 1], [1:3, ::2], a small tensor, or its type."""
    if isinstance(value, np.ndarray):
        return array_text(value) if value.size <= SMALL else f"{value.dtype.name}{list(value.shape)} tensor"
    if isinstance(value, tuple):
        return "[" + ", ".join(_index_item(v) for v in value) + "]"
    return str(value)


def _index_item(item: object) -> str:
    if not isinstance(item, slice):
        return str(item)
    text = ("" if item.start is None else str(item.start)) + ":" + ("" if item.stop is None else str(item.stop))
    return text if item.step is None else f"{text}:{item.step}"


def array_text(value: np.ndarray) -> str:
    """The value itself when small (0.5, [1, 2, 3]), else mean/min/max (bools: how many are true)."""
    a = np.asarray(value)
    if a.dtype == np.bool_:
        return str(bool(a)) if a.ndim == 0 else f"{int(a.sum())}/{a.size} true"
    if a.size == 0:
        return "empty"
    if a.size <= SMALL:
        items = [_number(v) for v in a.reshape(-1)]
        return items[0] if a.ndim == 0 else "[" + ", ".join(items) + "]"
    return f"mean {_number(a.mean())}, min {_number(a.min())}, max {_number(a.max())}"


def _number(v) -> str:
    return f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v)
