"""TLS and mutual TLS with certificates made in the test: the right certificates connect, a
client that does not trust the server, a plaintext client, and (mTLS) a client without a
certificate or with one from another CA cannot; a token travels with TLS."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import semigrad as sg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from semigrad_server.service import build_server
from semigrad_server.service.auth import load_tokens
from semigrad_server.service.tls import TlsFiles, tls_files
from tls_certs import issue, make_ca, write

TOKEN = "tls-tenant-token-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca, other_ca = make_ca(), make_ca("another CA")
    files = {"ca": write(directory, "ca", ca)[0], "other_ca": write(directory, "other-ca", other_ca)[0]}
    files["server"] = write(directory, "server", issue(ca, "semigrad server", server=True))
    files["client"] = write(directory, "client", issue(ca, "semigrad client", server=False))
    files["stranger"] = write(directory, "stranger", issue(other_ca, "stranger", server=False))
    return files


def start(tls: TlsFiles, **kwargs):
    server, port, _ = build_server("127.0.0.1:0", tls=tls, **kwargs)
    server.start()
    return server, f"localhost:{port}"


def square_graph() -> sg.Graph:
    g = sg.Graph()
    x = g.input("x", (3,))
    g.output("y", sg.sum(x * x))
    return g


POINT = np.array([1.0, -2.0, 0.5])


def works(client: sg.Client) -> None:
    np.testing.assert_array_equal(client.register(square_graph()).gradient({"x": POINT})["x"], 2 * POINT)


def fails(client: sg.Client) -> None:
    with pytest.raises(sg.SemigradError) as info:
        client.list_ops()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE, info.value


def wait_serving(client: sg.Client, process, seconds: float = 60) -> None:
    """Until `semigrad serve` (`process`) answers `client`'s calls; fails if it exits first."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        assert process.poll() is None, process.communicate()
        try:
            client.list_ops()
            return
        except sg.SemigradError:
            assert time.monotonic() < deadline, f"not serving within {seconds:g} s"
            time.sleep(0.2)


def test_tls(pki):
    server, address = start(TlsFiles(*pki["server"]))
    try:
        with sg.Client(address, root_certificates=pki["ca"], timeout=10) as client:
            works(client)
        with sg.Client(address, root_certificates=pki["other_ca"], timeout=3) as client:
            fails(client)  # does not trust the server's certificate
        with sg.Client(address, timeout=3) as client:
            fails(client)  # plaintext to a TLS port
    finally:
        server.stop(0)


def test_mutual_tls_with_a_token(pki):
    server, address = start(TlsFiles(*pki["server"], client_ca=pki["ca"]),
                            tokens=load_tokens(environ={"SEMIGRAD_TOKENS": f"t={TOKEN}"}))
    try:
        cert, key = pki["client"]
        with sg.Client(address, root_certificates=pki["ca"], certificate_chain=cert, private_key=key, token=TOKEN,
                       timeout=10) as client:
            works(client)
        with sg.Client(address, root_certificates=pki["ca"], certificate_chain=cert, private_key=key, token="x" * 20,
                       timeout=10) as client:
            with pytest.raises(sg.SemigradError) as info:
                client.list_ops()
            assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        with sg.Client(address, root_certificates=pki["ca"], token=TOKEN, timeout=3) as client:
            fails(client)  # no client certificate
        cert, key = pki["stranger"]
        with sg.Client(address, root_certificates=pki["ca"], certificate_chain=cert, private_key=key, token=TOKEN,
                       timeout=3) as client:
            fails(client)  # a certificate from a CA the server does not trust
    finally:
        server.stop(0)


def test_tls_options_must_make_sense(pki, tmp_path):
    assert tls_files(None, None, None) is None
    with pytest.raises(ValueError, match="both --tls-cert and --tls-key"):
        tls_files(pki["server"][0], None, None)
    with pytest.raises(ValueError, match="--tls-client-ca needs"):
        tls_files(None, None, pki["ca"])
    with pytest.raises(ValueError, match="no file"):
        tls_files(str(tmp_path / "missing.crt"), pki["server"][1], None)
    # an empty path is an error, not an option left out: --tls-client-ca "$CA" with $CA unset served
    # TLS without client certificates, and empty --tls-cert/--tls-key served plaintext, in silence
    cert, key = pki["server"]
    for given in [("", "", None), (cert, key, ""), (cert, key, " "), ("", key, pki["ca"])]:
        with pytest.raises(ValueError, match="names no file"):
            tls_files(*given)
    with pytest.raises(ValueError, match="both a private key and a certificate chain"):
        sg.Client("localhost:1", private_key=pki["client"][1])


def test_semigrad_serve_with_mutual_tls_and_tokens(pki, tmp_path):
    """The command line's --tls-cert/--tls-key/--tls-client-ca and --tokens reach the server."""
    import subprocess
    import sys

    from test_serve import free_port, stop

    tokens = tmp_path / "tokens"
    tokens.write_text(f"t {TOKEN}\n")
    port = free_port()
    cert, key = pki["server"]
    process = subprocess.Popen(
        [sys.executable, "-m", "semigrad_server", "serve", "--port", str(port), "--workers", "1", "--store", "memory",
         "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", pki["ca"], "--tokens", str(tokens)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client_cert, client_key = pki["client"]
        options = dict(root_certificates=pki["ca"], certificate_chain=client_cert, private_key=client_key, timeout=10)
        with sg.Client(f"localhost:{port}", token=TOKEN, **options) as client:
            wait_serving(client, process)
            works(client)
        with sg.Client(f"localhost:{port}", token="", **options) as client:
            with pytest.raises(sg.SemigradError) as info:
                client.list_ops()
            assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        log = stop(process)
    assert "auth: 1 tenants; tls: mutual" in log


def test_semigrad_serve_refuses_a_bad_token_file(tmp_path):
    """(Half TLS options take the same way out: tls_files raises ValueError, test_tls_options_must_make_sense.)"""
    from test_serve import free_port, run_cli

    tokens = tmp_path / "tokens"
    tokens.write_text("only-one-field\n")
    result = run_cli("serve", "--port", str(free_port()), "--store", "memory", "--workers", "1", "--tokens", str(tokens))
    assert result.returncode == 2 and "expected 'TENANT TOKEN'" in result.stderr, result.stderr


def test_failed_handshakes_write_no_lines_outside_the_json_logs(pki, tmp_path):
    """`semigrad serve --log-format json` writes JSON lines only: gRPC core logged every failed TLS
    handshake (any peer: a plaintext probe, a wrong CA) as a glog line 'I1127 ... Handshake failed'
    on stderr, at a rate any client could set."""
    import json
    import os
    import subprocess
    import sys

    from test_serve import free_port, stop

    port = free_port()
    cert, key = pki["server"]
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    process = subprocess.Popen(
        [sys.executable, "-m", "semigrad_server", "serve", "--port", str(port), "--workers", "1", "--store", "memory",
         "--tls-cert", cert, "--tls-key", key, "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        with sg.Client(f"localhost:{port}", root_certificates=pki["ca"], timeout=5) as client:
            wait_serving(client, process)
        for _ in range(3):  # plaintext to a TLS port: a failed handshake each
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.enable_retries", 0)]) as channel:
                with pytest.raises(grpc.RpcError):
                    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
    finally:
        log = stop(process)
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines and all(json.loads(line) for line in lines if line.startswith("{")), log
    assert [line for line in lines if not line.startswith("{")] == [], log
