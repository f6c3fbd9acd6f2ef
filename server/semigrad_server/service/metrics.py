"""Prometheus metrics (`semigrad serve --metrics-port PORT`): calls by RPC and status, latency
histograms, calls in flight, plan-cache hits and compiles, store operations and per-tenant usage.

With several worker processes every worker writes its values to files in a directory shared
with the supervisor (prometheus-client's multiprocess mode, PROMETHEUS_MULTIPROC_DIR), and the
supervisor serves their sum on the metrics port; with one process the process serves its own."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .. import telemetry

log = logging.getLogger("semigrad.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
ANONYMOUS_LABEL = "anonymous"  # the tenant of a server without authentication
UNAUTHENTICATED_LABEL = "unauthenticated"  # callers without a valid token


def _tenant_label(tenant: str | None) -> str:
    return UNAUTHENTICATED_LABEL if tenant is None else tenant or ANONYMOUS_LABEL


class Metrics:
    """The service's metrics in `registry` (None: prometheus-client's multiprocess files, or its
    default registry when not in multiprocess mode)."""

    _process: Metrics | None = None

    def __init__(self, registry: CollectorRegistry | None = None):
        kw = {"registry": registry} if registry is not None else {}
        self.requests = Counter("semigrad_requests", "Calls by RPC and final status code", ["rpc", "code"], **kw)
        self.latency = Histogram("semigrad_request_seconds", "Call latency by RPC", ["rpc"], buckets=LATENCY_BUCKETS,
                                 **kw)
        self.in_flight = Gauge("semigrad_requests_in_flight", "Calls being served, by RPC", ["rpc"],
                               multiprocess_mode="livesum", **kw)
        self.tenant_requests = Counter("semigrad_tenant_requests", "Calls by tenant and final status code",
                                       ["tenant", "code"], **kw)
        self.tenant_in_flight = Gauge("semigrad_tenant_requests_in_flight", "Calls being served, by tenant",
                                      ["tenant"], multiprocess_mode="livesum", **kw)
        self.tenant_graphs = Gauge("semigrad_tenant_stored_graphs", "Graphs a tenant stores (last seen)", ["tenant"],
                                   multiprocess_mode="mostrecent", **kw)
        self.tenant_bytes = Gauge("semigrad_tenant_stored_bytes", "Bytes of graphs a tenant stores (last seen)",
                                  ["tenant"], multiprocess_mode="mostrecent", **kw)
        self.store_ops = Counter("semigrad_store_operations", "Graph store operations", ["store", "op", "outcome"],
                                 **kw)
        self.store_latency = Histogram("semigrad_store_seconds", "Graph store operation latency", ["store", "op"],
                                       buckets=LATENCY_BUCKETS, **kw)
        self.engine_events = Counter("semigrad_engine_events", "Plan-cache hits (plan_hit), plan compiles "
                                     "(plan_compile), graphs compiled from the store (graph_compile), top_paths "
                                     "passes that did not verify pruned and ran again (top_paths_unpruned_rerun)",
                                     ["event"], **kw)
        telemetry.listen(lambda name: self.engine_events.labels(name).inc())

    @classmethod
    def for_process(cls) -> Metrics:
        """This process's metrics (made once: metric names are process-wide)."""
        if cls._process is None:
            cls._process = cls()
        return cls._process

    # ---------------------------------------------------------------- calls (service/calls.py)
    def call_started(self, rpc: str, tenant: str) -> None:
        self.in_flight.labels(rpc).inc()
        self.tenant_in_flight.labels(_tenant_label(tenant)).inc()

    def call_finished(self, rpc: str, tenant: str, code: str, seconds: float) -> None:
        self.in_flight.labels(rpc).dec()
        self.tenant_in_flight.labels(_tenant_label(tenant)).dec()
        self.call_done(rpc, tenant, code, seconds)

    def call_done(self, rpc: str, tenant: str | None, code: str, seconds: float) -> None:
        """A call that ended (also one refused before it started; tenant None: unauthenticated)."""
        self.requests.labels(rpc, code).inc()
        self.tenant_requests.labels(_tenant_label(tenant), code).inc()
        self.latency.labels(rpc).observe(seconds)

    # ---------------------------------------------------------------- the store
    def counting(self, store) -> CountingStore:
        return CountingStore(store, self)


class CountingStore:
    """A GraphStore that counts and times its operations, and keeps the tenant usage gauges."""

    def __init__(self, store, metrics: Metrics):
        self.store = store
        self.metrics = metrics
        self.name = store.name

    def _timed(self, op: str, fn, *args):
        start = time.perf_counter()
        outcome = "error"
        try:
            result = fn(*args)
            outcome = "ok"
            return result
        finally:
            self.metrics.store_ops.labels(self.name, op, outcome).inc()
            self.metrics.store_latency.labels(self.name, op).observe(time.perf_counter() - start)

    def _usage_seen(self, tenant: str) -> None:
        usage = self._timed("usage", self.store.usage, tenant)
        self.metrics.tenant_graphs.labels(_tenant_label(tenant)).set(usage.graphs)
        self.metrics.tenant_bytes.labels(_tenant_label(tenant)).set(usage.bytes)

    def put(self, tenant, key, data, quota):
        created = self._timed("put", self.store.put, tenant, key, data, quota)
        if created:
            self._usage_seen(tenant)
        return created

    def get(self, tenant, key):
        return self._timed("get", self.store.get, tenant, key)

    def contains(self, tenant, key):
        return self._timed("contains", self.store.contains, tenant, key)

    def delete(self, tenant, key):
        deleted = self._timed("delete", self.store.delete, tenant, key)
        if deleted:
            self._usage_seen(tenant)
        return deleted

    def usage(self, tenant):
        return self._timed("usage", self.store.usage, tenant)

    def close(self):
        self.store.close()


@contextlib.contextmanager
def metrics_exposed(config, workers: int):
    """Serve /metrics on `config.metrics_port` for the duration (nothing when it is None). Several
    workers: a fresh multiprocess directory, whose path the workers inherit through the environment."""
    if config.metrics_port is None:
        yield
        return
    if workers > 1:
        from prometheus_client import multiprocess

        directory = tempfile.mkdtemp(prefix="semigrad-metrics-")
        previous = os.environ.get(MULTIPROC_ENV)
        os.environ[MULTIPROC_ENV] = directory
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
    else:
        directory, previous, registry = None, None, None
    server, thread = start_http_server(config.metrics_port, addr=config.metrics_host,
                                       **({"registry": registry} if registry is not None else {}))
    log.info("metrics on http://%s:%d/metrics", config.metrics_host, server.server_port)
    try:
        yield
    finally:
        server.shutdown()
        if directory is not None:
            if previous is None:
                os.environ.pop(MULTIPROC_ENV, None)
            else:
                os.environ[MULTIPROC_ENV] = previous
            shutil.rmtree(directory, ignore_errors=True)


def process_dead(pid: int) -> None:
    """A worker died: its live gauges (calls in flight) no longer count."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
