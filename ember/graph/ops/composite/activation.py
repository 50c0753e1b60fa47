"""Composite activations (relu, gelu, silu, ...) and softmax / log_softmax."""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import FLOAT_TYPES, DType, from_numpy
from ember.errors import ShapeError
from ember.graph.ir import Value
from ember.graph.ops.common import (
    broadcastable_to,
    normalize_axis,
    require_dtype,
    same_dtype,
)
from ember.graph.ops.composite.base import (
    FLOAT_OR_INT,
    composite,
    finite,
    float_unary_infer,
    in_f32,
    scalar,
)
from ember.graph.ops.elementwise import erf
from ember.graph.ops.registry import Attr


# -- activations ---------------------------------------------------------------------------
def _sigmoid_np(x):
    e = np.exp(-np.abs(x))  # split by sign so that exp never overflows, as `sigmoid` does
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus_np(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _hard_sigmoid_np(x, alpha, beta):
    return np.minimum(np.maximum(x * alpha + beta, 0), 1)


def _gelu_np(x, approximate):
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x))
        return 0.5 * x * (1 + np.tanh(inner))
    return 0.5 * x * (1 + erf(x * (1 / math.sqrt(2))))


def _relu_dec(b, ops, attrs):
    return [b.max(ops[0], 0)]


@in_f32
def _leaky_relu_dec(b, ops, attrs):
    (x,) = ops
    return [b.where(b.ge(x, 0), x, b.mul(x, attrs["alpha"]))]


@in_f32
def _elu_dec(b, ops, attrs):
    (x,) = ops
    return [b.where(b.gt(x, 0), x, b.mul(b.expm1(x), attrs["alpha"]))]


@in_f32
def _selu_dec(b, ops, attrs):
    (x,) = ops
    y = b.where(b.gt(x, 0), x, b.mul(b.expm1(x), attrs["alpha"]))
    return [b.mul(y, attrs["gamma"])]


@in_f32
def _celu_dec(b, ops, attrs):
    (x,) = ops
    alpha = attrs["alpha"]
    return [b.where(b.gt(x, 0), x, b.mul(b.expm1(b.div(x, alpha)), alpha))]


def _check_celu(attrs):
    finite("alpha")(attrs)
    if attrs["alpha"] == 0:
        raise ShapeError("alpha must not be 0")


@in_f32
def _softplus_dec(b, ops, attrs):
    # max(x, 0) + log1p(exp(-|x|)): exp never overflows.
    (x,) = ops
    return [b.add(b.max(x, 0), b.log1p(b.exp(b.neg(b.abs(x)))))]


@in_f32
def _log_sigmoid_dec(b, ops, attrs):
    (x,) = ops
    return [b.sub(b.min(x, 0), b.log1p(b.exp(b.neg(b.abs(x)))))]


@in_f32
def _softsign_dec(b, ops, attrs):
    (x,) = ops
    return [b.div(x, b.add(b.abs(x), 1))]


@in_f32
def _mish_dec(b, ops, attrs):
    (x,) = ops
    return [b.mul(x, b.tanh(b.softplus(x)))]


@in_f32
def _gelu_dec(b, ops, attrs):
    (x,) = ops
    if attrs["approximate"] == "tanh":
        cube = b.mul(b.mul(x, x), x)
        inner = b.mul(b.add(x, b.mul(cube, 0.044715)), math.sqrt(2 / math.pi))
        return [b.mul(b.mul(x, 0.5), b.add(b.tanh(inner), 1))]
    return [b.mul(b.mul(x, 0.5), b.add(b.erf(b.mul(x, 1 / math.sqrt(2))), 1))]


@in_f32
def _silu_dec(b, ops, attrs):
    (x,) = ops
    return [b.mul(x, b.sigmoid(x))]


@in_f32
def _hard_sigmoid_dec(b, ops, attrs):
    (x,) = ops
    y = b.add(b.mul(x, attrs["alpha"]), attrs["beta"])
    return [b.min(b.max(y, 0), 1)]


@in_f32
def _hard_swish_dec(b, ops, attrs):
    (x,) = ops
    return [b.mul(x, b.hard_sigmoid(x, alpha=1 / 6, beta=0.5))]


def _clip_bounds(dtype: DType, lo: float, hi: float):
    """The bounds to apply to `dtype` values, each None when it clips nothing."""
    if dtype.is_float:
        return (None if lo == -math.inf else lo), (None if hi == math.inf else hi)
    info = np.iinfo(dtype.np)
    lo_i = None if lo == -math.inf else min(max(math.ceil(lo), info.min), info.max)
    hi_i = None if hi == math.inf else min(max(math.floor(hi), info.min), info.max)
    return (None if lo_i == info.min else lo_i), (None if hi_i == info.max else hi_i)


def _clip_np(x, min, max):
    lo, hi = _clip_bounds(from_numpy(x.dtype), min, max)
    if lo is not None:
        x = np.maximum(x, np.asarray(lo, x.dtype))
    if hi is not None:
        x = np.minimum(x, np.asarray(hi, x.dtype))
    return x


def _clip_dec(b, ops, attrs):
    (x,) = ops
    lo, hi = _clip_bounds(x.dtype, attrs["min"], attrs["max"])
    if lo is not None:
        x = b.max(x, scalar(b, lo, x))
    if hi is not None:
        x = b.min(x, scalar(b, hi, x))
    return [x]  # x itself when the bounds clip nothing


def _check_clip(attrs):
    if math.isnan(attrs["min"]) or math.isnan(attrs["max"]):
        raise ShapeError(f"clip bounds must not be NaN, got min {attrs['min']},"
                         f" max {attrs['max']}")


def _prelu_infer(types, attrs):
    x, slope = types
    same_dtype(types)
    require_dtype(x, FLOAT_TYPES)
    if not broadcastable_to(slope.shape, x.shape):
        raise ShapeError(f"slope {slope} does not broadcast to the input {x}")
    return x


@in_f32
def _prelu_dec(b, ops, attrs):
    x, slope = ops
    return [b.where(b.ge(x, 0), x, b.mul(x, slope))]


_ALPHA = {"alpha": Attr("float", 1.0)}

ACTIVATIONS = {
    # name: (reference, decomposition, attrs, attribute check, allowed dtypes, summary)
    "relu": (lambda x: np.maximum(x, np.zeros((), x.dtype)), _relu_dec, {}, None, FLOAT_OR_INT,
             "max(x, 0)"),
    "leaky_relu": (lambda x, alpha: np.where(x >= 0, x, x * alpha), _leaky_relu_dec,
                   {"alpha": Attr("float", 0.01)}, finite("alpha"), FLOAT_TYPES,
                   "x if x >= 0 else alpha * x"),
    "elu": (lambda x, alpha: np.where(x > 0, x, np.expm1(x) * alpha), _elu_dec, _ALPHA,
            finite("alpha"), FLOAT_TYPES, "x if x > 0 else alpha * (e**x - 1)"),
    "selu": (lambda x, alpha, gamma: np.where(x > 0, x, np.expm1(x) * alpha) * gamma, _selu_dec,
             {"alpha": Attr("float", 1.6732632423543772),
              "gamma": Attr("float", 1.0507009873554805)},
             finite("alpha", "gamma"), FLOAT_TYPES, "gamma * elu(x, alpha)"),
    "celu": (lambda x, alpha: np.where(x > 0, x, np.expm1(x / alpha) * alpha), _celu_dec,
             _ALPHA, _check_celu, FLOAT_TYPES, "x if x > 0 else alpha * (e**(x / alpha) - 1)"),
    "softplus": (_softplus_np, _softplus_dec, {}, None, FLOAT_TYPES, "log(1 + e**x)"),
    "log_sigmoid": (lambda x: np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x))), _log_sigmoid_dec,
                    {}, None, FLOAT_TYPES, "log(sigmoid(x))"),
    "softsign": (lambda x: x / (np.abs(x) + 1), _softsign_dec, {}, None, FLOAT_TYPES,
                 "x / (1 + |x|)"),
    "mish": (lambda x: x * np.tanh(_softplus_np(x)), _mish_dec, {}, None, FLOAT_TYPES,
             "x * tanh(softplus(x))"),
    "gelu": (_gelu_np, _gelu_dec, {"approximate": Attr("str", "none", ("none", "tanh"))}, None,
             FLOAT_TYPES, "x * Phi(x), exactly (erf) or by the tanh approximation"),
    "silu": (lambda x: x * _sigmoid_np(x), _silu_dec, {}, None, FLOAT_TYPES,
             "x * sigmoid(x)"),
    "hard_sigmoid": (_hard_sigmoid_np, _hard_sigmoid_dec,
                     {"alpha": Attr("float", 0.2), "beta": Attr("float", 0.5)},
                     finite("alpha", "beta"), FLOAT_TYPES, "max(0, min(1, alpha * x + beta))"),
    "hard_swish": (lambda x: x * _hard_sigmoid_np(x, 1 / 6, 0.5), _hard_swish_dec, {}, None,
                   FLOAT_TYPES, "x * hard_sigmoid(x, alpha=1/6, beta=0.5)"),
    "clip": (_clip_np, _clip_dec,
             {"min": Attr("float", -math.inf), "max": Attr("float", math.inf)}, _check_clip,
             FLOAT_OR_INT, "min(max(x, min), max); max wins when min > max"),
}

for _name, (_ref, _dec, _attrs, _check, _allowed, _summary) in ACTIVATIONS.items():
    composite(_name, arity=1, infer=float_unary_infer(_check, _allowed), reference=_ref,
              decompose=_dec, attrs=_attrs, summary=_summary, elementwise=True)

composite("prelu", arity=2, infer=_prelu_infer,
          reference=lambda x, slope: np.where(x >= 0, x, x * slope), decompose=_prelu_dec,
          summary="x if x >= 0 else slope * x; slope broadcasts to x", elementwise=True)


# -- softmax -------------------------------------------------------------------------------
def _softmax_infer(types, attrs):
    (x,) = types
    require_dtype(x, FLOAT_TYPES)
    normalize_axis(attrs["axis"], x.rank)
    if x.rank == 0:
        raise ShapeError(f"axis {attrs['axis']} is out of range for rank 0")
    return x


def _max_np(x, axis):
    # initial= makes an empty axis (whose softmax is empty too) reduce like reduce_max does.
    return np.max(x, axis=axis, keepdims=True, initial=-np.inf)


def softmax_np(x, axis):
    shifted = x - _max_np(x, axis)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def _logsoftmax_np(x, axis):
    shifted = x - _max_np(x, axis)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _shifted(b, x: Value, axis: int) -> Value:
    axes = (normalize_axis(axis, x.type.rank),)
    return b.sub(x, b.reduce_max(x, axes=axes, keepdims=True))


@in_f32
def _softmax_dec(b, ops, attrs):
    (x,) = ops
    axes = (normalize_axis(attrs["axis"], x.type.rank),)
    e = b.exp(_shifted(b, x, attrs["axis"]))
    return [b.div(e, b.reduce_sum(e, axes=axes, keepdims=True))]


@in_f32
def _log_softmax_dec(b, ops, attrs):
    (x,) = ops
    axes = (normalize_axis(attrs["axis"], x.type.rank),)
    s = _shifted(b, x, attrs["axis"])
    return [b.sub(s, b.log(b.reduce_sum(b.exp(s), axes=axes, keepdims=True)))]


composite("softmax", arity=1, infer=_softmax_infer, reference=softmax_np,
          decompose=_softmax_dec, attrs={"axis": Attr("int", -1)},
          summary="e**x / sum(e**x) along `axis`, computed with the maximum subtracted")
composite("log_softmax", arity=1, infer=_softmax_infer, reference=_logsoftmax_np,
          decompose=_log_softmax_dec, attrs={"axis": Attr("int", -1)},
          summary="log(softmax(x)) along `axis`")
