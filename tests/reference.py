"""Independent references for gradients: central finite differences, and the closed forms in bench/workloads.py."""

from __future__ import annotations

import numpy as np
from workloads import det_by_minors, det_gradient, det_graph  # noqa: F401  (bench/ is on the test path)


def finite_difference_gradient(evaluate, inputs: dict, shapes: dict, seeds: dict, wrt: str, step: float = 1e-6):
    """Per-item gradient of Σ seed·output w.r.t. input `wrt`, by central differences.

    Every input is first broadcast to the common batch shape, so each perturbation touches
    one batch item; all 2·size perturbations go in one call of `evaluate(inputs)` as an
    extra leading batch axis. `seeds[name]` has shape batch + output shape.
    """
    leads = [np.shape(v)[: np.ndim(v) - len(shapes[k])] for k, v in inputs.items()]
    batch = tuple(np.broadcast_shapes(*leads))
    full = {k: np.broadcast_to(v, batch + tuple(shapes[k])).copy() for k, v in inputs.items()}
    x = full[wrt]
    n = x.size
    h = step * np.maximum(1.0, np.abs(x.reshape(-1)))
    plus = np.repeat(x.reshape(1, -1), n, axis=0)
    minus = plus.copy()
    plus[np.arange(n), np.arange(n)] += h
    minus[np.arange(n), np.arange(n)] -= h
    args = dict(full, **{wrt: np.concatenate([plus, minus]).reshape((2 * n,) + x.shape)})
    total = 0.0
    for name, value in evaluate(args).items():
        item_axes = tuple(range(1 + len(batch), value.ndim))
        total = total + np.sum(value * seeds[name], axis=item_axes)  # (2n,) + batch
    diff = (total[:n] - total[n:]).reshape(n, -1)  # perturbation × batch item
    item_of = np.arange(n) // (n // diff.shape[1])  # x is C-ordered: batch axes first
    return (diff[np.arange(n), item_of] / (2 * h)).reshape(x.shape)
