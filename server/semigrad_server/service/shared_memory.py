"""Tensors in POSIX shared memory, for clients on the server's host (see docs/performance.md).

A same-host client writes a request's tensors into a region it created in /dev/shm and sends
only references (region name, offset, capability); it may also name space in a region where the
server writes the response's tensors and answers with references. This module opens the regions
by name, lazily, in each worker process (any worker may receive any request), and keeps their
file descriptors in a small LRU cache. It knows nothing of gRPC: errors are semigrad errors,
which the servicer maps to status codes.

Security (docs/conventions.md, "Shared memory"):

* **Only local peers.** A request from a peer that is not a unix socket or a loopback address
  may not name regions at all (FAILED_PRECONDITION, before the name is looked at).
* **Names, not paths.** A region name must match ``semigrad-<16 to 64 lowercase hex digits>``;
  the file is opened with O_NOFOLLOW (no symlinks) and O_NONBLOCK (a FIFO cannot stall a
  thread), and must be a regular file owned by the server's effective user that no other user
  may read or write (mode 0600 or stricter). Its identity is checked again on every request
  (lstat of the name against the open descriptor): a region replaced under its name is reopened.
* **Proof of access.** Naming a region proves nothing (names are visible in /dev/shm to every
  user). Its first 64 bytes hold a random 32-byte capability the client wrote there; every
  reference must carry it, and the server compares the two with ``hmac.compare_digest`` before
  it reads or writes any other byte of the region (PERMISSION_DENIED naming the region and the
  input otherwise). Only a process that could read the region can know it, so the server never
  reads or writes for a requester what the requester could not read itself.
* **No mapping, so no SIGBUS.** The server never maps a client's region: it copies inputs out
  with ``preadv`` and results in with ``pwritev`` on the descriptor. A region its client shrinks
  while a request reads it gives a short read, answered INVALID_ARGUMENT naming the input;
  writing past a shrunk end only grows the client's file back, never past the extent checked.
  (Reading a mapping past the end of its file is SIGBUS, which kills the whole process.)
* **Bounded copies.** The elements copied out of regions in one request are counted against
  ``max_elements`` (the server's ``max_request_elements``) before any memory is allocated.

Inputs are read-only arrays (the server never writes a request's tensors); the response is
written only inside the given output region.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import os
import re
import stat
import threading
import time
import urllib.parse
from collections import OrderedDict
from typing import Callable

import numpy as np
from semigrad import codec
from semigrad.shared_memory import HEADER_BYTES, header_capability
from semigrad.v1 import semigrad_pb2 as pb

from ..errors import FailedPrecondition, InvalidArgument, PermissionDenied, ResourceExhausted
from ..limits import Limits

SHM_DIR = "/dev/shm"
REGION_NAME = re.compile(r"semigrad-[0-9a-f]{16,64}")
ALIGNMENT = 64  # bytes: every tensor the server writes starts at a multiple of this in its region
DEFAULT_MAX_OPEN = 64  # regions kept open per worker process (least recently used ones are closed)
SWEEP_SECONDS = 1.0  # at most this often, descriptors of regions their client removed are closed
MAX_IO_BYTES = 1 << 30  # bytes per preadv/pwritev call (Linux moves at most 2 GiB - 4 KiB per call)
SAME_HOST = ("shared memory is only for clients on the same host as the server, running as the server's user; "
             "send the tensors inline")


def is_local_peer(peer: str) -> bool:
    """Whether a gRPC peer string (``context.peer()``) is a unix socket or a loopback address:
    ``unix:...``, ``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000`` (grpc may escape the brackets as
    %5B/%5D), ``ipv6:[::ffff:127.0.0.1]:5000``. Anything else (other schemes, unparsable) is not."""
    if peer.startswith(("unix:", "unix-abstract:")):
        return True
    scheme, _, address = peer.partition(":")
    address = urllib.parse.unquote(address)
    if scheme == "ipv4":
        host = address.rpartition(":")[0]
    elif scheme == "ipv6" and address.startswith("[") and "]" in address:
        host = address[1:address.index("]")].partition("%")[0]  # no zone id
    else:
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


class _Region:
    """One open region: ``pins`` counts the requests using it; an evicted region closes at the last unpin."""

    __slots__ = ("name", "fd", "ident", "pins", "evicted")

    def __init__(self, name: str, fd: int, ident: tuple[int, int]):
        self.name, self.fd, self.ident = name, fd, ident
        self.pins = 0
        self.evicted = False


class SharedMemory:
    """A worker process's view of its clients' shared-memory regions. Thread-safe.

    ``enabled=False``: every shared reference or output region is FAILED_PRECONDITION.
    ``max_elements``: elements one request may copy out of regions (RESOURCE_EXHAUSTED past it).
    """

    def __init__(self, enabled: bool = True, *, max_open: int = DEFAULT_MAX_OPEN, directory: str = SHM_DIR,
                 max_elements: int = Limits.max_request_elements):
        self.enabled = enabled
        self.max_open = max_open
        self.directory = directory
        self.max_elements = max_elements
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, _Region] = OrderedDict()
        self._last_sweep = time.monotonic()

    def session(self, peer: str | Callable[[], str] = "") -> Session:
        """The regions of one request from `peer` (``context.peer()``, or ``context.peer`` itself,
        called only when the request names a region: most name none; none: not local, so the
        request may not use shared memory): use as a context manager around decoding, computing
        and encoding."""
        return Session(self, peer)

    def opened(self) -> list[str]:
        """Names of the regions open now (most recently used last)."""
        with self._lock:
            return list(self._cache)

    def close(self) -> None:
        """Close every region (those still in use close when their request ends)."""
        with self._lock:
            for r in self._cache.values():
                self._retire(r)
            self._cache.clear()

    # -------------------------------------------------------------------------------- regions
    def pin(self, name: str, what: str) -> tuple[_Region, int]:
        """Region `name`, pinned, and its size now; its identity checked against its name now."""
        if not REGION_NAME.fullmatch(name):
            raise InvalidArgument(f"{what}: shared memory region name {name!r} is not valid: "
                                  f"expected 'semigrad-' and 16 to 64 lowercase hex digits")
        self._maybe_sweep()
        path = os.path.join(self.directory, name)
        st = self._check_file(path, name, what, os.lstat)
        with self._lock:
            r = self._cache.get(name)
            if r is not None and r.ident == (st.st_dev, st.st_ino):
                self._cache.move_to_end(name)
                r.pins += 1
            else:
                r = None
        if r is None:
            r = self._open(path, name, what)
            with self._lock:
                old = self._cache.pop(name, None)
                if old is not None:
                    self._retire(old)
                self._cache[name] = r
                r.pins += 1
                while len(self._cache) > self.max_open:
                    _, oldest = self._cache.popitem(last=False)
                    self._retire(oldest)
        try:
            size = self._check_file(path, name, what, os.fstat, fd=r.fd).st_size
        except BaseException:
            self.unpin(r)
            raise
        return r, size

    def _check_file(self, path: str, name: str, what: str, stat_fn, fd=None) -> os.stat_result:
        try:
            st = stat_fn(path if fd is None else fd)
        except FileNotFoundError:
            raise FailedPrecondition(f"{what}: shared memory region '{name}' not found on the server's host: "
                                     f"{SAME_HOST}") from None
        except OSError as e:
            raise FailedPrecondition(f"{what}: shared memory region '{name}' cannot be opened "
                                     f"({os.strerror(e.errno) if e.errno else e}): {SAME_HOST}") from None
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise FailedPrecondition(f"{what}: shared memory region '{name}' is not a regular file owned by the "
                                     f"server's user: {SAME_HOST}")
        if st.st_mode & 0o077:
            raise PermissionDenied(f"{what}: shared memory region '{name}' may be used by other users "
                                   f"(mode {stat.S_IMODE(st.st_mode):04o}), so its capability proves nothing; "
                                   "create regions with mode 0600")
        return st

    def _open(self, path: str, name: str, what: str) -> _Region:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                raise FailedPrecondition(f"{what}: shared memory region '{name}' not found on the server's host: "
                                         f"{SAME_HOST}") from None
            raise FailedPrecondition(f"{what}: shared memory region '{name}' cannot be opened "
                                     f"({os.strerror(e.errno) if e.errno else e}): {SAME_HOST}") from None
        try:
            st = self._check_file(path, name, what, os.fstat, fd=fd)
        except BaseException:
            os.close(fd)
            raise
        return _Region(name, fd, (st.st_dev, st.st_ino))

    def unpin(self, r: _Region) -> None:
        """Undo one `pin`: an evicted region closes at its last unpin."""
        with self._lock:
            r.pins -= 1
            if r.pins == 0 and r.evicted:
                _close(r)

    def _retire(self, r: _Region) -> None:
        """Out of the cache (lock held): close now, or at the last unpin."""
        r.evicted = True
        if r.pins == 0:
            _close(r)

    def _maybe_sweep(self) -> None:
        """Close the regions that were removed (their client closed), at most every SWEEP_SECONDS."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_sweep < SWEEP_SECONDS or not self._cache:
                return
            self._last_sweep = now
            entries = list(self._cache.items())
        gone = []
        for name, r in entries:
            try:
                st = os.lstat(os.path.join(self.directory, name))
                if (st.st_dev, st.st_ino) != r.ident:
                    gone.append((name, r))
            except OSError:
                gone.append((name, r))
        with self._lock:
            for name, r in gone:
                if self._cache.get(name) is r:
                    del self._cache[name]
                    self._retire(r)


def _close(r: _Region) -> None:
    if r.fd >= 0:
        os.close(r.fd)
        r.fd = -1


def _read_into(fd: int, buffer: memoryview, offset: int, name: str, what: str) -> int:
    """Read into `buffer` from `offset` of region `name`; the bytes read (fewer only at its end)."""
    done = 0
    while done < len(buffer):
        try:
            n = os.preadv(fd, [buffer[done:done + MAX_IO_BYTES]], offset + done)
        except OSError as e:
            raise FailedPrecondition(f"{what}: shared memory region '{name}' cannot be read "
                                     f"({os.strerror(e.errno) if e.errno else e})") from None
        if n == 0:
            break
        done += n
    return done


def _write_from(fd: int, buffer: memoryview, offset: int) -> None:
    done = 0
    while done < len(buffer):
        done += os.pwritev(fd, [buffer[done:done + MAX_IO_BYTES]], offset + done)


class Session:
    """The shared-memory side of one request: its peer, the regions it proved access to (pinned),
    the input extents read, and the elements copied."""

    def __init__(self, shm: SharedMemory, peer: str | Callable[[], str]):
        self._shm = shm
        self._peer = peer
        self._local: bool | None = None  # whether the peer is local: parsed only when a region is named
        self._pinned: dict[str, tuple[_Region, int, bytes | None]] = {}  # name -> (region, size, header capability)
        self._extents: list[tuple[str, int, int, str]] = []  # (region, start, end, what) of the inputs read
        self._elements = 0

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info) -> None:
        for r, _, _ in self._pinned.values():
            self._shm.unpin(r)
        self._pinned.clear()

    def _region(self, name: str, capability: bytes, what: str) -> tuple[_Region, int]:
        """Region `name` and its size, once `capability` matches its header's; nothing else of it is read before."""
        if not self._shm.enabled:
            raise FailedPrecondition(f"{what}: shared memory is disabled on this server "
                                     "(semigrad serve --no-shared-memory); send the tensors inline")
        if self._local is None:
            if callable(self._peer):
                self._peer = self._peer()
            self._local = is_local_peer(self._peer)
        if not self._local:
            raise FailedPrecondition(f"{what}: shared memory is only for clients on the server's host, and this "
                                     f"request came from {self._peer[:80]!r}; send the tensors inline")
        entry = self._pinned.get(name)
        if entry is None:
            r, size = self._shm.pin(name, what)
            try:
                head = bytearray(HEADER_BYTES)
                n = _read_into(r.fd, memoryview(head), 0, name, what)
            except BaseException:
                self._shm.unpin(r)
                raise
            entry = self._pinned[name] = (r, size, header_capability(bytes(head[:n])))
        r, size, expected = entry
        if expected is None:
            raise PermissionDenied(f"{what}: shared memory region '{name}' has no capability header (its first "
                                   f"{HEADER_BYTES} bytes); the client writes one when it creates the region")
        if not capability:
            raise PermissionDenied(f"{what}: no capability sent for shared memory region '{name}': a request must "
                                   "prove it may use a region with the capability in the region's header")
        if not hmac.compare_digest(capability, expected):
            raise PermissionDenied(f"{what}: the capability sent for shared memory region '{name}' is not the "
                                   "region's")
        return r, size

    def array(self, tensor: pb.Tensor, what: str) -> np.ndarray:
        """A read-only copy of the bytes a shared tensor references."""
        try:
            dtype = codec.wire_dtype(tensor.dtype)
        except ValueError as e:
            raise InvalidArgument(f"{what}: {e}") from None
        shape = codec.message_shape(tensor)
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"{what}: tensor shape {shape} has a negative dimension")
        ref = tensor.shared
        r, size = self._region(ref.region, ref.capability, what)
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        start = ref.offset
        if start < HEADER_BYTES:
            raise InvalidArgument(f"{what}: offset {start} in shared memory region '{ref.region}' is inside its "
                                  f"{HEADER_BYTES}-byte header")
        if start % dtype.itemsize:
            raise InvalidArgument(f"{what}: offset {start} in shared memory region '{ref.region}' is not a multiple "
                                  f"of {dtype.itemsize} (the size of {dtype.name})")
        if start + nbytes > size:
            raise InvalidArgument(f"{what}: a tensor of shape {shape} and dtype {dtype.name} needs {nbytes} bytes at "
                                  f"offset {start}, past the end of shared memory region '{ref.region}' "
                                  f"({size} bytes)")
        if self._elements + count > self._shm.max_elements:
            raise ResourceExhausted(f"{what}: {count} elements from shared memory region '{ref.region}' take this "
                                    f"request past {self._shm.max_elements} elements (max_request_elements)")
        try:
            array = np.empty(shape, dtype=dtype)
        except ValueError as e:  # a shape NumPy cannot hold (e.g. [0, 2**62, 4]: "array is too big")
            raise InvalidArgument(f"{what}: tensor shape {list(shape)}: {e}") from None
        self._elements += count
        if nbytes:
            got = _read_into(r.fd, memoryview(array.reshape(-1).view(np.uint8)), start, ref.region, what)
            if got < nbytes:
                raise InvalidArgument(f"{what}: shared memory region '{ref.region}' shrank while it was read: "
                                      f"{got} of {nbytes} bytes at offset {start} were there")
        array.flags.writeable = False
        self._extents.append((ref.region, start, start + nbytes, what))
        return array

    def writer(self, region: pb.SharedMemoryRegion, what: str = "output_region") -> Writer:
        """Where the response's tensors go; checked now (call it after the inputs are decoded)."""
        r, size = self._region(region.region, region.capability, what)
        start, end = region.offset, region.offset + region.capacity
        if start < HEADER_BYTES:
            raise InvalidArgument(f"{what}: offset {start} in shared memory region '{region.region}' is inside its "
                                  f"{HEADER_BYTES}-byte header")
        if end > size:
            raise InvalidArgument(f"{what}: {region.capacity} bytes at offset {start} run past the end of shared "
                                  f"memory region '{region.region}' ({size} bytes)")
        for name, a, b, other in self._extents:
            if name == region.region and a < end and start < b and a < b:
                raise InvalidArgument(f"{what}: bytes {start}..{end} of shared memory region '{name}' overlap "
                                      f"{other} (bytes {a}..{b})")
        return Writer(r, start, end)


class Writer:
    """Places a response's tensors one after another in an output region, each 64-byte aligned."""

    def __init__(self, region: _Region, start: int, end: int):
        self._r = region
        self._next = start
        self._end = end

    def place(self, value) -> pb.Tensor | None:
        """Copy `value` into the region and return a Tensor referencing it, or None when it does not
        fit (or is empty, or the region cannot be written): the caller sends it inline. Encodes like
        codec.to_tensor."""
        array = np.asarray(value)
        name = codec.value_dtype_name(array.dtype)
        wire = codec.wire_dtype(name)
        nbytes = array.size * wire.itemsize
        start = -(-self._next // ALIGNMENT) * ALIGNMENT
        if nbytes == 0 or start + nbytes > self._end:
            return None
        data = np.ascontiguousarray(array.astype(wire, casting="unsafe", copy=False))  # value_dtype_name: no loss
        try:
            _write_from(self._r.fd, memoryview(data.reshape(-1).view(np.uint8)), start)
        except OSError:  # /dev/shm full (the file's client shrank it and the write grows it back): inline
            return None
        self._next = start + nbytes
        return pb.Tensor(dtype=codec.dtype_to_proto(name), shape=array.shape,
                         shared=pb.SharedMemoryRef(region=self._r.name, offset=start))
