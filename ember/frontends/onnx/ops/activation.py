"""Converters of ONNX activations, Clip, the softmax family (Softmax, LogSoftmax, Hardmax)
and Dropout (at inference)."""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter
from ember.graph.ir import Value

FLT_MAX = float(np.finfo(np.float32).max)

# ONNX op: (Ember composite op, {attribute: ONNX default}); the attributes keep their names.
ACTIVATIONS = {
    "Relu": ("relu", {}),
    "LeakyRelu": ("leaky_relu", {"alpha": 0.01}),
    "Elu": ("elu", {"alpha": 1.0}),
    "Selu": ("selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
    "Celu": ("celu", {"alpha": 1.0}),
    "Softplus": ("softplus", {}),
    "Softsign": ("softsign", {}),
    "Mish": ("mish", {}),
    "Gelu": ("gelu", {"approximate": "none"}),
    "HardSigmoid": ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
    "HardSwish": ("hard_swish", {}),
}


@converter(*ACTIVATIONS)
def activation(ctx: ConvertContext):
    op, defaults = ACTIVATIONS[ctx.op_type]
    attrs = {name: ctx.attr(name, default) for name, default in defaults.items()}
    return getattr(ctx.b, op)(ctx.require(0), **attrs)


@converter("ThresholdedRelu")
def thresholded_relu(ctx: ConvertContext):
    x = ctx.require(0)
    return ctx.b.where(ctx.b.gt(x, ctx.attr("alpha", 1.0)), x, 0)


@converter("Swish")
def swish(ctx: ConvertContext):
    x, alpha = ctx.require(0), ctx.attr("alpha", 1.0)
    if alpha == 1.0:
        return ctx.b.silu(x)
    return ctx.b.mul(x, ctx.b.sigmoid(ctx.b.mul(x, alpha)))


@converter("Shrink")
def shrink(ctx: ConvertContext):
    """x + bias below -lambd, x - bias above lambd, else 0."""
    x = ctx.require(0)
    bias, lambd = ctx.attr("bias", 0.0), ctx.attr("lambd", 0.5)
    b = ctx.b
    # Integers compare with and shift by the float attributes in f64, then truncate back.
    wide = x if x.dtype.is_float else b.cast(x, to=DType.f64)
    y = b.where(b.lt(wide, -lambd), b.add(wide, bias),
                b.where(b.gt(wide, lambd), b.sub(wide, bias), 0))
    return y if y.dtype == x.dtype else b.cast(y, to=x.dtype)


@converter("PRelu")
def prelu(ctx: ConvertContext):
    x, slope = ctx.require(0), ctx.require(1)
    if ctx.opset < 7 and slope.type.rank == 1 and x.type.rank > 2 and \
            slope.shape[0] == x.shape[1] != 1:
        # Before opset 7 a [C] slope is per channel (axis 1), not NumPy-broadcast.
        slope = ctx.b.reshape(slope, shape=(slope.shape[0],) + (1,) * (x.type.rank - 2))
    if x.dtype.is_float:
        return ctx.b.prelu(x, slope)
    # Integer PRelu (opset 16) has no composite: spell it out.
    return ctx.b.where(ctx.b.ge(x, 0), x, ctx.b.mul(x, slope))


# -- Clip ------------------------------------------------------------------------------------

@converter("Clip")
def clip(ctx: ConvertContext):
    x = ctx.require(0)
    if ctx.opset < 11:
        # Bounds are attributes; from opset 6 on an absent one is the float32 extreme.
        default = FLT_MAX if ctx.opset >= 6 else math.inf
        return ctx.b.clip(x, min=ctx.attr("min", -default), max=ctx.attr("max", default))
    lo, hi = ctx.input(1), ctx.input(2)
    known = [None if v is None else ctx.maybe_const(i) for i, v in ((1, lo), (2, hi))]
    if x.dtype.is_float and all(v is None or k is not None for v, k in zip((lo, hi), known)):
        # Float bounds known at import: the composite, whose float attributes hold them exactly.
        lo_f = -math.inf if lo is None else float(np.asarray(known[0]).reshape(()))
        hi_f = math.inf if hi is None else float(np.asarray(known[1]).reshape(()))
        if not (math.isnan(lo_f) or math.isnan(hi_f)):
            return ctx.b.clip(x, min=lo_f, max=hi_f)
    # min(max(x, lo), hi): hi wins when lo > hi, as in ONNX.
    if lo is not None:
        x = ctx.b.max(x, lo)
    if hi is not None:
        x = ctx.b.min(x, hi)
    return x


# -- softmax family --------------------------------------------------------------------------

def _hardmax(b, x: Value, axis: int) -> Value:
    """1 at the first largest element along `axis`, 0 elsewhere."""
    index = b.argmax(x, axis=axis, keepdims=True)
    positions = b.iota(shape=x.type.shape, axis=axis, dtype=DType.i64)
    return b.cast(b.eq(positions, index), to=x.dtype)


SOFTMAX_FAMILY = {
    "Softmax": lambda b, x, axis: b.softmax(x, axis=axis),
    "LogSoftmax": lambda b, x, axis: b.log_softmax(x, axis=axis),
    "Hardmax": _hardmax,
}


@converter(*SOFTMAX_FAMILY)
def softmax_family(ctx: ConvertContext):
    x, fn = ctx.require(0), SOFTMAX_FAMILY[ctx.op_type]
    rank = x.type.rank
    axis = ctx.attr("axis", -1 if ctx.opset >= 13 else 1)
    if not -rank <= axis < max(rank, 1):
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    if ctx.opset >= 13:
        return fn(ctx.b, x, axis)
    # Before opset 13 the input is coerced to 2-D [prod(dims[:axis]), prod(dims[axis:])]
    # and the op works along all of axes axis.. at once.
    shape = x.type.shape
    flat = ctx.b.reshape(x, shape=(math.prod(shape[:axis]), math.prod(shape[axis:])))
    return ctx.b.reshape(fn(ctx.b, flat, 1), shape=shape)


# -- Dropout ---------------------------------------------------------------------------------

@converter("Dropout")
def dropout(ctx: ConvertContext):
    """Identity at inference; the mask output (if used) keeps every element."""
    x = ctx.require(0)
    if ctx.opset >= 12 and ctx.input(2) is not None:
        training = ctx.maybe_const(2)
        ratio = ctx.maybe_const(1) if ctx.input(1) is not None else np.asarray(0.5)
        if training is None:
            raise ctx.unsupported("training_mode must be a constant")
        if bool(training) and (ratio is None or float(ratio) != 0.0):
            raise ctx.unsupported("Dropout in training mode is random")
    if not ctx.output_used(1):
        return [x]
    # The mask is bool from opset 10 on, of the data's type before.
    mask_dtype = DType.bool if ctx.opset >= 10 else x.dtype
    mask = ctx.b.broadcast(ctx.b.constant(np.ones((), mask_dtype.np)), shape=x.type.shape)
    return [x, mask]
