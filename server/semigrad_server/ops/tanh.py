"""The tanh op's one implementation, used by every backend: the tensor plan and the scalar
programs' array flavour (`tanh`, over arrays), their float flavour and the JIT (`tanh_float`).

Why not NumPy's: on CPUs without AVX-512, np.tanh of float64 is glibc's scalar tanh, ~35 ns an
element (a 64 × 64 hidden layer: 145 µs, a third of the MLP's gradient). This one is written
with + - * / only, so numba compiles it into a SIMD loop (~15 ns an element where glibc takes 35),
and it is evaluated by the same IEEE operations, in the same order, whether its operands are
Python floats, numba's or NumPy arrays: every backend gets the same bits (no FMA: numba compiles
without fastmath, so LLVM contracts nothing).

Accuracy: at most 0.74 ulp from the exact tanh (99.3% of results correctly rounded), against
glibc's 1.2 ulp (82%) on the same points (tests/ops/test_tanh.py checks it against mpmath).
±0, subnormals and |x| < 2^-27 give x; |x| ≥ 20 gives ±1 (the exact value rounds to it past
19.06); NaN gives NaN.

    |x| < 9/16:  x + x u P(u), u = x², P a near-minimax polynomial for (tanh(√u)/√u − 1)/u
                 (Chebyshev interpolation at 300 bits, degree 10, relative error 3.7e-17),
                 its three leading terms by Horner (they carry the accuracy), the rest by Estrin
                 (independent products: the SIMD loop is not one long chain of latencies).
    otherwise:   with s = 2^-k, e^(-2|x|) = s (1 + w), w = e^r − 1 (r = k ln 2 − 2|x|, |r| ≤ ln2/2,
                 w = r + r² Q(r), Q likewise: degree 10, 3e-18), tanh|x| = (1 − s − s w) / (1 + s + s w):
                 numerator and denominator as exact double-double sums (s w is exact: s is a
                 power of two), and the quotient corrected by its exact residual (Dekker's
                 product, no FMA), so the only sizeable error is the last rounding.

Complex operands (the complex step of the cross-checks needs an analytic kernel) go to
np.tanh: this algorithm is real-only. Without numba (an optional extra) the op uses np.tanh and
math.tanh, as it did before this module: run by Python or NumPy operations the algorithm would
be slower than them.
"""

from __future__ import annotations

import inspect
import math
import types

import numpy as np

T_SMALL = 0.5625  # below: the polynomial; at or above: the exponential form
T_ONE = 20.0  # at or above: ±1 (computed as tanh(20), which rounds to 1)
T_TINY = 2.0**-27  # below: x itself (the exact value rounds to x)
SPLIT = 134217729.0  # 2^27 + 1: Veltkamp's split of a double into two 26-bit halves
SHIFT = 6755399441055744.0  # 1.5 * 2^52: (v + SHIFT) - SHIFT rounds v to an integer
LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # k LN2_HI exact for k < 2^20
POW2 = np.array([math.ldexp(1.0, -k) for k in range(64)])  # 2^-k; k ≤ 58 here


def _select(c, a, b):
    return a if c else b


def _whole(k):
    return int(k)


def _tanh(x):
    """The algorithm, over Python floats (rebound, over numba floats; as text, over NumPy arrays: SOURCE)."""
    a = abs(x)
    # |x| < 9/16: x + x u P(u)
    u = x * x
    u2 = u * u
    p = (((0.021869488476962563 + u * -0.008863234021529514) + u2 * (0.003592105532132769 + u * -0.0014556239774192678))
         + (u2 * u2) * ((0.0005887537111834804 + u * -0.00023410556936672797)
                        + u2 * (8.426522203958066e-05 + u * -2.0026740085317684e-05)))
    p = -0.3333333333333333 + u * (0.13333333333332392 + u * (-0.0539682539670594 + u * p))
    small = x + x * (u * p)
    # otherwise: e^(-2c) = s (1 + w), c = |x| within [T_SMALL, T_ONE] (NaN: T_ONE)
    c = _select(a < T_ONE, a, T_ONE)
    c = _select(c > T_SMALL, c, T_SMALL)
    y = c + c
    k = (y * 1.4426950408889634 + SHIFT) - SHIFT
    r = (k * LN2_HI - y) + k * LN2_LO
    r2 = r * r
    r4 = r2 * r2
    q = ((((0.5 + r * 0.1666666666666667) + r2 * (0.04166666666666667 + r * 0.008333333333326141))
          + r4 * ((0.0013888888888883752 + r * 0.00019841269874800493) + r2 * (2.4801587325533363e-05
                                                                              + r * 2.7557255425746435e-06)))
         + (r4 * r4) * ((2.7557273661348637e-07 + r * 2.510520637395701e-08) + r2 * 2.0914679376583935e-09))
    w = r + r2 * q
    s = POW2[_whole(k)]
    sw = s * w  # exact
    # numerator 1 - s - sw and denominator 1 + s + sw, each as an exact sum hi + lo
    a0 = 1.0 - s
    a1 = (1.0 - a0) - s
    nh = a0 - sw
    nl = ((a0 - nh) - sw) + a1
    b0 = 1.0 + s
    b1 = s - (b0 - 1.0)
    dh = b0 + sw
    dl = (sw - (dh - b0)) + b1
    # nh / dh, corrected by the residual nh - q0 dh (exact: Dekker's product) and the low parts
    q0 = nh / dh
    cq = SPLIT * q0
    qh = cq - (cq - q0)
    ql = q0 - qh
    cd = SPLIT * dh
    dhh = cd - (cd - dh)
    dhl = dh - dhh
    ph = q0 * dh
    pl = ((qh * dhh - ph) + qh * dhl + ql * dhh) + ql * dhl
    big = q0 + ((((nh - ph) - pl) + nl) - q0 * dl) / dh
    big = _select(x > 0.0, big, -big)
    value = _select(a < T_SMALL, small, big)
    return _select((a < T_TINY) | (x != x), x, value)


def _rebound(**names):
    """_tanh's code over other primitives (the same operations, other number types)."""
    return types.FunctionType(_tanh.__code__, {**_tanh.__globals__, **names}, "tanh_float")


def _standalone_source() -> str:
    """The same code over NumPy arrays, importing only math and numpy (printed formulas' helper)."""
    body = inspect.getsource(_tanh).replace("def _tanh(x):", "def _semigrad_tanh(x):")
    body = body.replace("_select(", "numpy.where(").replace("_whole(k)", "k.astype(numpy.intp)")
    body = body.replace("POW2[", "_SEMIGRAD_TANH_POW2[")
    for name in ("T_SMALL", "T_ONE", "T_TINY", "SPLIT", "SHIFT", "LN2_HI", "LN2_LO"):
        body = body.replace(name, repr(globals()[name]))
    return ("_SEMIGRAD_TANH_POW2 = numpy.array([math.ldexp(1.0, -k) for k in range(64)])\n\n\n" + body +
            "\n\ndef tanh(x):  # semigrad's tanh (semigrad_server/ops/tanh.py), real operands\n"
            "    with numpy.errstate(all='ignore'):\n"
            "        return _semigrad_tanh(numpy.asarray(x, dtype=numpy.float64))\n")


SOURCE = _standalone_source()

try:
    import numba
except ImportError:  # pragma: no cover - depends on the environment
    numba = None

if numba is not None:
    _select_jit = numba.njit(inline="always")(_select)
    _whole_jit = numba.njit(inline="always")(_whole)
    # Compiled lazily (the first call), cached on disk by numba for later processes. Inlined into
    # the array loop (SIMD); called, not inlined, by the JIT's programs: inlined, its body added
    # ~8 s to the compile of every program holding a tanh.
    _tanh_inlined = numba.njit(error_model="numpy", inline="always", cache=True)(
        _rebound(_select=_select_jit, _whole=_whole_jit))
    tanh_float = numba.njit(error_model="numpy", cache=True)(_rebound(_select=_select_jit, _whole=_whole_jit))

    @numba.njit(error_model="numpy", cache=True)
    def _tanh_loop(x, out):  # 1-D contiguous float64 arrays: one SIMD loop
        for i in range(x.size):
            out[i] = _tanh_inlined(x[i])
else:  # pragma: no cover - depends on the environment
    # Without numba this algorithm would run as ~40 Python float operations a call (a scalar
    # program's tanh 30x slower than math's) or ~40 NumPy passes: libm's and NumPy's tanh then,
    # as before it existed (they may differ from it, and from each other, in the last bit).
    tanh_float = math.tanh
    _tanh_loop = None

_RESULT_DTYPES: dict = {}


def _result_dtype(dtype: np.dtype) -> np.dtype:
    """np.tanh's result dtype for operands of `dtype` (the op's type rule is NumPy's)."""
    if dtype not in _RESULT_DTYPES:
        _RESULT_DTYPES[dtype] = np.tanh(np.zeros((), dtype=dtype)).dtype
    return _RESULT_DTYPES[dtype]


def tanh(x, out=None):
    """tanh over arrays, as np.tanh is called by the kernels: any shape, a NumPy scalar for a
    scalar, `out=` filled and returned. Computed in float64 (a float32 result is the float64
    one rounded)."""
    if (_tanh_loop is not None and type(x) is np.ndarray and x.dtype == np.float64 and x.flags.c_contiguous
            and (out is None or (type(out) is np.ndarray and out.dtype == np.float64 and out.flags.c_contiguous
                                 and out.shape == x.shape)) and x.ndim):
        # the kernels' case (a float64 array, maybe a buffer to fill): straight to the loop
        result = np.empty(x.shape) if out is None else out
        _tanh_loop(x.reshape(-1), result.reshape(-1))
        return result
    x = np.asarray(x)
    if x.dtype.kind == "c":  # the complex step: an analytic continuation this algorithm lacks
        return np.tanh(x, out=out)
    dtype = np.dtype(np.float64) if x.dtype == np.float64 else _result_dtype(x.dtype)
    flat = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    if out is not None and out.dtype == np.float64 and out.flags.c_contiguous and out.shape == x.shape:
        result = out
    else:
        result = np.empty(x.shape, dtype=np.float64)
    if _tanh_loop is None:  # pragma: no cover - depends on the environment
        return np.tanh(x, out=out)
    _tanh_loop(flat, result.reshape(-1))
    if out is not None:
        if result is not out:
            out[...] = result
        return out
    if dtype != np.float64:
        result = result.astype(dtype)
    return result if x.ndim else result[()]
