"""N-d indexing ops and scans beyond ops/shape.py: gather_nd, scatter_nd and cumprod.

Index operands follow ONNX as in ops/shape.py: negative indices count from the end, and
an index outside [-dim, dim) raises IndexError in the reference (an InterpreterError).
"""

from __future__ import annotations

import numpy as np

from ember.dtypes import NUMERIC_TYPES
from ember.errors import ShapeError
from ember.graph.ops.common import axis_of, require_dtype, same_dtype
from ember.graph.ops.registry import Attr, define
from ember.graph.ops.shape import _SCATTER_UFUNCS, INDEX_TYPES, _in_range


def _index_depth(data, indices, batch_dims: int) -> int:
    """The checked length k of the index tuples: indices [..., k] address k dims of data
    after its first `batch_dims`, which indices shares."""
    require_dtype(indices, INDEX_TYPES, "indices")
    if indices.rank < 1:
        raise ShapeError(f"indices must have rank >= 1, got {indices}")
    if not 0 <= batch_dims < min(data.rank, indices.rank):
        raise ShapeError(f"batch_dims {batch_dims} must be less than the ranks of data"
                         f" {data} and indices {indices}")
    if data.shape[:batch_dims] != indices.shape[:batch_dims]:
        raise ShapeError(f"data {data} and indices {indices} differ in their first"
                         f" {batch_dims} (batch) dims")
    k = indices.shape[-1]
    if not 1 <= k <= data.rank - batch_dims:
        raise ShapeError(f"index tuples of length {k} (the last dim of {indices}) must"
                         f" address 1 to {data.rank - batch_dims} dims of {data}")
    return k


def _nd_index(data_shape: tuple[int, ...], indices: np.ndarray, batch_dims: int) -> tuple:
    """The NumPy index picking data[batch..., *tuple] for each index tuple; it selects an
    array of shape batch + (M,) + the dims the tuples leave, M tuples per batch entry."""
    batch, k = data_shape[:batch_dims], indices.shape[-1]
    tuples = indices.reshape(batch + (-1, k))
    batch_index = np.indices(tuples.shape[:-1], sparse=True)[:batch_dims]
    coords = [_in_range(tuples[..., j], data_shape[batch_dims + j]) for j in range(k)]
    return (*batch_index, *coords)


# -- gather_nd, scatter_nd --------------------------------------------------------------

def _gather_nd_infer(types, attrs):
    data, indices = types
    b = attrs["batch_dims"]
    k = _index_depth(data, indices, b)
    return data.with_shape(indices.shape[:-1] + data.shape[b + k:])


def _gather_nd_reference(data, indices, batch_dims):
    k = indices.shape[-1]
    picked = data[_nd_index(data.shape, indices, batch_dims)]
    return picked.reshape(indices.shape[:-1] + data.shape[batch_dims + k:])


define("gather_nd", arity=2, attrs={"batch_dims": Attr("int", 0)}, infer=_gather_nd_infer,
       reference=_gather_nd_reference, traits=("pure",), family="indexing",
       summary="out[b..., i...] = data[b..., *indices[b..., i..., :]], the slices that index"
               " tuples address after `batch_dims` shared dims (ONNX GatherND)")


def _scatter_nd_infer(types, attrs):
    data, indices, updates = types
    k = _index_depth(data, indices, 0)
    want = indices.shape[:-1] + data.shape[k:]
    if updates.shape != want:
        raise ShapeError(f"updates {updates} must have shape {list(want)} for data {data}"
                         f" and indices {indices}")
    same_dtype([data, updates], "data and updates")
    return data


def _scatter_nd_reference(data, indices, updates, reduction):
    out = data.copy()
    index = _nd_index(data.shape, indices, 0)
    k = indices.shape[-1]
    updates = updates.reshape((-1,) + data.shape[k:])
    if reduction == "none":
        out[index] = updates  # on repeated tuples the last update wins; ONNX leaves it open
    else:
        _SCATTER_UFUNCS[reduction].at(out, index, updates)  # .at applies every repeat
    return out


define("scatter_nd", arity=3, infer=_scatter_nd_infer, reference=_scatter_nd_reference,
       attrs={"reduction": Attr("str", "none", ("none", "add", "mul", "max", "min"))},
       traits=("pure",), family="indexing",
       summary="a copy of data with the slices that index tuples address replaced (or"
               " combined) by updates (ONNX ScatterND)")


# -- cumprod ----------------------------------------------------------------------------

def _cumprod_infer(types, attrs):
    (x,) = types
    require_dtype(x, NUMERIC_TYPES)
    axis_of(x, attrs["axis"])
    return x


def _cumprod_reference(x, axis, exclusive, reverse):
    axis %= x.ndim
    if x.shape[axis] == 0:
        return x.copy()
    if reverse:
        x = np.flip(x, axis)
    if exclusive:  # shift x one step along the axis behind a 1, so each product stops early
        ones = np.ones_like(np.take(x, [0], axis=axis))
        x = np.concatenate([ones, np.take(x, np.arange(x.shape[axis] - 1), axis=axis)], axis)
    out = np.cumprod(x, axis=axis, dtype=x.dtype)  # dtype= so small integers wrap, not widen
    return np.flip(out, axis) if reverse else out


define("cumprod", arity=1, infer=_cumprod_infer, reference=_cumprod_reference,
       attrs={"axis": Attr("int"), "exclusive": Attr("bool", False),
              "reverse": Attr("bool", False)},
       traits=("pure",), family="indexing",
       summary="running product along `axis` (ONNX CumProd: exclusive and reverse variants)")
