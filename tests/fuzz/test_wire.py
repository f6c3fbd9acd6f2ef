"""semigrad.wire against protobuf itself: a request serialized by wire.Outgoing parses to the
message the plain way builds (codec.to_tensor into the maps), and a response read by
wire.Reader gives the arrays protobuf's parse and codec.from_tensor give, for arrays of every
dtype, shape and layout a user passes, maps and messages around them, and bytes protobuf
accepts that wire.Reader does not rewrite (shared references, unknown fields, fields repeated)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from semigrad import codec, wire
from semigrad.v1 import semigrad_pb2 as pb

DTYPES = ["<f8", ">f8", "<f4", "f2", "<i8", ">i4", "i1", "u2", "?"]
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    array = draw(hnp.arrays(dtype, shape, elements={"allow_nan": False} if dtype.kind == "f" else None))
    if array.ndim and draw(st.booleans()):  # a transposed or strided view, as users pass them
        array = array.T if draw(st.booleans()) else array[::2]
    return array


tensor_maps = st.dictionaries(names, arrays(), max_size=3)


def plain(message, tensors):
    for field, values in tensors.items():
        for key, array in values.items():
            getattr(message, field)[key].CopyFrom(codec.to_tensor(array))
    return message


@settings(max_examples=150, deadline=None)
@given(inputs=tensor_maps, seeds=tensor_maps, graph_id=names, wrt=st.lists(names, max_size=2),
       chunk=st.integers(0, 2**64 - 1), nested=st.booleans())
def test_an_outgoing_request_parses_to_the_plainly_built_message(inputs, seeds, graph_id, wrt, chunk, nested):
    request = pb.GradientRequest(graph_id=graph_id, wrt=wrt)
    tensors = {"inputs": inputs, "seeds": seeds}
    if nested:
        outgoing = wire.Outgoing(pb.GradientStreamRequest(chunk=chunk, request=request), tensors, ("request",))
        expected = pb.GradientStreamRequest(chunk=chunk, request=plain(pb.GradientRequest(graph_id=graph_id, wrt=wrt),
                                                                        tensors))
    else:
        outgoing = wire.Outgoing(request, tensors)
        expected = plain(pb.GradientRequest(graph_id=graph_id, wrt=wrt), tensors)
    raw = outgoing.SerializeToString()
    assert type(expected).FromString(raw) == expected
    assert outgoing.ByteSize() == len(raw)


def shared_tensor(array):
    return pb.Tensor(dtype=codec.dtype_to_proto(codec.value_dtype_name(array.dtype)), shape=array.shape,
                     shared=pb.SharedMemoryRef(region="semigrad-00ff", offset=64, capability=b"c" * 32))


@settings(max_examples=150, deadline=None)
@given(gradients=tensor_maps, outputs=tensor_maps, shared=st.dictionaries(names, arrays(), max_size=2),
       nested=st.booleans(), code=st.integers(0, 16), text=names, extra=st.binary(max_size=12))
def test_a_read_response_gives_what_protobuf_gives(gradients, outputs, shared, nested, code, text, extra):
    response = plain(pb.GradientResponse(), {"gradients": gradients, "outputs": outputs})
    for key, array in shared.items():  # references to regions: kept as protobuf reads them
        response.retained[key].CopyFrom(shared_tensor(array))
    if nested:
        message = pb.GradientStreamResponse(chunk=3, response=response, code=code, message=text)
        raw, reader = message.SerializeToString(), wire.Reader(pb.GradientStreamResponse, ("response",))
    else:
        raw, reader = response.SerializeToString(), wire.Reader(pb.GradientResponse)
    # an unknown field (number 900, length-delimited) at the end: protobuf keeps it as unknown
    raw += b"\xa2\x38" + bytes([len(extra)]) + extra
    parsed = reader.message_type.FromString(raw)
    with mock.patch.object(wire, "THRESHOLD", 0):  # every message read as large ones are
        received = reader(raw)
    inner_expected = parsed.response if nested else parsed
    inner = received.message.response if nested else received.message
    if nested:
        assert (received.message.chunk, received.message.code, received.message.message) == (3, code, text)
    for field in ("gradients", "outputs"):
        got, want = getattr(inner, field), getattr(inner_expected, field)
        assert got.keys() == want.keys()
        for key in want:
            a, b = received.read(got[key]), codec.from_tensor(want[key])
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
            assert not a.flags.writeable
    assert inner.retained == inner_expected.retained
    assert received.ByteSize() == len(raw)


def test_a_map_value_given_twice_is_merged_as_protobuf_merges_it():
    """Two Tensor messages in one map entry are merged by protobuf (the dtype of one, the data of
    the other): the reader leaves such an entry to protobuf."""
    data = np.arange(3.0)
    first = pb.Tensor(dtype=pb.DTYPE_FLOAT64).SerializeToString()
    second = pb.Tensor(shape=[3], data=data.tobytes()).SerializeToString()
    entry = b"\x0a\x01x" + b"\x12" + bytes([len(first)]) + first + b"\x12" + bytes([len(second)]) + second
    raw = b"\x0a" + bytes([len(entry)]) + entry + b"\x0a\x00" * 40000  # past the threshold
    expected = pb.GradientResponse.FromString(raw)
    received = wire.Reader(pb.GradientResponse)(raw)
    assert received.message == expected
    assert np.array_equal(received.read(received.message.gradients["x"]), data)


@pytest.mark.parametrize("mangle", ["truncated", "length past the end", "group wire type", "tag in two bytes",
                                    "length in two bytes", "length in six bytes"])
def test_bytes_the_reader_does_not_understand_are_protobufs_to_refuse_or_read(mangle):
    """(Varints longer than they need be: the reader writes tags and lengths back in their
    shortest form, so it leaves them to protobuf, which reads some and refuses others.)"""
    response = plain(pb.GradientResponse(), {"gradients": {"x": np.arange(4.0)}})
    raw = response.SerializeToString()
    bad = {"truncated": raw[:-3], "length past the end": raw[:1] + b"\xff\x01" + raw[2:],
           "group wire type": b"\x0b" + raw, "tag in two bytes": bytes([raw[0] | 0x80, 0]) + raw[1:],
           "length in two bytes": raw[:1] + bytes([raw[1] | 0x80, 0]) + raw[2:],
           "length in six bytes": raw[:1] + bytes([raw[1] | 0x80]) + b"\x80" * 4 + b"\x00" + raw[2:]}[mangle]
    try:
        expected = pb.GradientResponse.FromString(bad)
    except Exception as error:  # noqa: BLE001 (protobuf's DecodeError)
        with mock.patch.object(wire, "THRESHOLD", 0), pytest.raises(type(error)):
            wire.Reader(pb.GradientResponse)(bad)
    else:
        with mock.patch.object(wire, "THRESHOLD", 0):
            assert wire.Reader(pb.GradientResponse)(bad).message == expected


def test_a_marker_the_reader_did_not_write_is_refused():
    """A response naming the marker region itself (a server cannot make the client read its
    received bytes at an offset of the server's choosing)."""
    response = pb.GradientResponse()
    response.gradients["x"].CopyFrom(pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=[1],
                                               shared=pb.SharedMemoryRef(region=wire.MARK, offset=2)))
    with mock.patch.object(wire, "THRESHOLD", 0):
        received = wire.Reader(pb.GradientResponse)(response.SerializeToString())
    with pytest.raises(ValueError, match="not a region"):
        received.read(received.message.gradients["x"])


@pytest.mark.parametrize("names", [3, 4])
def test_a_message_of_more_fields_than_the_reader_walks_is_protobufs(names):
    """wire.MAX_FIELDS crossed (patched to 10): graph_id, `names` wrt names, one map entry (its
    key and value) and its tensor (dtype, shape, data) are 7 + names fields."""
    request = plain(pb.GradientRequest(graph_id="g", wrt=["w"] * names), {"inputs": {"x": np.arange(4.0)}})
    raw = request.SerializeToString()
    with mock.patch.object(wire, "THRESHOLD", 0), mock.patch.object(wire, "MAX_FIELDS", 10):
        received = wire.Reader(pb.GradientRequest)(raw)
    assert len(received._inline) == (1 if names == 3 else 0)  # its tensor read as a view, or by protobuf
    assert np.array_equal(received.read(received.message.inputs["x"]), np.arange(4.0))
    if names == 4:
        assert received.message == request


@settings(max_examples=100, deadline=None)
@given(inputs=tensor_maps, seeds=tensor_maps, graph_id=names, wrt=st.lists(names, max_size=2), nested=st.booleans())
def test_a_request_the_server_reads_gives_what_protobuf_gives(inputs, seeds, graph_id, wrt, nested):
    """The server's side (service/status.py): a request decoded as large ones are, its tensors read
    as the servicer reads them (convert.tensors_to_arrays), against protobuf's parse of the bytes."""
    import contextvars

    from semigrad_server.service import convert, status

    request = plain(pb.GradientRequest(graph_id=graph_id, wrt=wrt), {"inputs": inputs, "seeds": seeds})
    message = pb.GradientStreamRequest(chunk=1, request=request) if nested else request
    raw = message.SerializeToString()
    expected = type(message).FromString(raw)

    def read():
        decoded = status.decoded(status.decoder(type(message))(raw))
        inner = decoded.request if nested else decoded
        assert (inner.graph_id, list(inner.wrt)) == (graph_id, wrt)
        return {field: convert.tensors_to_arrays(getattr(inner, field), field) for field in ("inputs", "seeds")}

    with mock.patch.object(wire, "THRESHOLD", 0):
        got = contextvars.copy_context().run(read)
    want = expected.request if nested else expected
    for field in ("inputs", "seeds"):
        assert got[field].keys() == getattr(want, field).keys()
        for key, array in got[field].items():
            reference = codec.from_tensor(getattr(want, field)[key])
            assert array.dtype == reference.dtype and array.shape == reference.shape
            assert array.tobytes() == reference.tobytes() and not array.flags.writeable
