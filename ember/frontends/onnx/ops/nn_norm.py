"""Converters of ONNX normalizations: BatchNormalization, InstanceNormalization,
LayerNormalization, GroupNormalization, RMSNormalization, LRN, LpNormalization and
MeanVarianceNormalization."""

from __future__ import annotations

import numpy as np

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter
from ember.frontends.onnx.ops.nn import normalize_axes
from ember.graph.ir import Value


def like(b, v: Value, x: Value) -> Value:
    """v cast to x's dtype (BatchNormalization-15 lets the parameters differ)."""
    return v if v.dtype is x.dtype else b.cast(v, to=x.dtype)


def stash(b, x: Value, stash_type: int) -> Value:
    """x in the precision of stash_type (1: f32) when that is wider than x's."""
    wide = stash_type == 1 and x.dtype in (DType.f16, DType.bf16)
    return b.cast(x, to=DType.f32) if wide else x


@converter("BatchNormalization")
def batch_norm(ctx: ConvertContext):
    b = ctx.b
    x = ctx.require(0)
    scale, bias, mean, var = (like(b, ctx.require(i), x) for i in range(1, 5))
    if not ctx.attr("spatial", 1):
        raise ctx.unsupported("spatial=0 (per-activation statistics) is not supported")
    eps = ctx.attr("epsilon", 1e-5)
    training = ctx.attr("training_mode", 0) if ctx.opset >= 14 else ctx.num_outputs > 1
    if not training:
        return b.batch_norm(x, scale, bias, mean, var, epsilon=eps)
    if ctx.opset < 14:
        raise ctx.unsupported("training outputs of BatchNormalization before opset 14")
    # Training: normalize with the batch statistics, and update the running ones.
    axes = (0, *range(2, len(x.shape)))
    batch_mean = b.reduce_mean(x, axes=axes)
    batch_var = b.reduce_var(x, axes=axes)
    y = b.batch_norm(x, scale, bias, batch_mean, batch_var, epsilon=eps)
    momentum = ctx.attr("momentum", 0.9)
    running = [b.add(b.mul(old, momentum), b.mul(new, 1.0 - momentum))
               for old, new in ((mean, batch_mean), (var, batch_var))]
    dtype = ctx.require(3).dtype
    return [y, *(r if r.dtype is dtype else b.cast(r, to=dtype) for r in running)]


@converter("InstanceNormalization")
def instance_norm(ctx: ConvertContext):
    return ctx.b.instance_norm(ctx.require(0), ctx.require(1), ctx.require(2),
                               epsilon=ctx.attr("epsilon", 1e-5))


@converter("LayerNormalization", since=17)
def layer_norm(ctx: ConvertContext):
    b = ctx.b
    x = ctx.require(0)
    rank = len(x.shape)
    axis, eps = ctx.attr("axis", -1), ctx.attr("epsilon", 1e-5)
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    params = [v for v in (ctx.require(1), ctx.input(2)) if v is not None]
    y = b.layer_norm(x, *params, axis=axis, epsilon=eps)
    if not (ctx.output_used(1) or ctx.output_used(2)):
        return y
    # The saved statistics, over axes axis.. kept as size 1, in the stash precision.
    wide = stash(b, x, ctx.attr("stash_type", 1))
    axes = tuple(range(axis % rank, rank))
    mean = b.reduce_mean(wide, axes=axes, keepdims=True)
    var = b.reduce_var(wide, axes=axes, keepdims=True)
    return [y, mean, b.rsqrt(b.add(var, eps))]


@converter("GroupNormalization", since=18)
def group_norm(ctx: ConvertContext):
    b = ctx.b
    x, scale, bias = ctx.require(0), ctx.require(1), ctx.require(2)
    groups = ctx.attr("num_groups")
    if groups is None:
        raise ctx.error("num_groups is required")
    channels = x.shape[1]
    if groups <= 0 or channels % groups:
        raise ctx.error(f"num_groups {groups} does not divide the {channels} channels")
    if ctx.opset < 21:
        # Opset 18 takes one scale and bias per group: repeat them for its channels.
        def per_group(v: Value) -> Value:
            if v.shape != (groups,):
                raise ctx.error(f"scale and bias must have shape [{groups}], got {v.type}")
            v = b.broadcast(b.reshape(v, shape=(groups, 1)), shape=(groups, channels // groups))
            return b.reshape(v, shape=(channels,))

        scale, bias = per_group(scale), per_group(bias)
    return b.group_norm(x, scale, bias, num_groups=groups, epsilon=ctx.attr("epsilon", 1e-5))


@converter("RMSNormalization", since=23)
def rms_norm(ctx: ConvertContext):
    x = ctx.require(0)
    rank = len(x.shape)
    axis = ctx.attr("axis", -1)
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return ctx.b.rms_norm(x, ctx.require(1), axis=axis, epsilon=ctx.attr("epsilon", 1e-5))


@converter("LRN")
def lrn(ctx: ConvertContext):
    """x / (bias + alpha / size * sum of x^2 over `size` neighbouring channels)^beta."""
    b = ctx.b
    x = ctx.require(0)
    size = ctx.attr("size")
    if size is None or size < 1:
        raise ctx.error("size must be a positive int")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    n, c, *spatial = x.shape
    # The channel window sum is an average pool over channels of [N, 1, C, prod(spatial)]
    # counting the pads, times size.
    squares = b.reshape(b.mul(x, x), shape=(n, 1, c, int(np.prod(spatial, dtype=np.int64))))
    mean = b.avg_pool(squares, kernel=(size, 1),
                      pads=((size - 1) // 2, 0, size // 2, 0), count_include_pad=True)
    mean = b.reshape(mean, shape=x.shape)
    return b.div(x, b.pow(b.add(b.mul(mean, alpha), bias), beta))


@converter("LpNormalization")
def lp_normalization(ctx: ConvertContext):
    b = ctx.b
    x = ctx.require(0)
    p = ctx.attr("p", 2)
    if p not in (1, 2):
        raise ctx.error(f"p must be 1 or 2, got {p}")
    axes = normalize_axes(ctx, [ctx.attr("axis", -1)], len(x.shape))
    norm = (b.reduce_l1 if p == 1 else b.reduce_l2)(x, axes=axes, keepdims=True)
    # A zero norm gives 0, not NaN.
    zero = b.eq(norm, 0.0)
    return b.where(zero, 0.0, b.div(x, b.where(zero, 1.0, norm)))


@converter("MeanVarianceNormalization")
def mean_variance_normalization(ctx: ConvertContext):
    """(x - mean) / (sqrt(variance) + 1e-9) over `axes`, as the ONNX function body."""
    b = ctx.b
    x = ctx.require(0)
    axes = normalize_axes(ctx, ctx.attr("axes", [0, 2, 3]), len(x.shape))
    mean = b.reduce_mean(x, axes=axes, keepdims=True)
    std = b.sqrt(b.reduce_var(x, axes=axes, keepdims=True))
    return b.div(b.sub(x, mean), b.add(std, 1e-9))
