"""Hypothesis profiles for the generated-input suites in this folder.

`make test` runs them bounded (the "ci" profile: a fixed seed, a few minutes in all on 2 cores);
`make fuzz` sets SEMIGRAD_FUZZ=1 for the "fuzz" profile: many more examples, random seeds.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                     HealthCheck.function_scoped_fixture])
settings.register_profile("ci", max_examples=40, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("fuzz", max_examples=2_000, print_blob=True, **_COMMON)
settings.load_profile("fuzz" if os.environ.get("SEMIGRAD_FUZZ") else "ci")


def pytest_terminal_summary(terminalreporter):
    """The differential fuzzer's count of cases (the closing note of issue 12 quotes it)."""
    import sys

    module = sys.modules.get("test_engine_differential")
    if module is not None and module.STATS:
        counts = ", ".join(f"{key}: {n}" for key, n in sorted(module.STATS.items()))
        terminalreporter.write_line(f"differential fuzzer: {counts}")
