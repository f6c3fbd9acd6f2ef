"""Static shape inference (NumPy rules) used while building graphs.

Every function takes and returns shapes as tuples of ints, or None when unknown: an unknown
input gives an unknown result. Definite errors raise ValueError or IndexError, as NumPy would.
No function allocates memory proportional to the shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Shape = tuple[int, ...]


def _view(shape: Shape) -> np.ndarray:
    """A zero-strided array of ``shape``: a free stand-in for NumPy's own view-based rules."""
    return np.broadcast_to(np.empty((), dtype=np.int8), shape)


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of bounds for {ndim} dimensions")
    return axis % ndim


def broadcast(*shapes: Shape | None) -> Shape | None:
    """Broadcast shape of elementwise operands."""
    if any(s is None for s in shapes):
        return None
    return tuple(np.broadcast_shapes(*shapes))


def matmul(a: Shape | None, b: Shape | None) -> Shape | None:
    """Result shape of ``a @ b`` (1-D operands and batch broadcasting as in numpy.matmul)."""
    if a is None or b is None:
        return None
    if not a or not b:
        raise ValueError("matmul operands must have at least 1 dimension")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul contraction mismatch: {a} @ {b}")
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    return batch + (a2[-2],) * (len(a) > 1) + (b2[-1],) * (len(b) > 1)


def reduce(shape: Shape | None, axes: Sequence[int] | None, keepdims: bool) -> Shape | None:
    """Result shape of reducing ``axes`` (None = all axes)."""
    if shape is None:
        return None
    ndim = len(shape)
    reduced = set(range(ndim)) if axes is None else {_axis(a, ndim) for a in axes}
    if axes is not None and len(reduced) != len(axes):
        raise ValueError(f"repeated axis in {tuple(axes)}")
    if keepdims:
        return tuple(1 if i in reduced else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in reduced)


def reshape(shape: Shape | None, new: Sequence[int]) -> Shape | None:
    """Result shape of a reshape to ``new`` (one -1 allowed)."""
    new = tuple(new)
    if new.count(-1) > 1 or any(d < -1 for d in new):
        raise ValueError(f"invalid reshape target {new}")
    if shape is None:
        return None if -1 in new else new
    size = math.prod(shape)
    if -1 in new:
        known = math.prod(d for d in new if d != -1)
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape {shape} into {new}")
        new = tuple(size // known if d == -1 else d for d in new)
    if math.prod(new) != size:
        raise ValueError(f"cannot reshape {shape} into {new}")
    return new


def transpose(shape: Shape | None, perm: Sequence[int] | None) -> Shape | None:
    """Result shape of a transpose by ``perm`` (None = reversed axes)."""
    if shape is None:
        return None
    return _view(shape).transpose(perm).shape


def broadcast_to(shape: Shape | None, target: Sequence[int]) -> Shape | None:
    """Result shape of broadcasting ``shape`` to ``target``."""
    if shape is None:
        return tuple(target)
    return np.broadcast_to(_view(shape), tuple(target)).shape


def index(shape: Shape | None, key) -> Shape | None:
    """Result shape of the basic index ``key`` (ints and slices)."""
    if shape is None:
        return None
    return _view(shape)[key].shape


def concat(shapes: Sequence[Shape | None], axis: int) -> Shape | None:
    """Result shape of concatenating ``shapes`` along ``axis``."""
    if not shapes:
        raise ValueError("concat needs at least one operand")
    if any(s is None for s in shapes):
        return None
    first = shapes[0]
    if not first:
        raise ValueError("cannot concatenate 0-d operands")
    axis = _axis(axis, len(first))
    for s in shapes:
        if len(s) != len(first) or any(s[i] != first[i] for i in range(len(s)) if i != axis):
            raise ValueError(f"concat shapes {tuple(shapes)} differ outside axis {axis}")
    return first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1 :]


def stack(shapes: Sequence[Shape | None], axis: int) -> Shape | None:
    """Result shape of stacking ``shapes`` along a new ``axis``."""
    if not shapes:
        raise ValueError("stack needs at least one operand")
    if any(s is None for s in shapes):
        return None
    first = shapes[0]
    if any(s != first for s in shapes):
        raise ValueError(f"stack operands must have equal shapes, got {tuple(shapes)}")
    axis = _axis(axis, len(first) + 1)
    return first[:axis] + (len(shapes),) + first[axis:]


def along_axis(shape: Shape | None, axis: int) -> Shape | None:
    """Result shape of an op along one axis that keeps the shape (softmax, log_softmax)."""
    if shape is None:
        return None
    _axis(axis, len(shape))
    return shape


def normalized(shape: Shape | None, axes: Sequence[int]) -> Shape | None:
    """Result shape of a normalisation over ``axes`` (layer_norm): the shape itself."""
    if shape is None:
        return None
    if not axes:
        raise ValueError("needs at least one axis")
    reduce(shape, axes, False)  # checks the axes
    return shape


def _window_out(spatial: Shape, kernel: Shape, stride: Shape, padding: Shape, dilation: Shape) -> Shape:
    out = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                for s, k, st, p, d in zip(spatial, kernel, stride, padding, dilation))
    if any(o < 1 for o in out):
        raise ValueError(f"kernel {kernel} (dilation {dilation}) does not fit the input {spatial} padded by {padding}")
    return out


def conv(x: Shape | None, w: Shape | None, stride: Shape, padding: Shape, dilation: Shape,
         groups: int) -> Shape | None:
    """Result shape of a PyTorch-style convolution (x: N, C, *spatial; w: O, C/groups, *kernel)."""
    nd = len(stride)
    for what, s in (("x", x), ("w", w)):
        if s is not None and len(s) != nd + 2:
            raise ValueError(f"{what} must have {nd + 2} dimensions, got shape {s}")
    if x is None or w is None:
        return None
    if groups < 1 or x[1] % groups or w[0] % groups or w[1] * groups != x[1]:
        raise ValueError(f"channels do not fit {groups} group(s): x {x}, w {w}")
    return (x[0], w[0]) + _window_out(x[2:], w[2:], stride, padding, dilation)


def pool(x: Shape | None, kernel: Shape, stride: Shape, padding: Shape) -> Shape | None:
    """Result shape of PyTorch-style pooling (x: N, C, *spatial)."""
    nd = len(kernel)
    if x is None:
        return None
    if len(x) != nd + 2:
        raise ValueError(f"x must have {nd + 2} dimensions, got shape {x}")
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ValueError(f"padding {padding} must be at most half the kernel size {kernel}")
    return x[:2] + _window_out(x[2:], kernel, stride, padding, (1,) * nd)


def gather(shape: Shape | None, indices: Shape | None, axis: int) -> Shape | None:
    """Result shape of ``np.take(x, indices, axis)``."""
    if shape is None or indices is None:
        return None
    if not shape:
        raise ValueError("cannot gather from a 0-d operand")
    axis = _axis(axis, len(shape))
    return shape[:axis] + tuple(indices) + shape[axis + 1 :]


def scatter_add(updates: Shape | None, indices: Shape | None, size: int, axis: int) -> Shape | None:
    """Result shape of scattering ``updates`` into ``size`` slots along ``axis`` (the updates'
    axes ``axis .. axis + len(indices)`` are the indices' shape)."""
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    if updates is None or indices is None:
        return None
    q = len(indices)
    if len(updates) - q + 1 < 1:
        raise ValueError(f"updates {updates} have fewer axes than the indices {indices}")
    axis = _axis(axis, len(updates) - q + 1)
    if tuple(updates[axis : axis + q]) != tuple(indices):
        raise ValueError(f"updates {updates} do not hold the indices' shape {indices} at axis {axis}")
    return updates[:axis] + (size,) + updates[axis + q :]


def einsum(subscripts: str, shapes: Sequence[Shape | None]) -> Shape | None:
    """Result shape of ``numpy.einsum(subscripts, ...)`` over explicit letters (no ``...``)."""
    text = subscripts.replace(" ", "")
    if "..." in text:
        raise ValueError("subscripts with '...' are not supported: name every axis with a letter")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"{len(terms)} term(s) in {subscripts!r} for {len(shapes)} operand(s)")
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        if not term.isalpha() and term or len(set(term)) != len(term):
            raise ValueError(f"term {term!r}: distinct letters only")
        if shape is None:
            continue
        if len(term) != len(shape):
            raise ValueError(f"term {term!r} for an operand of shape {shape}")
        for letter, size in zip(term, shape):
            if sizes.setdefault(letter, size) != size:
                raise ValueError(f"letter {letter!r} has sizes {sizes[letter]} and {size}")
    out = rhs if arrow else "".join(sorted(c for c in set(lhs) - {","} if lhs.count(c) == 1))
    if any(s is None for s in shapes):
        return None
    if set(out) - set(sizes) or len(set(out)) != len(out):
        raise ValueError(f"output {out!r} must use distinct letters of the inputs")
    return tuple(sizes[c] for c in out)


def cumsum(shape: Shape | None, axis: int) -> Shape | None:
    """Result shape of a running sum along ``axis``: the operand's."""
    if shape is not None:
        _axis(axis, len(shape))
    return shape
