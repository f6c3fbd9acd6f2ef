"""Tensors through POSIX shared memory, for a server on this host (see docs/performance.md).

A :class:`RegionPool` keeps a few regions: files in /dev/shm named ``semigrad-<32 hex digits>``,
created exclusively with mode 0600 and removed when the pool closes, when they are garbage
collected, or at exit. A call takes a region of its own (concurrent calls from several threads
take different ones), writes its tensors at the front (one memcpy each) and offers the rest to
the server for the response. The results are then either lent (unary calls: arrays viewing the
region, which goes back to the pool only once the last of them, and every view of them, has
been garbage-collected; no copy) or copied out (stream chunks, which are concatenated anyway),
so the caller owns what it gets and a region is never reused under an array.

Every region starts with a 64-byte header holding a random capability (``secrets``, 256 bits)
that only processes able to read the region can know; each reference the client sends carries
it, and the server compares it with the header before it reads or writes anything, so naming a
region is not enough to make the server use it (docs/conventions.md, "Shared memory").
"""

from __future__ import annotations


import ctypes
import functools
import ipaddress
import math
import mmap
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Mapping

import numpy as np

from . import codec
from .v1 import semigrad_pb2 as pb

SHM_DIR = "/dev/shm"
PREFIX = "semigrad-"
ALIGNMENT = 64  # bytes; the server places response tensors at multiples of this too
MIN_REGION_BYTES = 1 << 20
MAX_IDLE_REGIONS = 4  # regions a pool keeps between calls; more are removed when given back
HEADER_BYTES = ALIGNMENT  # a region's header: MAGIC, the capability, zeros; tensors come after it
MAGIC = b"semigrad-shm-v1\0"
CAPABILITY_BYTES = 32


def header(capability: bytes) -> bytes:
    """A region's header holding `capability`."""
    if len(capability) != CAPABILITY_BYTES:
        raise ValueError(f"a capability has {CAPABILITY_BYTES} bytes, not {len(capability)}")
    return MAGIC + capability + bytes(HEADER_BYTES - len(MAGIC) - CAPABILITY_BYTES)


def header_capability(data: bytes) -> bytes | None:
    """The capability in a region's header (its first bytes), or None when they are not a header."""
    end = len(MAGIC) + CAPABILITY_BYTES
    if len(data) < end or data[:len(MAGIC)] != MAGIC:
        return None
    return bytes(data[len(MAGIC):end])


def available() -> bool:
    """Whether this host has a writable /dev/shm."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK)


def is_local_target(target: str) -> bool:
    """Whether a gRPC target names this host: a unix socket, localhost or a loopback address."""
    t = target.strip()
    if t.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:", "ipv4:", "ipv6:"):
        if t.startswith(scheme):
            t = t[len(scheme):]
            if t.startswith("//"):  # dns://authority/host:port
                t = t[2:].partition("/")[2]
            break
    addresses = [a.strip() for a in t.split(",")] if t else []
    return bool(addresses) and all(_is_loopback(_host(a)) for a in addresses)


def _host(address: str) -> str:
    if address.startswith("["):
        return address[1:address.find("]")]
    return address.rsplit(":", 1)[0] if address.count(":") == 1 else address


def _is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") in ("localhost", "ip6-localhost", "ip6-loopback"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def aligned(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


def region_size(nbytes: int) -> int:
    """Bytes to allocate for `nbytes`: at least 1 MiB, rounded up by at most 1/8."""
    nbytes = max(nbytes, MIN_REGION_BYTES)
    step = 1 << max(nbytes.bit_length() - 4, 12)
    return -(-nbytes // step) * step


def _remove(path: str, mm: mmap.mmap, pid: int) -> None:
    if os.getpid() != pid:  # a forked child never removes its parent's regions
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    try:
        mm.close()
    except BufferError:  # arrays still view it: it unmaps when they go
        pass


class Region:
    """One shared-memory file, mapped, its header written. ``close()`` removes it (also on garbage
    collection and at exit). ``capability``: what references to it must carry."""

    def __init__(self, size: int, directory: str = SHM_DIR):
        if size < HEADER_BYTES:
            raise ValueError(f"a region has at least {HEADER_BYTES} bytes (its header), not {size}")
        self.name = PREFIX + secrets.token_hex(16)
        self.size = size
        self.capability = secrets.token_bytes(CAPABILITY_BYTES)
        path = os.path.join(directory, self.name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            # Reserve the pages now: writing into an mmap of a full tmpfs would be SIGBUS, not an error.
            os.posix_fallocate(fd, 0, size)
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._mm[:HEADER_BYTES] = header(self.capability)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        self._finalizer = weakref.finalize(self, _remove, path, self._mm, os.getpid())

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        self._finalizer()

    @property
    def mapping(self) -> mmap.mmap:
        return self._mm

    def array(self, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> np.ndarray:
        """A writable view of `shape` items of `dtype` at `offset` (bounds-checked; never the header)."""
        count = math.prod(shape)
        if offset < HEADER_BYTES or offset + count * dtype.itemsize > self.size:
            raise ValueError(f"{count * dtype.itemsize} bytes at offset {offset} do not fit in region "
                             f"{self.name} ({self.size} bytes)")
        return np.frombuffer(self._mm, dtype=dtype, count=count, offset=offset).reshape(shape)


class RegionPool:
    """Regions reused across calls; thread-safe. ``acquire`` gives a region with at least n bytes
    after its header that no other call is using (a new, larger one when the idle ones are too small)."""

    def __init__(self, directory: str = SHM_DIR, max_idle: int = MAX_IDLE_REGIONS):
        self.directory = directory
        self.max_idle = max_idle
        self._lock = threading.RLock()  # a lent region can come back from a finalizer in any thread
        self._idle: list[Region] = []
        self._busy: set[Region] = set()
        self._closed = False

    def acquire(self, nbytes: int) -> Region:
        with self._lock:
            if self._closed:
                raise ValueError("the shared-memory pool is closed")
            fitting = [r for r in self._idle if r.size - HEADER_BYTES >= nbytes]
            if fitting:
                region = min(fitting, key=lambda r: r.size)
                self._idle.remove(region)
                self._busy.add(region)
                return region
            # Too small for this call: drop the smallest idle region rather than let the pool grow.
            stale = min(self._idle, key=lambda r: r.size) if self._idle else None
            if stale is not None:
                self._idle.remove(stale)
        if stale is not None:
            stale.close()
        region = Region(region_size(nbytes + HEADER_BYTES), self.directory)
        with self._lock:
            if self._closed:
                region.close()
                raise ValueError("the shared-memory pool is closed")
            self._busy.add(region)
        return region

    def release(self, region: Region) -> None:
        drop = []
        with self._lock:
            self._busy.discard(region)
            if self._closed or region.closed:
                drop.append(region)
            else:
                self._idle.append(region)
                while len(self._idle) > self.max_idle:
                    smallest = min(self._idle, key=lambda r: r.size)
                    self._idle.remove(smallest)
                    drop.append(smallest)
        for r in drop:
            r.close()

    def names(self) -> list[str]:
        """Names of the pool's regions (idle and in use)."""
        with self._lock:
            return [r.name for r in (*self._idle, *self._busy)]

    def close(self) -> None:
        """Remove every region (those in use by a call in another thread too)."""
        with self._lock:
            self._closed = True
            regions = [*self._idle, *self._busy]
            self._idle.clear()
            self._busy.clear()
        for r in regions:
            r.close()


class Placement:
    """One call's region: the request's tensors written at the front, the rest offered to the server
    as the output region; results are read by :meth:`lend` or :meth:`view`, then :meth:`finish`."""

    def __init__(self, region: Region):
        self.region = region
        self._next = HEADER_BYTES
        self._output = None  # offset of the output region, once offered
        self._loan = None  # the buffer lent arrays view (a ctypes array over the output region)

    def tensor(self, array: np.ndarray) -> pb.Tensor:
        """Write an array (already in a wire dtype) into the region; return the Tensor referencing it."""
        name = codec.value_dtype_name(array.dtype)
        wire = codec.wire_dtype(name)
        offset = aligned(self._next)
        np.copyto(self.region.array(wire, array.shape, offset), array, casting="unsafe")
        self._next = offset + array.size * wire.itemsize
        return pb.Tensor(dtype=codec.dtype_to_proto(name), shape=array.shape,
                         shared=pb.SharedMemoryRef(region=self.region.name, offset=offset,
                                                   capability=self.region.capability))

    def output_region(self) -> pb.SharedMemoryRegion:
        self._output = offset = min(aligned(self._next), self.region.size)
        return pb.SharedMemoryRegion(region=self.region.name, offset=offset, capacity=self.region.size - offset,
                                     capability=self.region.capability)

    def _located(self, tensor: pb.Tensor) -> tuple[np.dtype, tuple[int, ...], int]:
        """dtype, shape and offset of a shared response tensor, checked to lie in the output region."""
        ref = tensor.shared
        if ref.region != self.region.name:
            raise ValueError(f"the server answered with shared memory region '{ref.region}', "
                             f"not this call's '{self.region.name}'")
        dtype, shape = codec.wire_dtype(tensor.dtype), tuple(tensor.shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"tensor shape {shape} has a negative dimension")
        if self._output is None or ref.offset < self._output or \
                ref.offset + math.prod(shape) * dtype.itemsize > self.region.size:
            raise ValueError(f"the server answered with a tensor outside the output region of '{self.region.name}'")
        return dtype, shape, ref.offset

    def view(self, tensor: pb.Tensor) -> np.ndarray:
        """Decode a response tensor; shared ones view the region (no copy) and must be copied out
        before :meth:`finish` gives the region back."""
        if tensor.WhichOneof("payload") != "shared":
            return codec.from_tensor(tensor)
        dtype, shape, offset = self._located(tensor)
        return self.region.array(dtype, shape, offset)

    def lend(self, tensor: pb.Tensor) -> np.ndarray:
        """Decode a response tensor; shared ones become writable arrays viewing the region (no copy),
        which :meth:`finish` keeps out of the pool for as long as any of them lives."""
        if tensor.WhichOneof("payload") != "shared":
            return codec.from_tensor(tensor)
        dtype, shape, offset = self._located(tensor)
        return self._lent(dtype, shape, offset)

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """A new writable array in the region (no tensors are written after it), lent like
        :meth:`lend`'s; None when it does not fit."""
        dtype = np.dtype(dtype)
        if self._output is None:
            self.output_region()
        offset = aligned(max(self._next, self._output))
        end = offset + math.prod(shape) * dtype.itemsize
        if end > self.region.size:
            return None
        self._next = end
        return self._lent(dtype, shape, offset)

    def _lent(self, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> np.ndarray:
        if self._loan is None:
            # A ctypes array: the one buffer every lent array's (collapsed) .base points to, and weakly
            # referenceable, unlike NumPy's memoryviews of an mmap.
            self._loan = (ctypes.c_char * (self.region.size - self._output)).from_buffer(
                self.region.mapping, self._output)
        return np.ndarray(shape, dtype=dtype, buffer=self._loan, offset=offset - self._output)

    def finish(self, release: Callable[[Region], None]) -> None:
        """Give the region back through `release`: now, or when the last lent array is collected."""
        loan, self._loan = self._loan, None
        if loan is None:
            release(self.region)
        else:
            weakref.finalize(loan, release, self.region)


def tensor_bytes(arrays: Mapping[str, np.ndarray]) -> int:
    """Bytes the arrays take in a region (in their wire dtypes), alignment included."""
    return sum(aligned(a.size * _wire_itemsize(a.dtype)) for a in arrays.values())


@functools.lru_cache(maxsize=64)
def _wire_itemsize(dtype: np.dtype) -> int:
    try:
        return codec.wire_dtype(codec.value_dtype_name(dtype)).itemsize
    except TypeError:  # not encodable: the encoder says so
        return dtype.itemsize
