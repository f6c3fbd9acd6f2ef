"""TLS and mutual TLS for the server (`semigrad serve --tls-cert/--tls-key/--tls-client-ca`)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the server's certificate chain and key; with `client_ca`, clients must present
    a certificate signed by it (mutual TLS)."""

    cert: str
    key: str
    client_ca: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        chain, key = Path(self.cert).read_bytes(), Path(self.key).read_bytes()
        ca = Path(self.client_ca).read_bytes() if self.client_ca else None
        return grpc.ssl_server_credentials([(key, chain)], root_certificates=ca, require_client_auth=ca is not None)


def tls_files(cert: str | None, key: str | None, client_ca: str | None) -> TlsFiles | None:
    """The TLS settings of the command line; ValueError when they do not make sense together. An
    option given an empty path (`--tls-client-ca "$CA"` with $CA unset) is refused, not read as
    absent: that would serve without TLS, or without client certificates, in silence."""
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-client-ca", client_ca)):
        if path is not None and not str(path).strip():
            raise ValueError(f"{flag} names no file (an empty path)")
    if not cert and not key:
        if client_ca:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if not (cert and key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-client-ca", client_ca)):
        if path and not Path(path).is_file():
            raise ValueError(f"{flag}: no file {path}")
    # Checked here, once: grpc only finds a key that does not match its certificate (or a file that
    # is not PEM) when each worker starts, and the workers would die one after another.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")  # an encrypted key fails, never prompts
    except (ssl.SSLError, OSError) as e:
        raise ValueError(f"--tls-cert {cert} and --tls-key {key} are not a PEM certificate chain and its "
                         f"unencrypted private key: {e}") from None
    if client_ca:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(f"--tls-client-ca {client_ca} holds no PEM certificate: {e}") from None
    return TlsFiles(cert, key, client_ca)
