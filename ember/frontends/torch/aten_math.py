"""Converters of ATen pointwise math beyond aten_pointwise.py (copysign, hypot, ldexp,
nextafter, signbit, angle) and of the running extremes and log-sum-exp (cummax, cummin,
logcumsumexp), all compositions of IR ops.
"""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import DType
from ember.frontends.torch.aten_pointwise import _opmath, _or, _signbit, op_name, require
from ember.frontends.torch.aten_tensor import reshape
from ember.frontends.torch.context import ConvertContext, aten
from ember.graph.ir import Value


# -- sign and magnitude ---------------------------------------------------------------------
@aten("copysign.Tensor", "copysign.Scalar")
def copysign(ctx: ConvertContext, x, y):
    b = ctx.b

    def formula(a, s):  # |a| with the sign bit of s (-0.0 and NaN's sign bit included)
        magnitude = b.abs(a)
        return b.where(_signbit_nan(ctx, s), b.neg(magnitude), magnitude)

    return _opmath(ctx, formula, x, y)


def _signbit_nan(ctx: ConvertContext, x: Value) -> Value:
    """The sign bit of x, NaNs included (their sign bit is read through a bitcast)."""
    bits = {DType.f32: DType.i32, DType.f64: DType.i64}.get(x.dtype)
    if bits is None:
        return _signbit(ctx.b, x)
    return ctx.b.lt(ctx.b.bitcast(x, to=bits), ctx.constant(0, bits))


@aten("signbit.default")
def signbit(ctx: ConvertContext, x):
    if x.dtype is DType.bool or not x.dtype.is_signed:
        return ctx.b.broadcast(ctx.constant(False, DType.bool), shape=x.shape) \
            if x.shape else ctx.constant(False, DType.bool)
    if not x.dtype.is_float:
        return ctx.b.lt(x, ctx.constant(0, x.dtype))
    return _signbit_nan(ctx, x if x.dtype in (DType.f32, DType.f64)
                        else ctx.b.cast(x, to=DType.f32))


@aten("angle.default")
def angle(ctx: ConvertContext, x):
    """The argument of a real number: pi for negatives, 0 otherwise, NaN for NaN."""
    b = ctx.b
    dtype = ctx.result_type().dtype
    require(ctx, dtype.is_float, f"angle with result {dtype}")
    x = ctx.as_value(x, dtype)
    out = b.where(b.lt(x, ctx.constant(0, dtype)), ctx.constant(math.pi, dtype),
                  ctx.constant(0, dtype))
    return b.where(b.isnan(x), x, out)


@aten("hypot.default")
def hypot(ctx: ConvertContext, x, y):
    """sqrt(x*x + y*y) scaled by the larger magnitude so that squares cannot overflow;
    inf wins over NaN, as C's hypot."""
    b = ctx.b

    def formula(u, v):
        u, v = b.abs(u), b.abs(v)
        big, small = b.max(u, v), b.min(u, v)
        zero = ctx.constant(0, big.dtype)
        ratio = b.where(b.eq(big, zero), zero, b.div(small, big))
        out = b.mul(big, b.sqrt(b.add(b.mul(ratio, ratio), ctx.constant(1, big.dtype))))
        return b.where(_or(b, b.isinf(u), b.isinf(v)), ctx.constant(math.inf, big.dtype), out)

    return _opmath(ctx, formula, x, y)


@aten("ldexp.Tensor")
def ldexp(ctx: ConvertContext, x, e):
    """x * 2**e, as ATen's ldexp (a multiplication by pow(2, e))."""
    dtype = ctx.result_type().dtype
    two = ctx.constant(2, dtype)
    return ctx.b.mul(ctx.as_value(x, dtype), ctx.b.pow(two, ctx.as_value(e, dtype)))


@aten("nextafter.default")
def nextafter(ctx: ConvertContext, x, y):
    """The next float after x toward y, by stepping x's bit pattern by one."""
    b = ctx.b
    bits = {DType.f32: DType.i32, DType.f64: DType.i64}.get(x.dtype)
    require(ctx, bits is not None, f"nextafter of {x.dtype}")
    y = ctx.as_value(y, x.dtype)
    if x.shape != ctx.result_type().shape:
        x = b.broadcast(x, shape=ctx.result_type().shape)
    # Away from zero (the magnitude grows) when x < y for positive x, or x > y for negative.
    up = b.eq(b.lt(x, y), b.gt(x, ctx.constant(0, x.dtype)))
    one = ctx.constant(1, bits)
    stepped = b.bitcast(b.add(b.bitcast(x, to=bits), b.where(up, one, b.neg(one))), to=x.dtype)
    tiny = ctx.constant(np.finfo(x.dtype.np).smallest_subnormal, x.dtype)
    from_zero = b.where(b.lt(y, ctx.constant(0, x.dtype)), b.neg(tiny), tiny)
    out = b.where(b.eq(x, ctx.constant(0, x.dtype)), from_zero, stepped)
    out = b.where(b.eq(x, y), y, out)
    return b.where(_or(b, b.isnan(x), b.isnan(y)), b.add(x, y), out)


# -- running extremes, logcumsumexp ---------------------------------------------------------
def _prefix_table(ctx: ConvertContext, x: Value, axis: int, fill) -> Value:
    """[..., n (i), n (j), ...]: x[j] where j <= i along `axis`, else `fill` (O(n**2),
    for the scans the IR has no op for)."""
    b, n = ctx.b, x.shape[axis]
    rows = reshape(ctx, x, x.shape[:axis] + (1,) + x.shape[axis:])
    before = np.arange(n)[:, None] >= np.arange(n)[None, :]
    mask = b.constant(before.reshape((n, n) + (1,) * (x.type.rank - axis - 1)))
    return b.where(mask, rows, ctx.constant(fill, x.dtype))


@aten("cummax.default", "cummin.default")
def cummax(ctx: ConvertContext, x, dim):
    """(running extreme, the index of its last occurrence); NaN wins from where it first
    appears, and each later NaN takes the index (ATen's kernel)."""
    b = ctx.b
    largest = op_name(ctx) == "cummax"
    if x.type.rank == 0:
        return x, ctx.constant(0, DType.i64)
    keys = b.cast(x, to=DType.u8) if x.dtype is DType.bool else x
    axis = dim % x.type.rank
    if keys.dtype.is_float:
        fill = -math.inf if largest else math.inf
    else:
        info = np.iinfo(keys.dtype.np)
        fill = info.min if largest else info.max
    table = _prefix_table(ctx, keys, axis, fill)
    values = (b.reduce_max if largest else b.reduce_min)(table, axes=(axis + 1,))
    index = (b.argmax if largest else b.argmin)(table, axis=axis + 1, select_last_index=True)
    # A tie with the fill past i means every element up to i is that extreme: the last is i.
    position = b.iota(shape=index.shape, axis=axis, dtype=DType.i64)
    index = b.min(index, position)
    return ctx.as_value(values, x.dtype), index


@aten("logcumsumexp.default")
def logcumsumexp(ctx: ConvertContext, x, dim):
    b = ctx.b
    dtype = ctx.result_type().dtype
    x = ctx.as_value(x, dtype)
    if x.type.rank == 0:
        return x
    axis = dim % x.type.rank

    def formula(v):  # log(sum_{j<=i} e**(v_j - m_i)) + m_i, m_i the running maximum
        table = _prefix_table(ctx, v, axis, -math.inf)
        m = b.reduce_max(table, axes=(axis + 1,), keepdims=True)
        finite_m = b.where(b.isinf(m), ctx.constant(0, v.dtype), m)
        total = b.reduce_sum(b.exp(b.sub(table, finite_m)), axes=(axis + 1,))
        return b.add(b.log(total), reshape(ctx, finite_m, total.shape))

    return _opmath(ctx, formula, x)


