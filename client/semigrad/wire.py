"""Tensors through protobuf without extra copies.

Built the usual way, a request's megabyte array is copied four times before gRPC sees it
(``tobytes``, into the Tensor message, into the request's map by ``CopyFrom``, and by
``SerializeToString``), and a response's twice (parsed into the message, then read out of it as
a new ``bytes``). Each copy is a fresh allocation the kernel faults in page by page: a 1.28 MB
request took 2.7 ms to serialize on this project's VM, 0.08 ms written as here.

- :class:`Outgoing` serializes a message plus arrays that belong in its ``map<string, Tensor>``
  fields: the message without them through protobuf, then each map entry written by hand, the
  array's bytes copied once, straight into the serialized request.
- :class:`Reader` deserializes a response whose ``map<string, Tensor>`` fields hold inline
  tensors: each such tensor's bytes stay where gRPC received them, and the message is parsed
  with a small marker in their place (a ``shared`` reference to a region named :data:`MARK` and
  a random suffix drawn for this message, which no real region can be named: real names are
  ``semigrad-`` and hex digits, and no sender can forge a marker it reads); the
  :class:`Received` it returns reads marked tensors as read-only views of the received bytes
  and any other tensor as :func:`codec.from_tensor` does. A message this reader does not expect
  (a field of an unexpected wire type, a truncated one) is parsed by protobuf as it is, so the
  errors are protobuf's. So is a message of more than :data:`MAX_FIELDS` fields, or one whose
  varints are not in their shortest encoding.

Both follow the protobuf encoding (https://protobuf.dev/programming-guides/encoding/): a map
field is a repeated message of ``key = 1`` and ``value = 2``; fields may come in any order, and
a map entry may be written after the message's other fields."""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping

import numpy as np

from . import codec
from .v1 import semigrad_pb2 as pb

# Below this many bytes of tensors, a message goes through protobuf as it is: for small messages
# its C parser and serializer beat this module's Python (a det4 single point spent ~19% of its
# client time here), and small copies cost little.
THRESHOLD = 64 * 1024
MARK = "\x00inline"  # the region of the markers Reader puts in place of inline tensors' bytes
LEN = 2  # wire types
VARINT, I64, I32 = 0, 1, 5


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _field(message_type, name: str):
    return message_type.DESCRIPTOR.fields_by_name[name]


def _is_tensor_map(field) -> bool:
    entry = field.message_type
    return (entry is not None and entry.GetOptions().map_entry
            and entry.fields_by_name["value"].message_type is pb.Tensor.DESCRIPTOR)


# ---------------------------------------------------------------------------------------- out
class Outgoing:
    """`message` with `tensors` ({map field: {key: array}}) in the message at `path` (the names
    of the message fields that lead to it; () for `message` itself). The maps named must be
    ``map<string, Tensor>`` fields without those keys already in them. The arrays are converted
    to their wire dtypes here (errors are the caller's, not gRPC's), their bytes copied only by
    SerializeToString; they must not change in between."""

    __slots__ = ("_pieces",)

    def __init__(self, message, tensors: Mapping[str, Mapping[str, np.ndarray]], path: tuple[str, ...] = ()):
        self._pieces = _pieces(message, tensors, path)

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's names, as for a message)
        return b"".join(self._pieces)

    def inside(self, message, name: str) -> Outgoing:
        """`message` with this as its message field `name` (not set in `message`)."""
        field = _field(type(message), name)
        outer = Outgoing.__new__(Outgoing)
        outer._pieces = [message.SerializeToString(), _tag(field.number, LEN), _varint(self.ByteSize()), *self._pieces]
        return outer

    def ByteSize(self) -> int:  # noqa: N802
        return sum(len(p) for p in self._pieces)


def _pieces(message, tensors, path) -> list:
    if path:
        field = _field(type(message), path[0])
        rest = type(message)()
        rest.CopyFrom(message)
        rest.ClearField(path[0])
        inner = _pieces(getattr(message, path[0]), tensors, path[1:])
        return [rest.SerializeToString(), _tag(field.number, LEN), _varint(sum(len(p) for p in inner)), *inner]
    pieces = [message.SerializeToString()]
    for name, arrays in tensors.items():
        field = _field(type(message), name)
        if not _is_tensor_map(field):
            raise TypeError(f"{type(message).__name__}.{name} is not a map<string, Tensor>")
        for key, array in arrays.items():
            pieces += _entry(field.number, key, array)
    return pieces


def _entry(number: int, key: str, array: np.ndarray) -> list:
    """One map entry `key` -> the array as a Tensor, its bytes a view of the array's."""
    enum, array = codec.wire_array(array)
    data = memoryview(array).cast("B") if array.nbytes else b""
    head = pb.Tensor(dtype=enum, shape=array.shape).SerializeToString() + _tag(3, LEN) + _varint(array.nbytes)
    name = key.encode()
    value_size = len(head) + array.nbytes
    entry_head = _tag(1, LEN) + _varint(len(name)) + name + _tag(2, LEN) + _varint(value_size)
    return [_tag(number, LEN), _varint(len(entry_head) + value_size), entry_head, head, data]


def serialize(message) -> bytes:
    """gRPC's request serializer for messages and :class:`Outgoing` alike."""
    return message.SerializeToString()


# ----------------------------------------------------------------------------------------- in
class Unexpected(Exception):
    """The bytes are not what Reader rewrites: protobuf parses them as they are."""


def _read_varint(raw, at: int, end: int) -> tuple[int, int]:
    """A varint in its shortest encoding (the only one this module writes back: any other is left
    to protobuf, which accepts some and refuses others)."""
    value = shift = 0
    while True:
        if at >= end or shift > 63:
            raise Unexpected
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and shift:
                raise Unexpected
            return value, at
        shift += 7


# Fields Reader walks in one message (its own, its map entries' and their tensors') before it
# leaves the message to protobuf: walking them is Python, ~2 µs a field here, and a request of
# 3 M names (9 MB) held a server's thread and the GIL for 5.8 s, where protobuf parses it in 0.2 s.
# A message over this has fields besides its tensors that protobuf's C reads faster anyway.
MAX_FIELDS = 4096


def _fields(raw, at: int, end: int, budget: list[int]):
    """(number, wire type, start of the field, start of its value, end of the field) of each
    field in raw[at:end]; for LEN fields the value is what follows the length. `budget`: [fields
    still to walk] (Unexpected past it)."""
    while at < end:
        budget[0] -= 1
        if budget[0] < 0:
            raise Unexpected
        start = at
        key, at = _read_varint(raw, at, end)
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            _, at = _read_varint(raw, at, end)
            yield number, wire_type, start, start, at
            continue
        if wire_type == LEN:
            size, value = _read_varint(raw, at, end)
            at = value + size
        elif wire_type == I64:
            value, at = at, at + 8
        elif wire_type == I32:
            value, at = at, at + 4
        else:  # groups: not in proto3
            raise Unexpected
        if at > end:
            raise Unexpected
        yield number, wire_type, start, value, at


class Received:
    """A parsed response and how to read its tensors (`read`: a Tensor -> a read-only array)."""

    __slots__ = ("message", "_raw", "_inline", "_mark")

    def __init__(self, message, raw, inline: dict[int, int], mark: str = MARK):
        self.message, self._raw, self._inline, self._mark = message, raw, inline, mark

    def ByteSize(self) -> int:  # noqa: N802 (as a message's: the bytes received)
        return len(self._raw)

    def read(self, tensor: pb.Tensor) -> np.ndarray:
        array = codec.inline_array(tensor)  # (most tensors: inline and well formed)
        if array is not None:
            return array
        if tensor.WhichOneof("payload") != "shared" or not tensor.shared.region.startswith(MARK):
            return codec.from_tensor(tensor)
        offset = tensor.shared.offset
        size = self._inline.get(offset) if tensor.shared.region == self._mark else None
        if size is None:  # a marker this reader did not write
            raise ValueError(f"tensor refers to region {tensor.shared.region!r}, which is not a region")
        wire = codec.wire_dtype(tensor.dtype)
        shape = codec.message_shape(tensor)
        if any(d < 0 for d in shape):
            raise ValueError(f"tensor shape {shape} has a negative dimension")
        expected = math.prod(shape) * wire.itemsize
        if size != expected:
            raise ValueError(f"tensor of shape {shape} and dtype {wire.name} needs {expected} bytes, got {size}")
        return np.frombuffer(self._raw, dtype=wire, count=math.prod(shape), offset=offset).reshape(shape)


class Reader:
    """gRPC's response deserializer for `message_type`, the ``map<string, Tensor>`` fields of the
    message at `path` read without copying (see the module's docstring)."""

    def __init__(self, message_type, path: tuple[str, ...] = ()):
        self.message_type, self.path = message_type, path
        self._levels = []  # (field number leading deeper, or the set of tensor-map field numbers)
        t = message_type
        for name in path:
            field = _field(t, name)
            self._levels.append(field.number)
            t = getattr(pb, field.message_type.name)
        self._maps = frozenset(f.number for f in t.DESCRIPTOR.fields if _is_tensor_map(f))

    def __call__(self, raw: bytes) -> Received:
        inline: dict[int, int] = {}
        if len(raw) < THRESHOLD:
            return Received(self.message_type.FromString(raw), raw, inline)
        mark = MARK + secrets.token_hex(8)
        try:
            pieces = self._rewrite(raw, 0, len(raw), 0, inline, mark, [MAX_FIELDS])
        except Unexpected:
            return Received(self.message_type.FromString(raw), raw, {})
        return Received(self.message_type.FromString(b"".join(pieces)), raw, inline, mark)

    def _rewrite(self, raw, at: int, end: int, depth: int, inline: dict, mark: str, budget: list[int]) -> list:
        view = memoryview(raw)
        pieces, kept = [], at  # raw[kept:start] is copied as it is
        for number, wire_type, start, value, stop in _fields(raw, at, end, budget):
            if wire_type != LEN:
                continue
            if depth < len(self._levels):
                if number != self._levels[depth]:
                    continue
                inner = self._rewrite(raw, value, stop, depth + 1, inline, mark, budget)
                pieces += [view[kept:start], _tag(number, LEN), _varint(sum(len(p) for p in inner)), *inner]
            elif number in self._maps:
                entry = self._entry(raw, value, stop, inline, mark, budget)
                if entry is None:
                    continue
                pieces += [view[kept:start], _tag(number, LEN), _varint(len(entry)), entry]
            else:
                continue
            kept = stop
        pieces.append(view[kept:end])
        return pieces

    @staticmethod
    def _entry(raw, at: int, end: int, inline: dict, mark: str, budget: list[int]) -> bytes | None:
        """The map entry in raw[at:end] with its tensor's bytes replaced by a marker, or None to
        keep it as it is (a shared tensor, a field this reader does not know)."""
        key = tensor = None
        for number, wire_type, start, value, stop in _fields(raw, at, end, budget):
            if number == 1 and wire_type == LEN:
                key = (start, stop)
            elif number == 2 and wire_type == LEN and tensor is None:
                tensor = (value, stop)
            else:  # (a value given twice is two messages protobuf merges: left to protobuf)
                return None
        if tensor is None:
            return None
        head, data = [], None
        for number, wire_type, start, value, stop in _fields(raw, *tensor, budget):
            if number == 3 and wire_type == LEN:
                data = (value, stop)
            elif number in (1, 2):
                head.append(bytes(raw[start:stop]))
            else:
                return None
        if data is None:
            return None
        inline[data[0]] = data[1] - data[0]
        marker = pb.SharedMemoryRef(region=mark, offset=data[0]).SerializeToString()
        value = b"".join(head) + _tag(4, LEN) + _varint(len(marker)) + marker
        return (bytes(raw[key[0]:key[1]]) if key else b"") + _tag(2, LEN) + _varint(len(value)) + value
