import numpy as np
import pytest

from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb

DTYPES = ["float64", "float32", "int64", "bool"]
SHAPES = [(), (0,), (3,), (2, 3), (4, 1, 2), (0, 5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip(dtype, shape):
    array = (np.arange(int(np.prod(shape))).reshape(shape) % 3).astype(dtype)
    tensor = codec.to_tensor(array)
    assert tensor.dtype == codec.dtype_to_proto(dtype)
    assert tuple(tensor.shape) == shape
    back = codec.from_tensor(pb.Tensor.FromString(tensor.SerializeToString()))
    assert back.dtype.name == dtype and back.shape == shape
    np.testing.assert_array_equal(back, array)


def test_wire_bytes_are_little_endian_c_order():
    array = np.array([[1, 2], [3, 4]], dtype=">i8").T  # big-endian and not C-contiguous
    tensor = codec.to_tensor(array)
    assert tensor.data == np.array([[1, 3], [2, 4]], dtype="<i8").tobytes()
    np.testing.assert_array_equal(codec.from_tensor(tensor), array)


def test_decode_is_zero_copy_view():
    tensor = codec.to_tensor(np.ones((2, 2)))
    array = codec.from_tensor(tensor)
    assert not array.flags.writeable and not array.flags.owndata


def test_explicit_dtype_and_widening():
    assert codec.to_tensor([1, 2], "float32").dtype == pb.DTYPE_FLOAT32
    assert codec.to_tensor(np.array([1], np.int32)).dtype == pb.DTYPE_INT64
    assert codec.to_tensor(np.float16(1)).dtype == pb.DTYPE_FLOAT32
    assert codec.to_tensor(3.0).dtype == pb.DTYPE_FLOAT64
    with pytest.raises(TypeError):
        codec.to_tensor(np.array([1 + 2j]))
    with pytest.raises(TypeError):
        codec.dtype_name("int32")


def test_decode_checks_byte_length_and_dtype():
    with pytest.raises(ValueError, match="needs 48 bytes"):
        codec.from_tensor(pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=[2, 3], data=b"\0" * 40))
    with pytest.raises(ValueError):
        codec.from_tensor(pb.Tensor(shape=[1], data=b"\0" * 8))


def test_attr_values():
    assert codec.attr_value(True).WhichOneof("value") == "b"
    assert codec.attr_value(np.int64(3)).i == 3
    assert codec.attr_value(0.5).f == 0.5
    assert codec.attr_value("s").s == "s"
    assert list(codec.attr_value((1, -1)).ints.values) == [1, -1]
    assert codec.attr_value(()).WhichOneof("value") == "ints"
    assert codec.attr_value(np.eye(2)).tensor.shape == [2, 2]
    assert codec.attr_value(codec.index_list(0)).WhichOneof("value") == "index"
    with pytest.raises(TypeError):
        codec.attr_value(None)


def test_index_list():
    items = codec.index_list((1, slice(None, 3), slice(None, None, -1), np.int64(-2))).items
    assert [i.WhichOneof("item") for i in items] == ["index", "slice", "slice", "index"]
    assert items[1].slice.stop == 3 and not items[1].slice.HasField("start")
    assert items[2].slice.step == -1 and items[3].index == -2
    for bad in (..., None, [0, 1], True, slice(0.5, 2)):
        with pytest.raises(TypeError):
            codec.index_list(bad)
