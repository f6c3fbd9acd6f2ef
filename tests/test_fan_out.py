"""gradient_many(streams=N) over a target naming two servers (round_robin): the job's chunks
travel on N GradientStream calls that land on both servers, and the reassembled gradient is
the closed form's."""

from __future__ import annotations

import time

import numpy as np
import pytest
import semigrad as sg
from prometheus_client import CollectorRegistry
from semigrad_server.engine import Engine
from semigrad_server.service import build_server
from semigrad_server.service.metrics import Metrics
from semigrad_server.store import SqliteGraphStore


@pytest.mark.parametrize("streams", [1, 4])
def test_a_job_fans_out_over_streams_and_servers(tmp_path, streams):
    registries, servers = [], []
    for _ in range(2):  # two "replicas" on one shared store
        registry = CollectorRegistry()
        engine = Engine(store=SqliteGraphStore(tmp_path / "graphs.sqlite"))
        server, port, _ = build_server("127.0.0.1:0", engine=engine, metrics=Metrics(registry))
        server.start()
        registries.append(registry)
        servers.append((server, port))
    try:
        g = sg.Graph()
        x = g.input("x", (2,))
        g.output("y", sg.sum(sg.sin(x) * x[0]))
        points = np.random.default_rng(0).normal(size=(10_000, 2))
        target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for _, port in servers)
        with sg.Client(target, shared_memory=False) as client:
            f = client.register(g)
            gradient = f.gradient_many({"x": points}, chunk_size=500, streams=streams)["x"]
        x0, x1 = points[:, 0], points[:, 1]
        expected = np.stack([np.cos(x0) * x0 + np.sin(x0) + np.sin(x1), np.cos(x1) * x0], axis=1)
        np.testing.assert_allclose(gradient, expected, rtol=1e-12, atol=1e-12)
        deadline = time.monotonic() + 10  # a stream is counted when gRPC has ended it (service/call_end.py)
        while any(r.get_sample_value("semigrad_requests_in_flight", {"rpc": "GradientStream"}) for r in registries):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        calls = [r.get_sample_value("semigrad_requests_total", {"rpc": "GradientStream", "code": "OK"}) or 0
                 for r in registries]
        assert sum(calls) == streams
        if streams > 1:
            assert all(c >= 1 for c in calls), calls  # round_robin put streams on both servers
    finally:
        for server, _ in servers:
            server.stop(0)


def test_streams_past_the_tenants_call_quota_leave_their_chunks_to_the_admitted_ones():
    """gradient_many(streams=4) for a tenant whose max_tenant_requests is 2: the two streams
    refused at once (RESOURCE_EXHAUSTED) used to fail the whole job although two were admitted
    (docs/deploying.md suggests streams = 2 x replicas, and a per-replica quota beside it); their
    chunks now go on another stream once the admitted ones are done."""
    import threading

    from semigrad_server.limits import Limits
    from semigrad_server.service.auth import load_tokens

    token = "fan-out-tenant-token-0123456789"
    limits = Limits(max_tenant_requests=2)
    arrived, both = [], threading.Event()  # the first two chunks hold their streams' slots until both run

    class Holding(Engine):
        def run_gradient(self, spec, deadline=None, hook_run=None, **kw):
            if len(arrived) < 2:
                arrived.append(1)
                if len(arrived) >= 2:
                    both.set()
                both.wait(10)
            return super().run_gradient(spec, deadline, hook_run, **kw)

    server, port, _ = build_server("127.0.0.1:0", limits=limits, engine=Holding(limits),
                                   tokens=load_tokens(environ={"SEMIGRAD_TOKENS": f"t={token}"}))
    server.start()
    try:
        g = sg.Graph()
        x = g.input("x", (2,))
        g.output("y", sg.sum(sg.sin(x) * x[0]))
        points = np.random.default_rng(1).normal(size=(4_000, 2))
        with sg.Client(f"127.0.0.1:{port}", token=token, shared_memory=False, timeout=30) as client:
            gradient = client.register(g).gradient_many({"x": points}, chunk_size=500, streams=4)["x"]
        x0, x1 = points[:, 0], points[:, 1]
        expected = np.stack([np.cos(x0) * x0 + np.sin(x0) + np.sin(x1), np.cos(x1) * x0], axis=1)
        np.testing.assert_allclose(gradient, expected, rtol=1e-12, atol=1e-12)
    finally:
        server.stop(0)


def test_streams_must_be_positive(client):
    g = sg.Graph()
    g.output("y", sg.sum(g.input("x", (2,))))
    with pytest.raises(ValueError, match="streams"):
        client.register(g).gradient_many({"x": np.zeros((4, 2))}, streams=0)


def test_a_dns_target_is_served(server_address):
    """dns:///localhost:PORT (round_robin over what the name resolves to; an address the server
    does not listen on, such as ::1 here, is skipped)."""
    port = server_address.rsplit(":", 1)[1]
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("y", sg.sum(x * x))
    with sg.Client(f"dns:///localhost:{port}", timeout=20, shared_memory=False) as client:
        for _ in range(4):
            np.testing.assert_array_equal(client.register(g).gradient({"x": [1.0, 2.0, 3.0]})["x"], [2.0, 4.0, 6.0])
