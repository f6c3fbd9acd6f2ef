"""Packaging and tooling checks: generated stubs, container files, CI entry point.

Uses only the stdlib, PyYAML and grpc_tools; never starts the server.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "proto"
STUB_DIR = ROOT / "client" / "semigrad" / "v1"
CLI_DEFAULT_PORT = 50051  # `semigrad serve` default, per the conventions

# Same flags as `make proto` and docs/conventions: -I proto --python_out --grpc_python_out --pyi_out.
PROTOC_FLAGS = ("--python_out", "--grpc_python_out", "--pyi_out")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pinned_grpcio_tools() -> str:
    for req in _pyproject()["project"]["optional-dependencies"]["dev"]:
        m = re.fullmatch(r"\s*grpcio-tools\s*==\s*([\w.]+)\s*", req)
        if m:
            return m.group(1)
    raise AssertionError("grpcio-tools must be pinned with == in the dev extra")


def _stub_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*_pb2*.py*"))}


# --- (a) generated stubs are fresh -------------------------------------------------


def test_installed_grpcio_tools_matches_pin():
    pinned = _pinned_grpcio_tools()
    installed = metadata.version("grpcio-tools")
    assert installed == pinned, (
        f"grpcio-tools {installed} installed but pyproject pins {pinned}: "
        "stubs would not be reproducible; run `make venv`"
    )


def test_generated_stubs_are_fresh(tmp_path):
    protos = sorted(PROTO_DIR.glob("semigrad/v1/*.proto"))
    assert protos, "no .proto files under proto/semigrad/v1"
    cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I", "proto"]
    cmd += [f"{flag}={tmp_path}" for flag in PROTOC_FLAGS]
    cmd += [str(p.relative_to(ROOT)) for p in protos]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    fresh = _stub_files(tmp_path / "semigrad" / "v1")
    committed = _stub_files(STUB_DIR)
    assert fresh, "protoc produced no stubs"
    assert sorted(committed) == sorted(fresh), "stub file set differs; run `make proto`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated stubs {stale}; run `make proto` and commit"


# --- (b) container files agree on `serve` and the port ------------------------------


def _compose_service() -> dict:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = data["services"]
    assert list(services) == ["semigrad"], services
    return services["semigrad"]


def _dockerfile_cmd() -> list[str]:
    cmds = [
        line.split(None, 1)[1]
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.strip().upper().startswith("CMD ")
    ]
    assert len(cmds) == 1, cmds
    cmd = json.loads(cmds[0])  # exec form
    assert isinstance(cmd, list) and all(isinstance(c, str) for c in cmd)
    return cmd


def _serve_port(argv: list[str]) -> int:
    assert "serve" in argv, argv
    for i, arg in enumerate(argv):
        if arg == "--port":
            return int(argv[i + 1])
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
    return CLI_DEFAULT_PORT


def test_dockerfile():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM\s+python:3\.11-slim\b", text, re.M)
    assert re.search(rf"^EXPOSE\s+{CLI_DEFAULT_PORT}\s*$", text, re.M)
    cmd = _dockerfile_cmd()
    assert cmd[:2] == ["semigrad", "serve"]
    assert _serve_port(cmd) == CLI_DEFAULT_PORT
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"


def test_compose_port_matches_serve_command():
    svc = _compose_service()
    build = svc["build"]
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    assert dockerfile == "Dockerfile"

    command = svc.get("command")
    if command is None:
        argv = _dockerfile_cmd()
    else:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
    port = _serve_port(argv)

    mappings = [str(p) for p in svc["ports"]]
    assert len(mappings) == 1, mappings
    host_port, container_port = mappings[0].rsplit(":", 2)[-2:]
    assert int(container_port) == port == CLI_DEFAULT_PORT
    assert int(host_port) == CLI_DEFAULT_PORT


def test_compose_healthcheck_uses_grpc_health():
    check = _compose_service()["healthcheck"]["test"]
    assert isinstance(check, list) and check[0] == "CMD", check
    assert check[1:3] == ["python", "-c"]
    code = check[3]
    compile(code, "<healthcheck>", "exec")
    assert "grpc_health.v1" in code
    assert f":{CLI_DEFAULT_PORT}" in code


def test_makefile_default_port_matches_cli():
    text = (ROOT / "Makefile").read_text()
    assert re.search(rf"^PORT \?= {CLI_DEFAULT_PORT}$", text, re.M)
    assert re.search(r"^HOST \?= 127\.0\.0\.1$", text, re.M)


# --- (c) CI entry point -------------------------------------------------------------


def test_ci_run_calls_make_test():
    script = ROOT / ".ci" / "run"
    text = script.read_text()
    assert os.access(script, os.X_OK), ".ci/run must be executable"
    assert text.startswith("#!") and "bash" in text.splitlines()[0]
    assert "set -euo pipefail" in text
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert any(re.fullmatch(r"(exec\s+)?make\s+test\b.*", ln) for ln in lines), lines
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- pyproject sanity ---------------------------------------------------------------


def test_pyproject_metadata():
    project = _pyproject()["project"]
    assert project["name"] == "semigrad"
    assert project["version"] == "0.1.0"
    assert project["scripts"]["semigrad"] == "semigrad_server.cli:main"
    find = _pyproject()["tool"]["setuptools"]["packages"]["find"]
    assert find["where"] == ["client", "server"]
    assert "torch==2.13.0" in project["optional-dependencies"]["bench"]
    assert project["optional-dependencies"]["torch"] == ["torch==2.13.0"]  # the CPU build: sg.from_torch
    for heavy in ("torch", "jax", "jaxlib", "casadi", "symengine"):
        assert not any(req.startswith(heavy) for req in project["dependencies"])
        assert not any(req.startswith(heavy) for req in project["optional-dependencies"]["dev"])
