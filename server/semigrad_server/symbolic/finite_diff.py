"""Numerical Jacobians by perturbing inputs: central differences (optionally with Richardson
extrapolation) and the complex step.

All perturbations of one input go in one call as a batch (the graph's batch semantics), so
a Jacobian costs one evaluation per input. Steps are relative: h = step * max(1, |x|).
Central differences err by O(h²) + O(ε/h); Richardson's (4 D(h/2) - D(h)) / 3 removes the
h² term. The complex step Im f(x + ih) / h has no cancellation at all (h = 1e-20), but only
for graphs whose every op is analytic, evaluated over complex numbers.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from ..ir import Type

DEFAULT_STEP = 6e-6  # ≈ cube root of float64 epsilon: balances truncation and rounding error
COMPLEX_STEP = 1e-20

Evaluate = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def perturbations(x: np.ndarray, h: np.ndarray, sign: float) -> np.ndarray:
    """A batch of copies of x, copy i with element i moved by sign * h[i]: shape (n,) + x.shape."""
    n = x.size
    batch = np.repeat(x.reshape(1, -1), n, axis=0).astype(np.result_type(x, h, sign))
    batch[np.arange(n), np.arange(n)] += sign * h
    return batch.reshape((n,) + x.shape)


def relative_steps(x: np.ndarray, step: float) -> np.ndarray:
    return step * np.maximum(1.0, np.abs(x.reshape(-1)))


def central_jacobian(evaluate: Evaluate, point: Mapping[str, np.ndarray], wrt: Sequence[str],
                     out_types: Mapping[str, Type], step: float = DEFAULT_STEP,
                     richardson: bool = False) -> dict[tuple[str, str], np.ndarray]:
    """{(output, input): block shaped output shape + input shape} by central differences."""
    blocks = {}
    for x in wrt:
        value = np.asarray(point[x], dtype=np.float64)
        h = relative_steps(value, step)
        steps = [h, h / 2] if richardson else [h]
        batch = np.concatenate([perturbations(value, s, sign) for s in steps for sign in (1.0, -1.0)])
        results = evaluate({**point, x: batch})
        n = value.size
        for name, t in out_types.items():
            f = np.asarray(results[name], dtype=np.float64).reshape((len(steps) * 2, n) + t.shape)
            estimates = [(f[2 * k] - f[2 * k + 1]) / _per_row(2 * s, t) for k, s in enumerate(steps)]
            d = (4 * estimates[1] - estimates[0]) / 3 if richardson else estimates[0]
            blocks[name, x] = _block(d, t, value.shape)
    return blocks


def complex_step_jacobian(evaluate: Evaluate, point: Mapping[str, np.ndarray], wrt: Sequence[str],
                          out_types: Mapping[str, Type]) -> dict[tuple[str, str], np.ndarray]:
    """{(output, input): block} as Im f(x + ih e_i) / h; `evaluate` must accept complex inputs."""
    blocks = {}
    for x in wrt:
        value = np.asarray(point[x], dtype=np.float64)
        h = np.full(value.size, COMPLEX_STEP)
        batch = perturbations(value.astype(np.complex128), h * 1j, 1.0)
        results = evaluate({**point, x: batch})
        for name, t in out_types.items():
            f = np.asarray(results[name]).reshape((value.size,) + t.shape)
            blocks[name, x] = _block(np.imag(f) / COMPLEX_STEP, t, value.shape)
    return blocks


def _per_row(h: np.ndarray, t: Type) -> np.ndarray:
    return h.reshape((-1,) + (1,) * t.rank)


def _block(d: np.ndarray, t: Type, in_shape: tuple) -> np.ndarray:
    """Rows per input element (n,) + output shape → output shape + input shape."""
    return np.moveaxis(d, 0, -1).reshape(t.shape + tuple(in_shape))


def analytic_expression(expression, registry) -> bool:
    """Whether a custom op's SymPy expression uses only functions of ops declared analytic
    (+ - * / **, exp, sin, ...)."""
    import sympy as sp

    functions = registry.by_sympy_function()
    for sub in sp.preorder_traversal(expression):
        if isinstance(sub, sp.Function):
            op = functions.get(type(sub))
            if op is None or not op.analytic:
                return False
    return True
