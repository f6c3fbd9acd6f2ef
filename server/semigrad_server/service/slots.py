"""A tenant's calls in flight, counted across the worker processes of one server.

`semigrad serve --workers W` runs W processes on one port; the kernel spreads connections over
them, so a quota counted in each process would admit W times the quota. Here a tenant has
`quota` slots, bytes 0..quota-1 of a file of its own in a directory every worker of the server
opens (`TenantSlots(quota, directory)`; the supervisor makes it). A call takes a free slot with a
non-blocking POSIX record lock (`fcntl.lockf`) on its byte and releases it when it ends. The
kernel drops a process's locks when the process dies, so a worker killed with -9 leaves no slot
taken, which a counter in shared memory would. POSIX locks belong to the process, not the
thread: a process locking a byte it already holds succeeds, so each process also keeps the set
of slots its own threads hold, and never tries those.

The directory holds one file per tenant (tenant names are bounded by the token file, and are
letters, digits, `_ . -`: auth.TENANT_NAME).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
import weakref

PREFIX = "semigrad-slots-"


def make_directory() -> str:
    """A fresh private directory for the slot files of one server's workers."""
    return tempfile.mkdtemp(prefix=PREFIX)


def remove_directory(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class TenantSlots:
    """`take(tenant)` -> a slot number, or None when the tenant's `quota` calls are in flight in
    every process sharing `directory`; `give(tenant, slot)` ends it. `quota` 0: no bound (take
    returns -1 without touching a file). Without a directory, the process makes a private one
    (a server of one process), removed by `close`."""

    def __init__(self, quota: int, directory: str | None = None):
        self.quota = quota
        self._own = directory is None and quota > 0
        self.directory = make_directory() if self._own else directory
        self._files: dict[str, int] = {}  # tenant -> descriptor of its slot file (kept open: closing drops the locks)
        self._held: dict[str, set[int]] = {}  # tenant -> slots this process's threads hold
        self._lock = threading.Lock()
        if self._own:  # files unlinked under open descriptors keep their locks
            weakref.finalize(self, remove_directory, self.directory)

    def take(self, tenant: str) -> int | None:
        if not self.quota:
            return -1
        with self._lock:
            fd = self._file(tenant)
            held = self._held.setdefault(tenant, set())
            for slot in range(self.quota):
                if slot in held:
                    continue
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot, os.SEEK_SET)
                except OSError:  # another process holds it (EAGAIN or EACCES)
                    continue
                held.add(slot)
                return slot
            return None

    def give(self, tenant: str, slot: int) -> None:
        if slot < 0:
            return
        with self._lock:
            held = self._held[tenant]
            held.discard(slot)
            fcntl.lockf(self._files[tenant], fcntl.LOCK_UN, 1, slot, os.SEEK_SET)

    def _file(self, tenant: str) -> int:
        fd = self._files.get(tenant)
        if fd is None:
            fd = os.open(os.path.join(self.directory, f"tenant-{tenant}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                         0o600)
            self._files[tenant] = fd
        return fd

    def close(self) -> None:
        with self._lock:
            for fd in self._files.values():
                os.close(fd)
            self._files.clear()
            self._held.clear()
        if self._own:
            remove_directory(self.directory)
