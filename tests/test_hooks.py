"""Retained gradients and hooks on the backward pass, server-side and in the client, checked
against independently computed chain-rule values."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
import semigrad as sg
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc


def chain_graph():
    """a = sin(x); b = a*y; out = sum(b*b + a): the node `a` has two consumers."""
    g = sg.Graph()
    x, y = g.input("x", (3,)), g.input("y", (3,))
    a = sg.sin(x, name="a")
    b = sg.mul(a, y, name="b")
    g.output("out", sg.sum(b * b + a))
    return g


def real_expectations(x, y, scale_at_a=1.0):
    a, b = np.sin(x), np.sin(x) * y
    g_a = (2 * b * y + 1) * scale_at_a  # ∂out/∂a = 2 b y + 1, then the hook's factor
    return {"x": g_a * np.cos(x), "y": 2 * b * a, "a": g_a}


def max_product_expectations(x, y, scale_at_a=1.0):
    a, b = np.sin(x), np.sin(x) * y
    g_a = np.maximum(np.abs(y * b), 1.0) * scale_at_a  # best path from a: via b and b*b, or straight to the sum
    return {"x": np.abs(np.cos(x)) * g_a, "y": np.abs(a) * np.abs(b), "a": g_a}


@pytest.fixture
def chain(client):
    return client.register(chain_graph())


@pytest.fixture
def remote_chain(remote_client):
    """The chain on the test server, for tests that also reach that server another way."""
    return remote_client.register(chain_graph())


@pytest.fixture
def point(rng):
    return {"x": rng.normal(size=3), "y": rng.normal(size=3) * 2}


@pytest.mark.parametrize("semiring,expect", [("real", real_expectations), ("max_product", max_product_expectations)])
def test_retained_gradients(chain, point, semiring, expect):
    grads = chain.gradient(point, semiring=semiring, retain=["a"])
    want = expect(**point)
    np.testing.assert_allclose(grads.retained["a"], want["a"], rtol=1e-12)
    np.testing.assert_allclose(grads["x"], want["x"], rtol=1e-12)


@pytest.mark.parametrize("semiring,expect", [("real", real_expectations), ("max_product", max_product_expectations)])
def test_a_post_hook_doubling_a_gradient_changes_upstream_as_the_chain_rule_predicts(chain, point, semiring, expect):
    grads = chain.gradient(point, semiring=semiring, retain=["a"], hooks={"a": sg.ServerHook("scale", factor=2.0)})
    want = expect(**point, scale_at_a=2.0)
    np.testing.assert_allclose(grads.retained["a"], want["a"], rtol=1e-12)
    np.testing.assert_allclose(grads["x"], want["x"], rtol=1e-12)  # upstream of a: doubled
    np.testing.assert_allclose(grads["y"], want["y"], rtol=1e-12)  # not through a: unchanged


def three_consumers_graph():
    """a = exp(x) feeds three consumers: 3a, sin(a), a²."""
    g = sg.Graph()
    x = g.input("x", (2,))
    a = sg.exp(x, name="a")
    g.output("out", sg.sum(sg.mul(a, 3.0, name="triple") + sg.sin(a, name="wave") + sg.square(a, name="sq")))
    return g


def test_a_pre_hook_receives_every_contribution_and_replaces_the_accumulation(client, rng):
    f = client.register(three_consumers_graph())
    x = rng.normal(size=2)
    a = np.exp(x)
    recorded = f.gradient({"x": x}, hooks={"a": sg.ServerHook("record", kind="pre")}).records["a/pre"]
    edges = {k: v for k, v in recorded.items() if k != "accumulated"}
    assert set(edges) == {"triple:0", "wave:0", "sq:0"}
    np.testing.assert_allclose(edges["triple:0"], np.full(2, 3.0))
    np.testing.assert_allclose(edges["wave:0"], np.cos(a), rtol=1e-14)
    np.testing.assert_allclose(edges["sq:0"], 2 * a, rtol=1e-14)

    seen = []

    def replace(contributions):
        seen.extend((c.consumer, c.operand) for c in contributions)
        return np.full(2, 7.0)

    grads = f.gradient({"x": x}, hooks={"a": sg.PreHook(replace)})
    assert sorted(seen) == [("sq", 0), ("triple", 0), ("wave", 0)]
    np.testing.assert_allclose(grads["x"], 7.0 * a, rtol=1e-14)  # ∂a/∂x = a, times the hook's value


def test_a_client_hook_equals_the_server_hook(chain, point):
    server = chain.gradient(point, hooks={"a": sg.ServerHook("scale", factor=2.0)})
    client = chain.gradient(point, hooks={"a": lambda g: 2 * g})
    for name in ("x", "y"):
        np.testing.assert_allclose(client[name], server[name], rtol=0, atol=0)
    summed = chain.gradient(point, hooks={"a": sg.PreHook(lambda cs: sum(c.value for c in cs))})
    plain = chain.gradient(point)
    np.testing.assert_allclose(summed["x"], plain["x"], rtol=1e-15)


def test_client_hooks_on_batches(chain, rng):
    batch = {"x": rng.normal(size=(5, 3)), "y": rng.normal(size=(5, 3))}
    grads = chain.gradient(batch, hooks={"a": lambda g: g * 3})
    np.testing.assert_allclose(grads["x"], real_expectations(**batch, scale_at_a=3.0)["x"], rtol=1e-12)


def test_builtin_hooks(chain, point):
    plain = real_expectations(**point)
    zero = chain.gradient(point, hooks={"a": sg.ServerHook("zero")})
    np.testing.assert_array_equal(zero["x"], np.zeros(3))
    clipped = chain.gradient(point, retain=["a"], hooks={"a": sg.ServerHook("clip", min=-0.5, max=0.5)})
    np.testing.assert_allclose(clipped.retained["a"], np.clip(plain["a"], -0.5, 0.5))
    normed = chain.gradient(point, retain=["a"], hooks={"a": sg.ServerHook("clip_norm", max_norm=0.1)})
    np.testing.assert_allclose(np.linalg.norm(normed.retained["a"]), min(0.1, np.linalg.norm(plain["a"])))
    noisy = [chain.gradient(point, hooks={"a": sg.ServerHook("noise", std=0.1, seed=3)})["x"] for _ in range(2)]
    np.testing.assert_array_equal(noisy[0], noisy[1])
    noise = np.random.default_rng(3).normal(0.0, 0.1, size=3)
    np.testing.assert_allclose(noisy[0], (plain["a"] + noise) * np.cos(point["x"]), rtol=1e-12)


def test_hooks_are_listed_and_bad_attachments_rejected(client, chain, point):
    names = {h["name"] for h in client.list_hooks() if h["status"] == "ok"}
    assert {"scale", "clip", "clip_norm", "zero", "noise", "record"} <= names
    with pytest.raises(sg.FailedPrecondition, match="unknown hook 'nope'"):
        chain.gradient(point, hooks={"a": sg.ServerHook("nope")})
    with pytest.raises(sg.InvalidArgument, match="unknown node 'ghost'"):
        chain.gradient(point, hooks={"ghost": sg.ServerHook("zero")})
    with pytest.raises(sg.InvalidArgument, match="colour"):
        chain.gradient(point, hooks={"a": sg.ServerHook("scale", colour=2)})
    with pytest.raises(sg.InvalidArgument, match="retain names unknown node"):
        chain.gradient(point, retain=["ghost"])


def hook_threads():
    return [t for t in threading.enumerate() if t.name.startswith("semigrad-hook")]


def wait_for_no_hook_threads(timeout=5.0):
    deadline = time.monotonic() + timeout
    while hook_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not hook_threads(), hook_threads()


def test_a_client_error_ends_the_call_with_that_error(chain, point):
    def broken(g):
        raise ZeroDivisionError("the user's bug")

    with pytest.raises(ZeroDivisionError, match="the user's bug"):
        chain.gradient(point, hooks={"a": broken})
    wait_for_no_hook_threads()
    np.testing.assert_allclose(chain.gradient(point)["x"], real_expectations(**point)["x"], rtol=1e-12)


def test_a_deadline_while_the_client_hook_runs(server_address, remote_chain, point):
    chain = remote_chain
    with sg.Client(server_address, timeout=0.5) as impatient:
        f = impatient.get_graph(chain.id)
        with pytest.raises(sg.DeadlineExceeded):
            f.gradient(point, hooks={"a": lambda g: (time.sleep(1.0), g)[1]})
    wait_for_no_hook_threads()
    assert chain.gradient(point)["x"].shape == (3,)


def test_a_client_that_disconnects_mid_backward_leaves_the_server_healthy(server_address, remote_chain, point):
    chain = remote_chain
    request = pb.GradientRequest(graph_id=chain.id, inputs={k: codec.to_tensor(v) for k, v in point.items()},
                                 hooks=[pb.HookAttachment(node="a", kind="post", client=True)])
    channel = grpc.insecure_channel(server_address)
    replies = iter([pb.HookStreamRequest(start=request)])

    def requests():
        yield from replies
        time.sleep(30)  # never answers the hook call

    call = pb_grpc.GraphServiceStub(channel).GradientWithHooks(requests(), timeout=30)
    first = next(call)
    assert first.WhichOneof("kind") == "call" and first.call.node == "a"
    assert hook_threads()  # the server is paused in the backward pass
    call.cancel()
    channel.close()
    wait_for_no_hook_threads()
    np.testing.assert_allclose(chain.gradient(point)["x"], real_expectations(**point)["x"], rtol=1e-12)


def test_a_client_that_closes_its_stream_with_a_hook_call_unanswered_gets_invalid_argument(server_address, remote_chain,
                                                                                            point):
    """At once, not at the deadline: no reply can come (found by tests/hostile, which got CANCELLED)."""
    chain = remote_chain
    request = pb.GradientRequest(graph_id=chain.id, inputs={k: codec.to_tensor(v) for k, v in point.items()},
                                 hooks=[pb.HookAttachment(node="a", kind="post", client=True)])
    with grpc.insecure_channel(server_address) as channel:
        started = time.monotonic()
        call = pb_grpc.GraphServiceStub(channel).GradientWithHooks(iter([pb.HookStreamRequest(start=request)]),
                                                                   timeout=20)
        with pytest.raises(grpc.RpcError) as raised:
            for _ in call:
                pass
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert "without answering hook call 0" in raised.value.details() and "'a'" in raised.value.details()
    assert time.monotonic() - started < 10
    wait_for_no_hook_threads()
