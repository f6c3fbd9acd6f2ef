"""Tensors in POSIX shared memory, for clients on the server's host (see docs/performance.md).

A same-host client writes a request's tensors into a region it created in /dev/shm and sends
only references (region name, offset); it may also name space in a region where the server
writes the response's tensors (one memcpy each) and answers with references. This module
opens the regions by name, lazily, in each worker process (any worker may receive any
request), and keeps their mappings in a small LRU cache. It knows nothing of gRPC: errors are
semigrad errors, which the servicer maps to status codes.

Security. A region name must match ``semigrad-<16 to 64 lowercase hex digits>`` (no paths);
the file is opened with O_NOFOLLOW (no symlinks) and O_NONBLOCK (a FIFO cannot stall a
thread), and must be a regular file owned by the server's effective user, which with the
client's mode 0600 means client and server run as the same user. Its identity and size are
checked again on every request (lstat of the name, fstat of the mapping) before any byte is
touched, and every tensor must lie inside it. What remains: a process of the server's own user
that shrinks a region while a request reads it makes that worker die of SIGBUS; only processes
that could kill the server anyway can do that. Inputs are read-only views (the server never
writes a request's tensors); the response is written only inside the given output region.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import stat
import threading
import time
from collections import OrderedDict

import numpy as np
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb

from ..errors import FailedPrecondition, InvalidArgument

SHM_DIR = "/dev/shm"
REGION_NAME = re.compile(r"semigrad-[0-9a-f]{16,64}")
ALIGNMENT = 64  # bytes: every tensor the server writes starts at a multiple of this in its region
DEFAULT_MAX_MAPPINGS = 64  # mapped regions kept per worker process (least recently used ones go first)
SWEEP_SECONDS = 1.0  # at most this often, mappings of regions their client removed are dropped
SAME_HOST = ("shared memory is only for clients on the same host as the server, running as the server's user; "
             "send the tensors inline")


class _Mapping:
    """One mapped region: ``pins`` counts the requests using it; an evicted mapping closes at the last unpin."""

    __slots__ = ("name", "mm", "ident", "size", "pins", "evicted")

    def __init__(self, name: str, mm: mmap.mmap, ident: tuple[int, int], size: int):
        self.name, self.mm, self.ident, self.size = name, mm, ident, size
        self.pins = 0
        self.evicted = False


class SharedMemory:
    """A worker process's view of its clients' shared-memory regions. Thread-safe.

    ``enabled=False``: every shared reference or output region is FAILED_PRECONDITION.
    """

    def __init__(self, enabled: bool = True, *, max_mappings: int = DEFAULT_MAX_MAPPINGS,
                 directory: str = SHM_DIR):
        self.enabled = enabled
        self.max_mappings = max_mappings
        self.directory = directory
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, _Mapping] = OrderedDict()
        self._last_sweep = time.monotonic()

    def session(self) -> Session:
        """The regions of one request: use as a context manager around decoding, computing and encoding."""
        return Session(self)

    def mapped(self) -> list[str]:
        """Names of the regions mapped now (most recently used last)."""
        with self._lock:
            return list(self._cache)

    def close(self) -> None:
        """Drop every mapping (those still in use close when their request ends)."""
        with self._lock:
            for m in self._cache.values():
                self._retire(m)
            self._cache.clear()

    # -------------------------------------------------------------------------------- mappings
    def pin(self, name: str, what: str) -> _Mapping:
        """The mapping of region `name`, pinned, its identity and size checked now."""
        if not self.enabled:
            raise FailedPrecondition(f"{what}: shared memory is disabled on this server "
                                     "(semigrad serve --no-shared-memory); send the tensors inline")
        if not REGION_NAME.fullmatch(name):
            raise InvalidArgument(f"{what}: shared memory region name {name!r} is not valid: "
                                  f"expected 'semigrad-' and 16 to 64 lowercase hex digits")
        self._maybe_sweep()
        path = os.path.join(self.directory, name)
        st = self._check_file(path, name, what, os.lstat)
        with self._lock:
            m = self._cache.get(name)
            if m is not None and m.ident == (st.st_dev, st.st_ino):
                self._cache.move_to_end(name)
                m.pins += 1
            else:
                m = None
        if m is not None:
            try:
                size = m.mm.size()  # fstat of the mapped file: a region resized since it was mapped is remapped
            except (OSError, ValueError):
                size = -1
            if size == m.size:
                return m
            self.unpin(m)
            with self._lock:
                if self._cache.get(name) is m:
                    del self._cache[name]
                    self._retire(m)
        m = self._open(path, name, what)
        with self._lock:
            old = self._cache.pop(name, None)
            if old is not None:
                self._retire(old)
            self._cache[name] = m
            m.pins += 1
            while len(self._cache) > self.max_mappings:
                _, oldest = self._cache.popitem(last=False)
                self._retire(oldest)
        return m

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
        return st

    def _open(self, path: str, name: str, what: str) -> _Mapping:
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
            if st.st_size == 0:
                raise InvalidArgument(f"{what}: shared memory region '{name}' is empty")
            mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            raise FailedPrecondition(f"{what}: shared memory region '{name}' cannot be mapped "
                                     f"({os.strerror(e.errno) if e.errno else e}): {SAME_HOST}") from None
        finally:
            os.close(fd)  # the mapping keeps its own descriptor
        return _Mapping(name, mm, (st.st_dev, st.st_ino), st.st_size)

    def unpin(self, m: _Mapping) -> None:
        """Undo one `pin`: an evicted mapping closes at its last unpin."""
        with self._lock:
            m.pins -= 1
            if m.pins == 0 and m.evicted:
                _close(m)

    def _retire(self, m: _Mapping) -> None:
        """Out of the cache (lock held): close now, or at the last unpin."""
        m.evicted = True
        if m.pins == 0:
            _close(m)

    def _maybe_sweep(self) -> None:
        """Drop the mappings of regions that were removed (their client closed), at most every SWEEP_SECONDS."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_sweep < SWEEP_SECONDS or not self._cache:
                return
            self._last_sweep = now
            entries = list(self._cache.items())
        gone = []
        for name, m in entries:
            try:
                st = os.lstat(os.path.join(self.directory, name))
                if (st.st_dev, st.st_ino) != m.ident:
                    gone.append((name, m))
            except OSError:
                gone.append((name, m))
        with self._lock:
            for name, m in gone:
                if self._cache.get(name) is m:
                    del self._cache[name]
                    self._retire(m)


def _close(m: _Mapping) -> None:
    try:
        m.mm.close()
    except BufferError:  # arrays still view it (e.g. held by a cache): it unmaps when they go
        pass


class Session:
    """The shared-memory side of one request: input views, the output region, and the pins on their mappings."""

    def __init__(self, shm: SharedMemory):
        self._shm = shm
        self._pinned: dict[str, _Mapping] = {}
        self._extents: list[tuple[str, int, int, str]] = []  # (region, start, end, what) of the inputs read

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info) -> None:
        for m in self._pinned.values():
            self._shm.unpin(m)
        self._pinned.clear()

    def _mapping(self, name: str, what: str) -> _Mapping:
        m = self._pinned.get(name)
        if m is None:
            m = self._pinned[name] = self._shm.pin(name, what)
        return m

    def array(self, tensor: pb.Tensor, what: str) -> np.ndarray:
        """A read-only array viewing the bytes a shared tensor references (no copy)."""
        try:
            dtype = codec.wire_dtype(tensor.dtype)
        except ValueError as e:
            raise InvalidArgument(f"{what}: {e}") from None
        shape = tuple(tensor.shape)
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"{what}: tensor shape {shape} has a negative dimension")
        ref = tensor.shared
        m = self._mapping(ref.region, what)
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        start = ref.offset
        if start % dtype.itemsize:
            raise InvalidArgument(f"{what}: offset {start} in shared memory region '{ref.region}' is not a multiple "
                                  f"of {dtype.itemsize} (the size of {dtype.name})")
        if start + nbytes > m.size:
            raise InvalidArgument(f"{what}: a tensor of shape {shape} and dtype {dtype.name} needs {nbytes} bytes at "
                                  f"offset {start}, past the end of shared memory region '{ref.region}' "
                                  f"({m.size} bytes)")
        try:
            array = np.frombuffer(memoryview(m.mm)[start:start + nbytes].toreadonly(), dtype=dtype, count=count)
            array = array.reshape(shape)
        except ValueError as e:  # a shape NumPy cannot hold (e.g. [0, 2**62, 4]: "array is too big")
            raise InvalidArgument(f"{what}: tensor shape {list(shape)}: {e}") from None
        self._extents.append((ref.region, start, start + nbytes, what))
        return array

    def writer(self, region: pb.SharedMemoryRegion, what: str = "output_region") -> Writer:
        """Where the response's tensors go; checked now (call it after the inputs are decoded)."""
        m = self._mapping(region.region, what)
        start, end = region.offset, region.offset + region.capacity
        if end > m.size:
            raise InvalidArgument(f"{what}: {region.capacity} bytes at offset {start} run past the end of shared "
                                  f"memory region '{region.region}' ({m.size} bytes)")
        for name, a, b, other in self._extents:
            if name == region.region and a < end and start < b and a < b:
                raise InvalidArgument(f"{what}: bytes {start}..{end} of shared memory region '{name}' overlap "
                                      f"{other} (bytes {a}..{b})")
        return Writer(m, start, end)


class Writer:
    """Places a response's tensors one after another in an output region, each 64-byte aligned."""

    def __init__(self, mapping: _Mapping, start: int, end: int):
        self._m = mapping
        self._next = start
        self._end = end
        self._allocated: dict[int, int] = {}  # data address of an array handed out -> its offset

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """A writable array in the region, for a result the engine computes in place (no copy at
        `place`), or None when it does not fit or the dtype does not travel as it is."""
        dtype = np.dtype(dtype)
        try:
            if codec.wire_dtype(codec.dtype_name(dtype)) != dtype:
                return None
        except TypeError:
            return None
        count = math.prod(shape)
        start = -(-self._next // ALIGNMENT) * ALIGNMENT
        if count == 0 or start + count * dtype.itemsize > self._end:
            return None
        array = np.frombuffer(self._m.mm, dtype=dtype, count=count, offset=start).reshape(shape)
        self._allocated[array.__array_interface__["data"][0]] = start
        self._next = start + count * dtype.itemsize
        return array

    def place(self, value) -> pb.Tensor | None:
        """Copy `value` into the region and return a Tensor referencing it, or None when it does not
        fit (or is empty): the caller sends it inline. Encodes like codec.to_tensor. An array the
        engine wrote in place (see `allocate`) is referenced where it is."""
        array = np.asarray(value)
        name = codec.value_dtype_name(array.dtype)
        wire = codec.wire_dtype(name)
        if array.flags.c_contiguous and array.dtype == wire and array.size:
            start = self._allocated.get(array.__array_interface__["data"][0])
            if start is not None:
                return pb.Tensor(dtype=codec.dtype_to_proto(name), shape=array.shape,
                                 shared=pb.SharedMemoryRef(region=self._m.name, offset=start))
        nbytes = array.size * wire.itemsize
        start = -(-self._next // ALIGNMENT) * ALIGNMENT
        if nbytes == 0 or start + nbytes > self._end:
            return None
        target = np.frombuffer(self._m.mm, dtype=wire, count=array.size, offset=start).reshape(array.shape)
        np.copyto(target, array, casting="unsafe")  # value_dtype_name picked a dtype holding every value
        del target
        self._next = start + nbytes
        return pb.Tensor(dtype=codec.dtype_to_proto(name), shape=array.shape,
                         shared=pb.SharedMemoryRef(region=self._m.name, offset=start))
