"""The tanh op's own implementation (ops/tanh.py): its error against mpmath over the whole
range, the same bits from every form of it (numba SIMD loop, numba scalar, Python
floats, the printed stand-alone source over NumPy arrays), and NumPy's calling conventions."""

import math

import mpmath
import numpy as np
import pytest

from semigrad_server.ops import REGISTRY
from semigrad_server.ops import tanh as t

MAX_ULP = 0.74  # what the module docstring states

pytestmark = pytest.mark.skipif(t.numba is None, reason="without numba the op is NumPy's and libm's tanh")


def _points() -> np.ndarray:
    rng = np.random.default_rng(7)
    edges = [t.T_SMALL, t.T_ONE, t.T_TINY, 19.0615, 0.5, 1.0]  # every threshold, and where ±1 takes over
    near = [e + d for e in edges for d in rng.uniform(-1e-3, 1e-3, 400) * e]
    near += [np.nextafter(e, s) for e in edges for s in (0.0, np.inf)] + edges
    xs = np.concatenate([
        rng.uniform(0, 25, 8000),
        np.exp(rng.uniform(math.log(1e-12), math.log(30), 8000)),
        rng.standard_normal(4000),
        np.array(near),
        [5e-324, 2.2e-308, 1e-300, 1e-20, 1e-9, 3.0, 40.0, 1e300, np.finfo(float).max],
    ])
    return np.concatenate([xs, -xs])


def _ulp_errors(got: np.ndarray, xs: np.ndarray) -> np.ndarray:
    mpmath.mp.prec = 120
    out = np.empty(xs.size)
    for i, (x, g) in enumerate(zip(xs.tolist(), got.tolist())):
        exact = mpmath.tanh(mpmath.mpf(x))
        e = mpmath.frexp(exact)[1] if exact != 0 else -1074  # 2^(e-1) <= |exact| < 2^e
        ulp = mpmath.ldexp(1, max(int(e) - 53, -1074))
        out[i] = float(abs(mpmath.mpf(g) - exact) / ulp)
    return out


def test_error_against_mpmath_is_within_the_stated_bound():
    xs = _points()
    errors = _ulp_errors(t.tanh(xs), xs)
    assert errors.max() <= MAX_ULP, (errors.max(), xs[np.argmax(errors)])
    # almost always correctly rounded (glibc's tanh: ~18% of these points off by more than 0.5 ulp)
    assert np.mean(errors > 0.5) < 0.02


def test_special_values():
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1e-300, 20.0, -20.0, 19.0, 1e308])
    got = t.tanh(special)
    np.testing.assert_array_equal(got[:4], [0.0, -0.0, 1.0, -1.0])
    assert np.signbit(got[1]) and not np.signbit(got[0])
    assert np.isnan(got[4])
    np.testing.assert_array_equal(got[5:8], special[5:8])  # tiny x: x itself, subnormals included
    np.testing.assert_array_equal(got[8:10], [1.0, -1.0])
    assert got[10] == 1 - 2**-53  # tanh(19) = 1 - 6.3e-17 rounds below 1
    assert got[11] == 1.0


def _quietly(fn, xs):
    with np.errstate(all="ignore"):  # both branches are computed for every element (inf * inf, ...)
        return fn(xs)


def test_every_form_gives_the_same_bits():
    xs = np.concatenate([_points(), [np.nan, np.inf, -np.inf, 0.0, -0.0]])
    kernel = t.tanh(xs)
    forms = {
        "compiled float": np.array([t.tanh_float(float(x)) for x in xs]),
        "python floats": np.array([t._tanh(float(x)) for x in xs]),
    }
    namespace = {"numpy": np, "math": math}
    exec(t.SOURCE, namespace)  # the printed formulas' stand-alone definition
    forms["stand-alone source"] = _quietly(namespace["tanh"], xs)
    for name, got in forms.items():
        np.testing.assert_array_equal(got.view(np.int64), kernel.view(np.int64), err_msg=name)


def test_the_op_uses_it_everywhere():
    op = next(o for o in REGISTRY if o.name == "tanh")
    assert op.elementwise_fn is t.tanh and op.float_fn is t.tanh_float and op.source == t.SOURCE


def test_numpy_conventions():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 7)) * 3
    expected = t.tanh(x.reshape(-1)).reshape(6, 7)
    out = np.empty((6, 7))
    assert t.tanh(x, out=out) is out
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(t.tanh(x.T), expected.T)  # non-contiguous operand
    strided = np.empty((7, 6)).T  # a non-contiguous out=
    assert t.tanh(x, out=strided) is strided
    np.testing.assert_array_equal(strided, expected)
    scalar = t.tanh(np.float64(0.25))
    assert type(scalar) is np.float64 and scalar == t.tanh(np.array([0.25]))[0]
    assert t.tanh(np.array(0.25)).shape == () or np.isscalar(t.tanh(np.array(0.25)))
    f32 = t.tanh(x.astype(np.float32))
    assert f32.dtype == np.float32
    np.testing.assert_array_equal(f32, t.tanh(x.astype(np.float32).astype(np.float64)).astype(np.float32))
    assert t.tanh(np.arange(3)).dtype == np.float64
    z = np.array([0.3 + 1e-20j])  # the complex step: NumPy's analytic tanh
    assert t.tanh(z)[0].imag == pytest.approx(1e-20 / math.cosh(0.3) ** 2, rel=1e-12)
    assert t.tanh(np.empty((0, 3))).shape == (0, 3)
