"""Depth-safe carriers on deep graphs where float64 over- or underflows: maxplus (max-product
in log space), log_entropy (entropy with log Z) and log_counting (path counts past 2^53),
against independent references computed here by dynamic programming over the graph's layers
in arbitrary precision (mpmath at 60 digits, Python ints), sharing no code with the server.

The graphs are chains of matmuls by constant matrices, h_{l+1} = W_l @ h_l, then a sum: the
element-level edges are h_l[j] → h_{l+1}[i] with partial W_l[i, j], then h_L[i] → y with 1."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import semigrad as sg

mpmath.mp.dps = 60


def chain(weights):
    g = sg.Graph()
    x = g.input("x", (weights[0].shape[1],))
    h = x
    for w in weights:
        h = g.const(w) @ h
    g.output("y", h.sum())
    return g


def backward_dp(weights, leaf, combine):
    """value[j] of every element of the input layer: combine(values of the next layer, W) from
    the output back; `leaf` is the value of each element of the last layer (its edge to y)."""
    values = [leaf] * weights[-1].shape[0]
    for w in reversed(weights):
        values = [combine(values, [w[i, j] for i in range(w.shape[0])]) for j in range(w.shape[1])]
    return values


def scales(rng, shape, lo, hi, density=1.0):
    """Signed entries of magnitude 10^U(lo, hi); a fraction 1 − density of them 0."""
    w = rng.choice([-1.0, 1.0], size=shape) * 10.0 ** rng.uniform(lo, hi, size=shape)
    return np.where(rng.random(shape) < density, w, 0.0)


def test_max_product_underflows_where_maxplus_does_not(client):
    rng = np.random.default_rng(0)
    weights = [scales(rng, (4, 4), -35, -30) for _ in range(12)]  # path products 1e-420 .. 1e-360
    f = client.register(chain(weights))
    point = {"x": np.ones(4)}

    def best(values, column):  # max over edges of |w| · best below
        return max((abs(mpmath.mpf(float(w))) * v for v, w in zip(values, column) if w != 0), default=mpmath.mpf(0))

    want = [mpmath.log(v) for v in backward_dp(weights, mpmath.mpf(1), best)]
    assert all(v < math.log(5e-324) for v in want)  # below the smallest float64: max_product is 0 there
    np.testing.assert_array_equal(f.gradient(point, semiring="max_product")["x"], np.zeros(4))
    np.testing.assert_allclose(f.gradient(point, semiring="maxplus")["x"], [float(v) for v in want], rtol=1e-13)


def test_entropy_overflows_where_log_entropy_does_not(client):
    rng = np.random.default_rng(1)
    for lo, hi in ((28, 35), (-35, -28)):  # Z ~ 1e+380 (overflows) and ~1e-380 (underflows)
        weights = [scales(rng, (4, 4), lo, hi, density=0.8) for _ in range(12)]
        f = client.register(chain(weights))
        point = {"x": np.ones(4)}

        def z_and_r(values, column):  # (Z, R) = ⊕ over edges of φ(w) ⊗ (Z, R) below
            z, r = mpmath.mpf(0), mpmath.mpf(0)
            for (zc, rc), w in zip(values, column):
                if w != 0:
                    p = abs(mpmath.mpf(float(w)))
                    z, r = z + p * zc, r + p * rc - zc * p * mpmath.log(p)
            return z, r

        zr = backward_dp(weights, (mpmath.mpf(1), mpmath.mpf(0)), z_and_r)
        want_h = [float(mpmath.log(z) + r / z) if z else 0.0 for z, r in zr]
        want_log_z = [float(mpmath.log(z)) if z else -math.inf for z, _ in zr]
        assert all(abs(v) > 745.2 for v in want_log_z)  # beyond float64 (1.8e308; subnormals end at 4.9e-324)
        got = f.gradient(point, semiring="log_entropy", return_components=True)
        np.testing.assert_allclose(got.components["x"]["log_Z"], want_log_z, rtol=1e-13)
        # An absolute error of ~1e-16 · |log Z| in log Z is a relative error of the paths' weights
        # in Q, the mean of −log w (|log w| ≈ |log Z|): H's absolute error grows as ~1e-16 · |log Z|²
        # (measured here: 1.3e-10 at |log Z| ≈ 808 over 12 layers; see docs/semirings.md).
        np.testing.assert_allclose(got["x"], want_h, rtol=0, atol=1e-15 * max(map(abs, want_log_z)) ** 2)
        assert min(want_h) > 0.5  # a spread-out distribution, not a trivial one
        with np.errstate(all="ignore"):
            plain = f.gradient(point, semiring="entropy")["x"]
        assert not np.allclose(plain, want_h, rtol=1e-6)  # float64 (Z, R) lost it


def test_counts_past_2_53_with_log_counting(client):
    rng = np.random.default_rng(2)
    weights = [scales(rng, (6, 6), -1, 1, density=0.7) for _ in range(40)]
    f = client.register(chain(weights))
    point = {"x": np.ones(6)}

    def count(values, column):
        return sum(v for v, w in zip(values, column) if w != 0)

    exact = backward_dp(weights, 1, count)  # Python ints
    assert min(exact) > 2**53
    floats = f.gradient(point, semiring="counting")["x"]
    assert any(int(c) != e for c, e in zip(floats, exact))  # float64 counting has rounded
    got = f.gradient(point, semiring="log_counting")["x"]
    np.testing.assert_allclose(got, [math.log(e) for e in exact], rtol=1e-14)
    # the count itself, to ~1e-13 relative (the log's error times log(count))
    for g, e in zip(got, exact):
        assert float(mpmath.exp(mpmath.mpf(float(g))) / e) == pytest.approx(1.0, rel=1e-12)


def test_signed_max_product_in_log_space(client):
    """12 layers of signed partials around 1e-32: the signed extremes underflow in float64
    (signed_max_product reads ±0), log_signed_max_product keeps their signs and logs."""
    rng = np.random.default_rng(3)
    weights = [scales(rng, (4, 4), -35, -30, density=0.8) for _ in range(12)]
    f = client.register(chain(weights))
    point = {"x": np.ones(4)}

    def extremes(values, column):  # (max, min) of the signed path products below, exactly
        hi, lo = None, None
        for (h, low), w in zip(values, column):
            if w != 0 and h is not None:
                w = mpmath.mpf(float(w))
                cands = (w * h, w * low)
                hi = max(cands) if hi is None else max(hi, *cands)
                lo = min(cands) if lo is None else min(lo, *cands)
        return hi, lo

    want = backward_dp(weights, (mpmath.mpf(1), mpmath.mpf(1)), extremes)
    assert all(h is not None and h != 0 for h, _ in want)
    got = f.gradient(point, semiring="log_signed_max_product", return_components=True).components["x"]
    for key, pick in (("max", 0), ("min", 1)):
        exact = [v[pick] for v in want]
        np.testing.assert_array_equal(got[f"sign_{key}"], [float(mpmath.sign(v)) for v in exact])
        np.testing.assert_allclose(got[f"log_abs_{key}"], [float(mpmath.log(abs(v))) for v in exact], rtol=1e-13)
    assert all(float(mpmath.log(abs(h))) < math.log(5e-324) for h, _ in want)  # float64 cannot hold them
    plain = f.gradient(point, semiring="signed_max_product", return_components=True).components["x"]
    assert np.all(plain["max"] == 0) and np.all(plain["min"] == 0)
