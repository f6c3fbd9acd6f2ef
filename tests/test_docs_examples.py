"""The Python examples in README.md and docs/ run as written against a real server, and those
written for a server also with the engine in this process (`sg.Client()`); the README's shell
commands run as written in a fresh shell (the ones starting with `.venv/bin/`)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


CONTINUED = "# continued"  # a block starting so runs after the document's blocks before it


def examples(path: Path) -> list[tuple[Path, int, str]]:
    out, before = [], ""
    for i, code in enumerate(python_blocks(path)):
        if code.startswith(CONTINUED):
            code = before + code
        before = code
        if "# not-run" not in code:
            out.append((path, i, code))
    return out


EXAMPLES = [example for path in DOCUMENTS for example in examples(path)]


def test_readme_has_the_seed_example():
    assert any("det" in code and "np.linalg.inv" in code for path, _, code in EXAMPLES if path.name == "README.md")


@pytest.mark.parametrize("path,index,code", EXAMPLES, ids=[f"{p.relative_to(ROOT)}#{i}" for p, i, _ in EXAMPLES])
def test_example_runs(server_address, path, index, code):
    _needs_torch(code)
    code = code.replace("127.0.0.1:50051", server_address)
    exec(compile(code, f"{path.name}[block {index}]", "exec"), {"__name__": "__doc_example__"})


def _needs_torch(code: str) -> None:
    if "import torch" in code:
        pytest.importorskip("torch")  # the torch extra (make venv installs it)


ADDRESSED = re.compile(r"""Client\(\s*["']127\.0\.0\.1:50051["']\s*(,\s*)?""")
# (shared memory is a server connection's: those examples are about the wire)
SERVER_EXAMPLES = [(path, i, code) for path, i, code in EXAMPLES
                   if ADDRESSED.search(code) and "shared_memory" not in code]


@pytest.mark.parametrize("path,index,code", SERVER_EXAMPLES,
                         ids=[f"{p.relative_to(ROOT)}#{i}" for p, i, _ in SERVER_EXAMPLES])
def test_example_runs_in_process(path, index, code):
    """Examples written for a server give the same with the engine in this process."""
    _needs_torch(code)
    code = ADDRESSED.sub("Client(", code)
    exec(compile(code, f"{path.name}[block {index}, in process]", "exec"), {"__name__": "__doc_example__"})


def shell_commands(path: Path) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", path.read_text(), flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith(".venv/bin/")]


COMMANDS = shell_commands(ROOT / "README.md")


def test_the_readme_checks_health_and_runs_the_cli_from_the_venv():
    assert any("grpc_health" in c for c in COMMANDS) and any(c.startswith(".venv/bin/semigrad ") for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs_in_a_fresh_shell(server_address, command):
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv in this checkout (make venv makes it)")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"  # nothing activated
    result = subprocess.run(["bash", "--noprofile", "--norc", "-c", command.replace("127.0.0.1:50051", server_address)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    if "grpc_health" in command:
        assert result.stdout.strip() == "SERVING"
