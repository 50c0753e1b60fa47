"""Converters of core ATen pointwise ops: arithmetic, comparisons, logic and bit ops, unary
math, clamps, `where` and activations (copies, casts and creation: aten_creation.py).

Type promotion is PyTorch's: every converter computes in the dtype PyTorch recorded for
the result (`ctx.result_type()`), comparisons in the promoted dtype of their operands.
Where ATen's kernel evaluates a formula of several steps on f16/bf16 it computes in f32
("opmath") and rounds once; `_opmath` does the same, so the results agree bit for bit
more often than per-op rounding would.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import ml_dtypes
import numpy as np

from ember.dtypes import DType
from ember.frontends.torch.context import ConvertContext, aten, overload_name
from ember.graph.ir import Value

HALF = frozenset({DType.f16, DType.bf16})


# -- helpers -------------------------------------------------------------------------------
def op_name(ctx: ConvertContext) -> str:
    """The op's name without the overload: "add" for aten.add.Tensor."""
    return overload_name(ctx.node.target).split(".")[0]


def _result(ctx: ConvertContext, x: Value) -> Value:
    """`x` cast to the node's result dtype."""
    return ctx.as_value(x, ctx.result_type().dtype)


def _opmath(ctx: ConvertContext, fn: Callable[..., Value], *xs) -> Value:
    """fn(*xs) with the operands (tensors or scalars) in the result's compute dtype (f32 for
    f16/bf16, as ATen's opmath), rounded to the result dtype once at the end."""
    compute = ctx.result_type().dtype.compute
    return _result(ctx, fn(*(ctx.as_value(x, compute) for x in xs)))


def _arith(ctx: ConvertContext, fn: Callable[..., Value], *xs) -> Value:
    """fn(*xs) in the result dtype; on f16/bf16 with a scalar (or wider) operand in f32, as
    ATen's opmath, which keeps such an operand unrounded."""
    dtype = ctx.result_type().dtype
    if dtype in HALF and any(not (isinstance(x, Value) and x.dtype is dtype) for x in xs):
        return _opmath(ctx, fn, *xs)
    return fn(*(ctx.as_value(x, dtype) for x in xs))


def _scalar_in(value, dtype: DType):
    """A Python scalar rounded to `dtype`, as ATen does before using it in some kernels."""
    return np.asarray(value, dtype.np).item() if isinstance(value, float) else value


def require(ctx: ConvertContext, ok: bool, why: str) -> None:
    if not ok:
        raise ctx.unsupported(why)


def _signbit(b, x: Value) -> Value:
    """x < 0, or x is -0.0 (1 / -0.0 is -inf)."""
    return _or(b, b.lt(x, 0), b.lt(b.reciprocal(x), 0))


def _or(b, x: Value, y: Value) -> Value:
    return b.op("or", [x, y]).result


def _and(b, x: Value, y: Value) -> Value:
    return b.op("and", [x, y]).result


def _not(b, x: Value) -> Value:
    return b.op("not", [x]).result


def _bool(ctx: ConvertContext, x) -> Value:
    """x != 0 as bool (NaN is true), the truth value ATen's logical ops use."""
    return ctx.as_value(x, DType.bool)


# -- add, sub, mul, div, pow ---------------------------------------------------------------
@aten("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar")
def add_sub(ctx: ConvertContext, x, y, alpha=1):
    dtype = ctx.result_type().dtype
    op = op_name(ctx)
    if dtype is DType.bool:  # bool + bool is `or` (ATen refuses bool subtraction)
        require(ctx, op == "add" and bool(alpha), "bool subtraction or alpha=0")
        return _or(ctx.b, _bool(ctx, x), _bool(ctx, y))
    # ATen rounds a scalar operand and alpha to the tensor's dtype, then computes
    # x + alpha * y in opmath: one rounding for f16 and bf16.
    x, y, alpha = (_scalar_in(v, dtype) for v in (x, y, alpha))
    if alpha == 1:
        return getattr(ctx.b, op)(ctx.as_value(x, dtype), ctx.as_value(y, dtype))
    return _opmath(ctx, lambda a, c, k: getattr(ctx.b, op)(a, ctx.b.mul(c, k)), x, y, alpha)


@aten("mul.Tensor", "mul.Scalar")
def mul(ctx: ConvertContext, x, y):
    if ctx.result_type().dtype is DType.bool:
        return _and(ctx.b, _bool(ctx, x), _bool(ctx, y))
    return _arith(ctx, ctx.b.mul, x, y)


def _floor_div(b, x: Value, y: Value) -> Value:
    """Python's floor division, as ATen's div_floor: from fmod, so that 1 // 0.1 is 9."""
    if x.dtype.is_int:
        q = b.div(x, y)  # truncates
        if not x.dtype.is_signed:
            return q
        r = b.fmod(x, y)
        adjust = _and(b, b.ne(r, 0), b.ne(b.lt(r, 0), b.lt(y, 0)))
        return b.sub(q, b.cast(adjust, to=x.dtype))
    mod = b.fmod(x, y)
    div = b.div(b.sub(x, mod), y)
    div = b.where(_and(b, b.ne(mod, 0), b.ne(b.lt(y, 0), b.lt(mod, 0))), b.sub(div, 1), div)
    floor = b.floor(div)
    floor = b.where(b.gt(b.sub(div, floor), 0.5), b.add(floor, 1), floor)
    true_div = b.div(x, y)
    floor = b.where(b.eq(div, 0), b.mul(true_div, 0), floor)  # a signed zero, as a / b's
    return b.where(b.eq(y, 0), true_div, floor)  # x / 0 is the IEEE result


@aten("div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode")
def div(ctx: ConvertContext, x, y, rounding_mode=None):
    b, dtype = ctx.b, ctx.result_type().dtype
    if rounding_mode is None:
        return _arith(ctx, b.div, x, y)
    if rounding_mode == "trunc":
        if dtype.is_int:
            return b.div(ctx.as_value(x, dtype), ctx.as_value(y, dtype))
        return _opmath(ctx, lambda a, c: b.trunc(b.div(a, c)), x, y)
    require(ctx, rounding_mode == "floor", f"rounding_mode {rounding_mode!r}")
    require(ctx, dtype is not DType.bool, "floor division of bools")
    return _opmath(ctx, lambda a, c: _floor_div(b, a, c), x, y)


# pow(x, k) for these k is computed as ATen's pow_tensor_scalar_optimized_kernel does.
_POW_SPECIAL = {
    2: lambda b, x: b.mul(x, x),
    3: lambda b, x: b.mul(b.mul(x, x), x),
    0.5: lambda b, x: b.sqrt(x),
    -0.5: lambda b, x: b.rsqrt(x),
    -1: lambda b, x: b.reciprocal(x),
    -2: lambda b, x: b.reciprocal(b.mul(x, x)),
}


@aten("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar")
def pow_(ctx: ConvertContext, x, y):
    dtype = ctx.result_type().dtype
    require(ctx, dtype is not DType.bool, "pow of bools")
    if isinstance(y, (int, float)) and not isinstance(y, bool) and dtype.is_float \
            and y in _POW_SPECIAL:
        return _POW_SPECIAL[y](ctx.b, ctx.as_value(x, dtype))
    return _arith(ctx, ctx.b.pow, x, y)


# -- remainders, extremes, atan2 -----------------------------------------------------------
@aten("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor",
      "fmod.Tensor", "fmod.Scalar")
def remainder(ctx: ConvertContext, x, y):
    # remainder takes the sign of the divisor (Python's %, the IR's mod), fmod of the dividend.
    # A scalar operand is rounded to the tensor's dtype first (unlike in div and pow).
    op, dtype = "mod" if op_name(ctx) == "remainder" else "fmod", ctx.result_type().dtype
    return getattr(ctx.b, op)(*(ctx.as_value(_scalar_in(v, dtype), dtype) for v in (x, y)))


@aten("maximum.default", "minimum.default", "fmax.default", "fmin.default")
def extreme(ctx: ConvertContext, x, y):
    b, dtype = ctx.b, ctx.result_type().dtype
    name = op_name(ctx)
    x, y = ctx.as_value(x, dtype), ctx.as_value(y, dtype)
    if dtype is DType.bool:
        return (_or if name in ("maximum", "fmax") else _and)(b, x, y)
    out = (b.max if name in ("maximum", "fmax") else b.min)(x, y)  # NaN wins, as maximum's
    if name.startswith("f") and dtype.is_float:  # fmax/fmin: a NaN loses to a number
        out = b.where(b.isnan(x), y, b.where(b.isnan(y), x, out))
    return out


def _atan2(b, y: Value, x: Value) -> Value:
    """atan2 from atan(y / x) with the quadrant from the signs (signed zeros included)."""
    def const(v):
        return b.constant(np.asarray(v, y.dtype.np))

    pi = b.where(_signbit(b, y), const(-math.pi), const(math.pi))
    out = b.atan(b.div(y, x))
    out = b.where(_signbit(b, x), b.add(out, pi), out)  # the left half-plane
    zeros = _and(b, b.eq(x, 0), b.eq(y, 0))  # 0 / 0 is NaN: atan2 gives +-0 or +-pi
    out = b.where(zeros, b.where(_signbit(b, x), pi, y), out)
    infs = _and(b, b.isinf(x), b.isinf(y))  # inf / inf is NaN: atan2 gives +-pi/4 or 3pi/4
    corner = b.where(_signbit(b, x), const(3 * math.pi / 4), const(math.pi / 4))
    return b.where(infs, b.where(_signbit(b, y), b.neg(corner), corner), out)


@aten("atan2.default")
def atan2(ctx: ConvertContext, y, x):
    return _opmath(ctx, lambda a, c: _atan2(ctx.b, a, c), y, x)


# -- comparisons, logic, bits --------------------------------------------------------------
@aten(*(f"{op}.{kind}" for op in ("eq", "ne", "lt", "le", "gt", "ge")
        for kind in ("Tensor", "Scalar")))
def compare(ctx: ConvertContext, x, y):
    dtype = ctx.promoted(*ctx.node.args[:2])
    op = op_name(ctx)
    if dtype is DType.bool and op not in ("eq", "ne"):
        dtype = DType.u8  # the IR orders numbers only; False < True as 0 < 1
    return _result(ctx, getattr(ctx.b, op)(ctx.as_value(x, dtype), ctx.as_value(y, dtype)))


_LOGICAL = {"logical_and": "and", "logical_or": "or", "logical_xor": "xor"}


@aten(*(f"{name}.default" for name in _LOGICAL))
def logical(ctx: ConvertContext, x, y):
    op = _LOGICAL[op_name(ctx)]
    return _result(ctx, ctx.b.op(op, [_bool(ctx, x), _bool(ctx, y)]).result)


@aten("logical_not.default")
def logical_not(ctx: ConvertContext, x):
    return _result(ctx, _not(ctx.b, _bool(ctx, x)))


@aten(*(f"bitwise_{op}.{kind}" for op in ("and", "or", "xor")
        for kind in ("Tensor", "Scalar", "Scalar_Tensor")))
def bitwise(ctx: ConvertContext, x, y):
    dtype = ctx.result_type().dtype
    require(ctx, dtype.is_int or dtype is DType.bool, f"bitwise ops on {dtype}")
    op = op_name(ctx)
    return getattr(ctx.b, op)(ctx.as_value(x, dtype), ctx.as_value(y, dtype))


@aten("bitwise_not.default")
def bitwise_not(ctx: ConvertContext, x):
    return _not(ctx.b, x) if x.dtype is DType.bool else ctx.b.bitwise_not(x)


_LEFT_SHIFTS = ("bitwise_left_shift.Tensor", "bitwise_left_shift.Tensor_Scalar",
                "bitwise_left_shift.Scalar_Tensor", "__lshift__.Tensor", "__lshift__.Scalar")
_RIGHT_SHIFTS = tuple(name.replace("left", "right").replace("__l", "__r")
                      for name in _LEFT_SHIFTS)


@aten(*_LEFT_SHIFTS, *_RIGHT_SHIFTS)
def shift(ctx: ConvertContext, x, y):
    b, dtype = ctx.b, ctx.result_type().dtype
    require(ctx, dtype.is_int, f"shifts of {dtype}")
    x, y = ctx.as_value(x, dtype), ctx.as_value(y, dtype)
    bits = dtype.itemsize * 8
    # ATen: a shift by a negative amount or by >= the width gives 0, or the sign for >>.
    out_of_range = b.ge(y, bits)
    if dtype.is_signed:
        out_of_range = _or(b, out_of_range, b.lt(y, 0))
    y = b.where(out_of_range, 0, y)  # keeps the shift itself defined
    if op_name(ctx) in ("bitwise_left_shift", "__lshift__"):
        return b.where(out_of_range, 0, b.shl(x, y))
    fill = b.shr(x, bits - 1) if dtype.is_signed else ctx.constant(0, dtype)
    return b.where(out_of_range, fill, b.shr(x, y))


# -- unary math ----------------------------------------------------------------------------
# Ops whose result is always floating: an integer operand is cast first (exp(int) is float).
FLOAT_UNARY = ("exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos",
               "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
               "atanh", "erf", "sigmoid")


@aten(*(f"{op}.default" for op in FLOAT_UNARY))
def float_unary(ctx: ConvertContext, x):
    op = op_name(ctx)
    return getattr(ctx.b, op)(_result(ctx, x))


@aten("abs.default", "neg.default", "sign.default", "sgn.default")
def signed_unary(ctx: ConvertContext, x):
    op = op_name(ctx)
    if x.dtype is DType.bool:
        require(ctx, op in ("sign", "sgn"), f"{op} of bools")
        return x
    if op == "neg" and not x.dtype.is_signed:
        return ctx.b.sub(ctx.constant(0, x.dtype), x)  # wraps around, as ATen's
    if op in ("sign", "sgn") and x.dtype.is_float:  # ATen: (0 < x) - (x < 0), 0 for NaN
        return ctx.b.where(ctx.b.isnan(x), ctx.constant(0, x.dtype), ctx.b.sign(x))
    return getattr(ctx.b, op)(x)


@aten("floor.default", "ceil.default", "round.default", "trunc.default")
def rounding(ctx: ConvertContext, x):
    if not x.dtype.is_float:
        return x  # integers are already whole
    return getattr(ctx.b, op_name(ctx))(x)


@aten("round.decimals")
def round_decimals(ctx: ConvertContext, x, decimals=0):
    b = ctx.b
    require(ctx, x.dtype.is_float, f"round with decimals of {x.dtype}")
    scale = 10.0 ** abs(decimals)
    if decimals < 0:  # ATen's formula, in opmath
        return _opmath(ctx, lambda v: b.mul(b.round(b.div(v, scale)), scale), x)
    return _opmath(ctx, lambda v: b.div(b.round(b.mul(v, scale)), scale), x)


# exp2, log2 and log10 from exp and log: within an ulp or two of ATen's dedicated kernels.
_FROM_EXP_LOG = {
    "exp2": lambda b, x: b.pow(b.constant(np.asarray(2, x.dtype.np)), x),
    "log2": lambda b, x: b.div(b.log(x), math.log(2)),
    "log10": lambda b, x: b.div(b.log(x), math.log(10)),
    "frac": lambda b, x: b.sub(x, b.trunc(x)),
}


@aten(*(f"{op}.default" for op in _FROM_EXP_LOG))
def exp_log(ctx: ConvertContext, x):
    fn = _FROM_EXP_LOG[op_name(ctx)]
    require(ctx, ctx.result_type().dtype.is_float, "frac of integers")
    return _opmath(ctx, lambda v: fn(ctx.b, v), x)


@aten("isnan.default", "isinf.default", "isfinite.default")
def classify(ctx: ConvertContext, x):
    op = op_name(ctx)
    if not x.dtype.is_float:  # integers are finite numbers
        return filled(ctx, op == "isfinite")
    if op == "isfinite":
        return _not(ctx.b, _or(ctx.b, ctx.b.isnan(x), ctx.b.isinf(x)))
    return getattr(ctx.b, op)(x)


@aten("nan_to_num.default")
def nan_to_num(ctx: ConvertContext, x, nan=None, posinf=None, neginf=None):
    if not x.dtype.is_float:
        return x
    b, info = ctx.b, ml_dtypes.finfo(x.dtype.np)
    x = b.where(b.isnan(x), ctx.constant(0.0 if nan is None else nan, x.dtype), x)
    big = ctx.constant(info.max if posinf is None else posinf, x.dtype)
    small = ctx.constant(info.min if neginf is None else neginf, x.dtype)
    return b.where(b.isinf(x), b.where(b.gt(x, 0), big, small), x)


# -- clamps, where, masked_fill ------------------------------------------------------------
def _clamp(ctx: ConvertContext, x, lo, hi) -> Value:
    """min(max(x, lo), hi): NaN in x or a bound propagates and hi wins over lo, as ATen's."""
    dtype = ctx.result_type().dtype
    require(ctx, dtype is not DType.bool, "clamp of bools")
    x = ctx.as_value(x, dtype)
    if lo is not None:
        x = ctx.b.max(x, ctx.as_value(lo, dtype))
    if hi is not None:
        x = ctx.b.min(x, ctx.as_value(hi, dtype))
    return x


@aten("clamp.default", "clamp.Tensor")
def clamp(ctx: ConvertContext, x, min=None, max=None):
    return _clamp(ctx, x, min, max)


@aten("clamp_min.default", "clamp_min.Tensor")
def clamp_min(ctx: ConvertContext, x, min):
    return _clamp(ctx, x, min, None)


@aten("clamp_max.default", "clamp_max.Tensor")
def clamp_max(ctx: ConvertContext, x, max):
    return _clamp(ctx, x, None, max)


@aten("hardtanh.default")
def hardtanh(ctx: ConvertContext, x, min_val=-1, max_val=1):
    return _clamp(ctx, x, min_val, max_val)


@aten("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def where(ctx: ConvertContext, cond, x, y):
    dtype = ctx.result_type().dtype
    return ctx.b.where(_bool(ctx, cond), ctx.as_value(x, dtype), ctx.as_value(y, dtype))


@aten("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(ctx: ConvertContext, x, mask, value):
    return ctx.b.where(_bool(ctx, mask), ctx.as_value(value, x.dtype), x)


# -- activations ---------------------------------------------------------------------------
@aten("relu.default")
def relu(ctx: ConvertContext, x):
    require(ctx, x.dtype is not DType.bool, "relu of bools")
    return ctx.b.relu(x)


@aten("silu.default", "mish.default")
def float_activation(ctx: ConvertContext, x):
    return getattr(ctx.b, op_name(ctx))(x)


@aten("gelu.default")
def gelu(ctx: ConvertContext, x, approximate="none"):
    return ctx.b.gelu(x, approximate=approximate)


@aten("leaky_relu.default")
def leaky_relu(ctx: ConvertContext, x, negative_slope=0.01):
    return ctx.b.leaky_relu(x, alpha=float(negative_slope))


@aten("elu.default")
def elu(ctx: ConvertContext, x, alpha=1, scale=1, input_scale=1):
    b = ctx.b
    if scale == 1 and input_scale == 1:
        return b.elu(x, alpha=float(alpha))
    # selu and celu arrive as elu with scales; ATen's formula, in opmath.
    return _opmath(ctx, lambda v: b.where(b.gt(v, 0), b.mul(v, scale), b.mul(
        b.expm1(b.mul(v, input_scale)), alpha * scale)), x)


@aten("softplus.default")
def softplus(ctx: ConvertContext, x, beta=1, threshold=20):
    b = ctx.b

    def formula(v):  # ATen: x where beta * x > threshold, else log1p(exp(beta * x)) / beta
        scaled = b.mul(v, beta) if beta != 1 else v
        soft = b.log1p(b.exp(scaled))
        return b.where(b.gt(scaled, threshold), v, b.div(soft, beta) if beta != 1 else soft)

    return _opmath(ctx, formula, x)


@aten("hardsigmoid.default", "hardswish.default")
def hard(ctx: ConvertContext, x):
    b = ctx.b
    swish = op_name(ctx) == "hardswish"

    def formula(v):  # ATen: min(max(x + 3, 0), 6) / 6, times x for hardswish
        relu6 = b.min(b.max(b.add(v, 3), 0), 6)
        return b.div(b.mul(v, relu6), 6) if swish else b.div(relu6, 6)

    return _opmath(ctx, formula, x)


@aten("log_sigmoid_forward.default")
def log_sigmoid_forward(ctx: ConvertContext, x):
    # The buffer only feeds the backward; an inference graph never reads it.
    if any(u.target is operator.getitem and u.args[1] == 1 and u.users for u in ctx.node.users):
        raise ctx.unsupported("the graph reads log_sigmoid's backward buffer")
    buffer = ctx.result_type(1)
    zeros = ctx.b.broadcast(ctx.constant(0, buffer.dtype), shape=buffer.shape)
    return ctx.b.log_sigmoid(x), zeros


# -- tensors filled with one value ---------------------------------------------------------
def filled(ctx: ConvertContext, value) -> Value:
    """A tensor of the node's result type with every element `value` (a number or a 0-d
    Value), as one scalar broadcast rather than a constant of the full size."""
    t = ctx.result_type()
    v = ctx.as_value(value, t.dtype)
    return v if v.type.shape == t.shape else ctx.b.broadcast(v, shape=t.shape)
