"""The metrics name every tenant, its store usage and its calls, and the metrics port has no
authentication: by default it listens on loopback only, and the deploy files that want a scraper
on another host say so explicitly."""

import logging
import re
import shlex
import socket
from pathlib import Path

from semigrad_server.cli import build_parser
from semigrad_server.service.metrics import metrics_exposed
from semigrad_server.service.server import Serving

ROOT = Path(__file__).resolve().parents[1]


def _non_loopback_address() -> str | None:
    """An address of this host that is not loopback (None when it has none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_metrics_listen_on_loopback_by_default(caplog):
    args = build_parser().parse_args(["serve", "--metrics-port", "0"])
    assert args.metrics_host == "127.0.0.1"
    assert Serving().metrics_host == "127.0.0.1"
    caplog.set_level(logging.INFO, logger="semigrad.metrics")
    with metrics_exposed(Serving(metrics_port=0), workers=1):
        port = int(re.search(r"metrics on http://[^:]+:(\d+)/metrics", caplog.text).group(1))
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        other = _non_loopback_address()
        if other is not None:  # not reachable from another interface
            try:
                socket.create_connection((other, port), timeout=2).close()
            except OSError:
                pass
            else:
                raise AssertionError(f"the metrics port {port} answers on {other}")


def test_deploy_files_that_expose_metrics_bind_them_explicitly():
    files = [ROOT / "Dockerfile", ROOT / "deploy/docker-compose.yml", ROOT / "deploy/k8s/deployment.yaml"]
    for path in files:
        text = path.read_text()
        if "--metrics-port" in text:
            assert '"--metrics-host", "0.0.0.0"' in text, f"{path} serves metrics to other hosts without saying so"
    assert "--metrics-host" not in shlex.split("semigrad serve")  # (the CLI default is loopback: above)


def test_the_compose_file_publishes_haproxys_stats_on_loopback_only():
    """HAProxy's stats page and metrics (port 8404: no authentication, every replica named with its
    state) were published on every interface of the host by deploy/docker-compose.yml, where
    docs/deploying.md speaks of localhost:8404."""
    import yaml

    compose = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())
    published = [str(p) for p in compose["services"]["haproxy"]["ports"]]
    stats = [p for p in published if p.rsplit(":", 1)[-1] == "8404"]
    assert stats == ["127.0.0.1:8404:8404"], published
