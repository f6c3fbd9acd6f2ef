"""A graph registered once gives exact gradients for any number of new inputs (no stale
saved values), one at a time or in batches: det-by-minors against det(A)·A⁻ᵀ."""

from __future__ import annotations

import numpy as np
import pytest
from reference import det_gradient, det_graph


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_det_by_minors_reused_over_fresh_matrices(client, rng, n):
    f = client.register(det_graph(n))
    for _ in range(20):
        a = rng.normal(size=(n, n))
        grads, outputs = f.gradient({"A": a}, return_outputs=True)
        np.testing.assert_allclose(outputs["det"], np.linalg.det(a), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(grads["A"], det_gradient(a), rtol=1e-9, atol=1e-11)


def test_registering_again_returns_the_same_id(client):
    first = client.register(det_graph(3))
    second = client.register(det_graph(3))
    assert first.id == second.id
    assert first.id != client.register(det_graph(4)).id


def test_one_batched_call_equals_many_single_calls(client, rng):
    n, count = 3, 1000
    f = client.register(det_graph(n))
    batch = rng.normal(size=(count, n, n))
    batched = f.gradient({"A": batch})["A"]
    assert batched.shape == (count, n, n)
    singles = np.stack([f.gradient({"A": a})["A"] for a in batch])
    np.testing.assert_array_equal(batched, singles)
    np.testing.assert_allclose(batched, det_gradient(batch), rtol=1e-9, atol=1e-11)


def test_multiple_batch_dimensions(client, rng):
    f = client.register(det_graph(3))
    batch = rng.normal(size=(4, 5, 3, 3))
    np.testing.assert_allclose(f.gradient({"A": batch})["A"], det_gradient(batch), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(f.evaluate({"A": batch})["det"], np.linalg.det(batch), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("batch", [(), (300,)], ids=["single", "batched"])
def test_plain_requests_take_a_shorter_path_to_the_same_bits(client, rng, batch, monkeypatch):
    """The server answers option-free real gradient requests through a short path; an explicit
    seed of ones (the default cotangent) sends the same question through the general path."""
    from semigrad_server.engine import Engine

    short = []
    original = Engine.plain_gradient
    monkeypatch.setattr(Engine, "plain_gradient", lambda self, *a: short.append(1) or original(self, *a))
    f = client.register(det_graph(4))
    for _ in range(3):
        a = rng.normal(size=batch + (4, 4))
        plain, plain_out = f.gradient({"A": a}, return_outputs=True)
        general, general_out = f.gradient({"A": a}, seeds={"det": np.ones(batch)}, return_outputs=True)
        np.testing.assert_array_equal(plain["A"], general["A"])
        np.testing.assert_array_equal(plain_out["det"], general_out["det"])
        np.testing.assert_allclose(plain["A"], det_gradient(a), rtol=1e-10, atol=1e-12)
    assert len(short) == 3  # one per plain request, none for the seeded ones
