"""Semiring plugins as real installed distributions, next to an unchanged server.

Three distributions are built and installed with `pip install --no-deps --no-build-isolation
--no-index --target DIR` (no network), and `semigrad serve` runs in a subprocess with DIR on
its PYTHONPATH:

* tests/plugin_fixtures/broken-plugin: entry points that fail to import, are not a
  Semiring, break the axioms, or are misnamed: each must be listed as failed, with its
  reason, while every other semiring serves;
* tests/plugin_fixtures/semigrad-minproduct: a third-party plugin written only from
  docs/writing-a-plugin.md, which must load and answer requests (and trace best paths);
* semigrad-abssum: the example of docs/writing-a-plugin.md, its files taken from the
  document as written; the document's client example then runs against the server.
"""

from __future__ import annotations

import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import semigrad as sg
from path_reference import random_case

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "plugin_fixtures"
GUIDE = ROOT / "docs" / "writing-a-plugin.md"
PLUGGED = ("max_product", "log", "entropy", "kbest", "signed_max_product", "log_entropy", "log_counting",
           "log_signed_max_product", "boolean", "counting", "maxplus", "minplus", "bottleneck")
BROKEN = {  # entry point -> what its error must say
    "broken_import": ("cannot load", "ModuleNotFoundError", "semigrad_fixture_dependency_that_is_not_installed"),
    "not_a_semiring": ("semigrad_broken_fixture.semirings:NotASemiring is not a semigrad_server.semiring.Semiring",),
    "broken_axioms": ("axiom self-check", "⊕ is commutative", "⊕ is associative"),
    "misnamed": ("entry point is named 'misnamed' but the semiring calls itself 'not_misnamed'",),
}
STARTUP_TIMEOUT = 60.0


def guide_files() -> dict[str, str]:
    """The files docs/writing-a-plugin.md shows, by path: each code block after `<!-- file: PATH -->`."""
    found = re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return dict(found)


def guide_client_example() -> str:
    (code,) = [c for c in re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S) if "client" in c.lower()
               and "semiring=\"abs_sum\"" in c]
    return code


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    """A directory with the three test distributions installed into it."""
    base = tmp_path_factory.mktemp("plugins")
    sources = []
    for name in ("broken-plugin", "semigrad-minproduct"):  # copies: building writes into the tree
        sources.append(shutil.copytree(FIXTURES / name, base / "src" / name))
    for path, text in guide_files().items():
        target = base / "src" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    sources.append(base / "src" / "semigrad-abssum")
    target = base / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--disable-pip-version-check", "--quiet", "--target", str(target), *map(str, sources)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return target


def plugin_env(plugin_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin_dir), env.get("PYTHONPATH")]))
    return env


def serve_options() -> list[str]:
    """One process on any free port, graphs in memory (when the server has these options)."""
    usage = subprocess.run([sys.executable, "-m", "semigrad_server", "serve", "--help"], capture_output=True,
                           text=True, timeout=60).stdout
    return ["--port", "0"] + ["--workers", "1"] * ("--workers" in usage) + ["--store", "memory"] * ("--store" in usage)


@pytest.fixture(scope="module")
def address(plugin_dir):
    """`semigrad serve` on a free port (--port 0) in a subprocess that sees the test plugins."""
    process = subprocess.Popen([sys.executable, "-m", "semigrad_server", "serve", "--host", "127.0.0.1",
                                *serve_options()],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=plugin_env(plugin_dir))
    lines: queue.Queue = queue.Queue()
    log: list[str] = []

    def pump():
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    port = None
    try:
        while port is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"server did not start in {STARTUP_TIMEOUT} s:\n{''.join(log)}")
            if line is None:
                pytest.fail(f"server exited with {process.wait()}:\n{''.join(log)}")
            log.append(line)
            m = re.search(r"semigrad serving on [\d.]+:(\d+)", line)
            port = int(m.group(1)) if m else None
        yield f"127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def remote(address):
    with sg.Client(address, timeout=30) as client:
        yield client


def two_paths(client):
    """y = 0.5 · (2x + 3x): two paths with products 1.0 and 1.5."""
    g = sg.Graph()
    x = g.input("x", ())
    g.output("y", (x * 2.0 + x * 3.0) * 0.5)
    return client.register(g)


# ---------------------------------------------------------------- broken plugins


def test_broken_plugins_are_listed_as_failed_with_the_reason(remote):
    infos = {s.name: s for s in remote.list_semirings()}
    for name, words in BROKEN.items():
        info = infos[name]
        assert (info.status, info.distribution, info.version) == ("failed", "semigrad-broken-fixture", "0.0.1"), info
        for word in words:
            assert word in info.error, (name, info.error)
    for name in ("real", *PLUGGED, "minproduct", "abs_sum"):
        assert infos[name].status == "ok" and infos[name].error == "", infos[name]


@pytest.mark.parametrize("name,want", [("real", 2.5), ("max_product", 1.5), ("log", math.log(2.5)), ("counting", 2.0),
                                       ("kbest", 1.5), ("bottleneck", 0.5), ("minproduct", 1.0), ("abs_sum", 2.5)])
def test_the_other_semirings_still_serve(remote, name, want):
    got = two_paths(remote).gradient({"x": np.array([0.3, -2.0])}, semiring=name)["x"]
    np.testing.assert_allclose(got, [want, want], rtol=1e-12)


def test_an_unknown_semiring_is_failed_precondition_listing_the_available_ones(remote):
    with pytest.raises(sg.FailedPrecondition) as error:
        two_paths(remote).gradient({"x": 1.0}, semiring="no_such_semiring")
    message = str(error.value)
    assert "unknown semiring 'no_such_semiring'" in message
    available = set(message.split("available: ", 1)[1].replace(",", " ").split())
    assert available == {"real", *PLUGGED, "minproduct", "abs_sum"}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_refused_plugin_cannot_be_used(remote, name):
    with pytest.raises(sg.FailedPrecondition, match=f"unknown semiring '{name}' .its plugin failed to load"):
        two_paths(remote).gradient({"x": 1.0}, semiring=name)


def test_the_command_line_lists_and_checks_installed_plugins(plugin_dir):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "semigrad_server", "plugins", *args], capture_output=True,
                              text=True, timeout=120, env=plugin_env(plugin_dir))

    listing = run()
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
    for name in BROKEN:
        assert " failed " in rows[name] and "semigrad-broken-fixture" in rows[name], rows[name]
    assert " ok " in rows["minproduct"] and "selective" in rows["minproduct"]
    assert " ok " in rows["abs_sum"] and "semigrad-abssum" in rows["abs_sum"]
    for name, laws in (("minproduct", 16), ("abs_sum", 14)):
        check = run("check", name)
        assert check.returncode == 0 and f"all {laws} laws hold" in check.stdout, check.stdout + check.stderr
    check = run("check", "broken_axioms")
    assert check.returncode == 1 and "FAIL  ⊕ is commutative" in check.stdout
    check = run("check", "broken_import")
    assert check.returncode == 1 and "cannot load" in check.stdout


# ---------------------------------------------------------------- the third-party plugins


def test_minproduct_is_listed_with_its_properties(remote):
    info = {s.name: s for s in remote.list_semirings()}["minproduct"]
    assert (info.distribution, info.version, info.entry_point) == (
        "semigrad-minproduct", "0.2.0", "semigrad_minproduct:MinProductSemiring")
    assert (info.commutative, info.idempotent, info.selective, info.components) == (True, True, True, 1)


@pytest.mark.parametrize("seed", range(8))
def test_minproduct_is_exp_of_minplus_and_abs_sum_is_exp_of_log(remote, seed):
    """On random graphs with batch dims (tests/path_reference.py): the new semirings agree with
    the installed ones, and minproduct's best paths reproduce its value."""
    c = random_case(seed)
    f = remote.register(c.graph.client_graph())

    def grad(name, **kw):
        return f.gradient(c.inputs, seeds=c.seeds or None, semiring=name, **kw)

    minproduct, minplus, abs_sum, log = grad("minproduct"), grad("minplus"), grad("abs_sum"), grad("log")
    starts = []
    for x, shape in c.graph.inputs.items():
        np.testing.assert_allclose(minproduct[x], np.exp(minplus[x]), rtol=1e-9)
        np.testing.assert_allclose(abs_sum[x], np.exp(log[x]), rtol=1e-9)
        starts += [(x, index) for index in np.ndindex(*np.shape(minproduct[x]))]
    traced = grad("minproduct", best_path=starts)
    for (x, index), path in zip(starts, traced.best_paths):
        value = minproduct[x][index]
        if np.isinf(value):
            assert path.steps == ()
            continue
        weight = math.prod(abs(step.partial) for step in path.steps)
        if c.seeds:  # the seed of the output element reached is the path's last factor
            ref = c.graph.outputs[path.output]
            weight *= abs(np.broadcast_to(c.seeds[path.output], c.batch + c.graph.shape(ref))[
                index[: len(c.batch)] + path.steps[-1].index])
        assert weight == pytest.approx(value, rel=1e-12), path


def test_the_guide_example_runs_as_written(address):
    code = guide_client_example().replace("127.0.0.1:50051", address)
    exec(compile(code, f"{GUIDE.name}[client example]", "exec"), {"__name__": "__doc_example__"})
