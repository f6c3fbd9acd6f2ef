"""Ops for imported models, beyond the op table: the PyTorch rules at their edges (clamp's
bounds, GELU's forms) and refusals with the right status."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest
import semigrad as sg


def one_op(fn, shape=(5,)):
    g = sg.Graph()
    x = g.input("x", shape)
    g.output("out", fn(x))
    return g


def test_clamp_passes_the_gradient_at_its_bounds_as_pytorch_does(client):
    """torch.clamp's backward is 1 where min <= x <= max: at x == min and x == max too."""
    f = client.register(one_op(lambda x: sg.clamp(x, -1.0, 2.0)))
    x = np.array([-3.0, -1.0, 0.5, 2.0, 7.0])
    np.testing.assert_array_equal(f.evaluate({"x": x})["out"], [-1.0, -1.0, 0.5, 2.0, 2.0])
    np.testing.assert_array_equal(f.gradient({"x": x})["x"], [0.0, 1.0, 1.0, 1.0, 0.0])


def test_clamp_with_min_above_max_gives_max_everywhere_and_no_gradient(client):
    """torch.clamp(x, 2, 1) is 1 everywhere (max applied last); its gradient mask is empty."""
    f = client.register(one_op(lambda x: sg.clamp(x, 2.0, 1.0), (3,)))
    x = np.array([0.0, 1.5, 3.0])
    np.testing.assert_array_equal(f.evaluate({"x": x})["out"], [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(f.gradient({"x": x})["x"], [0.0, 0.0, 0.0])


def test_clamp_without_bounds_is_refused(client):
    with pytest.raises(ValueError, match="clamp"):
        one_op(lambda x: sg.clamp(x))
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("out", g.add_node("clamp", [x], {}, name="c"))
    with pytest.raises(sg.SemigradError) as excinfo:
        client.register(g)
    assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT and "'c'" in excinfo.value.message


@pytest.mark.parametrize("subscripts, why", [
    ("...ij,...jk->...ik", "'...'"), ("ii->i", "repeats"), ("ij,jk", "term"), ("ij,jk->ik", "size"),
    ("ij->iz", "output"), ("i1,1->i", "letter")])
def test_einsum_subscripts_the_engine_does_not_take_are_invalid_argument_naming_the_node(client, subscripts, why):
    g = sg.Graph()
    a, b = g.input("a", (2, 3)), g.input("b", (3, 2))
    operands = [a] if subscripts.count(",") == 0 else [a, b]
    if subscripts == "ij,jk":
        operands = [a, b, a]
    if why == "size":
        operands = [a, g.input("c", (4, 5))]
    if subscripts == "i1,1->i":
        operands = [a, b]
    g.output("out", g.add_node("einsum", operands, {"subscripts": subscripts}, name="e"))
    with pytest.raises(sg.SemigradError) as excinfo:
        client.register(g)
    assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'e'" in excinfo.value.message and why in excinfo.value.message, excinfo.value.message


def test_einsum_batches_every_operand_like_vmap(client, rng):
    """Both operands batched differently ((2, 1) and (3,)): item (s, t) is a NumPy loop's
    einsum of item s of a with item t of b; gradients per item by the closed form g·bᵀ."""
    g = sg.Graph()
    a, b = g.input("a", (2, 3)), g.input("b", (3, 4))
    g.output("out", sg.einsum("ij,jk->ik", a, b))
    f = client.register(g)
    av, bv = rng.normal(size=(2, 1, 2, 3)), rng.normal(size=(3, 3, 4))
    out = f.evaluate({"a": av, "b": bv})["out"]
    seed = rng.normal(size=out.shape)
    da = f.gradient({"a": av, "b": bv}, seeds={"out": seed})["a"]
    assert out.shape == (2, 3, 2, 4) and da.shape == (2, 3, 2, 3)
    for s in range(2):
        for t in range(3):
            np.testing.assert_allclose(out[s, t], av[s, 0] @ bv[t], rtol=1e-13)
            np.testing.assert_allclose(da[s, t], seed[s, t] @ bv[t].T, rtol=1e-13)


@pytest.mark.parametrize("subscripts, sizes", [
    ("u,uS,u", {"u": 182, "S": 2}),  # found by the differential fuzzer (issue 12)
    ("i,i,i->i", {"i": 4}),  # every letter in the output: NumPy's path is one step of all three
    ("ij,j,jk,k->", {"i": 2, "j": 3, "k": 2}),
])
def test_einsum_of_three_or_more_operands_whose_path_contracts_them_at_once(client, rng, subscripts, sizes):
    """NumPy's greedy path may contract three or more operands in one step (when every letter
    is in the output, or no pair fits its memory bound): 'u,uS,u' was INTERNAL ('too many
    values to unpack') in evaluate and gradient. Values and gradients against NumPy loops over
    the letters (the definition), with batch axes on one operand."""
    lhs, _, out = subscripts.partition("->")
    terms = lhs.split(",")
    if "->" not in subscripts:
        out = "".join(sorted(c for c in sizes if lhs.count(c) == 1))
    g = sg.Graph()
    handles = [g.input(f"x{k}", tuple(sizes[c] for c in t)) for k, t in enumerate(terms)]
    g.output("out", sg.einsum(subscripts, *handles))
    f = client.register(g)
    values = {f"x{k}": rng.normal(size=((2,) if k == 0 else ()) + tuple(sizes[c] for c in t))
              for k, t in enumerate(terms)}
    got = f.evaluate(values)["out"]
    seed = rng.normal(size=got.shape)
    grads = f.gradient(values, seeds={"out": seed})
    letters = sorted(sizes)
    for b in range(2):
        xs = [values[f"x{k}"][b] if k == 0 else values[f"x{k}"] for k in range(len(terms))]
        want = np.zeros(tuple(sizes[c] for c in out))
        dx = [np.zeros_like(x) for x in xs]
        for combo in np.ndindex(*(sizes[c] for c in letters)):
            at = dict(zip(letters, combo))
            factors = [x[tuple(at[c] for c in t)] for x, t in zip(xs, terms)]
            o = tuple(at[c] for c in out)
            want[o] += math.prod(factors)
            for k, t in enumerate(terms):
                dx[k][tuple(at[c] for c in t)] += seed[b][o] * math.prod(factors[:k] + factors[k + 1:])
        np.testing.assert_allclose(got[b], want, rtol=1e-12, atol=1e-12)
        for k in range(len(terms)):
            np.testing.assert_allclose(grads[f"x{k}"][b], dx[k], rtol=1e-12, atol=1e-12)


def test_an_einsum_of_few_products_over_large_operands_is_not_refused(client, rng):
    """The request's operation bound counted an einsum by its element-level expansion bound
    (operands × the product of the operands' sizes: 1.9·10¹² for 'lpV,lV,lpV->' at l = V = 64,
    p = 3), so a call of 24,576 products was RESOURCE_EXHAUSTED past max_request_operations
    (found by the differential fuzzer). The kernel's contractions are what it computes.
    Values and gradients by the closed forms of Σ a·b·c."""
    g = sg.Graph()
    a, b, c = g.input("a", (64, 3, 64)), g.input("b", (64, 64)), g.input("c", (64, 3, 64))
    g.output("out", sg.einsum("lpV,lV,lpV->", a, b, c))
    f = client.register(g)
    values = {"a": rng.normal(size=(2, 64, 3, 64)), "b": rng.normal(size=(64, 64)), "c": rng.normal(size=(64, 3, 64))}
    got = f.evaluate(values)["out"]
    grads = f.gradient(values)
    for i in range(2):
        ai, bb, cc = values["a"][i], values["b"][:, None, :], values["c"]
        np.testing.assert_allclose(got[i], np.sum(ai * bb * cc), rtol=1e-12)
        np.testing.assert_allclose(grads["a"][i], bb * cc, rtol=1e-12)
        np.testing.assert_allclose(grads["c"][i], ai * bb, rtol=1e-12)
        np.testing.assert_allclose(grads["b"][i], np.sum(ai * cc, axis=1), rtol=1e-12)


def test_argmax_and_argmin_take_the_first_of_ties_and_flatten_without_an_axis(client):
    g = sg.Graph()
    x = g.input("x", (2, 3))
    g.output("rows", sg.argmax(x, axis=1))
    g.output("cols", sg.argmin(x, axis=0, keepdims=True))
    g.output("flat", sg.argmax(x))
    f = client.register(g)
    xv = np.array([[[1.0, 5.0, 5.0], [2.0, 2.0, 0.0]], [[7.0, 7.0, 7.0], [0.0, 9.0, -1.0]]])  # batch of 2
    out = f.evaluate({"x": xv})
    np.testing.assert_array_equal(out["rows"], [[1, 0], [0, 1]])
    np.testing.assert_array_equal(out["cols"], [[[0, 1, 1]], [[1, 0, 1]]])
    np.testing.assert_array_equal(out["flat"], [1, 4])
    assert out["rows"].dtype == np.int64


def test_dropout_is_the_identity_in_eval_and_refuses_training():
    g = sg.Graph()
    x = g.input("x", (3,))
    assert sg.dropout(x, 0.1) is x and sg.dropout(x, 0.5, training=False) is x
    with pytest.raises(ValueError, match="training=True"):
        sg.dropout(x, 0.1, training=True)
    with pytest.raises(ValueError, match="p must be"):
        sg.dropout(x, 1.5)
