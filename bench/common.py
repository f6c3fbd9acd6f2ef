"""Helpers shared by the bench scripts: timing, machine description, markdown output."""

from __future__ import annotations

import gc
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent

BACKGROUND_COMPILE_THREADS = ("semigrad-jit",)  # thread names of semigrad's background JIT compiles


def settle(timeout: float = 300.0) -> float:
    """Wait for semigrad's background compile threads (names in BACKGROUND_COMPILE_THREADS); the wait in s.

    semigrad serves the first calls of a plan with NumPy while numba compiles its kernel in a
    thread; timing before that finishes would measure the compile, not the kernel.
    """
    t0 = time.perf_counter()
    deadline = t0 + timeout
    while True:
        pending = [t for t in threading.enumerate() if t.is_alive() and t.name.startswith(BACKGROUND_COMPILE_THREADS)]
        if not pending or time.perf_counter() > deadline:
            return time.perf_counter() - t0
        for t in pending:
            t.join(max(0.0, deadline - time.perf_counter()))


def alternated_blocks(calls: dict[str, Callable[[], object]], blocks: int, per_block: int = 20) -> dict[str, list[float]]:
    """µs per call of each of `calls`, one figure per block of `per_block` calls, the calls' blocks
    taken in turn `blocks` times (a noisy machine disturbs them alike)."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(blocks):
        for k, call in calls.items():
            start = time.perf_counter()
            for _ in range(per_block):
                call()
            times[k].append((time.perf_counter() - start) / per_block * 1e6)
    return times


def median_latency(call: Callable[[], object], *, budget: float, min_reps: int = 20,
                   warmup: float | None = None) -> tuple[float, int]:
    """Median wall time of one `call()` in seconds, and the number of timed calls.

    Warms up for `warmup` seconds (default budget / 5, at least 3 calls), then times calls one by
    one with time.perf_counter until `budget` seconds of timed calls and at least `min_reps` calls.
    """
    warmup = budget / 5 if warmup is None else warmup
    end, n = time.perf_counter() + warmup, 0
    while n < 3 or time.perf_counter() < end:
        call()
        n += 1
    settle()  # an engine that compiled a hot call in the background: time the compiled one
    gc.collect()
    samples, spent = [], 0.0
    while len(samples) < min_reps or spent < budget:
        t0 = time.perf_counter()
        call()
        dt = time.perf_counter() - t0
        samples.append(dt)
        spent += dt
    return statistics.median(samples), len(samples)


def median_run(call: Callable[[], object], *, runs: int, warmup_runs: int = 1) -> float:
    """Median wall time in seconds of `runs` timed calls after `warmup_runs` untimed ones."""
    for _ in range(warmup_runs):
        call()
        settle()
    gc.collect()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def package_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> list[tuple[str, str]]:
    import numpy as np

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        ("python", f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"),
        ("numpy", np.__version__),
        ("grpcio", package_version("grpcio")),
        ("protobuf", package_version("protobuf")),
        ("cpu count", f"{os.cpu_count()} (usable by this process: {usable})"),
        ("cpu", _cpu_model()),
        ("platform", platform.platform()),
    ]


def rerun_command(script: str, argv: list[str]) -> str:
    """The exact command (from the repo root) that reruns `script` with the resolved arguments."""
    try:
        python = os.path.relpath(sys.executable, REPO)
        python = python if not python.startswith("..") else sys.executable
    except ValueError:
        python = sys.executable
    return f"cd {shlex.quote(str(REPO))} && " + shlex.join([python, script, *argv])


def markdown_table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """`align`: one of 'l'/'r' per column (default: first left, others right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    widths = [max(3, len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w)
                                 for c, w, a in zip(cells, widths, align)) + " |"

    rule = "| " + " | ".join("-" * (w - 1) + (":" if a == "r" else "-") for w, a in zip(widths, align)) + " |"
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def fmt(x: float, digits: int = 3) -> str:
    """A number with `digits` significant digits and thousands separators, no exponent."""
    if x == 0 or x != x:
        return str(x)
    from math import floor, log10

    decimals = max(0, digits - 1 - floor(log10(abs(x))))
    return f"{x:,.{decimals}f}"


@contextmanager
def section(title: str):
    print(f"... {title}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    yield
    print(f"    done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
