"""sg.trace on NumPy-style functions (issue 14 item 3): the same function run by NumPy gives the
reference values, central finite differences of it (and closed forms where there are any) the
reference gradients; every test runs against the server and in process (the `client` fixture)."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg


def central_differences(fn, args: dict, name: str, step: float = 1e-6) -> np.ndarray:
    """d fn / d args[name] by central differences of the NumPy function itself."""
    x = np.array(args[name], dtype=float)
    grad = np.empty_like(x)
    for index in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[index] += step
        lo[index] -= step
        grad[index] = (fn(**{**args, name: hi}) - fn(**{**args, name: lo})) / (2 * step)
    return grad


# ---------------------------------------------------------------- the acceptance functions

def det(a):
    """The README's determinant by minors, written with NumPy indexing and np.concatenate."""
    n = a.shape[0]
    if n == 1:
        return a[0, 0]
    total = 0.0
    for j in range(n):
        minor = np.concatenate([a[1:, k:k + 1] for k in range(n) if k != j], axis=1)
        total = total + (-1) ** j * a[0, j] * det(minor)
    return total


def mlp(x, W1, b1, W2, b2):
    h = np.tanh(x @ W1 + b1)
    return np.sum((h @ W2 + b2) ** 2)


def attention(q, k, v):
    """Softmax attention (numerically stable), its outputs squared and summed."""
    scores = q @ k.T / np.sqrt(q.shape[-1])
    e = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
    p = e / np.sum(e, axis=-1, keepdims=True)
    return np.sum((p @ v) ** 2)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_recursive_determinant_with_numpy_indexing(client, rng, n):
    a = rng.normal(size=(n, n))
    f = client.register(sg.trace(det, a))
    assert list(f.input_specs) == ["a"]
    grads, outputs = f.gradient({"a": a}, return_outputs=True)
    np.testing.assert_allclose(outputs["out"], det(a), rtol=1e-12)
    np.testing.assert_allclose(outputs["out"], np.linalg.det(a), rtol=1e-10)
    np.testing.assert_allclose(grads["a"], np.linalg.det(a) * np.linalg.inv(a).T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads["a"], central_differences(det, {"a": a}, "a"), rtol=1e-6, atol=1e-8)
    batch = rng.normal(size=(7, n, n))  # the traced graph takes batches like any other
    np.testing.assert_allclose(f.gradient({"a": batch})["a"],
                               np.linalg.det(batch)[:, None, None] * np.linalg.inv(batch).transpose(0, 2, 1),
                               rtol=1e-9, atol=1e-12)


def test_an_mlp_with_tanh_and_matmul(client, rng):
    args = {"x": rng.normal(size=(5, 3)), "W1": rng.normal(size=(3, 4)), "b1": rng.normal(size=4),
            "W2": rng.normal(size=(4, 2)), "b2": rng.normal(size=2)}
    f = client.register(sg.trace(mlp, *args.values()))
    assert list(f.input_specs) == list(args)
    grads, outputs = f.gradient(args, return_outputs=True)
    np.testing.assert_allclose(outputs["out"], mlp(**args), rtol=1e-12)
    for name in args:
        np.testing.assert_allclose(grads[name], central_differences(mlp, args, name), rtol=1e-6, atol=1e-7,
                                   err_msg=name)


def test_softmax_attention_with_exp_and_sum(client, rng):
    args = {"q": rng.normal(size=(4, 3)), "k": rng.normal(size=(5, 3)), "v": rng.normal(size=(5, 2))}
    f = client.register(sg.trace(attention, *args.values()))
    grads, outputs = f.gradient(args, return_outputs=True)
    np.testing.assert_allclose(outputs["out"], attention(**args), rtol=1e-12)
    for name in args:
        np.testing.assert_allclose(grads[name], central_differences(attention, args, name), rtol=1e-6, atol=1e-8,
                                   err_msg=name)


# ---------------------------------------------------------------- the mapped NumPy functions

def everything(x, y):
    """One of each mapped function, every result kept (as outputs of a dict)."""
    return {
        "ufuncs": np.sin(x) * np.cos(y) + np.exp(-np.square(x)) - np.log1p(np.abs(y)) / np.sqrt(2 + np.tanh(x)),
        "max_min": np.maximum(x, y) - np.minimum(x, 0.5) + np.sign(y),
        "where": np.where(x > y, x, 2 * y),
        "sum_axis": np.sum(x, axis=0) + x.sum(1)[0] + np.mean(y) + np.max(x, axis=1, keepdims=True).T[0, 1],
        "shapes": np.concatenate([x, y], axis=0).reshape(12)[::2] + np.stack([x, y], axis=1).transpose(1, 0, 2)[0]
        .reshape(-1)[:6] + np.swapaxes(x, 0, 1).reshape((6,)),
        "linear": np.dot(x, y.T) + np.matmul(y, x.T) + x @ np.ones((3, 3)) @ y.T,
        "clip_expand": np.clip(np.expand_dims(x, 0), -0.5, 0.5)[0] + np.squeeze(x[:1]),
    }


def test_every_mapped_function_equals_numpy(client, rng):
    x, y = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    f = client.register(sg.trace(everything, x, y))
    values = f.evaluate({"x": x, "y": y})
    want = everything(x, y)
    assert set(values) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(values[name], value, rtol=1e-12, atol=1e-14, err_msg=name)
    total = lambda x, y: sum(float(np.sum(v)) for v in everything(x, y).values())  # noqa: E731
    grads = f.gradient({"x": x, "y": y})
    for name in ("x", "y"):  # finite differences away from the kinks of max, where, clip, sign
        np.testing.assert_allclose(grads[name], central_differences(total, {"x": x, "y": y}, name),
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("call, named", [
    (lambda h: np.linalg.det(h), "numpy.linalg.det"),
    (lambda h: np.sort(h), "numpy.sort"),
    (lambda h: np.arccos(h), "numpy.arccos"),
    (lambda h: np.add.reduce(h), "numpy.add.reduce"),
    (lambda h: np.asarray(h), "not an array"),
    (lambda h: np.sin(h, out=np.empty((2, 2))), "out="),
    (lambda h: np.sum(h, dtype=np.float32), "dtype"),
    (lambda h: np.where(h > 0), "three-argument"),
])
def test_anything_else_is_a_type_error_naming_the_function(call, named):
    with pytest.raises(TypeError, match=named.replace(".", r"\.")):
        sg.trace(call, np.ones((2, 2)))


def test_inputs_are_named_after_the_parameters_or_given_names():
    def f(weights, *rest):
        return np.sum(weights) + rest[0] * rest[1]

    g = sg.trace(f, np.ones(3), 1.0, np.float32(2))
    assert [(i.name, list(i.shape)) for i in g.to_proto().inputs] == [("weights", [3]), ("rest_0", []), ("rest_1", [])]
    g = sg.trace(f, np.ones(3), 1.0, 2.0, names=["a", "b", "c"], outputs="total")
    assert [i.name for i in g.to_proto().inputs] == ["a", "b", "c"]
    assert [o.name for o in g.to_proto().outputs] == ["total"]
    g = sg.trace(lambda x: (np.sin(x), np.cos(x)), sg.TensorSpec((2, 2), "float32"))
    assert [o.name for o in g.to_proto().outputs] == ["out0", "out1"]
    with pytest.raises(TypeError, match="positional"):
        sg.trace(lambda x: x, 1.0, 2.0)
    with pytest.raises(TypeError, match="truth value"):  # a branch on a value cannot be traced
        sg.trace(lambda x: x if x > 0 else -x, 1.0)
