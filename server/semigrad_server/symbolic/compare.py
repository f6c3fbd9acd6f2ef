"""Elementwise comparison of a result against a reference, as torch.autograd.gradcheck does:
an element passes when |a - b| <= atol + rtol·|b| (b the reference). Equal values pass
(including equal infinities and NaN against NaN); a NaN against a number fails with an
infinite error."""

from __future__ import annotations

import numpy as np

ATOL = 1e-5
RTOL = 1e-3


def within(a, b, atol: float, rtol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(passes, |a - b|, |a - b| / |b|) per element; errors of unequal non-finite values are inf."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(all="ignore"):
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        abs_err = np.where(same, 0.0, np.abs(a - b))
        abs_err = np.where(np.isnan(abs_err), np.inf, abs_err)
        rel_err = np.where(same, 0.0, np.where(b != 0, abs_err / np.abs(b), np.inf))
        rel_err = np.where(np.isnan(rel_err), np.inf, rel_err)
        ok = same | (abs_err <= atol + rtol * np.abs(b))
    return ok, abs_err, rel_err


def worst(ok: np.ndarray, abs_err: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> int:
    """Flat index of the element furthest outside its tolerance (or nearest to it)."""
    if abs_err.size == 0:
        return -1
    with np.errstate(all="ignore"):
        excess = abs_err - (atol + rtol * np.abs(np.asarray(b, dtype=np.float64)))
    excess = np.where(np.isnan(excess), np.inf, excess)
    return int(np.argmax(excess))
