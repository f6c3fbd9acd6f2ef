import pytest

from semigrad import shapes


def test_matmul():
    assert shapes.matmul((2, 3), (3, 4)) == (2, 4)
    assert shapes.matmul((3,), (3,)) == ()
    assert shapes.matmul((3,), (5, 3, 4)) == (5, 4)
    assert shapes.matmul((5, 2, 3), (3,)) == (5, 2)
    assert shapes.matmul((7, 1, 2, 3), (5, 3, 4)) == (7, 5, 2, 4)
    with pytest.raises(ValueError):
        shapes.matmul((2, 3), (2, 3))


def test_reduce_reshape_concat_stack():
    assert shapes.reduce((2, 3, 4), (0, -1), False) == (3,)
    assert shapes.reduce((2, 3, 4), None, True) == (1, 1, 1)
    assert shapes.reshape((2, 3, 4), (-1, 4)) == (6, 4)
    assert shapes.reshape(None, (2, 3)) == (2, 3)
    assert shapes.concat([(2, 3), (2, 5)], -1) == (2, 8)
    assert shapes.stack([(2, 3), (2, 3)], -1) == (2, 3, 2)
    for bad in (lambda: shapes.reduce((2,), (0, 0), False), lambda: shapes.reshape((2, 3), (4, -1)),
                lambda: shapes.concat([(2, 3), (3, 3)], 1), lambda: shapes.stack([(2,), (3,)], 0)):
        with pytest.raises(ValueError):
            bad()


def test_views_and_unknowns():
    assert shapes.index((4, 5, 6), (1, slice(None, None, -2))) == (3, 6)
    assert shapes.transpose((2, 3, 4), None) == (4, 3, 2)
    assert shapes.broadcast_to((3,), (2, 3)) == (2, 3)
    assert shapes.broadcast((2, 1), None) is None
    with pytest.raises(IndexError):
        shapes.index((3,), 3)
