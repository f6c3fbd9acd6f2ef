"""The client works without the server's dependencies: a child process where importing sympy or
semigrad_server fails builds, registers, evaluates and differentiates a graph against the test
server, and `Client()` without an address (the engine in process) says it needs the server package or
an address. And the client distribution declares only grpcio, protobuf and numpy."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("sympy", "semigrad_server")

CHILD = r"""
import importlib.abc, json, sys

BLOCKED = set(json.loads(sys.argv[3]))
attempts = []

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            attempts.append(name)
            raise ModuleNotFoundError(f"blocked in this test: {name}", name=name)
        return None

sys.meta_path.insert(0, Block())

import numpy as np
import semigrad as sg

address, matrix = sys.argv[1], np.array(json.loads(sys.argv[2]))
g = sg.Graph()
a = g.input("A", (2, 2))
g.output("det", a[0, 0] * a[1, 1] - a[0, 1] * a[1, 0])
with sg.Client(address, timeout=30) as client:
    f = client.register(g)
    value = f.evaluate({"A": matrix})["det"]
    grad = f.gradient({"A": matrix})["A"]
attempts_before_local = list(attempts)
try:  # the engine in this process needs the server package: the thin client says so
    sg.Client()
    local_error = None
except ImportError as e:
    local_error = str(e)
print(json.dumps({
    "local_error": local_error,
    "attempts_before_local": attempts_before_local,
    "det": float(value),
    "grad": grad.tolist(),
    "loaded": sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED),
    "attempts": attempts,
    "semigrad_file": sg.__file__,
}))
"""


def test_client_without_sympy_or_server_package(server_address, rng):
    matrix = rng.normal(size=(2, 2))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, server_address, json.dumps(matrix.tolist()), json.dumps(BLOCKED)],
        capture_output=True, text=True, timeout=60, cwd=ROOT / "client")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    assert result["loaded"] == []
    assert result["attempts_before_local"] == []  # a remote client never even tries the server package
    assert "needs the server package" in result["local_error"]
    assert "semigrad.Client('host:port')" in result["local_error"]
    assert Path(result["semigrad_file"]).resolve().is_relative_to(ROOT / "client" / "semigrad")
    (a, b), (c, d) = matrix
    np.testing.assert_allclose(result["det"], a * d - b * c, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(result["grad"], [[d, -c], [-b, a]], rtol=1e-14, atol=1e-15)


def test_the_blocker_really_blocks():
    """The child's finder works: importing a blocked package fails there."""
    script = CHILD.split("import numpy as np")[0] + "import sympy\n"
    proc = subprocess.run([sys.executable, "-c", script, "", "[]", json.dumps(BLOCKED)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "blocked in this test: sympy" in proc.stderr


def test_client_pyproject_depends_only_on_grpcio_protobuf_numpy():
    project = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]
    names = {re.match(r"\s*([A-Za-z0-9_.-]+)", req).group(1).lower().replace("_", "-")
             for req in project["dependencies"]}
    assert names == {"grpcio", "protobuf", "numpy"}
    for extra in project.get("optional-dependencies", {}).values():
        assert not any(req.lower().startswith(("sympy", "semigrad")) for req in extra)


def test_client_pyproject_lists_every_package():
    """The thin client's distribution ships every package of client/semigrad (a subpackage left
    out would make `import semigrad` fail in a client-only install)."""
    listed = set(tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {".".join(init.parent.relative_to(ROOT / "client").parts)
                for init in (ROOT / "client" / "semigrad").rglob("__init__.py")}
    assert packages == listed
