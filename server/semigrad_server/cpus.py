"""How many CPUs this process may use: the container's CPU quota (cgroup v2 `cpu.max`, or v1
`cpu.cfs_quota_us`/`cpu.cfs_period_us`) and the CPU affinity mask, not the host's core count
(a container limited to 2 CPUs on a 64-core host must not start 64 workers)."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota in CPUs (1.5 for "150000 100000"), or None when unlimited or unknown."""
    try:
        text = (root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:  # cgroup v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def available_cpus(root: Path = CGROUP_ROOT) -> int:
    """CPUs this process may keep busy: the affinity mask's size, lowered to the cgroup quota
    (rounded up: a quota of 1.5 CPUs keeps 2 workers partly busy), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = cgroup_quota(root)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)



BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def limit_blas_threads() -> bool:
    """One BLAS thread in this process (NumPy's OpenBLAS), unless the operator set one of
    BLAS_THREAD_VARIABLES; True when it set it. A server gets its parallelism from its workers
    (one per CPU, `available_cpus`) and concurrent calls. OpenBLAS sizes its pool by the host's
    cores, not the container's quota, and its threads spin while they wait: on a 2-CPU machine
    NumPy's product of a 16 x 8 matrix with 10,700 vectors took 1.50 ms of CPU with 2 threads and
    0.84 ms with one, so a replica with a quota of one CPU would spend it on spinning."""
    if any(os.environ.get(v) for v in BLAS_THREAD_VARIABLES):
        return False
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    return True
