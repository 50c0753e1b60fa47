"""Scaled dot-product attention, and `tile`, as composites."""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import FLOAT_TYPES, DType
from ember.errors import ShapeError
from ember.graph.ir import TensorType
from ember.graph.ops.common import (
    broadcast_shapes,
    broadcastable_to,
    require_dtype,
    same_dtype,
)
from ember.graph.ops.composite.activation import softmax_np
from ember.graph.ops.composite.base import (
    composite,
    in_f32,
    scalar,
)
from ember.graph.ops.registry import Attr


# -- attention -----------------------------------------------------------------------------
def _sdpa_infer(types, attrs):
    q, k, v, *mask = types
    same_dtype([q, k, v], "q, k and v")
    require_dtype(q, FLOAT_TYPES, "q")
    for what, t in (("q", q), ("k", k), ("v", v)):
        if t.rank < 2:
            raise ShapeError(f"{what} must have rank >= 2, got {t}")
    (length, embed), (source, k_embed) = q.shape[-2:], k.shape[-2:]
    if k_embed != embed:
        raise ShapeError(f"q {q} and k {k} differ in the last dim")
    if v.shape[-2] != source:
        raise ShapeError(f"k {k} and v {v} differ in the sequence dim (-2)")
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask:
        (m,) = mask
        if attrs["is_causal"]:
            raise ShapeError("is_causal and an explicit mask cannot be used together")
        if m.dtype is not DType.bool and m.dtype is not q.dtype:
            raise ShapeError(f"the mask must be bool or {q.dtype}, got {m}")
        scores = (*batch, length, source)
        if not broadcastable_to(m.shape, scores):
            raise ShapeError(f"the mask {m} does not broadcast to the scores"
                             f" [{','.join(map(str, scores))}]")
    if math.isinf(attrs["scale"]):
        raise ShapeError(f"scale must be finite (or nan for the default), got {attrs['scale']}")
    return TensorType(q.dtype, (*batch, length, v.shape[-1]))


def _sdpa_scale(scale: float, embed: int) -> float:
    return 1 / math.sqrt(embed) if math.isnan(scale) else scale


def _sdpa_np(q, k, v, mask=None, *, scale, is_causal):
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * _sdpa_scale(scale, q.shape[-1])
    ninf = np.asarray(-np.inf, scores.dtype)
    if is_causal:
        scores = np.where(np.tri(q.shape[-2], k.shape[-2], dtype=bool), scores, ninf)
    if mask is not None:
        scores = np.where(mask, scores, ninf) if mask.dtype == np.bool_ else scores + mask
    return np.matmul(softmax_np(scores, -1), v)


@in_f32
def _sdpa_dec(b, ops, attrs):
    q, k, v, *mask = ops
    rank_k = k.type.rank
    perm = (*range(rank_k - 2), rank_k - 1, rank_k - 2)
    scores = b.matmul(q, b.transpose(k, perm=perm))
    scores = b.mul(scores, _sdpa_scale(attrs["scale"], q.shape[-1]))
    if attrs["is_causal"]:
        shape = (q.shape[-2], k.shape[-2])
        keep = b.ge(b.iota(shape=shape, axis=0), b.iota(shape=shape, axis=1))
        scores = b.where(keep, scores, scalar(b, -math.inf, scores))
    if mask:
        (m,) = mask
        if m.dtype is DType.bool:
            scores = b.where(m, scores, scalar(b, -math.inf, scores))
        else:
            scores = b.add(scores, m)
    return [b.matmul(b.softmax(scores, axis=-1), v)]


composite("sdpa", arity=(3, 4), infer=_sdpa_infer, reference=_sdpa_np, decompose=_sdpa_dec,
          attrs={"scale": Attr("float", math.nan), "is_causal": Attr("bool", False)},
          summary="scaled dot-product attention softmax(q @ k^T * scale + mask) @ v;"
                  " scale nan means 1/sqrt(q.shape[-1])")


# -- shape -----------------------------------------------------------------------------------
def _tile_infer(types, attrs):
    (x,) = types
    repeats = attrs["repeats"]
    if len(repeats) != x.rank:
        raise ShapeError(f"repeats {list(repeats)} must have one entry per dim of {x}")
    if any(r < 0 for r in repeats):
        raise ShapeError(f"repeats {list(repeats)} must be >= 0")
    return x.with_shape(tuple(d * r for d, r in zip(x.shape, repeats)))


def _tile_dec(b, ops, attrs):
    (x,) = ops
    repeats = attrs["repeats"]
    if all(r == 1 for r in repeats):
        return [x]
    spread = tuple(d for dim in x.shape for d in (1, dim))
    big = tuple(d for pair in zip(repeats, x.shape) for d in pair)
    y = b.broadcast(b.reshape(x, shape=spread), shape=big)
    return [b.reshape(y, shape=tuple(d * r for d, r in zip(x.shape, repeats)))]


composite("tile", arity=1, infer=_tile_infer, reference=lambda x, repeats: np.tile(x, repeats),
          decompose=_tile_dec, attrs={"repeats": Attr("ints")},
          summary="x repeated `repeats[i]` times along each dim i (np.tile)")
