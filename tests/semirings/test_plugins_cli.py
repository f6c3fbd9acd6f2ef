"""`semigrad plugins` and `semigrad plugins check NAME`."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest
from semigrad_server import cli
from semigrad_server.semiring import Semiring
from semigrad_server.semiring.loader import GROUP

ALL = ("real", "max_product", "log", "entropy", "kbest", "signed_max_product", "log_entropy", "log_counting",
       "log_signed_max_product", "boolean", "counting", "maxplus", "minplus", "bottleneck")


def run(*args):
    return subprocess.run([sys.executable, "-m", "semigrad_server", *args], capture_output=True, text=True, timeout=120)


def test_plugins_lists_all_ten_with_status_ok():
    proc = run("plugins")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DISTRIBUTION", "VERSION", "STATUS", "PROPERTIES", "ERROR"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(ALL) <= set(rows), proc.stdout
    for name in ALL:
        assert rows[name][3] == "ok", rows[name]
        assert rows[name][1] == ("semigrad" if name == "real" else
                                 "semigrad-logic" if name in ("boolean", "counting", "maxplus", "minplus", "bottleneck")
                                 else "semigrad-paths")
    assert "idempotent" in rows["max_product"][4] and "selective" in rows["max_product"][4]
    assert "components=2" in rows["entropy"][4]
    assert "params=k" in rows["kbest"][4]


def test_plugins_check_passes():
    proc = run("plugins", "check", "max_product")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    laws = [line for line in proc.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(laws) >= 12 and all(line.startswith("PASS") for line in laws), proc.stdout
    assert any("⊕ is selective (declared)" in line for line in laws)


def test_plugins_check_with_options_and_parameters():
    proc = run("plugins", "check", "kbest", "--samples", "50", "--seed", "4", "--param", "k=9")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "key kbest:k=9" in proc.stdout and "50 samples, seed 4" in proc.stdout


@pytest.mark.parametrize("args", [("no_such_semiring",), ("kbest", "--param", "k=0"), ("kbest", "--param", "q=1")])
def test_plugins_check_rejects_unknown_names_and_bad_parameters(args):
    proc = run("plugins", "check", *args)
    assert proc.returncode != 0
    assert proc.stderr


class BrokenAdd(Semiring):
    """Not a semiring: ⊕ = a + 2b is neither commutative nor associative."""

    name = "broken_add"

    def zeros(self, shape):
        return np.zeros(shape)

    def ones(self, shape):
        return np.ones(shape)

    def add(self, a, b):
        return a + 2 * b

    def mul(self, a, b):
        return a * b

    def lift(self, d):
        return np.asarray(d, dtype=np.float64)


@pytest.fixture
def with_broken_plugin(monkeypatch):
    """The entry point group as installed, plus `broken_add` and one that cannot import."""
    extra = [metadata.EntryPoint("broken_add", f"{__name__}:BrokenAdd", GROUP),
             metadata.EntryPoint("unimportable", "no_such_module_xyz:Thing", GROUP)]
    installed = metadata.entry_points

    def entry_points(**selection):
        found = list(installed(**selection))
        return found + extra if selection.get("group") == GROUP else found

    monkeypatch.setattr(metadata, "entry_points", entry_points)


def test_plugins_lists_a_failed_plugin_with_its_error(with_broken_plugin, capsys):
    assert cli.main(["plugins"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert " failed " in rows["broken_add"] and "⊕ is commutative" in rows["broken_add"]
    assert " failed " in rows["unimportable"] and "cannot load" in rows["unimportable"]
    assert " ok " in rows["max_product"]


def test_plugins_check_shows_the_failing_laws_of_a_rejected_plugin(with_broken_plugin, capsys):
    assert cli.main(["plugins", "check", "broken_add"]) == 1
    out = capsys.readouterr().out
    assert "loader status: failed" in out
    assert "FAIL  ⊕ is commutative" in out and "FAIL  ⊕ is associative" in out
    assert "PASS  ⊗ is associative" in out and "PASS  φ(0) = 0̄" in out


def test_plugins_check_of_an_unimportable_plugin_fails(with_broken_plugin, capsys):
    assert cli.main(["plugins", "check", "unimportable"]) == 1
    assert "cannot load" in capsys.readouterr().out
