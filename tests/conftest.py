"""Shared fixtures: a real semigrad server on an ephemeral loopback port, a client to it, and a
client running the engine in this process.

`client` runs a test that takes it twice, against the server (remote) and in process, since both
must behave identically: in the modules of IN_PROCESS_MODULES (the client API: calls, errors, hooks,
streams, custom ops, trace; cross-checks, descriptions and drawings through the docs' examples).
The op, backend and semiring tables (every op on every backend and semiring, thousands of cases)
and the SymPy-heavy cross-check suites run against the server only, as the engine behind both is
the same: their in-process half took ~23 minutes on the 2 shared cores, far past the suite's
budget. Every op runs in process once through tests/ops/test_completeness.py::test_every_transport.
`SEMIGRAD_IN_PROCESS=all` runs every client test in process too; `SEMIGRAD_CLIENTS=remote` (or
`in_process`) runs one kind only. Tests that also talk to the server some other way (a raw stub,
its address) take `remote_client`."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest
import semigrad
from semigrad_server.limits import Limits
from semigrad_server.service import build_server


@pytest.fixture(scope="session")
def server_address():
    server, port, _ = build_server("127.0.0.1:0", limits=Limits())
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0).wait()


@pytest.fixture(scope="session")
def remote_client(server_address):
    with semigrad.Client(server_address) as c:
        yield c


@pytest.fixture(scope="session")
def in_process_client():
    with semigrad.Client() as c:
        yield c


CLIENT_KINDS = [kind for kind in ("remote", "in_process")
                if os.environ.get("SEMIGRAD_CLIENTS", kind) == kind]
IN_PROCESS_MODULES = frozenset({
    "test_bad_input.py", "test_default_outputs.py", "test_describe.py", "test_draw.py", "test_hooks.py", "test_in_process.py",
    "test_lossy_casts.py", "test_reuse_and_batch.py", "test_streaming.py", "test_trace.py", "test_torch_import.py",
    "test_torch_import_modules.py",
    "test_docs_examples.py", "symbolic/test_custom_ops.py", "semirings/test_plugins_e2e.py",
})


@pytest.fixture(scope="session", params=CLIENT_KINDS)
def client(request):
    """A client to the test server, or one running the engine in this process."""
    return request.getfixturevalue(f"{request.param}_client")


def pytest_collection_modifyitems(config, items):
    """The in-process half of `client` only in IN_PROCESS_MODULES (see the module docstring)."""
    if os.environ.get("SEMIGRAD_IN_PROCESS") == "all":
        return
    tests = Path(__file__).resolve().parent
    kept, dropped = [], []
    for item in items:
        kind = getattr(item, "callspec", None) and item.callspec.params.get("client")
        module = Path(str(item.fspath)).resolve()
        inside = module.is_relative_to(tests) and module.relative_to(tests).as_posix() in IN_PROCESS_MODULES
        (dropped if kind == "in_process" and not inside else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: reproducible, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
