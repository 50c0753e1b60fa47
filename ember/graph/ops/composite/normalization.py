"""Composite mean/variance reductions and normalizations (layer, group, instance,
batch, RMS)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ember.dtypes import FLOAT_TYPES
from ember.errors import ShapeError
from ember.graph.ir import Value
from ember.graph.ops.common import (
    broadcastable_to,
    normalize_axes,
    normalize_axis,
    require_dtype,
    same_dtype,
)
from ember.graph.ops.composite.base import (
    FLOAT_OR_INT,
    channel_shape,
    composite,
    in_f32,
    scalar,
)
from ember.graph.ops.reduce import reduced_shape
from ember.graph.ops.registry import Attr

# -- reductions ----------------------------------------------------------------------------
_REDUCE_ATTRS = {"axes": Attr("ints"), "keepdims": Attr("bool", False)}


def _reduce_infer(allowed):
    def infer(types, attrs):
        (x,) = types
        require_dtype(x, allowed)
        axes = normalize_axes(attrs["axes"], x.rank)
        if attrs.get("correction", 0) < 0:
            raise ShapeError(f"correction must be >= 0, got {attrs['correction']}")
        return x.with_shape(reduced_shape(x.shape, axes, attrs["keepdims"]))

    return infer


def _count(x: Value, axes: Sequence[int]) -> int:
    return math.prod(x.shape[a] for a in normalize_axes(axes, x.type.rank))


def _np_count(x, axes):
    return math.prod(x.shape[a] for a in axes)


def _mean_np(x, axes, keepdims):
    # sum / count, as the decomposition computes it (np.mean does the same for floats).
    return np.sum(x, axis=tuple(axes), keepdims=keepdims) / x.dtype.type(_np_count(x, axes))


def _var_np(x, axes, keepdims, correction):
    d = x - _mean_np(x, axes, True)
    total = np.sum(d * d, axis=tuple(axes), keepdims=keepdims)
    return total / x.dtype.type(max(_np_count(x, axes) - correction, 0))


def _logsumexp_np(x, axes, keepdims):
    m = np.max(x, axis=tuple(axes), keepdims=True, initial=-np.inf)
    m = np.where(np.isinf(m), np.zeros((), x.dtype), m)
    total = np.sum(np.exp(x - m), axis=tuple(axes), keepdims=True)
    out = np.log(total) + m
    return out if keepdims else np.squeeze(out, axis=tuple(axes))


@in_f32
def _mean_dec(b, ops, attrs):
    (x,) = ops
    total = b.reduce_sum(x, axes=attrs["axes"], keepdims=attrs["keepdims"])
    return [b.div(total, float(_count(x, attrs["axes"])))]


@in_f32
def _var_dec(b, ops, attrs):
    (x,) = ops
    d = b.sub(x, b.reduce_mean(x, axes=attrs["axes"], keepdims=True))
    total = b.reduce_sum(b.mul(d, d), axes=attrs["axes"], keepdims=attrs["keepdims"])
    return [b.div(total, float(max(_count(x, attrs["axes"]) - attrs["correction"], 0)))]


@in_f32
def _l1_dec(b, ops, attrs):
    return [b.reduce_sum(b.abs(ops[0]), axes=attrs["axes"], keepdims=attrs["keepdims"])]


@in_f32
def _l2_dec(b, ops, attrs):
    (x,) = ops
    return [b.sqrt(b.reduce_sum(b.mul(x, x), axes=attrs["axes"], keepdims=attrs["keepdims"]))]


@in_f32
def _sum_square_dec(b, ops, attrs):
    (x,) = ops
    return [b.reduce_sum(b.mul(x, x), axes=attrs["axes"], keepdims=attrs["keepdims"])]


@in_f32
def _logsumexp_dec(b, ops, attrs):
    (x,) = ops
    axes = attrs["axes"]
    m = b.reduce_max(x, axes=axes, keepdims=True)
    m = b.where(b.isinf(m), scalar(b, 0, m), m)  # all -inf (or any +inf): shift by 0
    out = b.add(b.log(b.reduce_sum(b.exp(b.sub(x, m)), axes=axes, keepdims=True)), m)
    if not attrs["keepdims"]:
        out = b.reshape(out, shape=reduced_shape(x.shape, normalize_axes(axes, x.type.rank),
                                                 False))
    return [out]


def _sum_np(fn):
    # Integer sums wrap in the input dtype, like reduce_sum.
    return lambda x, axes, keepdims: np.sum(fn(x), axis=tuple(axes), keepdims=keepdims,
                                            dtype=x.dtype)


REDUCTIONS = {
    # name: (reference, decomposition, allowed dtypes, summary)
    "reduce_mean": (_mean_np, _mean_dec, FLOAT_TYPES, "mean over `axes`"),
    "reduce_l1": (_sum_np(np.abs), _l1_dec, FLOAT_OR_INT, "sum of |x| over `axes`"),
    "reduce_l2": (lambda x, axes, keepdims: np.sqrt(_sum_np(lambda v: v * v)(x, axes, keepdims)),
                  _l2_dec, FLOAT_TYPES, "sqrt(sum(x * x)) over `axes`"),
    "reduce_sum_square": (_sum_np(lambda v: v * v), _sum_square_dec, FLOAT_OR_INT,
                          "sum of x * x over `axes`"),
    "reduce_logsumexp": (_logsumexp_np, _logsumexp_dec, FLOAT_TYPES,
                         "log(sum(e**x)) over `axes`, computed with the maximum subtracted"),
}

for _name, (_ref, _dec, _allowed, _summary) in REDUCTIONS.items():
    composite(_name, arity=1, infer=_reduce_infer(_allowed), reference=_ref, decompose=_dec,
              attrs=_REDUCE_ATTRS, summary=_summary)

composite("reduce_var", arity=1, infer=_reduce_infer(FLOAT_TYPES), reference=_var_np,
          decompose=_var_dec, attrs={**_REDUCE_ATTRS, "correction": Attr("int", 0)},
          summary="variance over `axes`, dividing by count - correction")


# -- normalizations ------------------------------------------------------------------------
def _normalize_np(x, axes, epsilon):
    mean = _mean_np(x, axes, True)
    d = x - mean
    var = _mean_np(d * d, axes, True)
    return d * (1 / np.sqrt(var + x.dtype.type(epsilon)))


def _normalize(b, x: Value, axes: Sequence[int], epsilon: float) -> Value:
    """(x - mean) * rsqrt(var + epsilon) over `axes`, keeping x's shape."""
    d = b.sub(x, b.reduce_mean(x, axes=tuple(axes), keepdims=True))
    var = b.reduce_mean(b.mul(d, d), axes=tuple(axes), keepdims=True)
    return b.mul(d, b.rsqrt(b.add(var, epsilon)))


def _check_epsilon(attrs):
    if not (math.isfinite(attrs["epsilon"]) and attrs["epsilon"] >= 0):
        raise ShapeError(f"epsilon must be finite and >= 0, got {attrs['epsilon']}")


def _layer_norm_infer(types, attrs):
    x, *params = types
    same_dtype(types)
    require_dtype(x, FLOAT_TYPES)
    _check_epsilon(attrs)
    if x.rank == 0:
        raise ShapeError(f"axis {attrs['axis']} is out of range for rank 0")
    axis = normalize_axis(attrs["axis"], x.rank)
    for what, p in zip(("scale", "bias"), params):
        if not broadcastable_to(p.shape, x.shape[axis:]):
            raise ShapeError(f"{what} {p} does not broadcast to the normalized shape"
                             f" {list(x.shape[axis:])}")
    return x


def _layer_norm_np(x, scale=None, bias=None, *, axis, epsilon):
    axes = tuple(range(axis % x.ndim, x.ndim))
    y = _normalize_np(x, axes, epsilon)
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y


@in_f32
def _layer_norm_dec(b, ops, attrs):
    x, *params = ops
    rank = x.type.rank
    y = _normalize(b, x, range(normalize_axis(attrs["axis"], rank), rank), attrs["epsilon"])
    if len(params) > 0:
        y = b.mul(y, params[0])
    if len(params) > 1:
        y = b.add(y, params[1])
    return [y]


def _rms_norm_np(x, scale=None, *, axis, epsilon):
    axes = tuple(range(axis % x.ndim, x.ndim))
    y = x * (1 / np.sqrt(_mean_np(x * x, axes, True) + x.dtype.type(epsilon)))
    return y if scale is None else y * scale


@in_f32
def _rms_norm_dec(b, ops, attrs):
    x, *params = ops
    rank = x.type.rank
    axes = tuple(range(normalize_axis(attrs["axis"], rank), rank))
    ms = b.reduce_mean(b.mul(x, x), axes=axes, keepdims=True)
    y = b.mul(x, b.rsqrt(b.add(ms, attrs["epsilon"])))
    return [b.mul(y, params[0]) if params else y]


_NORM_ATTRS = {"axis": Attr("int", -1), "epsilon": Attr("float", 1e-5)}

composite("layer_norm", arity=(1, 3), infer=_layer_norm_infer, reference=_layer_norm_np,
          decompose=_layer_norm_dec, attrs=_NORM_ATTRS,
          summary="normalize over axes axis.., then * scale + bias (ONNX LayerNormalization)")
composite("rms_norm", arity=(1, 2), infer=_layer_norm_infer, reference=_rms_norm_np,
          decompose=_rms_norm_dec, attrs=_NORM_ATTRS,
          summary="x / sqrt(mean(x * x) + epsilon) over axes axis.., then * scale")


def _channel_params_infer(min_rank: int):
    def infer(types, attrs):
        x, *params = types
        same_dtype(types)
        require_dtype(x, FLOAT_TYPES)
        _check_epsilon(attrs)
        if x.rank < min_rank:
            raise ShapeError(f"the input must have rank >= {min_rank} ([N, C, ...]), got {x}")
        for p in params:
            if p.shape != (x.shape[1],):
                raise ShapeError(f"per-channel parameters must have shape [{x.shape[1]}],"
                                 f" got {p}")
        if "num_groups" in attrs:
            groups = attrs["num_groups"]
            if groups <= 0 or x.shape[1] % groups:
                raise ShapeError(f"num_groups {groups} does not divide the {x.shape[1]}"
                                 f" channels")
        return x

    return infer


def _per_channel(p, ndim):
    return p.reshape(channel_shape(ndim, p.shape[0]))


def _group_norm_np(x, scale, bias, *, num_groups, epsilon):
    n, c = x.shape[:2]
    grouped = x.reshape(n, num_groups, c // num_groups * math.prod(x.shape[2:]))
    y = _normalize_np(grouped, (2,), epsilon).reshape(x.shape)
    return y * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)


@in_f32
def _group_norm_dec(b, ops, attrs):
    x, scale, bias = ops
    n, c = x.shape[:2]
    groups = attrs["num_groups"]
    rank = x.type.rank
    grouped = b.reshape(x, shape=(n, groups, c // groups * math.prod(x.shape[2:])))
    y = b.reshape(_normalize(b, grouped, (2,), attrs["epsilon"]), shape=x.shape)
    y = b.mul(y, b.reshape(scale, shape=channel_shape(rank, c)))
    return [b.add(y, b.reshape(bias, shape=channel_shape(rank, c)))]


def _instance_norm_np(x, scale, bias, *, epsilon):
    y = _normalize_np(x, tuple(range(2, x.ndim)), epsilon)
    return y * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)


@in_f32
def _instance_norm_dec(b, ops, attrs):
    x, scale, bias = ops
    rank, c = x.type.rank, x.shape[1]
    y = _normalize(b, x, range(2, rank), attrs["epsilon"])
    y = b.mul(y, b.reshape(scale, shape=channel_shape(rank, c)))
    return [b.add(y, b.reshape(bias, shape=channel_shape(rank, c)))]


def _batch_norm_np(x, scale, bias, mean, var, *, epsilon):
    factor = scale * (1 / np.sqrt(var + x.dtype.type(epsilon)))
    return (x - _per_channel(mean, x.ndim)) * _per_channel(factor, x.ndim) + _per_channel(
        bias, x.ndim)


@in_f32
def _batch_norm_dec(b, ops, attrs):
    x, scale, bias, mean, var = ops
    rank, c = x.type.rank, x.shape[1]
    factor = b.mul(scale, b.rsqrt(b.add(var, attrs["epsilon"])))
    y = b.sub(x, b.reshape(mean, shape=channel_shape(rank, c)))
    y = b.mul(y, b.reshape(factor, shape=channel_shape(rank, c)))
    return [b.add(y, b.reshape(bias, shape=channel_shape(rank, c)))]


_EPSILON = {"epsilon": Attr("float", 1e-5)}

composite("group_norm", arity=3, infer=_channel_params_infer(2), reference=_group_norm_np,
          decompose=_group_norm_dec, attrs={"num_groups": Attr("int"), **_EPSILON},
          summary="normalize x [N, C, *] over groups of channels, then per-channel scale, bias")
composite("instance_norm", arity=3, infer=_channel_params_infer(3),
          reference=_instance_norm_np, decompose=_instance_norm_dec, attrs=_EPSILON,
          summary="normalize x [N, C, *] over its spatial axes, then per-channel scale, bias")
composite("batch_norm", arity=5, infer=_channel_params_infer(2), reference=_batch_norm_np,
          decompose=_batch_norm_dec, attrs=_EPSILON,
          summary="inference batch norm: (x - mean) / sqrt(var + epsilon) * scale + bias,"
                  " per channel (axis 1)")
