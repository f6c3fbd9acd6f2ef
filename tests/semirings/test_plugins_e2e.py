"""The plugin semirings through the gRPC service: gradients, components, parameters, best paths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import semigrad as sg

H_04_06 = -(0.4 * math.log(0.4) + 0.6 * math.log(0.6))

# y = 0.5 · (2x + 3x): two parallel paths with partials 2 and 3, joined by an add, then 0.5.
# Path products 1.0 and 1.5.
EXPECTED = {
    "real": 2.5,
    "max_product": 1.5,
    "log": math.log(2.5),
    "entropy": H_04_06,
    "kbest": 1.5,
    "boolean": True,
    "counting": 2.0,
    "maxplus": math.log(1.5),
    "minplus": 0.0,
    "bottleneck": 0.5,
    "signed_max_product": 1.5,  # the most positive path product (its "min" is 1.0)
    "log_entropy": H_04_06,
    "log_counting": math.log(2.0),
    "log_signed_max_product": math.log(1.5),  # log|most positive path product|
}


@pytest.fixture(scope="module")
def two_paths(client):
    g = sg.Graph()
    x = g.input("x", ())
    g.output("y", (x * 2.0 + x * 3.0) * 0.5)
    return client.register(g)


@pytest.fixture(scope="module")
def matmul_sum(client):
    g = sg.Graph()
    a, b = g.input("A", (2, 3)), g.input("B", (3, 4))
    g.output("s", (a @ b).sum())
    return client.register(g)


def test_the_server_lists_every_plugin_semiring(client):
    infos = {s.name: s for s in client.list_semirings()}
    assert set(EXPECTED) <= set(infos)
    assert all(infos[name].status == "ok" for name in EXPECTED)
    assert infos["entropy"].primary == "entropy" and infos["entropy"].components == 2
    assert infos["kbest"].parameters.keys() == {"k"}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_two_parallel_paths(two_paths, name):
    got = two_paths.gradient({"x": 0.7}, semiring=name)["x"]
    assert got.shape == ()
    assert got == pytest.approx(EXPECTED[name], rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_two_parallel_paths_batched(two_paths, name):
    got = two_paths.gradient({"x": np.arange(6.0).reshape(2, 3)}, semiring=name)["x"]
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got, np.full((2, 3), float(EXPECTED[name])), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("backend", ["tensor", "scalar"])
@pytest.mark.parametrize("name", list(EXPECTED))
def test_forward_values_come_back_as_values_under_every_semiring(two_paths, name, backend):
    """return_outputs: the forward values, whatever the semiring's carrier (the scalar backend
    returned a tuple carrier's outputs as tuples: INTERNAL, found by tests/hostile)."""
    x = np.array([1.0, -2.0])
    _, outputs = two_paths.gradient({"x": x}, semiring=name, backend=backend, return_outputs=True)
    np.testing.assert_array_equal(outputs["y"], 2.5 * x)


def test_entropy_components(two_paths):
    grads = two_paths.gradient({"x": 1.0}, semiring="entropy", return_components=True)
    parts = grads.components["x"]
    assert set(parts) == {"entropy", "Z", "R"}
    assert parts["Z"] == pytest.approx(2.5) and parts["R"] == pytest.approx(-1.5 * math.log(1.5))
    assert grads["x"] == pytest.approx(H_04_06)


@pytest.mark.parametrize("k,want", [(None, [1.5, 1.0, 0.0]), (1, [1.5]),
                                    (5, [1.5, 1.0, 0.0, 0.0, 0.0])])
def test_kbest_parameter_and_components(two_paths, k, want):
    params = None if k is None else {"k": k}
    grads = two_paths.gradient({"x": np.zeros(4)}, semiring="kbest", semiring_params=params, return_components=True)
    np.testing.assert_array_equal(grads["x"], np.full(4, 1.5))
    np.testing.assert_array_equal(grads.components["x"]["kbest"], np.tile(want, (4, 1)))


def test_kbest_rejects_a_bad_k(two_paths):
    with pytest.raises(sg.errors.InvalidArgument, match="'k'"):
        two_paths.gradient({"x": 1.0}, semiring="kbest", semiring_params={"k": 100})


def test_semiring_matmul_through_the_service(matmul_sum):
    """∂s/∂A[i, k] runs over the paths A[i, k] → C[i, j] (partial B[k, j]) → s, one per j."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 3)), rng.normal(size=(3, 4))
    b[1, 2] = 0.0
    row = np.abs(b)  # per k: the path products over j
    cases = {
        "real": b.sum(axis=1),
        "log": np.log(row.sum(axis=1)),
        "max_product": row.max(axis=1),
        "bottleneck": np.minimum(row, 1.0).max(axis=1),  # the sum's partial 1 is on every path
        "maxplus": np.log(row.max(axis=1)),
        "minplus": np.log(np.where(row > 0, row, np.inf).min(axis=1)),
        "counting": (b != 0).sum(axis=1).astype(float),
        "boolean": (b != 0).any(axis=1),
    }
    for name, per_k in cases.items():
        got = matmul_sum.gradient({"A": a, "B": b}, wrt="A", semiring=name)["A"]
        np.testing.assert_allclose(got, np.broadcast_to(per_k, (2, 3)), rtol=1e-12, err_msg=name)
    got = matmul_sum.gradient({"A": a, "B": b}, wrt="A", semiring="kbest", semiring_params={"k": 1})["A"]
    np.testing.assert_allclose(got, np.broadcast_to(row.max(axis=1), (2, 3)), rtol=1e-12)


def test_tuple_semirings_through_matmul(matmul_sum):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 3)), rng.normal(size=(3, 4))
    row = np.abs(b)
    grads = matmul_sum.gradient({"A": a, "B": b}, wrt="A", semiring="kbest", semiring_params={"k": 4},
                                return_components=True)
    np.testing.assert_allclose(grads.components["A"]["kbest"][0], np.sort(row, axis=1)[:, ::-1])
    p = row / row.sum(axis=1, keepdims=True)
    h = matmul_sum.gradient({"A": a, "B": b}, wrt="A", semiring="entropy")["A"]
    np.testing.assert_allclose(h[0], -(p * np.log(p)).sum(axis=1), rtol=1e-12)


def test_best_path_under_max_product(two_paths):
    grads = two_paths.gradient({"x": 1.0}, semiring="max_product", best_path=[("x", ())])
    (path,) = grads.best_paths
    assert path.output == "y"
    assert path.value == {"value": pytest.approx(1.5)}
    assert [step.partial for step in path.steps] == [1.0, 3.0, 1.0, 0.5]
