"""deploy/: the Kubernetes manifests and the compose file agree with each other and with
`semigrad serve` (its options parse; ports, names and selectors line up). Nothing here runs a
cluster or Docker; tests/test_replicas.py runs the HAProxy settings against real processes."""

from __future__ import annotations

from pathlib import Path

import yaml
from semigrad_server.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def manifests() -> dict[str, dict]:
    docs = [d for f in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def serve_args(argv: list[str]):
    assert argv[:2] == ["semigrad", "serve"], argv
    return build_parser().parse_args(argv[1:])


def test_kubernetes_manifests_line_up():
    m = manifests()
    deployment = m["Deployment/semigrad"]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    args = serve_args([a.replace("$(SEMIGRAD_STORE)", "redis://redis:6379/0") for a in container["args"]])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": args.port, "metrics": args.metrics_port}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["grpc"]["port"] == args.port, probe  # the standard gRPC health service
    assert args.store.startswith("redis://") and args.tokens and args.drain_seconds > 0
    # the pod's grace period covers the drain and the grace given to calls in flight
    assert pod["spec"]["terminationGracePeriodSeconds"] > args.drain_seconds + args.grace_seconds
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["resources"]["limits"]["cpu"]  # workers follow the CPU quota
    labels = pod["metadata"]["labels"]
    for name in ("Service/semigrad", "Service/semigrad-headless"):
        assert m[name]["spec"]["selector"].items() <= labels.items()
    assert m["Service/semigrad-headless"]["spec"]["clusterIP"] == "None"  # dns:/// sees every pod
    assert m["HorizontalPodAutoscaler/semigrad"]["spec"]["scaleTargetRef"]["name"] == "semigrad"
    assert m["PodDisruptionBudget/semigrad"]["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_compose_file_lines_up():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    args = serve_args(services["semigrad"]["command"])
    assert args.store == "redis://redis:6379/0" and "redis" in services
    redis_command = " ".join(services["redis"]["command"])
    for setting in ("--appendonly yes", "--appendfsync always", "--maxmemory-policy noeviction"):
        assert setting in redis_command
    assert services["semigrad"]["deploy"]["replicas"] == 3
    config = (DEPLOY / "haproxy.cfg").read_text()
    assert f"semigrad:{args.port} check" in config and "bind :50051 proto h2" in config
    assert "--drain-seconds" in services["semigrad"]["command"] and args.drain_seconds >= 5
