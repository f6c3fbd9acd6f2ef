"""Runs every benchmark listed in BENCHES, in order, each in its own Python process.

    python bench/run.py [ARGS...]      # `make bench BENCH_ARGS="..."` does this

ARGS are passed through unchanged to every benchmark. Exits non-zero if any benchmark fails
(the others still run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHES = [
    "suite",  # semigrad vs peers on every workload (det-by-minors n = 4..7 included); writes RESULTS.md
    "semiring_cost",
    "stream_chunks",
    "inprocess",  # the in-process client's call overhead against the engine and JAX jit(grad)
]
# bench/det_minors.py still runs on its own (its in-process/gRPC det figures are part of suite.py's)


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    failed = []
    for name in BENCHES:
        print(f"\n<!-- bench/{name}.py {' '.join(argv)} -->\n", flush=True)
        if subprocess.call([sys.executable, str(here / f"{name}.py"), *argv]) != 0:
            failed.append(name)
    if failed:
        print(f"bench/run.py: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
