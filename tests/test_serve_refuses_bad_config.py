"""`semigrad serve` refuses a store or TLS files it cannot use at once, in the one process, with exit
status 2 and a message naming the option: not a traceback, and not worker after worker dying of it
for the supervisor's whole give-up schedule (about 40 s on this machine)."""

import subprocess
import sys
import time

import pytest
from tls_certs import issue, make_ca, write


def _serve(*args: str) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "semigrad_server", "serve", "--port", "1", *args],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr, time.monotonic() - started


@pytest.mark.parametrize("workers", ["1", "2"])
def test_unknown_store_scheme_exits_2_naming_it(workers):
    code, err, seconds = _serve("--workers", workers, "--store", "foo://x")
    assert code == 2, err
    assert "unknown store 'foo://x'" in err and "Traceback" not in err, err
    assert seconds < 30, seconds  # no worker was started and restarted


def test_tls_key_of_another_certificate_exits_2(tmp_path):
    ca = make_ca()
    cert, _ = write(tmp_path, "server", issue(ca, "localhost", server=True))
    _, other_key = write(tmp_path, "client", issue(ca, "client", server=False))
    code, err, seconds = _serve("--workers", "2", "--store", str(tmp_path / "g.sqlite"),
                                "--tls-cert", cert, "--tls-key", other_key)
    assert code == 2, err
    assert "--tls-key" in err and "Traceback" not in err, err
    assert seconds < 30, seconds


def test_client_ca_that_is_not_a_certificate_exits_2(tmp_path):
    ca = make_ca()
    cert, key = write(tmp_path, "server", issue(ca, "localhost", server=True))
    code, err, _ = _serve("--workers", "2", "--store", str(tmp_path / "g.sqlite"),
                          "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", key)
    assert code == 2 and "--tls-client-ca" in err, err


@pytest.mark.parametrize("given", ["empty-file", "empty-path", "empty-client-ca"])
def test_authentication_asked_for_but_given_nothing_exits_2(tmp_path, given):
    """A token file with no token (or an empty --tokens or --tls-client-ca path) is a configuration
    error: it used to start a server with authentication (or client certificates) off, every caller
    the anonymous tenant, and on loopback not even a warning."""
    store = ("--store", "memory", "--workers", "1")
    if given == "empty-file":
        tokens = tmp_path / "tokens"
        tokens.write_text("# one 'TENANT TOKEN' a line, filled in by the deploy\n")
        code, err, _ = _serve(*store, "--tokens", str(tokens))
        assert code == 2 and "holds no 'TENANT TOKEN' line" in err, err
    elif given == "empty-path":
        code, err, _ = _serve(*store, "--tokens", "")
        assert code == 2 and "--tokens names no file" in err, err
    else:
        ca = make_ca()
        cert, key = write(tmp_path, "server", issue(ca, "localhost", server=True))
        code, err, _ = _serve(*store, "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", "")
        assert code == 2 and "--tls-client-ca names no file" in err, err


def test_several_workers_on_a_port_another_server_listens_on_exit_2(tmp_path):
    """The workers bind with SO_REUSEPORT, which the kernel grants beside any listener of the same
    user that set it too: a second `semigrad serve --workers 2` on a port another one served started
    silently and took a share of its connections (its own tokens or none). Now it stops at once."""
    import socket

    from test_serve import free_port

    port = free_port()
    with socket.socket() as other:  # another server's worker
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", port))
        other.listen()
        code, err, seconds = _serve("--workers", "2", "--store", str(tmp_path / "g.sqlite"), "--port", str(port))
    assert code == 2 and f"127.0.0.1:{port} is in use" in err, err
    assert seconds < 30, seconds
