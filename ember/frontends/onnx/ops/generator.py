"""Converters of ONNX ops that generate tensors from a few numbers: Range, EyeLike, Trilu
(a triangular mask) and the window functions."""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter, onnx_dtype
from ember.graph.ir import Value


def _scalar(ctx: ConvertContext, index: int, what: str) -> np.ndarray:
    value = ctx.const(index, what)
    if value.size != 1:
        raise ctx.error(f"{what} must be a scalar, got shape {list(value.shape)}")
    return value.reshape(())


def _offsets(b, shape: tuple[int, int]) -> Value:
    """col - row for each element of a [rows, cols] matrix (0 on the main diagonal)."""
    return b.sub(b.iota(shape=shape, axis=1), b.iota(shape=shape, axis=0))


@converter("Range")
def range_(ctx: ConvertContext):
    """start + i * delta for i < max(ceil((limit - start) / delta), 0)."""
    start, limit, delta = (_scalar(ctx, i, what) for i, what in
                           enumerate(("start", "limit", "delta")))
    dtype = ctx.require(0).dtype
    if delta == 0:
        raise ctx.error("delta must not be 0")
    if dtype.is_int:
        span, step = int(limit) - int(start), int(delta)
        count = -(-span // step)  # exact ceiling division on Python ints
    else:
        count = math.ceil((float(limit) - float(start)) / float(delta))
    count = max(count, 0)
    # f16/bf16 compute in the stash type (f32 unless stash_type says f64) and round once.
    compute = dtype
    if dtype in (DType.f16, DType.bf16):
        compute = onnx_dtype(ctx.attr("stash_type", 1), "Range's stash_type")
    b = ctx.b
    steps = b.iota(shape=(count,), dtype=compute)
    values = b.add(b.mul(steps, ctx.constant(delta, compute)), ctx.constant(start, compute))
    return values if compute == dtype else b.cast(values, to=dtype)


@converter("EyeLike")
def eye_like(ctx: ConvertContext):
    x = ctx.require(0)
    if x.type.rank != 2:
        raise ctx.error(f"the input must be 2-D, got {x.type}")
    dtype = onnx_dtype(ctx.attr("dtype"), "EyeLike's dtype") if ctx.has_attr("dtype") \
        else x.dtype
    ones = ctx.b.eq(_offsets(ctx.b, x.type.shape), ctx.attr("k", 0))
    return ones if dtype is DType.bool else ctx.b.cast(ones, to=dtype)


@converter("Trilu")
def trilu(ctx: ConvertContext):
    """Keep the elements on and above (upper=1) or below (upper=0) the k-th diagonal."""
    x, k = ctx.require(0), ctx.input(1)
    if x.type.rank < 2:
        raise ctx.error(f"the input must have rank 2 or more, got {x.type}")
    b = ctx.b
    offsets = _offsets(b, x.type.shape[-2:])
    if k is None:
        k = b.constant(np.zeros((), np.int64))
    elif k.type.rank:
        k = b.reshape(k, shape=())
    keep = b.ge(offsets, k) if ctx.attr("upper", 1) else b.le(offsets, k)
    return b.where(keep, x, 0)


# Window functions of n = 0..size-1 over the period N (size, or size - 1 when not periodic).
WINDOWS = {
    "HannWindow": lambda n, N: np.sin(np.pi * n / N) ** 2,
    "HammingWindow": lambda n, N: 25 / 46 - (21 / 46) * np.cos(2 * np.pi * n / N),
    "BlackmanWindow": lambda n, N: (0.42 - 0.5 * np.cos(2 * np.pi * n / N)
                                    + 0.08 * np.cos(4 * np.pi * n / N)),
}


@converter(*WINDOWS, since=17)
def window(ctx: ConvertContext):
    # The size decides the shape, so the whole window is known at import: a constant.
    size = int(_scalar(ctx, 0, "size"))
    if size < 0:
        raise ctx.error(f"size must not be negative, got {size}")
    period = size if ctx.attr("periodic", 1) else size - 1
    dtype = onnx_dtype(ctx.attr("output_datatype", 1), "the output_datatype")
    with np.errstate(all="ignore"):
        values = WINDOWS[ctx.op_type](np.arange(size, dtype=np.float64), period)
    return ctx.b.constant(values.astype(dtype.np))
