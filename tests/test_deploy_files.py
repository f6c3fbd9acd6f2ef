"""deploy/: the Kubernetes manifests and the compose file agree with each other and with
`semigrad serve` (its options parse; ports, names and selectors line up), and are valid:

- every Kubernetes manifest of deploy/k8s/ against the Kubernetes API's own schemas, in strict
  mode (unknown fields refused), as bundled by `kubernetes-validate`, for the newest Kubernetes it
  knows and the oldest whose API the manifests use (gRPC probes are GA from 1.27);
- deploy/docker-compose.yml by the `compose-spec` package (the compose_spec parser, which refuses
  what the Compose specification does not define).

Each validator is shown broken copies too, so one that accepted anything would fail here.
Nothing here runs a cluster or Docker: tests/test_deploy_compose_run.py runs both compose files
(opt-in: `make compose-test`), and tests/test_replicas.py runs the HAProxy settings against real
processes. No cluster has run the Kubernetes manifests."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import compose_spec  # dev extra
import kubernetes_validate  # dev extra
import pytest
import yaml
from semigrad_server.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
OLDEST_KUBERNETES = "1.27.0"  # gRPC probes are GA from 1.27; autoscaling/v2 and policy/v1 are older


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


def test_the_manifests_are_all_there():
    assert sorted(manifests()) == ["Deployment/semigrad", "HorizontalPodAutoscaler/semigrad",
                                   "PodDisruptionBudget/semigrad", "Service/semigrad", "Service/semigrad-headless"]


@pytest.mark.parametrize("version", [kubernetes_validate.latest_version(), OLDEST_KUBERNETES])
@pytest.mark.parametrize("name, document", manifests().items(), ids=list(manifests()))
def test_each_manifest_is_valid_kubernetes(name, document, version):
    kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("break_it, what", [
    (lambda d: d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"].update(prot=50051),
     "a misspelt field"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"].update(port="grpc"),
     "a gRPC probe's port by name (it takes a number only)"),
    (lambda d: d["spec"].update(replicas="three"), "a string where a number goes"),
    (lambda d: d["spec"].pop("selector"), "a Deployment without its selector"),
], ids=["misspelt", "grpc-port-name", "type", "required"])
def test_the_validator_refuses_a_broken_deployment(break_it, what):
    deployment = copy.deepcopy(manifests()["Deployment/semigrad"])
    break_it(deployment)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_the_manifests_balance_calls_and_keep_replicas():
    m = manifests()
    container = m["Deployment/semigrad"]["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["grpc"]["service"] == "semigrad.v1.GraphService"
    assert container["resources"]["limits"]["cpu"] == container["resources"]["requests"]["cpu"]
    assert m["HorizontalPodAutoscaler/semigrad"]["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": "semigrad"}
    assert m["HorizontalPodAutoscaler/semigrad"]["spec"]["minReplicas"] > \
        m["PodDisruptionBudget/semigrad"]["spec"]["minAvailable"]
    grpc_port = next(p for p in m["Service/semigrad"]["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_port["appProtocol"] == "kubernetes.io/h2c"  # per-call balancing by an L7 proxy


def test_the_compose_file_is_valid_compose():
    parsed = compose_spec.PyCompose.from_yaml(COMPOSE.read_text())
    assert sorted(parsed.service_names()) == ["haproxy", "redis", "semigrad"]


@pytest.mark.parametrize("replace", [("    stop_grace_period:", "    stop_grace_periods:"),
                                     ("      replicas: 3", "      replicas: three"),
                                     ("condition: service_healthy", "condition: when_ready")],
                         ids=["misspelt", "type", "enum"])
def test_the_compose_parser_refuses_a_broken_file(replace):
    text = COMPOSE.read_text()
    assert replace[0] in text
    with pytest.raises(ValueError):
        compose_spec.PyCompose.from_yaml(text.replace(replace[0], replace[1], 1))


def test_the_compose_file_drains_within_its_stop_grace_period():
    semigrad = yaml.safe_load(COMPOSE.read_text())["services"]["semigrad"]
    args = serve_args(semigrad["command"])
    match = re.fullmatch(r"(\d+)s", semigrad["stop_grace_period"])
    assert match and float(match.group(1)) > args.drain_seconds + args.grace_seconds
    assert semigrad["depends_on"]["redis"]["condition"] == "service_healthy"
    assert (COMPOSE.parent / semigrad["build"]["context"] / semigrad["build"]["dockerfile"]).is_file()
    secrets = yaml.safe_load(COMPOSE.read_text())["secrets"]
    assert (COMPOSE.parent / secrets["semigrad-tokens"]["file"]).is_file()
