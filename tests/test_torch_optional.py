"""torch is an optional extra: the client never imports it, and from_torch without it says how to
install it (these tests run with or without torch installed)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_semigrad_does_not_import_torch():
    code = "import sys, semigrad; semigrad.from_torch; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_from_torch_without_torch_names_the_extra():
    code = """
import sys
sys.modules["torch"] = None  # as if torch were not installed
import semigrad
try:
    semigrad.from_torch(lambda x: x, ())
except ImportError as error:
    assert "semigrad[torch]" in str(error) and "torch==2.13.0" in str(error), error
else:
    raise AssertionError("no ImportError")
"""
    subprocess.run([sys.executable, "-c", code], check=True)
