"""Converters of core ATen indexing ops: advanced indexing (index, index_put), gather,
scatter and its reductions, index_select, embedding, slice_scatter and select_scatter.

Index tensors follow PyTorch: negative entries count from the end, as the IR's
gather/scatter ops read them. Boolean masks select a data-dependent number of elements,
so only the writes through them that do not depend on that count are converted.
"""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import DType
from ember.frontends.torch.aten_tensor import (
    clamped_range,
    filled,
    index_value,
    reshape,
    slice_axis,
    transpose,
)
from ember.frontends.torch.context import ConvertContext, aten
from ember.graph.ir import Value


# -- writes into slices ---------------------------------------------------------------------
@aten("slice_scatter.default")
def slice_scatter(ctx: ConvertContext, x, src, dim=0, start=None, end=None, step=1):
    axis = dim % x.type.rank
    start, end = clamped_range(x.shape[axis], start, end)
    return _write_range(ctx, x, ctx.as_value(src, x.dtype), axis, start, end, step)


@aten("select_scatter.default")
def select_scatter(ctx: ConvertContext, x, src, dim, index):
    axis = dim % x.type.rank
    index = index + x.shape[axis] if index < 0 else index
    src = reshape(ctx, ctx.as_value(src, x.dtype), x.shape[:axis] + (1,) + x.shape[axis + 1:])
    return _write_range(ctx, x, src, axis, index, index + 1, 1)


def _write_range(ctx, x: Value, src: Value, axis: int, start: int, end: int, step: int):
    """x with x[start:end:step] along `axis` replaced by src."""
    if step == 1:  # a concatenation of what stays before, src, what stays after
        parts = [slice_axis(ctx, x, axis, 0, start), src,
                 slice_axis(ctx, x, axis, end, x.shape[axis])]
        parts = [p for p in parts if p.type.numel]
        if not parts:  # x is empty
            return x
        return parts[0] if len(parts) == 1 else ctx.b.concat(*parts, axis=axis)
    positions = np.arange(start, end, step).reshape(
        [-1 if i == axis else 1 for i in range(x.type.rank)])
    index = ctx.b.broadcast(ctx.b.constant(positions.astype(np.int64)), shape=src.shape)
    return ctx.b.scatter_elements(x, index, src, axis=axis)


# -- advanced indexing ----------------------------------------------------------------------
def _index_entries(ctx: ConvertContext, x: Value, indices) -> tuple[list[int], list[Value]]:
    """The dims that index tensors address and those tensors (masks are data-dependent)."""
    dims, tensors = [], []
    for dim, index in enumerate(indices):
        if index is None:
            continue
        if index.dtype in (DType.bool, DType.u8):
            raise ctx.unsupported("indexing with a boolean mask gives a data-dependent shape")
        dims.append(dim)
        tensors.append(index)
    if not dims:
        raise ctx.unsupported("no index tensor")
    return dims, tensors


def _index_tuples(ctx: ConvertContext, tensors: list[Value]) -> tuple[Value, tuple[int, ...]]:
    """The index tensors broadcast together and stacked into tuples [*B, k] (i64)."""
    shape = np.broadcast_shapes(*(t.shape for t in tensors))
    cols = [reshape(ctx, ctx.b.broadcast(ctx.as_value(t, DType.i64), shape=shape)
                    if t.shape != shape else ctx.as_value(t, DType.i64), shape + (1,))
            for t in tensors]
    return (cols[0] if len(cols) == 1 else ctx.b.concat(*cols, axis=-1)), shape


def _batch_position(dims: list[int]) -> int:
    """Where x[indices] puts the broadcast index dims: at the first indexed dim when the
    indexed dims are adjacent, else in front."""
    return dims[0] if dims == list(range(dims[0], dims[-1] + 1)) else 0


def _batch_perm(rest: int, batch: int, position: int) -> list[int]:
    """The permutation of [*B, *rest] (batch-first) that puts B at `position`."""
    return [*range(batch, batch + position), *range(batch),
            *range(batch + position, batch + rest)]


@aten("index.Tensor")
def index(ctx: ConvertContext, x, indices):
    dims, tensors = _index_entries(ctx, x, indices)
    if len(dims) == 1:
        return ctx.b.gather(x, index_value(ctx, tensors[0]), axis=dims[0])
    rest = [d for d in range(x.type.rank) if d not in dims]
    tuples, batch = _index_tuples(ctx, tensors)
    y = ctx.b.gather_nd(transpose(ctx, x, dims + rest), tuples)  # [*B, *rest]
    return transpose(ctx, y, _batch_perm(len(rest), len(batch), _batch_position(dims)))


@aten("index_put.default")
def index_put(ctx: ConvertContext, x, indices, values, accumulate=False):
    values = ctx.as_value(values, x.dtype)
    masks = [(d, i) for d, i in enumerate(indices)
             if i is not None and i.dtype in (DType.bool, DType.u8)]
    if masks:
        return _masked_put(ctx, x, indices, masks, values, accumulate)
    dims, tensors = _index_entries(ctx, x, indices)
    if len(dims) == 1:
        return _put_along(ctx, x, dims[0], tensors[0], values, accumulate)
    rest = [d for d in range(x.type.rank) if d not in dims]
    tuples, batch = _index_tuples(ctx, tensors)
    # values broadcast against x[indices], whose layout puts B at _batch_position.
    perm = _batch_perm(len(rest), len(batch), _batch_position(dims))
    batch_first = (*batch, *(x.shape[d] for d in rest))
    layout = tuple(batch_first[p] for p in perm)
    if values.shape != layout:
        values = ctx.b.broadcast(values, shape=layout)
    values = transpose(ctx, values, np.argsort(perm))
    order = dims + rest
    y = ctx.b.scatter_nd(transpose(ctx, x, order), tuples, values,
                         reduction="add" if accumulate else "none")
    return transpose(ctx, y, np.argsort(order))


def _put_along(ctx, x: Value, axis: int, index: Value, values: Value,
               accumulate: bool) -> Value:
    """x[..., index, ...] = values along one axis (index_copy_, a cache written at its
    positions): a scatter along that axis, in x's own layout, where the general form
    would move the axis to the front and back, copying x twice. The index is flattened
    (x[idx] puts its dims where the axis was)."""
    count = index.type.numel
    layout = (*x.shape[:axis], count, *x.shape[axis + 1:])
    put = (*x.shape[:axis], *index.shape, *x.shape[axis + 1:])
    if values.shape != put:
        values = ctx.b.broadcast(values, shape=put)
    values = reshape(ctx, values, layout)
    flat = reshape(ctx, ctx.as_value(index, DType.i64), (count,))
    along = reshape(ctx, flat, tuple(count if d == axis else 1 for d in range(x.type.rank)))
    return ctx.b.scatter_elements(x, ctx.b.broadcast(along, shape=layout), values, axis=axis,
                                  reduction="add" if accumulate else "none")


def _masked_put(ctx, x: Value, indices, masks, values: Value, accumulate: bool) -> Value:
    """x[mask] = values, expressible when values is the same for every selected element:
    then it is a `where` on the mask (broadcast over the dims after it)."""
    if len(masks) > 1 or any(i is not None for i in indices if i is not masks[0][1]):
        raise ctx.unsupported("a boolean mask mixed with other indices")
    at, mask = masks[0]
    after = x.shape[at + mask.type.rank:]
    per_element = (*x.shape[:at], 1, *after)
    try:
        fits = np.broadcast_shapes(values.shape, per_element) == per_element
    except ValueError:
        fits = False
    if not fits:
        raise ctx.unsupported("index_put through a mask with values that differ per selected"
                              " element (a data-dependent count)")
    if values.shape != per_element:
        values = ctx.b.broadcast(values, shape=per_element)
    values = reshape(ctx, values, (*x.shape[:at], *(1,) * mask.type.rank, *after))
    if accumulate:
        values = ctx.b.add(x, values)
    mask = reshape(ctx, ctx.as_value(mask, DType.bool),
                   (1,) * at + mask.shape + (1,) * len(after))
    return ctx.b.where(mask, values, x)


@aten("index_select.default")
def index_select(ctx: ConvertContext, x, dim, index):
    axis = dim % max(x.type.rank, 1)
    index = reshape(ctx, index_value(ctx, index), (index.type.numel,))
    x = reshape(ctx, x, (1,)) if x.type.rank == 0 else x  # a scalar selects as a [1] vector
    return reshape(ctx, ctx.b.gather(x, index, axis=axis), ctx.result_type().shape)


@aten("embedding.default")
def embedding(ctx: ConvertContext, weight, indices, padding_idx=-1, scale_grad_by_freq=False,
              sparse=False):
    return ctx.b.gather(weight, index_value(ctx, indices), axis=0)  # padding_idx: grads only


@aten("gather.default")
def gather(ctx: ConvertContext, x, dim, index, sparse_grad=False):
    if index.type.numel == 0:  # PyTorch accepts an empty index of any shape
        return filled(ctx, 0, index.shape, x.dtype)
    if x.type.rank == 0:  # the result has the index's shape ([] or [1])
        return reshape(ctx, ctx.b.gather_elements(reshape(ctx, x, (1,)), reshape(
            ctx, index_value(ctx, index), (1,))), index.shape)
    return ctx.b.gather_elements(x, index_value(ctx, index), axis=dim % x.type.rank)


# -- scatter --------------------------------------------------------------------------------
_SCATTER_REDUCE = {"add": "add", "multiply": "mul", "sum": "add", "prod": "mul",
                   "amax": "max", "amin": "min"}


def _updates(ctx: ConvertContext, x: Value, index: Value, src) -> Value:
    """src as the updates of a scatter: PyTorch reads only its index-shaped corner."""
    if not isinstance(src, Value):
        return filled(ctx, src, index.shape, x.dtype)
    src = ctx.as_value(src, x.dtype)
    if src.shape != index.shape:
        src = ctx.b.slice(src, starts=[0] * src.type.rank, ends=list(index.shape),
                          steps=[1] * src.type.rank)
    return src


def _scatter(ctx, x: Value, dim: int, index: Value, src, reduction: str = "none") -> Value:
    if index.type.numel == 0:  # nothing is written
        return x
    if x.type.rank == 0:  # a scalar scatters as a [1] vector (index and src are scalars too)
        as_vector = [reshape(ctx, v, (1,)) if isinstance(v, Value) else v
                     for v in (x, index, src)]
        return reshape(ctx, _scatter(ctx, *as_vector[:1], 0, *as_vector[1:], reduction), ())
    index = index_value(ctx, index)
    return ctx.b.scatter_elements(x, index, _updates(ctx, x, index, src),
                                  axis=dim % x.type.rank, reduction=reduction)


@aten("scatter.src", "scatter.value")
def scatter(ctx: ConvertContext, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src)


@aten("scatter.reduce", "scatter.value_reduce")
def scatter_with_reduce(ctx: ConvertContext, x, dim, index, src, reduce):
    if reduce not in ("add", "multiply"):
        raise ctx.unsupported(f"reduce={reduce!r}")
    return _scatter(ctx, x, dim, index, src, _SCATTER_REDUCE[reduce])


@aten("scatter_add.default")
def scatter_add(ctx: ConvertContext, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src, "add")


@aten("scatter_reduce.two")
def scatter_reduce(ctx: ConvertContext, x, dim, index, src, reduce, include_self=True):
    if reduce == "mean":
        if not x.dtype.is_float:
            raise ctx.unsupported("mean of integers (PyTorch floors the quotient)")
        total = scatter_reduce(ctx, x, dim, index, src, "sum", include_self)
        count = _scatter(ctx, filled(ctx, int(include_self), x.shape, x.dtype), dim, index,
                         1, "add")
        return ctx.b.div(total, ctx.b.max(count, ctx.constant(1, x.dtype)))
    if reduce not in _SCATTER_REDUCE:
        raise ctx.unsupported(f"reduce={reduce!r}")
    if not include_self:  # reset the written places to the reduction's identity first
        x = _scatter(ctx, x, dim, index, _identity(reduce, x.dtype))
    return _scatter(ctx, x, dim, index, src, _SCATTER_REDUCE[reduce])


def _identity(reduce: str, dtype: DType) -> float:
    if reduce in ("sum", "prod"):
        return 0 if reduce == "sum" else 1
    if dtype.is_float:
        return -math.inf if reduce == "amax" else math.inf
    info = np.iinfo(dtype.np) if dtype.is_int else None
    if info is None:  # bool
        return reduce == "amin"
    return info.min if reduce == "amax" else info.max


@aten("index_reduce.default")
def index_reduce(ctx: ConvertContext, x, dim, index, src, reduce, include_self=True):
    """A scatter_reduce whose 1-D index picks whole slices along `dim`: the index,
    broadcast over src's other dims, addresses each src element."""
    if x.type.rank == 0:  # a scalar reduces as a [1] vector
        src = reshape(ctx, src, (1,))
        out = index_reduce(ctx, reshape(ctx, x, (1,)), 0, index, src, reduce, include_self)
        return reshape(ctx, out, ())
    axis = dim % x.type.rank
    index = reshape(ctx, index_value(ctx, index),
                    (1,) * axis + (index.type.numel,) + (1,) * (x.type.rank - axis - 1))
    if index.shape != src.shape:
        index = ctx.b.broadcast(index, shape=src.shape)
    return scatter_reduce(ctx, x, axis, index, src, reduce, include_self)


# -- diagonals, strided views -------------------------------------------------------------
@aten("diagonal_scatter.default")
def diagonal_scatter(ctx: ConvertContext, x, src, offset=0, dim1=0, dim2=1):
    """x with its diagonal (as aten.diagonal reads it) replaced by src: a scatter into x
    viewed as [*others, rows * cols] at the diagonal's flat positions."""
    rank = x.type.rank
    a, b = dim1 % rank, dim2 % rank
    others = [d for d in range(rank) if d not in (a, b)]
    perm = others + [a, b]
    rows, cols = x.shape[a], x.shape[b]
    length = src.shape[-1]
    if length == 0:
        return x
    batch = tuple(x.shape[d] for d in others)
    flat = reshape(ctx, transpose(ctx, x, perm), batch + (rows * cols,))
    i = np.arange(length, dtype=np.int64)
    positions = (i + max(-offset, 0)) * cols + i + max(offset, 0)
    index = ctx.b.broadcast(ctx.b.constant(positions), shape=batch + (length,))
    out = ctx.b.scatter_elements(flat, index, ctx.as_value(src, x.dtype), axis=-1)
    out = reshape(ctx, out, batch + (rows, cols))
    return transpose(ctx, out, np.argsort(perm))


def _strided_positions(size, stride, offset) -> np.ndarray:
    """The storage positions of an as_strided view: offset + sum_d i_d * stride_d."""
    positions = np.full(tuple(size), offset or 0, np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        positions += (np.arange(n, dtype=np.int64) * s).reshape(
            (1,) * d + (n,) + (1,) * (len(size) - d - 1))
    return positions


def _storage(ctx: ConvertContext, x: Value, positions: np.ndarray) -> Value:
    """x flattened (its storage as a contiguous tensor), checked to hold `positions`."""
    if positions.size and (positions.min() < 0 or positions.max() >= x.type.numel):
        raise ctx.unsupported("an as_strided view outside the tensor's own elements")
    return reshape(ctx, x, (x.type.numel,))


@aten("as_strided.default", "as_strided_copy.default")
def as_strided(ctx: ConvertContext, x, size, stride, storage_offset=None):
    """A view of x's elements (read as a contiguous tensor, the layout the graph gives
    its values) by explicit strides: a gather at the computed flat positions."""
    positions = _strided_positions(size, stride, storage_offset)
    if positions.size == 0:
        return filled(ctx, 0, tuple(size), x.dtype)
    flat = _storage(ctx, x, positions)
    return ctx.b.gather(flat, ctx.b.constant(positions), axis=0)


@aten("as_strided_scatter.default")
def as_strided_scatter(ctx: ConvertContext, x, src, size, stride, storage_offset=None):
    positions = _strided_positions(size, stride, storage_offset)
    if positions.size == 0:
        return x
    flat = _storage(ctx, x, positions)
    src = reshape(ctx, ctx.as_value(src, x.dtype), (positions.size,))
    out = ctx.b.scatter_elements(flat, ctx.b.constant(positions.reshape(-1)), src, axis=0)
    return reshape(ctx, out, x.shape)


# -- sorted search --------------------------------------------------------------------------
def _count_below(ctx: ConvertContext, seq: Value, values: Value, right: bool) -> Value:
    """For each value, how many entries of the sorted last axis of `seq` are < it (<= it
    when `right`): its insertion point. seq is 1-D, or shares values' leading dims."""
    b = ctx.b
    cols = reshape(ctx, values, values.shape + (1,))
    if seq.type.rank == 1:
        rows = seq
    else:
        rows = reshape(ctx, seq, seq.shape[:-1] + (1, seq.shape[-1]))
    below = b.le(rows, cols) if right else b.lt(rows, cols)
    return b.reduce_sum(b.cast(below, to=DType.i64), axes=(cols.type.rank - 1,))


def _search(ctx: ConvertContext, seq: Value, values, right: bool, sorter=None) -> Value:
    out = ctx.result_type()
    if not isinstance(values, Value):
        values = ctx.constant(values, seq.dtype)
    if sorter is not None:
        seq = ctx.b.gather_elements(seq, index_value(ctx, sorter), axis=-1) \
            if seq.type.rank > 1 else ctx.b.gather(seq, index_value(ctx, sorter), axis=0)
    common = seq.dtype if seq.dtype == values.dtype else (
        DType.f64 if seq.dtype.is_float or values.dtype.is_float else DType.i64)
    seq, values = ctx.as_value(seq, common), ctx.as_value(values, common)
    if seq.type.rank == 0 or seq.shape[-1] == 0:
        return filled(ctx, 0, out.shape, out.dtype)
    counts = _count_below(ctx, seq, values, right)
    return ctx.as_value(reshape(ctx, counts, out.shape), out.dtype)


@aten("searchsorted.Tensor", "searchsorted.Scalar")
def searchsorted(ctx: ConvertContext, seq, values, *, out_int32=False, right=False,
                 side=None, sorter=None):
    return _search(ctx, seq, values, right or side == "right", sorter)


@aten("bucketize.Tensor", "bucketize.Scalar")
def bucketize(ctx: ConvertContext, values, boundaries, *, out_int32=False, right=False):
    return _search(ctx, boundaries, values, right)
