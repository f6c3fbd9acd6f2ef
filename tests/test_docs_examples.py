"""The Python examples in README.md and docs/ run as written against a real server."""

from __future__ import annotations

import re
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
    if "import torch" in code:
        pytest.importorskip("torch")  # the torch extra (installed by make venv's dev extra)
    code = code.replace("127.0.0.1:50051", server_address)
    exec(compile(code, f"{path.name}[block {index}]", "exec"), {"__name__": "__doc_example__"})
