"""Generated window geometries for conv1d/conv2d and max/avg pooling (shapes, kernel, stride,
padding, dilation, groups, batch axes on either operand): values and gradients against the
definition written as NumPy loops here (the gradient as the definition's adjoint, loop by
loop), and the client's shape rule against the server's. A geometry whose windows do not
fit is refused by both: ValueError while building, INVALID_ARGUMENT naming the node."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import semigrad as sg
from hypothesis import given
from hypothesis import strategies as st


def _reads(spatial, kernel, stride, padding, dilation):
    """[(output position, kernel offset, unpadded input position)] for every in-range read."""
    nd = len(spatial)
    out = [(spatial[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    reads = []
    for pos in np.ndindex(*out):
        for k in np.ndindex(*kernel):
            src = tuple(pos[i] * stride[i] + k[i] * dilation[i] - padding[i] for i in range(nd))
            if all(0 <= s < spatial[i] for i, s in enumerate(src)):
                reads.append((pos, k, src))
    return tuple(out), reads


def conv_reference(x, w, seed, stride, padding, dilation, groups):
    """out, d(Σ seed·out)/dx, d(Σ seed·out)/dw for one item."""
    out_sp, reads = _reads(x.shape[2:], w.shape[2:], stride, padding, dilation)
    out = np.zeros((x.shape[0], w.shape[0]) + out_sp)
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    cg, og = x.shape[1] // groups, w.shape[0] // groups
    for n in range(x.shape[0]):
        for o in range(w.shape[0]):
            for pos, k, src in reads:
                for c in range(cg):
                    xi = (n, (o // og) * cg + c) + src
                    out[(n, o) + pos] += w[(o, c) + k] * x[xi]
                    dx[xi] += w[(o, c) + k] * seed[(n, o) + pos]
                    dw[(o, c) + k] += x[xi] * seed[(n, o) + pos]
    return out, dx, dw


def pool_reference(x, seed, kind, kernel, stride, padding):
    out_sp, reads = _reads(x.shape[2:], kernel, stride, padding, (1,) * len(kernel))
    out = np.zeros(x.shape[:2] + out_sp)
    dx = np.zeros_like(x)
    size = int(np.prod(kernel))
    for n, c in np.ndindex(*x.shape[:2]):
        windows: dict = {}
        for pos, _, src in reads:
            windows.setdefault(pos, []).append(src)
        for pos, srcs in windows.items():
            values = [x[(n, c) + s] for s in srcs]
            if kind == "max":
                first = int(np.argmax(values))  # the first maximum
                out[(n, c) + pos] = values[first]
                dx[(n, c) + srcs[first]] += seed[(n, c) + pos]
            else:
                out[(n, c) + pos] = sum(values) / size
                for s in srcs:
                    dx[(n, c) + s] += seed[(n, c) + pos] / size
    return out, dx


@st.composite
def geometries(draw, pool: bool):
    nd = draw(st.sampled_from([1, 2]))
    spatial = tuple(draw(st.integers(1, 6)) for _ in range(nd))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(nd))
    dilation = (1,) * nd if pool else tuple(draw(st.integers(1, 2)) for _ in range(nd))
    return nd, spatial, kernel, stride, padding, dilation


def _fits(spatial, kernel, stride, padding, dilation) -> bool:
    return all(s + 2 * p - d * (k - 1) - 1 >= 0 for s, k, p, d in zip(spatial, kernel, padding, dilation))


@given(geometry=geometries(pool=False), groups=st.integers(1, 2), per_group=st.integers(1, 2),
       out_per_group=st.integers(1, 2), images=st.integers(1, 2), batch=st.sampled_from(["none", "x", "w", "both"]),
       seed=st.integers(0, 2**32 - 1))
def test_conv(client, geometry, groups, per_group, out_per_group, images, batch, seed):
    nd, spatial, kernel, stride, padding, dilation = geometry
    rng = np.random.default_rng(seed)
    xs, ws = (images, groups * per_group) + spatial, (groups * out_per_group, per_group) + kernel
    conv = sg.conv2d if nd == 2 else sg.conv1d
    g = sg.Graph()
    x, w = g.input("x", xs), g.input("w", ws)
    if not _fits(spatial, kernel, stride, padding, dilation):
        with pytest.raises(ValueError):
            conv(x, w, stride, padding, dilation, groups)
        g.output("out", g.add_node(f"conv{nd}d", [x, w], {"stride": stride, "padding": padding,
                                                          "dilation": dilation, "groups": groups}, name="c"))
        with pytest.raises(sg.SemigradError) as excinfo:
            client.register(g)
        assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT and "'c'" in excinfo.value.message
        return
    h = conv(x, w, stride, padding, dilation, groups)
    g.output("out", h)
    f = client.register(g)
    b = 2
    inputs = {"x": rng.normal(size=((b,) if batch in ("x", "both") else ()) + xs),
              "w": rng.normal(size=((b,) if batch in ("w", "both") else ()) + ws)}
    out = f.evaluate(inputs)["out"]
    lead = (b,) if batch != "none" else ()
    assert out.shape == lead + h.shape
    seeds = rng.normal(size=out.shape)
    grads = f.gradient(inputs, seeds={"out": seeds})
    for item in (range(b) if lead else [None]):
        pick = (lambda a, batched: a[item] if item is not None and batched else a)
        want, dx, dw = conv_reference(pick(inputs["x"], batch in ("x", "both")), pick(inputs["w"], batch in ("w", "both")),
                                      pick(seeds, True), stride, padding, dilation, groups)
        np.testing.assert_allclose(pick(out, True), want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(pick(grads["x"], True), dx, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(pick(grads["w"], True), dw, rtol=1e-12, atol=1e-12)


@given(geometry=geometries(pool=True), kind=st.sampled_from(["max", "avg"]), channels=st.integers(1, 2),
       seed=st.integers(0, 2**32 - 1), ties=st.booleans())
def test_pool(client, geometry, kind, channels, seed, ties):
    nd, spatial, kernel, stride, padding, _ = geometry
    rng = np.random.default_rng(seed)
    pool = getattr(sg, f"{kind}_pool{nd}d")
    xs = (1, channels) + spatial
    g = sg.Graph()
    x = g.input("x", xs)
    if not _fits(spatial, kernel, stride, padding, (1,) * nd) or any(2 * p > k for p, k in zip(padding, kernel)):
        with pytest.raises(ValueError):
            pool(x, kernel, stride, padding)
        g.output("out", g.add_node(f"{kind}_pool{nd}d", [x], {"kernel_size": kernel, "stride": stride,
                                                              "padding": padding}, name="p"))
        with pytest.raises(sg.SemigradError) as excinfo:
            client.register(g)
        assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT and "'p'" in excinfo.value.message
        return
    h = pool(x, kernel, stride, padding)
    g.output("out", h)
    f = client.register(g)
    value = rng.integers(-2, 3, size=xs).astype(float) if ties else rng.normal(size=xs)  # ties: small integers
    out = f.evaluate({"x": value})["out"]
    assert out.shape == h.shape
    seeds = rng.normal(size=out.shape)
    want, dx = pool_reference(value, seeds, kind, kernel, stride, padding)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(f.gradient({"x": value}, seeds={"out": seeds})["x"], dx, rtol=1e-12, atol=1e-12)
