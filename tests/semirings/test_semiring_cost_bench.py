"""bench/semiring_cost.py stays runnable and right: its closed forms agree with the engine on a
small MLP for every semiring, and semiring matmuls stay within their memory blocks."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad_paths.kbest as kbest_module
import semigrad_server.semiring.base as base_module
import semiring_cost  # bench/ is on the test path
from semigrad_server.engine import Engine
from semigrad_server.semiring.loader import default_registry
from semigrad_server.service.convert import graph_from_proto


@pytest.fixture(scope="module")
def mlp():
    engine = Engine()
    gid = engine.register(graph_from_proto(semiring_cost.mlp_graph(5, 3, 4).to_proto()))[0].id
    rng = np.random.default_rng(1)
    inputs = {"x": rng.normal(size=(5, 3)), "W1": rng.normal(size=(3, 4)), "W2": rng.normal(size=(4, 3))}
    return engine, gid, inputs


@pytest.mark.parametrize("name", semiring_cost.SEMIRINGS)
def test_the_closed_forms_agree_with_the_engine(mlp, name):
    engine, gid, inputs = mlp
    got = engine.gradient(gid, inputs, semiring=name).gradients
    semiring_cost.check(name, got, semiring_cost.expected(name, inputs["x"], inputs["W1"], inputs["W2"]))


def test_a_wrong_gradient_is_caught(mlp):
    engine, gid, inputs = mlp
    got = dict(engine.gradient(gid, inputs, semiring="max_product").gradients)
    got["W1"] = got["W1"] * (1 + 1e-6)
    with pytest.raises(semiring_cost.WrongGradient, match="W1"):
        semiring_cost.check("max_product", got, semiring_cost.expected("max_product", inputs["x"], inputs["W1"],
                                                                       inputs["W2"]))


@pytest.mark.parametrize("name", ["max_product", "kbest", "maxplus", "bottleneck", "entropy", "log"])
def test_semiring_matmul_does_not_build_the_full_product(monkeypatch, name):
    """With blocks of 2¹⁶ elements, a 96×96 @ 96×96 matmul peaks far below the 96³·8 bytes
    per component of the whole product, and still equals it."""
    monkeypatch.setattr(base_module, "MATMUL_BLOCK_ELEMENTS", 1 << 16)
    monkeypatch.setattr(kbest_module, "MATMUL_BLOCK_ELEMENTS", 1 << 16)
    s = default_registry().get(name, {})
    n = 96
    rng = np.random.default_rng(0)
    a, b = s.lift(rng.normal(size=(n, n))), s.lift(rng.normal(size=(n, n)))
    full = n**3 * 8 * s.components
    s.matmul(a, b)  # a first call may compile (numba) or load a compiled kernel: not the matmul's memory
    got = []
    peak = semiring_cost.peak_bytes(lambda: got.append(s.matmul(a, b)))
    assert peak < full / 4, (peak, full)
    rows = s.map(lambda c: c[:7], a)  # spot check 7 rows against ⊕ over k of a[i, k] ⊗ b[k, j]
    want = None
    for k in range(n):
        term = s.mul(s.map(lambda c: c[:, k, None], rows), s.map(lambda c: c[None, k, :], b))
        want = term if want is None else s.add(want, term)
    assert np.all(s.equal(s.map(lambda c: c[:7], got[0]), want))
