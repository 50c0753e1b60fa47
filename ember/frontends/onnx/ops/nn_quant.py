"""Converters of ONNX quantization ops: QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.

Scales and zero points are per tensor (one element), per axis (a vector along `axis`) or
blocked (opset 21: a tensor like x with `axis` shrunk by block_size); `quant_param` shapes
each to broadcast against x. Integer arithmetic is exact: matrix products run in i32,
convolutions (float-only in the IR) on integer-valued f64.
"""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import DType, from_numpy
from ember.frontends.onnx.context import ConvertContext, converter, onnx_dtype
from ember.frontends.onnx.ops.nn_conv import operands, per_channel, window_geometry
from ember.graph.ir import Value

QUANT_TYPES = (DType.u8, DType.i8, DType.u16, DType.i16)


def quant_param(ctx: ConvertContext, v: Value | None, x: Value, axis: int,
                block_size: int = 0) -> Value | None:
    """A scale or zero point shaped to broadcast against x."""
    b = ctx.b
    if v is None:
        return None
    rank = len(x.shape)
    if math.prod(v.shape) == 1:
        return b.reshape(v, shape=()) if v.shape else v
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    if not block_size:
        if v.shape != (x.shape[axis],):
            raise ctx.error(f"a per-axis parameter must have shape [{x.shape[axis]}], got"
                            f" {v.type}")
        return b.reshape(v, shape=tuple(x.shape[axis] if i == axis else 1 for i in range(rank)))
    # Blocked: repeat each entry block_size times along axis, cut to x's length.
    blocks = -(-x.shape[axis] // block_size)
    if v.shape != tuple(blocks if i == axis else d for i, d in enumerate(x.shape)):
        raise ctx.error(f"a blocked parameter for {x.type} with block_size {block_size} must"
                        f" have {blocks} entries on axis {axis}, got {v.type}")
    lead, rest = v.shape[:axis + 1], v.shape[axis + 1:]
    v = b.broadcast(b.reshape(v, shape=(*lead, 1, *rest)), shape=(*lead, block_size, *rest))
    v = b.reshape(v, shape=(*lead[:-1], blocks * block_size, *rest))
    if blocks * block_size != x.shape[axis]:
        v = b.slice(v, starts=(0,) * rank, ends=x.shape, steps=(1,) * rank)
    return v


def to(b, v: Value, dtype: DType) -> Value:
    return v if v.dtype is dtype else b.cast(v, to=dtype)


def promote(*dtypes: DType) -> DType:
    return from_numpy(np.result_type(*(d.np for d in dtypes)))


def saturate(b, y: Value, dtype: DType) -> Value:
    """Round a float y half to even and clip it to dtype's range, in dtype."""
    info = np.iinfo(dtype.np)
    return to(b, b.clip(b.round(y), min=float(info.min), max=float(info.max)), dtype)


@converter("QuantizeLinear", since=10)
def quantize_linear(ctx: ConvertContext):
    """saturate(round(x / scale) + zero_point)"""
    b = ctx.b
    x, scale, zp = ctx.require(0), ctx.require(1), ctx.input(2)
    axis, block = ctx.attr("axis", 1), ctx.attr("block_size", 0)
    if zp is not None:
        out = zp.dtype
    elif ctx.attr("output_dtype", 0):
        out = onnx_dtype(ctx.attr("output_dtype"), "output_dtype")
    else:
        out = DType.u8
    if out not in QUANT_TYPES:
        raise ctx.unsupported(f"quantizing to {out}")
    precision = ctx.attr("precision", 0)
    compute = onnx_dtype(precision, "precision") if precision else promote(x.dtype, scale.dtype)
    scale = quant_param(ctx, scale, x, axis, block)
    q = b.round(b.div(to(b, x, compute), to(b, scale, compute)))
    # Add the zero point in a float that holds every quantized value exactly.
    wide = DType.f64 if compute is DType.f64 else DType.f32
    q = to(b, q, wide)
    if zp is not None:
        q = b.add(q, to(b, quant_param(ctx, zp, x, axis, block), wide))
    return saturate(b, q, out)


@converter("DequantizeLinear", since=10)
def dequantize_linear(ctx: ConvertContext):
    """(x - zero_point) * scale, computed in f32 (or wider) like ONNX's reference."""
    b = ctx.b
    x, scale, zp = ctx.require(0), ctx.require(1), ctx.input(2)
    axis, block = ctx.attr("axis", 1), ctx.attr("block_size", 0)
    out = (onnx_dtype(ctx.attr("output_dtype"), "output_dtype") if ctx.attr("output_dtype", 0)
           else scale.dtype)
    if x.dtype not in (*QUANT_TYPES, DType.i32):
        raise ctx.unsupported(f"dequantizing {x.dtype}")
    compute = promote(DType.f32, scale.dtype)
    y = to(b, x, compute)
    if zp is not None:
        y = b.sub(y, to(b, quant_param(ctx, zp, x, axis, block), compute))
    y = b.mul(y, to(b, quant_param(ctx, scale, x, axis, block), compute))
    return to(b, y, out)


@converter("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(ctx: ConvertContext):
    """u8 quantization with the scale and zero point that map [min(x, 0), max(x, 0)]
    onto [0, 255]."""
    b = ctx.b
    x = ctx.require(0)
    wide = to(b, x, DType.f32)
    axes = tuple(range(len(x.shape)))
    hi = b.max(b.reduce_max(wide, axes=axes), 0.0)
    lo = b.min(b.reduce_min(wide, axes=axes), 0.0)
    span = b.sub(hi, lo)
    scale = b.div(b.where(b.eq(span, 0.0), 1.0, span), 255.0)
    zp = b.round(b.clip(b.neg(b.div(lo, scale)), min=0.0, max=255.0))
    y = saturate(b, b.add(b.round(b.div(wide, scale)), zp), DType.u8)
    return [y, to(b, scale, x.dtype), to(b, zp, DType.u8)]


# -- integer and quantized products ---------------------------------------------------------


def centered(ctx: ConvertContext, v: Value, zp: Value | None, dtype: DType,
             row_axis: int | None = None) -> Value:
    """v - zero_point in dtype. A vector zero point is per row (row_axis) or per
    trailing entry."""
    b = ctx.b
    v = to(b, v, dtype)
    if zp is None:
        return v
    if math.prod(zp.shape) == 1:
        zp = b.reshape(zp, shape=())
    elif len(zp.shape) == 1 and row_axis is not None:
        shape = [1] * len(v.shape)
        shape[row_axis] = zp.shape[0]
        zp = b.reshape(zp, shape=tuple(shape))
    return b.sub(v, to(b, zp, dtype))


@converter("MatMulInteger", since=10)
def matmul_integer(ctx: ConvertContext):
    a, w = ctx.require(0), ctx.require(1)
    # A's zero point is per row (axis -2), B's per column (the last axis).
    a = centered(ctx, a, ctx.input(2), DType.i32, row_axis=len(a.shape) - 2
                 if len(a.shape) >= 2 else None)
    return ctx.b.matmul(a, centered(ctx, w, ctx.input(3), DType.i32))


@converter("ConvInteger", since=10)
def conv_integer(ctx: ConvertContext):
    b = ctx.b
    x, w = ctx.require(0), ctx.require(1)
    # Integer sums are exact in f64 (the IR conv is float-only); padding adds zeros after
    # the zero point is taken off, as in ONNX's reference.
    xf = centered(ctx, x, ctx.input(2), DType.f64)
    wf = centered(ctx, w, ctx.input(3), DType.f64, row_axis=0)
    _, strides, pads, dilations = window_geometry(ctx, x, w.shape[2:])
    y = b.conv(xf, wf, strides=strides, pads=pads, dilations=dilations,
               groups=ctx.attr("group", 1))
    return b.cast(y, to=DType.i32)


def requantize(ctx: ConvertContext, acc: Value, multiplier: Value, y_zp: Value | None,
               out: DType) -> Value:
    """saturate(acc * multiplier + y_zero_point): an integer accumulator back to `out`."""
    b = ctx.b
    if out not in QUANT_TYPES:  # (a float y_zero_point, or float inputs)
        raise ctx.error(f"the quantized output must be one of"
                        f" {', '.join(str(t) for t in QUANT_TYPES)}, not {out}")
    y = b.mul(to(b, acc, DType.f32), to(b, multiplier, DType.f32))
    if y_zp is not None:
        y = b.add(y, to(b, b.reshape(y_zp, shape=()) if y_zp.shape else y_zp, DType.f32))
    return saturate(b, y, out)


def scalar_param(ctx: ConvertContext, i: int) -> Value:
    v = ctx.require(i)
    if math.prod(v.shape) != 1:
        raise ctx.unsupported(f"input {i} must be a single value (per-tensor quantization)")
    return ctx.b.reshape(v, shape=()) if v.shape else v


@converter("QLinearMatMul", since=10)
def qlinear_matmul(ctx: ConvertContext):
    b = ctx.b
    a, w = ctx.require(0), ctx.require(3)
    acc = b.matmul(centered(ctx, a, ctx.input(2), DType.i32),
                   centered(ctx, w, ctx.input(5), DType.i32))
    scale = b.div(b.mul(scalar_param(ctx, 1), scalar_param(ctx, 4)), scalar_param(ctx, 6))
    y_zp = ctx.input(7)
    return requantize(ctx, acc, scale, y_zp, y_zp.dtype if y_zp is not None else a.dtype)


@converter("QLinearConv", since=10)
def qlinear_conv(ctx: ConvertContext):
    b = ctx.b
    x, w, bias = ctx.require(0), ctx.require(3), ctx.input(8)
    xf = centered(ctx, x, ctx.input(2), DType.f32)
    wf = centered(ctx, w, ctx.input(5), DType.f32, row_axis=0)
    _, strides, pads, dilations = window_geometry(ctx, x, w.shape[2:])
    bias = None if bias is None else to(b, bias, DType.f32)
    acc = b.conv(*operands(xf, wf, bias), strides=strides, pads=pads, dilations=dilations,
                 groups=ctx.attr("group", 1))
    # The weight scale is per tensor or per output channel.
    w_scale = ctx.require(4)
    if math.prod(w_scale.shape) == 1:
        w_scale = scalar_param(ctx, 4)
    else:
        w_scale = per_channel(b, w_scale, len(x.shape))
    scale = b.div(b.mul(scalar_param(ctx, 1), w_scale), scalar_param(ctx, 6))
    y_zp = ctx.input(7)
    return requantize(ctx, acc, scale, y_zp, y_zp.dtype if y_zp is not None else x.dtype)
