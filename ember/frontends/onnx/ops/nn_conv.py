"""Converters of ONNX convolutions and pools: Conv, ConvTranspose, MaxPool, AveragePool,
LpPool, the Global* pools and MaxUnpool.

ONNX's auto_pad, output_shape and ceil_mode are resolved here into the explicit pads the
IR ops take. Window sums that the IR pools cannot express (dilated averages, Lp norms) are
a depthwise convolution with a ones kernel, with the averaging divisor computed at import.
"""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter
from ember.graph.ir import Value
from ember.graph.ops.linalg import window_count


def spatial_attr(ctx: ConvertContext, name: str, nd: int, default: int) -> list[int]:
    values = ctx.attr(name) or [default] * nd
    if len(values) != nd:
        raise ctx.error(f"{name} must have {nd} entries, got {values}")
    return list(values)


def explicit_pads(ctx: ConvertContext, in_spatial, kernel, strides, dilations) -> list[int]:
    """Pads [begins..., ends...] from the pads attribute or auto_pad."""
    nd = len(in_spatial)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return spatial_attr(ctx, "pads", 2 * nd, 0)
    if auto == "VALID":
        return [0] * (2 * nd)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"unknown auto_pad '{auto}'")
    begins, ends = [], []
    for size, k, s, d in zip(in_spatial, kernel, strides, dilations):
        # SAME: ceil(size / stride) outputs; the odd pad goes at the end (UPPER) or begin.
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins + ends


def window_geometry(ctx: ConvertContext, x: Value, kernel=None):
    """(kernel, strides, pads, dilations) of a conv or pool node over x [N, C, *S]."""
    nd = len(x.shape) - 2
    if nd < 1:
        raise ctx.error(f"the input must be [N, C, *spatial], got {x.type}")
    kernel = list(kernel) if kernel is not None else spatial_attr(ctx, "kernel_shape", nd, 0)
    if not kernel or min(kernel) < 1:
        raise ctx.error("kernel_shape is required")
    strides = spatial_attr(ctx, "strides", nd, 1)
    dilations = spatial_attr(ctx, "dilations", nd, 1)
    pads = explicit_pads(ctx, x.shape[2:], kernel, strides, dilations)
    return kernel, strides, pads, dilations


def operands(*values: Value | None) -> list[Value]:
    return [v for v in values if v is not None]


@converter("Conv")
def conv(ctx: ConvertContext):
    x, w = ctx.require(0), ctx.require(1)
    kernel, strides, pads, dilations = window_geometry(ctx, x, w.shape[2:])
    return ctx.b.conv(*operands(x, w, ctx.input(2)), strides=strides, pads=pads,
                      dilations=dilations, groups=ctx.attr("group", 1))


def per_channel(b, v: Value, rank: int) -> Value:
    """A [C] vector shaped to broadcast against [N, C, *spatial] of `rank`."""
    return b.reshape(v, shape=(v.shape[0],) + (1,) * (rank - 2))


@converter("ConvTranspose")
def conv_transpose(ctx: ConvertContext):
    b = ctx.b
    x, w, bias = ctx.require(0), ctx.require(1), ctx.input(2)
    nd = len(x.shape) - 2
    kernel = w.shape[2:]
    strides = spatial_attr(ctx, "strides", nd, 1)
    dilations = spatial_attr(ctx, "dilations", nd, 1)
    extra = spatial_attr(ctx, "output_padding", nd, 0)
    # The output without pads: every touched position plus the output padding.
    full = [(i - 1) * s + (k - 1) * d + 1 + e
            for i, s, k, d, e in zip(x.shape[2:], strides, kernel, dilations, extra)]
    auto = ctx.attr("auto_pad", "NOTSET")
    target = ctx.attr("output_shape")
    if target or auto in ("SAME_UPPER", "SAME_LOWER"):
        # Pads derived from the wanted size; a negative total grows the output.
        target = list(target)[-nd:] if target else [i * s for i, s in zip(x.shape[2:], strides)]
        totals = [f - t for f, t in zip(full, target)]
        if auto == "SAME_UPPER":
            begins = [t // 2 for t in totals]
        else:
            begins = [t - t // 2 for t in totals]
        ends = [t - p for t, p in zip(totals, begins)]
    else:
        pads = spatial_attr(ctx, "pads", 2 * nd, 0)
        begins, ends = pads[:nd], pads[nd:]
    # The IR op takes non-negative pads and output_padding < max(stride, dilation); the
    # rest of a negative pad becomes zero padding of the result (before the bias).
    ir_begins = [max(p, 0) for p in begins]
    ir_ends, ir_extra, post = [], [], []
    for end, e, s, d in zip(ends, extra, strides, dilations):
        net = end - e  # trimmed from the touched end; negative: grown
        grow = max(-net, 0)
        ir_ends.append(max(net, 0))
        ir_extra.append(min(grow, max(s, d) - 1))
        post.append(grow - ir_extra[-1])
    pre = [max(-p, 0) for p in begins]
    attrs = dict(strides=strides, dilations=dilations, groups=ctx.attr("group", 1),
                 pads=ir_begins + ir_ends, output_padding=ir_extra)
    if not any(pre) and not any(post):
        return b.conv_transpose(*operands(x, w, bias), **attrs)
    y = b.conv_transpose(x, w, **attrs)
    y = b.pad(y, pads=[0, 0, *pre, 0, 0, *post])
    return y if bias is None else b.add(y, per_channel(b, bias, len(y.shape)))


# -- pools ---------------------------------------------------------------------------------


def pool_outputs(x: Value, kernel, strides, pads, dilations, ceil_mode) -> list[int]:
    nd = len(kernel)
    return [window_count(size, k, s, pads[i], pads[nd + i], d, ceil_mode, axis=i)
            for i, (size, k, s, d) in enumerate(zip(x.shape[2:], kernel, strides, dilations))]


def window_sum(ctx: ConvertContext, x: Value, kernel, strides, pads, dilations,
               ceil_mode: bool) -> Value:
    """The sum of each pooling window of x (zero padded), as a convolution of every
    channel with a ones kernel; end pads grow to hold a ceil_mode window's overhang."""
    b = ctx.b
    nd = len(kernel)
    n, c, *spatial = x.shape
    out = pool_outputs(x, kernel, strides, pads, dilations, ceil_mode)
    ends = pool_end_pads(x, kernel, strides, pads, dilations, out)
    flat = b.reshape(x, shape=(n * c, 1, *spatial))
    ones = b.constant(np.ones((1, 1, *kernel), dtype=x.dtype.np))
    y = b.conv(flat, ones, strides=strides, pads=[*pads[:nd], *ends], dilations=dilations)
    return b.reshape(y, shape=(n, c, *out))


def average_divisor(x: Value, kernel, strides, pads, dilations, out, include_pad) -> np.ndarray:
    """How many elements each output of an average pool averages, [*out]: per axis the
    window taps inside the input (or inside the explicit pads), multiplied over axes."""
    nd = len(kernel)
    divisor = np.ones((), np.float64)
    for i, (size, k, s, d, o) in enumerate(zip(x.shape[2:], kernel, strides, dilations, out)):
        taps = np.arange(o)[:, None] * s - pads[i] + np.arange(k)[None, :] * d
        lo, hi = (-pads[i], size + pads[nd + i]) if include_pad else (0, size)
        divisor = np.multiply.outer(divisor, ((taps >= lo) & (taps < hi)).sum(axis=1))
    return divisor


def pool_end_pads(x: Value, kernel, strides, pads, dilations, out) -> list[int]:
    """End pads grown to hold the overhang of a ceil_mode window."""
    nd = len(kernel)
    return [max(pads[nd + i], (o - 1) * s + (k - 1) * d + 1 - size - pads[i])
            for i, (o, s, k, d, size) in enumerate(zip(out, strides, kernel, dilations,
                                                          x.shape[2:]))]


@converter("MaxPool")
def max_pool(ctx: ConvertContext):
    x = ctx.require(0)
    kernel, strides, pads, dilations = window_geometry(ctx, x)
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    y = ctx.b.max_pool(x, kernel=kernel, strides=strides, pads=pads, dilations=dilations,
                       ceil_mode=ceil_mode)
    if not ctx.output_used(1):
        return y
    return [y, max_pool_indices(ctx, x, y, kernel, strides, pads, dilations)]


def max_pool_indices(ctx: ConvertContext, x: Value, y: Value, kernel, strides, pads,
                     dilations) -> Value:
    """The flat index in x of each maximum (the first in window order), one window tap
    at a time: the tap's value and static index win where they equal the maximum."""
    b = ctx.b
    nd = len(kernel)
    order = ctx.attr("storage_order", 0)
    if order and nd != 2:
        raise ctx.unsupported("storage_order=1 is only defined for 2-D pools")
    n, c, *spatial = x.shape
    out = y.shape[2:]
    padded = b.pad(x, pads=[0, 0, *pads[:nd], 0, 0,
                            *pool_end_pads(x, kernel, strides, pads, dilations, out)])
    # Flat spatial index of each position (column-major planes for storage_order=1).
    plane = np.arange(math.prod(spatial)).reshape(spatial[::-1] if order else spatial)
    plane = plane.T if order else plane
    result = None
    for tap in reversed(list(np.ndindex(*kernel))):
        starts = [t * d for t, d in zip(tap, dilations)]
        ends = [st + (o - 1) * s + 1 for st, o, s in zip(starts, out, strides)]
        value = b.slice(padded, starts=(0, 0, *starts), ends=(n, c, *ends),
                        steps=(1, 1, *strides))
        # The input position of this tap for every output, and whether it is padding.
        where = [np.arange(o) * s + st - p for o, s, st, p in zip(out, strides, starts, pads)]
        inside = np.ones(out, bool)
        for i, w in enumerate(where):
            shape = [1] * nd
            shape[i] = -1
            inside = inside & ((w >= 0) & (w < spatial[i])).reshape(shape)
        index = plane[np.ix_(*(np.clip(w, 0, size - 1) for w, size in zip(where, spatial)))]
        hit = b.eq(value, y)
        if not inside.all():
            hit = getattr(b, "and")(hit, b.constant(inside))
        index = b.constant(index.astype(np.int64))
        result = index if result is None else b.where(hit, index, result)
    result = b.broadcast(result, shape=y.shape) if result.shape != y.shape else result
    offsets = (np.arange(n * c) * math.prod(spatial)).reshape(n, c, *(1,) * nd)
    return b.add(result, b.constant(offsets.astype(np.int64)))


@converter("AveragePool")
def average_pool(ctx: ConvertContext):
    b = ctx.b
    x = ctx.require(0)
    kernel, strides, pads, dilations = window_geometry(ctx, x)
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    include_pad = bool(ctx.attr("count_include_pad", 0))
    if all(d == 1 for d in dilations):
        return b.avg_pool(x, kernel=kernel, strides=strides, pads=pads, ceil_mode=ceil_mode,
                          count_include_pad=include_pad)
    total = window_sum(ctx, x, kernel, strides, pads, dilations, ceil_mode)
    out = total.shape[2:]
    divisor = average_divisor(x, kernel, strides, pads, dilations, out, include_pad)
    return b.div(total, b.constant(divisor.astype(x.dtype.np)))


def lp_power(b, x: Value, p: float) -> Value:
    return b.mul(x, x) if p == 2 else b.pow(b.abs(x), float(p))


def lp_root(b, x: Value, p: float) -> Value:
    return b.sqrt(x) if p == 2 else b.pow(x, 1.0 / p)


@converter("LpPool")
def lp_pool(ctx: ConvertContext):
    x = ctx.require(0)
    kernel, strides, pads, dilations = window_geometry(ctx, x)
    p = ctx.attr("p", 2)
    total = window_sum(ctx, lp_power(ctx.b, x, p), kernel, strides, pads, dilations,
                       bool(ctx.attr("ceil_mode", 0)))
    return lp_root(ctx.b, total, p)


@converter("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(ctx: ConvertContext):
    b = ctx.b
    x = ctx.require(0)
    axes = tuple(range(2, len(x.shape)))
    if ctx.op_type == "GlobalAveragePool":
        return b.reduce_mean(x, axes=axes, keepdims=True)
    if ctx.op_type == "GlobalMaxPool":
        return b.reduce_max(x, axes=axes, keepdims=True)
    p = ctx.attr("p", 2)
    return lp_root(b, b.reduce_sum(lp_power(b, x, p), axes=axes, keepdims=True), p)


@converter("MaxUnpool", since=9)
def max_unpool(ctx: ConvertContext):
    b = ctx.b
    x, indices = ctx.require(0), ctx.require(1)
    nd = len(x.shape) - 2
    kernel = spatial_attr(ctx, "kernel_shape", nd, 0)
    strides = spatial_attr(ctx, "strides", nd, 1)
    pads = spatial_attr(ctx, "pads", 2 * nd, 0)
    # The indices (from MaxPool) are flat positions in the unpadded pool input.
    inferred = [*x.shape[:2], *((i - 1) * s - pads[j] - pads[nd + j] + k for j, (i, s, k)
                                in enumerate(zip(x.shape[2:], strides, kernel)))]
    size = math.prod(inferred)
    zeros = b.broadcast(b.constant(np.zeros((), x.dtype.np)), shape=(size,))
    flat_indices = b.reshape(indices, shape=(math.prod(indices.shape),))
    if flat_indices.dtype is not DType.i64:
        flat_indices = b.cast(flat_indices, to=DType.i64)
    y = b.scatter_elements(zeros, flat_indices, b.reshape(x, shape=(math.prod(x.shape),)),
                           axis=0)
    y = b.reshape(y, shape=tuple(inferred))
    if ctx.input(2) is None:
        return y
    shape = [int(v) for v in ctx.const(2, "output_shape")]
    if len(shape) != len(inferred) or any(s < i for s, i in zip(shape, inferred)):
        raise ctx.error(f"output_shape {shape} is smaller than the unpooled {inferred}")
    return b.pad(y, pads=[0] * len(shape) + [s - i for s, i in zip(shape, inferred)])


@converter("DeformConv", since=19)
def deform_conv(ctx: ConvertContext):
    """A 2-D convolution whose taps sample x at learned offsets (bilinear, zero outside),
    scaled by an optional mask: the samples are gathered, then contracted with the
    weights as one grouped matmul."""
    b = ctx.b
    x, w, offset, bias, mask = (ctx.require(0), ctx.require(1), ctx.require(2), ctx.input(3),
                                ctx.input(4))
    if len(x.shape) != 4:
        raise ctx.unsupported("only 2-D DeformConv is supported")
    n, c, height, width = x.shape
    m, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    groups, offset_groups = ctx.attr("group", 1), ctx.attr("offset_group", 1)
    strides = spatial_attr(ctx, "strides", 2, 1)
    dilations = spatial_attr(ctx, "dilations", 2, 1)
    pads = spatial_attr(ctx, "pads", 4, 0)
    out = [window_count(size, k, s, pads[i], pads[2 + i], d, axis=i)
           for i, (size, k, s, d) in enumerate(zip((height, width), (kh, kw), strides,
                                                   dilations))]
    taps, positions = kh * kw, out[0] * out[1]
    if c % offset_groups or offset.shape != (n, offset_groups * taps * 2, *out):
        raise ctx.error(f"offset {offset.type} does not fit offset_group {offset_groups}")
    # Where each tap of each output samples before the offsets: [taps, positions] per axis.
    ki, kj = np.meshgrid(np.arange(kh) * dilations[0], np.arange(kw) * dilations[1],
                         indexing="ij")
    oi, oj = np.meshgrid(np.arange(out[0]) * strides[0] - pads[0],
                         np.arange(out[1]) * strides[1] - pads[1], indexing="ij")
    base = [(k.reshape(-1, 1) + o.reshape(1, -1)).astype(x.dtype.np) for k, o in
            ((ki, oi), (kj, oj))]
    offset = b.reshape(offset, shape=(n, offset_groups, taps, 2, positions))
    coords = []
    for axis in range(2):  # [N, offset groups, taps, positions]
        delta = b.slice(offset, starts=(0, 0, 0, axis, 0),
                        ends=(n, offset_groups, taps, axis + 1, positions), steps=(1,) * 5)
        coords.append(b.add(b.reshape(delta, shape=(n, offset_groups, taps, positions)),
                            b.constant(base[axis])))
    scale = None if mask is None else b.reshape(mask, shape=(n, offset_groups, taps, positions))
    # Bilinear sampling: the four neighbours, each weighted and zero outside x.
    flat = b.reshape(x, shape=(n, c, height * width))
    per_group = c // offset_groups
    lows = [b.floor(p) for p in coords]
    fracs = [b.sub(p, lo) for p, lo in zip(coords, lows)]
    sampled = None
    for di, dj in ((0, 0), (0, 1), (1, 0), (1, 1)):
        weight, index = None, None
        for lo, frac, step, size in zip(lows, fracs, (di, dj), (height, width)):
            at = b.add(lo, float(step)) if step else lo
            part = frac if step else b.sub(1.0, frac)
            inside = getattr(b, "and")(b.ge(at, 0.0), b.le(at, float(size - 1)))
            part = b.where(inside, part, 0.0)
            weight = part if weight is None else b.mul(weight, part)
            at = b.clip(at, min=0.0, max=float(size - 1))
            index = at if index is None else b.add(b.mul(index, float(size)), at)
        if scale is not None:
            weight = b.mul(weight, scale)
        # The same sample positions for every channel of an offset group.
        index = b.cast(b.reshape(index, shape=(n, offset_groups, 1, taps * positions)),
                       to=DType.i64)
        index = b.broadcast(index, shape=(n, offset_groups, per_group, taps * positions))
        values = b.gather_elements(flat, b.reshape(index, shape=(n, c, taps * positions)),
                                   axis=2)
        values = b.mul(b.reshape(values, shape=(n, offset_groups, per_group, taps, positions)),
                       b.reshape(weight, shape=(n, offset_groups, 1, taps, positions)))
        sampled = values if sampled is None else b.add(sampled, values)
    # The convolution: [g, M/g, C/g*taps] @ [N, g, C/g*taps, positions].
    cols = b.reshape(sampled, shape=(n, groups, c // groups * taps, positions))
    y = b.matmul(b.reshape(w, shape=(groups, m // groups, c // groups * taps)), cols)
    y = b.reshape(y, shape=(n, m, *out))
    return y if bias is None else b.add(y, per_channel(b, bias, 4))
