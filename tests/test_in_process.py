"""The engine in this process (`semigrad.Client()` without an address) behaves as a server does:
the same results to the bit, the same error classes, codes and messages (the remote client is
the reference), deadlines and cancellation, results that later calls and later writes to the
inputs cannot change. The rest of the client API runs against both through the `client` fixture
(tests/conftest.py)."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
import semigrad as sg
from semigrad_server.limits import Limits


def det_graph(n: int) -> sg.Graph:
    g = sg.Graph()
    a = g.input("A", (n, n))

    def det(rows, cols):
        if len(rows) == 1:
            return a[rows[0], cols[0]]
        total = None
        for k, c in enumerate(cols):
            term = a[rows[0], c] * det(rows[1:], cols[:k] + cols[k + 1:])
            total = term if total is None else (total + term if k % 2 == 0 else total - term)
        return total

    g.output("det", det(tuple(range(n)), tuple(range(n))))
    return g


def mixed_graph() -> sg.Graph:
    g = sg.Graph()
    x, k = g.input("x", (3,)), g.input("k", (), "int64")
    g.output("y", sg.sum(sg.sin(x) * x))
    g.output("x_again", x)
    g.output("k_again", k)
    return g


def outcome(call):
    """What a call gives: its values, or the class, code and message of its error."""
    try:
        return "ok", call()
    except sg.SemigradError as e:
        return type(e).__name__, e.code, e.message
    except (TypeError, ValueError) as e:
        return type(e).__name__, str(e)


BAD_CALLS = {
    "missing input": lambda f: f.gradient({"x": np.ones(3)}),
    "unknown input": lambda f: f.gradient({"x": np.ones(3), "k": 1, "z": np.ones(2)}),
    "unknown input that is no array": lambda f: f.evaluate({"x": np.ones(3), "k": 1, "z": "text"}),
    "wrong item shape": lambda f: f.gradient({"x": np.ones(4), "k": 1}),
    "batch shapes that do not broadcast": lambda f: f.evaluate({"x": np.ones((2, 3)), "k": np.ones(5, int)}),
    "lossy cast": lambda f: f.gradient({"x": np.ones(3), "k": 2.5}),
    "string input": lambda f: f.evaluate({"x": "abc", "k": 1}),
    "unknown wrt": lambda f: f.gradient({"x": np.ones(3), "k": 1}, wrt="nope"),
    "int wrt": lambda f: f.gradient({"x": np.ones(3), "k": 1}, wrt="k"),
    "unknown output": lambda f: f.gradient({"x": np.ones(3), "k": 1}, outputs="nope"),
    "int output": lambda f: f.gradient({"x": np.ones(3), "k": 1}, outputs="k_again"),
    "unknown backend": lambda f: f.gradient({"x": np.ones(3), "k": 1}, backend="gpu"),
    "unknown node": lambda f: f.evaluate({"x": np.ones(3), "k": 1}, nodes=["nope"]),
    "unknown semiring": lambda f: f.gradient({"x": np.ones(3), "k": 1}, semiring="nope"),
    "semiring list holding None": lambda f: f.gradient({"x": np.ones(3), "k": 1}, outputs="y",
                                                      semiring=["max_product", None]),
    "semiring list holding a list": lambda f: f.gradient({"x": np.ones(3), "k": 1}, outputs="y", semiring=[["real"]]),
    "semiring list holding a number": lambda f: f.gradient({"x": np.ones(3), "k": 1}, outputs="y",
                                                        semiring=["max_product", 3]),
    "semiring as bytes": lambda f: f.gradient({"x": np.ones(3), "k": 1}, outputs="y", semiring=b"max_product"),
    "seed for an unknown output": lambda f: f.gradient({"x": np.ones(3), "k": 1}, seeds={"nope": 1.0}),
    "best path on real": lambda f: f.gradient({"x": np.ones(3), "k": 1}, outputs="y", best_path=[("x", (0,))]),
    "unknown hook": lambda f: f.gradient({"x": np.ones(3), "k": 1}, outputs="y",
                                         hooks={"x": sg.ServerHook("nope")}),
    "crosscheck of an unknown method": lambda f: f.crosscheck({"x": np.ones(3), "k": 1}, outputs="y",
                                                              methods=["oracle"]),
    "describe with an unknown semiring": lambda f: f.describe(semiring="nope"),
    "rank past the wire's": lambda f: f.gradient({"x": np.ones((1,) * 40 + (3,)), "k": 1}),
    "non-finite values (not an error)": lambda f: f.gradient({"x": [np.nan, np.inf, -1.0], "k": 1}, outputs="y"),
    "empty batch (not an error)": lambda f: f.gradient({"x": np.ones((0, 3)), "k": 1}, outputs="y"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_every_outcome_equals_the_servers(remote_client, in_process_client, name):
    call = BAD_CALLS[name]
    remote = outcome(lambda: call(remote_client.register(mixed_graph())))
    local = outcome(lambda: call(in_process_client.register(mixed_graph())))
    if remote[0] == "ok":
        assert local[0] == "ok", local
        want, got = remote[1], local[1]
        assert set(got) == set(want)
        for key in want:
            assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape
            np.testing.assert_array_equal(got[key], want[key])
    else:
        assert local == remote


@pytest.mark.parametrize("names", [["real", "max_product", "entropy"], ["entropy", "real", "max_product"],
                                   ["max_product", "real"]])
def test_several_semirings_come_back_in_the_order_asked(remote_client, in_process_client, names):
    for client in (remote_client, in_process_client):
        f = client.register(mixed_graph())
        for semiring in (lambda: names, lambda: iter(names)):  # (a generator too: read once)
            assert list(f.gradient({"x": np.ones(3), "k": 1}, outputs="y", semiring=semiring())) == names
            assert list(f.gradient({"x": np.ones(3), "k": 1}, outputs="y", semiring=semiring(),
                                   seeds={"y": 2.0})) == names  # (the message path in process too)


def test_unknown_graph_ids_and_listings_equal_the_servers(remote_client, in_process_client):
    assert outcome(lambda: in_process_client.get_graph("g0")) == outcome(lambda: remote_client.get_graph("g0"))
    assert [s.name for s in in_process_client.list_semirings()] == [s.name for s in remote_client.list_semirings()]
    assert [op.name for op in in_process_client.list_ops()] == [op.name for op in remote_client.list_ops()]
    assert [h["name"] for h in in_process_client.list_hooks()] == [h["name"] for h in remote_client.list_hooks()]


@pytest.mark.parametrize("inputs", [
    lambda rng: {"A": rng.normal(size=(4, 4))},  # the path straight from arrays
    lambda rng: {"A": np.asfortranarray(rng.normal(size=(4, 4)))},  # through the messages
    lambda rng: {"A": rng.normal(size=(300, 4, 4))},  # a batch
    lambda rng: {"A": rng.normal(size=(4, 4)).astype(">f8")},  # big-endian: cast first
])
def test_gradients_equal_the_servers_to_the_bit(remote_client, in_process_client, rng, inputs):
    values = inputs(rng)
    remote, local = remote_client.register(det_graph(4)), in_process_client.register(det_graph(4))
    assert local.id == remote.id
    for kwargs in ({}, {"return_outputs": True}, {"backend": "tensor"}, {"backend": "scalar"},
                   {"seeds": {"det": 2.0}}, {"semiring": "max_product"}, {"semiring": "entropy", "return_outputs": True},
                   {"semiring": ["real", "max_product", "entropy"]}, {"semiring": ["entropy"], "return_outputs": True},
                   {"semiring": []}):
        want, got = remote.gradient(values, **kwargs), local.gradient(values, **kwargs)
        if kwargs.get("return_outputs"):
            (want, want_outputs), (got, got_outputs) = want, got
            np.testing.assert_array_equal(got_outputs["det"], want_outputs["det"])
            assert got.outputs.keys() == want.outputs.keys()
        assert type(got) is type(want)
        for name, (got_one, want_one) in ({"": (got, want)} if isinstance(want, sg.Gradients) else
                                          {n: (got[n], want[n]) for n in want}).items():
            assert type(got_one) is type(want_one) and got_one.keys() == want_one.keys()
            assert (got_one.components, got_one.best_paths, got_one.retained, got_one.records) == \
                (want_one.components, want_one.best_paths, want_one.retained, want_one.records)
            np.testing.assert_array_equal(got_one["A"], want_one["A"], err_msg=f"{kwargs} {name}")
            assert got_one["A"].shape == np.shape(values["A"]) and not got_one["A"].flags.writeable
    np.testing.assert_array_equal(local.evaluate(values)["det"], remote.evaluate(values)["det"])
    np.testing.assert_allclose(local.evaluate(values)["det"], np.linalg.det(values["A"]), rtol=1e-10)


def test_results_are_read_only_and_never_change_afterwards(in_process_client, rng):
    f = in_process_client.register(mixed_graph())
    x = rng.normal(size=3)
    values = f.evaluate({"x": x, "k": 3})
    grads = f.gradient({"x": x, "k": 3}, outputs="x_again")
    first = {name: v.copy() for name, v in values.items()}
    for value in (*values.values(), grads["x"]):
        assert not value.flags.writeable
    x[:] = 7.0  # the caller changes its input
    f.evaluate({"x": rng.normal(size=3), "k": 4})  # and calls again
    f.gradient({"x": rng.normal(size=3), "k": 4}, outputs="x_again")
    for name, value in values.items():
        np.testing.assert_array_equal(value, first[name], err_msg=name)
    np.testing.assert_array_equal(grads["x"], np.ones(3))
    whole = rng.normal(size=(4, 3))  # an input that is a view of the caller's array
    again = f.evaluate({"x": whole[1], "k": 3})["x_again"]
    before = again.copy()
    whole[:] = 0.0
    np.testing.assert_array_equal(again, before)


def test_a_deadline_ends_a_long_call_with_deadline_exceeded(rng):
    with sg.Client() as impatient:
        f = impatient.register(det_graph(5))
        batch = rng.normal(size=(200_000, 5, 5))
        impatient.timeout = 0.2
        started = time.monotonic()
        with pytest.raises(sg.DeadlineExceeded):
            f.gradient({"A": batch}, backend="tensor")
        assert time.monotonic() - started < 5  # the engine checked the deadline while it worked
        impatient.timeout = None
        np.testing.assert_allclose(f.gradient({"A": np.eye(5)})["A"], np.eye(5))


def test_a_deadline_while_an_in_process_client_hook_runs():
    with sg.Client() as impatient:
        f = impatient.register(mixed_graph())
        impatient.timeout = 0.3
        with pytest.raises(sg.DeadlineExceeded):
            f.gradient({"x": np.ones(3), "k": 1}, outputs="y", hooks={"x": lambda g: (time.sleep(1.0), g)[1]})
        _wait_for_no_hook_threads()


def test_an_interrupted_hook_call_is_cancelled_and_leaves_no_worker():
    """A KeyboardInterrupt in a client hook (Ctrl-C) ends the call; the backward pass waiting
    for the hook is cancelled and its thread ends; the engine goes on serving."""
    with sg.Client() as c:
        f = c.register(mixed_graph())

        def interrupted(g):
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            f.gradient({"x": np.ones(3), "k": 1}, outputs="y", hooks={"x": interrupted})
        _wait_for_no_hook_threads()
        np.testing.assert_allclose(f.gradient({"x": np.zeros(3), "k": 1}, outputs="y")["x"], np.zeros(3))


def test_in_process_limits_are_the_engines(rng):
    with sg.Client(limits=Limits(max_batch=10)) as small:
        f = small.register(det_graph(2))
        f.gradient({"A": rng.normal(size=(10, 2, 2))})
        with pytest.raises(sg.ResourceExhausted, match="batch"):
            f.gradient({"A": rng.normal(size=(11, 2, 2))})


def test_server_connection_options_are_refused_without_an_address():
    with pytest.raises(ValueError, match="server connection"):
        sg.Client(shared_memory=True)
    with pytest.raises(ValueError, match="server connection"):
        sg.Client(options=[("grpc.enable_retries", 0)])
    with pytest.raises(ValueError, match="in-process"):
        sg.Client("127.0.0.1:1", limits=Limits())
    with sg.Client() as c:
        assert c.in_process and c.shared_memory_regions() == []


def _wait_for_no_hook_threads(timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [t for t in threading.enumerate() if t.name.startswith("semigrad-hook")]:
            return
        time.sleep(0.02)
    raise AssertionError([t.name for t in threading.enumerate()])


def test_paths_reports_descriptions_and_streams_equal_the_servers(remote_client, in_process_client, rng):
    a = rng.normal(size=(3, 3))
    batch = rng.normal(size=(50, 3, 3))
    got, want = {}, {}
    for client, into in ((remote_client, want), (in_process_client, got)):
        f = client.register(det_graph(3))
        into["paths"] = f.gradient({"A": a}, semiring="max_product", best_path=[("A", (0, 1)), ("A", (2, 2))]).best_paths
        into["crosscheck"] = re.sub(r"ran in [0-9.]+ s", "", str(f.crosscheck({"A": a})))  # (times differ)
        into["symbolic"] = f.symbolic_gradient().python
        into["describe"] = f.describe(semiring="max_product")
        into["dot"] = f.to_dot(inputs={"A": a})
        streamed = f.gradient_many({"A": batch}, chunk_size=7, return_outputs=True, progress=False)
        into["stream"] = (streamed["A"], streamed.outputs["det"])
        into["entropy"] = f.gradient({"A": a}, semiring="entropy", return_components=True).components
    assert got["paths"] == want["paths"] and len(got["paths"]) == 2
    assert got["crosscheck"] == want["crosscheck"] and got["symbolic"] == want["symbolic"] and "def jacobian" in got["symbolic"]
    assert got["describe"] == want["describe"] and got["dot"] == want["dot"]
    for g, w in zip(got["stream"], want["stream"]):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_allclose(got["stream"][0], np.linalg.det(batch)[:, None, None]
                               * np.linalg.inv(batch).transpose(0, 2, 1), rtol=1e-10)
    assert got["entropy"].keys() == want["entropy"].keys()
    for name, parts in want["entropy"].items():
        for part, value in parts.items():
            np.testing.assert_array_equal(got["entropy"][name][part], value)
