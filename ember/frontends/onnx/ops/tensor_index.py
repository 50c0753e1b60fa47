"""Converters of ONNX indexing, scan and selection ops: Gather, GatherElements, GatherND,
ScatterElements, Scatter, ScatterND, TensorScatter, OneHot, TopK, CumSum, CumProd,
ReverseSequence, Compress and Col2Im.

Index inputs pass through as they are (graph ops take i32 or i64 indices and wrap
negative ones, as ONNX does); inputs that decide a shape (TopK's k, OneHot's depth,
Compress's condition) must be constants.
"""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter
from ember.frontends.onnx.ops.tensor import axis_arg, const_ints, reshape, slice_axes

# -- gather and scatter ------------------------------------------------------------------


@converter("Gather")
def gather(ctx: ConvertContext):
    data = ctx.require(0)
    axis = axis_arg(ctx, ctx.attr("axis", 0), data.type.rank)
    return ctx.b.gather(data, ctx.require(1), axis=axis)


@converter("GatherElements", since=11)
def gather_elements(ctx: ConvertContext):
    return ctx.b.gather_elements(ctx.require(0), ctx.require(1), axis=ctx.attr("axis", 0))


@converter("GatherND", since=11)
def gather_nd(ctx: ConvertContext):
    return ctx.b.gather_nd(ctx.require(0), ctx.require(1), batch_dims=ctx.attr("batch_dims", 0))


@converter("ScatterElements", since=11)
@converter("Scatter", since=9)  # the deprecated name of ScatterElements, without reduction
def scatter_elements(ctx: ConvertContext):
    return ctx.b.scatter_elements(ctx.require(0), ctx.require(1), ctx.require(2),
                                  axis=ctx.attr("axis", 0), reduction=ctx.attr("reduction", "none"))


@converter("ScatterND", since=11)
def scatter_nd(ctx: ConvertContext):
    return ctx.b.scatter_nd(ctx.require(0), ctx.require(1), ctx.require(2),
                            reduction=ctx.attr("reduction", "none"))


@converter("TensorScatter", since=24)
def tensor_scatter(ctx: ConvertContext):
    """present[b, .., s, ..] = update[b, .., s - w[b], ..] where that index is in the update
    (w = write_indices, the difference taken modulo the cache length in circular mode),
    else past[b, .., s, ..]."""
    past, update = ctx.require(0), ctx.require(1)
    axis = axis_arg(ctx, ctx.attr("axis", -2), past.type.rank)
    mode = ctx.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.unsupported(f"mode '{mode}'")
    if axis == 0 or update.type.rank != past.type.rank or any(
            u != p for i, (u, p) in enumerate(zip(update.shape, past.shape)) if i != axis):
        raise ctx.error(f"update {update.type} must match past_cache {past.type} off the"
                        f" sequence axis {axis} (which must not be the batch axis 0)")
    length, capacity = update.shape[axis], past.shape[axis]
    if length == 0:
        return past
    b = ctx.b
    steps = b.iota(shape=[capacity if i == axis else 1 for i in range(past.type.rank)],
                   axis=axis)
    rel = steps
    if ctx.input(2) is not None:  # one write index per batch entry
        writes = ctx.require(2)
        writes = writes if writes.dtype == DType.i64 else b.cast(writes, to=DType.i64)
        rel = b.sub(steps, reshape(b, writes, [past.shape[0]] + [1] * (past.type.rank - 1)))
    if mode == "circular":
        rel = b.mod(rel, capacity)
    inside = getattr(b, "and")(b.ge(rel, 0), b.lt(rel, length))
    index = b.broadcast(b.where(inside, rel, 0), shape=past.shape)
    picked = b.gather_elements(update, index, axis=axis)
    return b.where(b.broadcast(inside, shape=past.shape), picked, past)


# -- one_hot, topk, compress ----------------------------------------------------------------

@converter("OneHot", since=9)
def one_hot(ctx: ConvertContext):
    indices, values = ctx.require(0), ctx.require(2)
    depth = np.asarray(ctx.const(1, "depth")).reshape(-1)
    if depth.size != 1:
        raise ctx.error(f"depth must hold one value, got {depth.size}")
    if values.type.numel != 2:
        raise ctx.error(f"values must hold [off, on], got {values.type}")
    if indices.dtype not in (DType.i32, DType.i64):  # ONNX casts other indices to int64
        indices = ctx.b.cast(indices, to=DType.i64)
    return ctx.b.one_hot(indices, reshape(ctx.b, values, (2,)), depth=int(depth[0]),
                         axis=ctx.attr("axis", -1))


@converter("TopK")
def topk(ctx: ConvertContext):
    x = ctx.require(0)
    k = ctx.attr("k") if ctx.opset < 10 else const_ints(ctx, 1, "k")[0]
    values, indices = ctx.b.topk(x, k=k, axis=ctx.attr("axis", -1),
                                 largest=bool(ctx.attr("largest", 1)),
                                 sorted=bool(ctx.attr("sorted", 1)))
    return values, indices


@converter("Compress", since=9)
def compress(ctx: ConvertContext):
    x = ctx.require(0)
    condition = np.asarray(ctx.const(1, "the condition")).reshape(-1)
    axis = ctx.attr("axis")
    if axis is None:  # over the flattened input
        x, axis = reshape(ctx.b, x, (x.type.numel,)), 0
    axis = axis_arg(ctx, axis, x.type.rank)
    if condition.size > x.shape[axis]:
        raise ctx.error(f"condition of length {condition.size} is longer than axis {axis}"
                        f" of {x.type}")
    picked = np.flatnonzero(condition).astype(np.int64)
    return ctx.b.gather(x, ctx.constant(picked), axis=axis)


# -- scans ------------------------------------------------------------------------------------

@converter("CumSum", since=11)
@converter("CumProd", since=26)
def cumulative(ctx: ConvertContext):
    x = ctx.require(0)
    axis = const_ints(ctx, 1, "axis")
    if len(axis) != 1:
        raise ctx.error(f"axis must hold one value, got {axis}")
    op = ctx.b.cumsum if ctx.op_type == "CumSum" else ctx.b.cumprod
    return op(x, axis=axis_arg(ctx, axis[0], x.type.rank), exclusive=bool(ctx.attr("exclusive", 0)),
              reverse=bool(ctx.attr("reverse", 0)))


@converter("ReverseSequence", since=10)
def reverse_sequence(ctx: ConvertContext):
    """Along the time axis, each batch entry b reads index lens[b] - 1 - t for t < lens[b]
    and t itself after that."""
    x, lens = ctx.require(0), ctx.require(1)
    time_axis = axis_arg(ctx, ctx.attr("time_axis", 0), x.type.rank, "time_axis")
    batch_axis = axis_arg(ctx, ctx.attr("batch_axis", 1), x.type.rank, "batch_axis")
    if time_axis == batch_axis or x.type.rank < 2:
        raise ctx.error("time_axis and batch_axis must be two different axes")
    b = ctx.b
    lens = lens if lens.dtype == DType.i64 else b.cast(lens, to=DType.i64)
    lens = reshape(b, lens, [x.shape[batch_axis] if i == batch_axis else 1
                             for i in range(x.type.rank)])
    t = b.iota(shape=[d if i in (time_axis, batch_axis) else 1 for i, d in enumerate(x.shape)],
               axis=time_axis)
    index = b.where(b.lt(t, lens), b.sub(b.sub(lens, 1), t), t)
    return b.gather_elements(x, b.broadcast(index, shape=x.shape), axis=time_axis)


# -- col2im ---------------------------------------------------------------------------------

@converter("Col2Im", since=18)
def col2im(ctx: ConvertContext):
    """Every column entry adds into one pixel of the padded image: a scatter-add along the
    flattened padded image by constant indices, then the pads sliced off."""
    x = ctx.require(0)
    image, block = const_ints(ctx, 1, "image_shape"), const_ints(ctx, 2, "block_shape")
    nd = len(image)
    strides = ctx.attr("strides", [1] * nd)
    dilations = ctx.attr("dilations", [1] * nd)
    pads = ctx.attr("pads", [0] * 2 * nd)
    kernel = math.prod(block)
    if x.type.rank != 3 or len(block) != nd or x.shape[1] % kernel:
        raise ctx.error(f"input {x.type} must be [N, C * {kernel}, L] for block {block}")
    padded = [d + pads[i] + pads[nd + i] for i, d in enumerate(image)]
    grid = [(p - (dil * (k - 1) + 1)) // s + 1
            for p, k, s, dil in zip(padded, block, strides, dilations)]
    if math.prod(grid) != x.shape[2]:
        raise ctx.error(f"input {x.type} has {x.shape[2]} blocks, but the image, block,"
                        f" pads, strides and dilations give {grid}")
    # position of (kernel offset, block) along each dim, then flattened in the padded image
    offsets = np.indices(block).reshape(nd, -1, 1)
    starts = np.indices(grid).reshape(nd, 1, -1)
    coords = (starts * np.reshape(strides, (nd, 1, 1))
              + offsets * np.reshape(dilations, (nd, 1, 1)))
    flat = np.ravel_multi_index(tuple(coords), padded).reshape(1, 1, -1)
    n, c = x.shape[0], x.shape[1] // kernel
    b = ctx.b
    columns = reshape(b, x, (n, c, kernel * x.shape[2]))
    index = b.broadcast(ctx.constant(flat.astype(np.int64)), shape=columns.shape)
    zeros = b.broadcast(ctx.constant(np.zeros((), x.dtype.np)), shape=(n, c, math.prod(padded)))
    summed = b.scatter_elements(zeros, index, columns, axis=2, reduction="add")
    out = reshape(b, summed, (n, c, *padded))
    return slice_axes(b, out, {2 + i: (pads[i], pads[i] + d, 1) for i, d in enumerate(image)})
