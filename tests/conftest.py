"""Shared fixtures: a real semigrad server on an ephemeral loopback port, and a client to it."""

from __future__ import annotations

import zlib

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
def client(server_address):
    with semigrad.Client(server_address) as c:
        yield c


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: reproducible, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
