"""Shape and data-movement ops: reshape, broadcast, transpose, slice, concat, pad, the
gather/scatter family, iota, cumsum, topk and one_hot.

Attributes are in canonical form (no -1 in shapes, one slice entry per dim, explicit
pads): frontends normalize, so inference here stays exact. Index operands follow ONNX:
negative indices count from the end, and an index outside [-dim, dim) raises IndexError
in the reference, which the interpreter reports as an InterpreterError.
"""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import NUMERIC_TYPES, DType
from ember.errors import ShapeError
from ember.graph.ir import TensorType
from ember.graph.ops.common import (
    axis_of,
    broadcastable_to,
    normalize_axis,
    require_dtype,
    require_len,
    same_dtype,
)
from ember.graph.ops.registry import Attr, define
from ember.graph.symbolic import Dim, dim_max, floor_div

INDEX_TYPES = frozenset({DType.i32, DType.i64})


def _dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    if any(d < 0 for d in shape):
        raise ShapeError(f"shape {list(shape)} has a negative dim (-1 is not allowed here)")
    return shape


def _along(n: int, axis: int, rank: int) -> np.ndarray:
    """arange(n) laid along `axis` of a rank-`rank` array, size 1 elsewhere (to broadcast)."""
    return np.arange(n).reshape([n if i == axis else 1 for i in range(rank)])


def _in_range(indices: np.ndarray, dim: int) -> np.ndarray:
    """`indices` into an axis of size `dim` with negative ones wrapped; IndexError if outside."""
    indices = indices.astype(np.int64)
    bad = (indices < -dim) | (indices >= dim)
    if bad.any():
        raise IndexError(f"index {indices[bad][0]} is out of range for an axis of size {dim}")
    return np.where(indices < 0, indices + dim, indices)


# -- reshape, broadcast, transpose --------------------------------------------------------

def _reshape_infer(types, attrs):
    (x,) = types
    shape = _dims(attrs["shape"])
    if math.prod(shape) != x.numel:
        raise ShapeError(f"cannot reshape {x} ({x.numel} elements) to {list(shape)}"
                         f" ({math.prod(shape)} elements)")
    return x.with_shape(shape)


define("reshape", arity=1, attrs={"shape": Attr("ints")}, infer=_reshape_infer,
       reference=lambda x, shape: x.reshape(shape), traits=("pure",),
       summary="the same elements in row-major order under a new shape", family="shape",
       category="index map")


def _broadcast_infer(types, attrs):
    (x,) = types
    shape = _dims(attrs["shape"])
    if not broadcastable_to(x.shape, shape):
        raise ShapeError(f"cannot broadcast {x} to {list(shape)}")
    return x.with_shape(shape)


define("broadcast", arity=1, attrs={"shape": Attr("ints")}, infer=_broadcast_infer,
       # A copy: broadcast_to returns a read-only view with zero strides.
       reference=lambda x, shape: np.broadcast_to(x, shape).copy(), traits=("pure",),
       summary="NumPy broadcasting of x to exactly `shape`", family="shape",
       # Fused like an elementwise op: its operand is read at the broadcast index.
       category="elementwise")


def _transpose_infer(types, attrs):
    (x,) = types
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"perm {list(perm)} is not a permutation of the {x.rank} axes of {x}")
    return x.with_shape([x.shape[p] for p in perm])


define("transpose", arity=1, attrs={"perm": Attr("ints")}, infer=_transpose_infer,
       reference=lambda x, perm: np.transpose(x, perm), traits=("pure",),
       summary="permute the axes: result axis i is axis perm[i] of x", family="shape",
       category="index map")


# -- slice, concat, pad -------------------------------------------------------------------

def _slice_infer(types, attrs):
    (x,) = types
    starts, ends, steps = attrs["starts"], attrs["ends"], attrs["steps"]
    for key in ("starts", "ends", "steps"):
        require_len(attrs[key], x.rank, key)
    shape = []
    for axis, (start, end, step, dim) in enumerate(zip(starts, ends, steps, x.shape)):
        if step == 0:
            raise ShapeError(f"the step of axis {axis} is 0")
        if any(isinstance(v, Dim) for v in (start, end, step, dim)):
            shape.append(_symbolic_extent(axis, start, end, step, dim))
            continue
        read = range(start, end, step)
        if read and not (0 <= min(read[0], read[-1]) and max(read[0], read[-1]) < dim):
            raise ShapeError(f"axis {axis} of size {dim} is read at indices {read[0]} to"
                             f" {read[-1]} (start {start}, end {end}, step {step})")
        shape.append(len(read))
    return x.with_shape(shape)


def _symbolic_extent(axis: int, start, end, step, dim):
    """The length of range(start, end, step) over an axis of `dim`, where some of them are
    symbolic sizes: the bounds must be decidable (start and end within the axis)."""
    if isinstance(step, Dim):
        raise ShapeError(f"the step of axis {axis} is the size {step}; steps are numbers")
    if step > 0 and not (start >= 0 and end <= dim):
        raise ShapeError(f"axis {axis} of size {dim} is read from {start} to {end}")
    if step < 0 and not (start < dim and end >= -1):
        raise ShapeError(f"axis {axis} of size {dim} is read from {start} down to {end}")
    length = floor_div(end - start + step - 1, step) if step > 0 else \
        floor_div(start - end - step - 1, -step)
    return dim_max(length, 0)


def _as_slice(start: int, end: int, step: int) -> slice:
    """The Python slice reading the indices of range(start, end, step), all in bounds."""
    read = range(start, end, step)
    if not read:
        return slice(0, 0)
    stop = read[-1] + (1 if step > 0 else -1)
    return slice(read[0], stop if stop >= 0 else None, step)  # stop -1 would mean "the end"


define("slice", arity=1,
       attrs={"starts": Attr("ints"), "ends": Attr("ints"), "steps": Attr("ints")},
       infer=_slice_infer,
       reference=lambda x, starts, ends, steps: x[tuple(map(_as_slice, starts, ends, steps))],
       traits=("pure",), family="shape", category="index map",
       summary="x[start:end:step] per axis with Python range semantics, in bounds")


def _concat_infer(types, attrs):
    dtype = same_dtype(types)
    first = types[0]
    axis = axis_of(first, attrs["axis"])
    for t in types[1:]:
        if t.rank != first.rank or any(a != b for i, (a, b) in
                                       enumerate(zip(t.shape, first.shape)) if i != axis):
            raise ShapeError(f"cannot concatenate {', '.join(map(str, types))} along axis"
                             f" {axis}: the other dims differ")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return TensorType(dtype, shape)


define("concat", arity=(1, None), attrs={"axis": Attr("int")}, infer=_concat_infer,
       reference=lambda *xs, axis: np.concatenate(xs, axis=axis), traits=("pure",),
       summary="join the operands along `axis`", family="shape")


def _pad_infer(types, attrs):
    (x,) = types
    pads, mode = attrs["pads"], attrs["mode"]
    require_len(pads, 2 * x.rank, "pads")
    if any(p < 0 for p in pads):
        raise ShapeError(f"pads {list(pads)} must be non-negative")
    begins, ends = pads[:x.rank], pads[x.rank:]
    for axis, (dim, lo, hi) in enumerate(zip(x.shape, begins, ends)):
        widest = max(lo, hi)
        if widest and mode == "reflect" and widest >= dim:
            raise ShapeError(f"reflect padding of axis {axis} must be less than its size"
                             f" {dim}, got {widest}")
        if widest and mode in ("edge", "wrap") and dim == 0:
            raise ShapeError(f"{mode} padding of axis {axis} needs elements, but it has size 0")
    return x.with_shape([d + lo + hi for d, lo, hi in zip(x.shape, begins, ends)])


def _pad_reference(x, pads, mode, value):
    width = list(zip(pads[:x.ndim], pads[x.ndim:]))
    if mode == "constant":
        return np.pad(x, width, constant_values=np.array(value).astype(x.dtype))
    return np.pad(x, width, mode=mode)  # NumPy's reflect/edge/wrap are ONNX's


define("pad", arity=1, infer=_pad_infer, reference=_pad_reference,
       attrs={"pads": Attr("ints"),
              "mode": Attr("str", "constant", ("constant", "reflect", "edge", "wrap")),
              "value": Attr("float", 0.0)},
       traits=("pure",), family="shape",
       summary="pad each axis by pads[i] before and pads[rank + i] after (ONNX Pad)")


# -- gather and scatter -------------------------------------------------------------------

def _gather_infer(types, attrs):
    data, indices = types
    require_dtype(indices, INDEX_TYPES, "indices")
    axis = axis_of(data, attrs["axis"], "data")
    return data.with_shape(data.shape[:axis] + indices.shape + data.shape[axis + 1:])


define("gather", arity=2, attrs={"axis": Attr("int", 0)}, infer=_gather_infer,
       reference=lambda data, indices, axis: np.take(
           data, _in_range(indices, data.shape[axis]), axis=axis),
       traits=("pure",), family="shape",
       summary="pick whole slices of data along `axis` by index (ONNX Gather)")


def _elements_axis(data: TensorType, indices: TensorType, axis: int) -> int:
    """The checked axis of gather_elements/scatter_elements, whose indices pair
    element-wise with data: same rank, and no larger than data off the axis."""
    require_dtype(indices, INDEX_TYPES, "indices")
    axis = axis_of(data, axis, "data")
    if indices.rank != data.rank or any(
            i > d for k, (i, d) in enumerate(zip(indices.shape, data.shape)) if k != axis):
        raise ShapeError(f"indices {indices} must have the rank of data {data} and no larger"
                         f" dims off axis {axis}")
    return axis


def _element_index(indices: np.ndarray, shape: tuple[int, ...], axis: int) -> tuple:
    """The NumPy index pairing each entry of `indices` with its own position off `axis`."""
    index = list(np.indices(indices.shape, sparse=True))
    index[axis] = _in_range(indices, shape[axis])
    return tuple(index)


def _gather_elements_infer(types, attrs):
    data, indices = types
    _elements_axis(data, indices, attrs["axis"])
    return data.with_shape(indices.shape)


define("gather_elements", arity=2, attrs={"axis": Attr("int", 0)},
       infer=_gather_elements_infer,
       reference=lambda data, indices, axis: data[
           _element_index(indices, data.shape, axis % data.ndim)],
       traits=("pure",), family="shape",
       summary="out[i][j] = data[indices[i][j]][j] for axis 0 (ONNX GatherElements)")


def _scatter_elements_infer(types, attrs):
    data, indices, updates = types
    _elements_axis(data, indices, attrs["axis"])
    if updates.shape != indices.shape:
        raise ShapeError(f"updates {updates} must have the shape of indices {indices}")
    same_dtype([data, updates], "data and updates")
    return data


_SCATTER_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_elements_reference(data, indices, updates, axis, reduction):
    out = data.copy()
    index = _element_index(indices, data.shape, axis % data.ndim)
    if reduction == "none":
        out[index] = updates  # on repeated indices the last update wins; ONNX leaves it open
    else:
        _SCATTER_UFUNCS[reduction].at(out, index, updates)  # .at applies every repeat
    return out


define("scatter_elements", arity=3, infer=_scatter_elements_infer,
       reference=_scatter_elements_reference,
       attrs={"axis": Attr("int", 0),
              "reduction": Attr("str", "none", ("none", "add", "mul", "max", "min"))},
       traits=("pure",), family="shape",
       summary="a copy of data with updates written (or combined) at indices along `axis`"
               " (ONNX ScatterElements)")


# -- iota, cumsum, topk, one_hot ----------------------------------------------------------

def _iota_infer(types, attrs):
    if attrs["dtype"] not in NUMERIC_TYPES:
        raise ShapeError(f"dtype must be numeric, got {attrs['dtype']}")
    t = TensorType(attrs["dtype"], _dims(attrs["shape"]))
    axis_of(t, attrs["axis"], "the result")
    return t


def _iota_reference(shape, axis, dtype):
    axis %= len(shape)
    return np.broadcast_to(_along(shape[axis], axis, len(shape)), shape).astype(dtype.np)


define("iota", arity=0, infer=_iota_infer, reference=_iota_reference,
       attrs={"shape": Attr("ints"), "axis": Attr("int", 0), "dtype": Attr("dtype", DType.i64)},
       traits=("pure",), family="shape", category="index map",
       summary="a tensor whose elements are their index along `axis`")


define("size", arity=0, infer=lambda types, attrs: TensorType(DType.i64, ()),
       reference=lambda value: np.array(value, np.int64), attrs={"value": Attr("int")},
       traits=("pure",), family="shape", category="index map",
       summary="a size (a symbolic dim, `?b`, or a number once bound) as an i64 scalar")


def _cumsum_infer(types, attrs):
    (x,) = types
    require_dtype(x, NUMERIC_TYPES)
    axis_of(x, attrs["axis"])
    return x


def _cumsum_reference(x, axis, exclusive, reverse):
    axis %= x.ndim
    if reverse:
        x = np.flip(x, axis)
    if exclusive:  # shift x one step along the axis, so each sum stops before its element
        width = [(1, 0) if i == axis else (0, 0) for i in range(x.ndim)]
        x = np.take(np.pad(x, width), np.arange(x.shape[axis]), axis=axis)
    out = np.cumsum(x, axis=axis, dtype=x.dtype)  # dtype= so small integers wrap, not widen
    return np.flip(out, axis) if reverse else out


define("cumsum", arity=1, infer=_cumsum_infer, reference=_cumsum_reference,
       attrs={"axis": Attr("int"), "exclusive": Attr("bool", False),
              "reverse": Attr("bool", False)},
       traits=("pure",), family="shape",
       summary="running sum along `axis` (ONNX CumSum: exclusive and reverse variants)")


def _topk_infer(types, attrs):
    (x,) = types
    require_dtype(x, NUMERIC_TYPES)
    axis = axis_of(x, attrs["axis"])
    k = attrs["k"]
    if not 0 <= k <= x.shape[axis]:
        raise ShapeError(f"k = {k} is outside [0, {x.shape[axis]}], the size of axis {axis}")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [x.with_shape(shape), TensorType(DType.i64, shape)]


def _topk_reference(x, k, axis, largest, sorted):
    # Always sorted: ONNX allows it for sorted=False, and it makes the result unique.
    axis %= x.ndim
    if largest:
        # Sort the reversed axis stably and read it backwards: descending order that keeps
        # the lower index first among equal values (NaN counts as largest, as in torch).
        n = x.shape[axis]
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, indices, axis), indices


define("topk", arity=1, infer=_topk_infer, reference=_topk_reference,
       attrs={"k": Attr("int"), "axis": Attr("int", -1), "largest": Attr("bool", True),
              "sorted": Attr("bool", True)},
       traits=("pure",), family="shape",
       summary="the k largest (or smallest) values along `axis` and their i64 indices")


def _one_hot_infer(types, attrs):
    indices, values = types
    require_dtype(indices, INDEX_TYPES, "indices")
    if values.shape != (2,):
        raise ShapeError(f"values must hold [off, on] with shape [2], got {values}")
    depth = attrs["depth"]
    if depth < 1:
        raise ShapeError(f"depth must be positive, got {depth}")
    axis = normalize_axis(attrs["axis"], indices.rank + 1)
    return TensorType(values.dtype, indices.shape[:axis] + (depth,) + indices.shape[axis:])


def _one_hot_reference(indices, values, depth, axis):
    rank = indices.ndim + 1
    axis %= rank
    hot = np.expand_dims(indices.astype(np.int64), axis)
    hot = np.where(hot < 0, hot + depth, hot)  # what stays outside [0, depth) matches nothing
    return np.where(hot == _along(depth, axis, rank), values[1], values[0])


define("one_hot", arity=2, infer=_one_hot_infer, reference=_one_hot_reference,
       attrs={"depth": Attr("int"), "axis": Attr("int", -1)},
       traits=("pure",), family="shape",
       summary="values[1] where the new `axis` matches the index, else values[0] (ONNX OneHot)")
