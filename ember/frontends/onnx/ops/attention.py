"""Converters of the ONNX transformer-block ops: Attention, FlexAttention (ai.onnx.preview),
RotaryEmbedding and SwiGLU. LinearAttention and CausalConvWithState are in recurrent.py.

Layout: heads are axis 1 ([B, H, T, D]). Grouped-query attention never materializes the
repeated K/V heads: q is viewed as [B, Hkv, G, L, D] against k as [B, Hkv, 1, S, D], so
query head h = kv * G + g uses kv head h // G (np.repeat's order, as ONNX specifies).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter, onnx_dtype
from ember.graph.builder import Builder
from ember.graph.ir import Value

HALF = (DType.f16, DType.bf16)


# -- helpers shared with recurrent.py ------------------------------------------------------
def scalar(b: Builder, value: float, dtype: DType) -> Value:
    return b.constant(np.asarray(value, dtype=dtype.np))


def split_heads(ctx: ConvertContext, x: Value, heads: int | None, what: str) -> Value:
    """[B, T, H*D] -> [B, H, T, D]."""
    batch, length, hidden = x.shape
    if not heads or heads <= 0 or hidden % heads:
        raise ctx.error(f"{what} {x.type}: the last dim must split into {heads} heads")
    x = ctx.b.reshape(x, shape=(batch, length, heads, hidden // heads))
    return ctx.b.transpose(x, perm=(0, 2, 1, 3))


def merge_heads(b: Builder, x: Value) -> Value:
    """[B, H, T, D] -> [B, T, H*D]."""
    batch, heads, length, dim = x.shape
    return b.reshape(b.transpose(x, perm=(0, 2, 1, 3)), shape=(batch, length, heads * dim))


def all_of(b: Builder, conds: list[Value]) -> Value:
    return functools.reduce(lambda x, y: b.op("and", [x, y]).result, conds)


def _group(b: Builder, x: Value, groups: int) -> Value:
    """[B, Hq, T, D] -> [B, Hkv, G, T, D]: the query heads that share one kv head."""
    batch, heads, length, dim = x.shape
    return b.reshape(x, shape=(batch, heads // groups, groups, length, dim))


def _ungroup(b: Builder, x: Value) -> Value:
    batch, kv_heads, groups, length, dim = x.shape
    return b.reshape(x, shape=(batch, kv_heads * groups, length, dim))


def _check_heads(ctx: ConvertContext, q: Value, k: Value, v: Value) -> int:
    """The query heads per kv head, after checking q, k, v [B, H, T, D] agree."""
    if not q.type.rank == k.type.rank == v.type.rank == 4:
        raise ctx.error(f"q {q.type}, k {k.type} and v {v.type} must all be rank 4")
    q_heads, kv_heads = q.shape[1], k.shape[1]
    if v.shape[1] != kv_heads or kv_heads == 0 or q_heads % kv_heads:
        raise ctx.error(f"{q_heads} query heads cannot share k {k.type} and v {v.type}")
    return q_heads // kv_heads


def _scores(b: Builder, q: Value, k: Value, groups: int, root_scale: float) -> Value:
    """(q * root_scale) @ (k * root_scale)^T as [B, Hq, L, S]: ONNX scales both sides by
    sqrt(scale), rounded to the input type, to keep the product from overflowing."""
    q, k = b.mul(q, root_scale), b.mul(k, root_scale)
    k_t = b.transpose(k, perm=(0, 1, 3, 2))
    if groups == 1:
        return b.matmul(q, k_t)
    return _ungroup(b, b.matmul(_group(b, q, groups), b.reshape(k_t, shape=(
        k_t.shape[0], k_t.shape[1], 1, *k_t.shape[2:]))))


def _weighted_values(b: Builder, probs: Value, v: Value, groups: int) -> Value:
    """probs [B, Hq, L, S] @ v [B, Hkv, S, Dv] -> [B, Hq, L, Dv]."""
    if groups == 1:
        return b.matmul(probs, v)
    v = b.reshape(v, shape=(v.shape[0], v.shape[1], 1, *v.shape[2:]))
    return _ungroup(b, b.matmul(_group(b, probs, groups), v))


def _precision(ctx: ConvertContext, default: DType) -> DType:
    code = ctx.attr("softmax_precision")
    return default if code is None else onnx_dtype(code, "softmax_precision")


# -- Attention -------------------------------------------------------------------------------
@converter("Attention", since=23)
def attention(ctx: ConvertContext):
    b = ctx.b
    q, k, v = ctx.require(0), ctx.require(1), ctx.require(2)
    mask, past_k, past_v = ctx.input(3), ctx.input(4), ctx.input(5)
    nonpad = ctx.input(6)
    packed = q.type.rank == 3  # [B, T, H*D] with the head counts as attributes
    if packed:
        if not k.type.rank == v.type.rank == 3:
            raise ctx.error(f"with a 3-D Q, K {k.type} and V {v.type} must be 3-D too")
        q = split_heads(ctx, q, ctx.attr("q_num_heads"), "Q")
        k = split_heads(ctx, k, ctx.attr("kv_num_heads"), "K")
        v = split_heads(ctx, v, ctx.attr("kv_num_heads"), "V")
    if (past_k is None) != (past_v is None):
        raise ctx.error("past_key and past_value must be given together")
    if past_k is not None:
        if nonpad is not None:
            raise ctx.error("nonpad_kv_seqlen cannot be used with past_key/past_value")
        k, v = b.concat(past_k, k, axis=2), b.concat(past_v, v, axis=2)
    groups = _check_heads(ctx, q, k, v)
    length, total = q.shape[2], k.shape[2]
    scale = ctx.attr("scale") if ctx.has_attr("scale") else 1 / math.sqrt(max(q.shape[3], 1))
    softcap = ctx.attr("softcap", 0.0)
    mode = ctx.attr("qk_matmul_output_mode", 0)
    window = (ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1))
    causal = bool(ctx.attr("is_causal", 0))
    if mode not in (0, 1, 2, 3) or min(window) < -1:
        raise ctx.error(f"bad qk_matmul_output_mode {mode} or window sizes {window}")
    # Keys before the query block: the past cache, or per batch the padded external cache.
    offset: int | Value = 0 if past_k is None else past_k.shape[2]
    if nonpad is not None and (causal or max(window) >= 0):
        offset = b.sub(_batch_column(b, nonpad), length)

    want_qk = ctx.output_used(3)
    plain = (mask is None and nonpad is None and max(window) < 0 and softcap <= 0
             and not want_qk and (not causal or past_k is None)
             and _precision(ctx, q.dtype) is q.dtype)
    if plain:  # one sdpa op, which later stages recognize and fuse
        y = _sdpa(b, q, k, v, groups, scale, causal)
        qk = None
    else:
        allowed = _allowed_keys(b, length, total, offset, causal, window, nonpad)
        bias = _bias(ctx, mask, allowed, total, q.dtype)
        guard = bias is not None and (mask is not None or nonpad is not None or _empty_rows(
            length, total, offset, causal, window))
        y, qk = _attend(ctx, q, k, v, groups, scale, softcap, bias, guard, mode)
    if packed:
        y = merge_heads(b, y)
    return [y, k, v, qk]


def _sdpa(b: Builder, q: Value, k: Value, v: Value, groups: int, scale: float,
          causal: bool) -> Value:
    if groups == 1:
        return b.sdpa(q, k, v, scale=scale, is_causal=causal)
    k, v = (b.reshape(x, shape=(x.shape[0], x.shape[1], 1, *x.shape[2:])) for x in (k, v))
    return _ungroup(b, b.sdpa(_group(b, q, groups), k, v, scale=scale, is_causal=causal))


def _batch_column(b: Builder, lengths: Value) -> Value:
    """Per-batch lengths [B] as i64 [B, 1, 1, 1], to broadcast against [B, H, L, S]."""
    lengths = lengths if lengths.dtype is DType.i64 else b.cast(lengths, to=DType.i64)
    return b.reshape(lengths, shape=(lengths.shape[0], 1, 1, 1))


def _allowed_keys(b: Builder, length: int, total: int, offset: int | Value, causal: bool,
                  window: tuple[int, int], nonpad: Value | None) -> Value | None:
    """Whether query i may attend key j, [L, S] or [B, 1, L, S]; None when all may.

    Query i sits at absolute position p = i + offset; causal allows j <= p, the window
    p - left <= j <= p + right, and an external cache j < nonpad_kv_seqlen[b]."""
    conds = []
    left, right = window
    if causal or left >= 0 or right >= 0:
        lag = b.sub(b.iota(shape=(length, 1), axis=0), b.iota(shape=(1, total), axis=1))
        if not isinstance(offset, int) or offset:
            lag = b.add(lag, offset)  # p - j
        if causal:
            conds.append(b.ge(lag, 0))
        if left >= 0:
            conds.append(b.le(lag, left))
        if right >= 0:
            conds.append(b.ge(lag, -right))
    if nonpad is not None:
        conds.append(b.lt(b.iota(shape=(1, 1, 1, total), axis=3), _batch_column(b, nonpad)))
    return all_of(b, conds) if conds else None


def _empty_rows(length: int, total: int, offset: int, causal: bool,
                window: tuple[int, int]) -> bool:
    """Whether a static causal/window rule leaves some query with no key at all."""
    p = np.arange(length) + offset
    left, right = window
    first = np.maximum(p - left, 0) if left >= 0 else np.zeros_like(p)
    last = np.full_like(p, total - 1)
    if causal:
        last = np.minimum(last, p)
    if right >= 0:
        last = np.minimum(last, p + right)
    return bool(np.any(first > last))


def _bias(ctx: ConvertContext, mask: Value | None, allowed: Value | None, total: int,
          dtype: DType) -> Value | None:
    """The additive score bias: the float mask (a bool one as 0 / -inf), padded with -inf
    to the total key length, plus -inf where `allowed` is false."""
    b = ctx.b
    zero, ninf = scalar(b, 0, dtype), scalar(b, -math.inf, dtype)
    bias = None
    if mask is not None:
        if mask.dtype is DType.bool:
            mask = b.where(mask, zero, ninf)
        elif mask.dtype is not dtype:
            raise ctx.error(f"attn_mask {mask.type} must be bool or the type of Q ({dtype})")
        short = total - mask.shape[-1]
        if short < 0:
            raise ctx.error(f"attn_mask {mask.type} is longer than the {total} keys")
        if short:
            rank = mask.type.rank
            mask = b.pad(mask, pads=(0,) * (2 * rank - 1) + (short,), value=-math.inf)
        bias = mask
    if allowed is not None:
        blocked = b.where(allowed, zero, ninf)
        bias = blocked if bias is None else b.add(bias, blocked)
    return bias


def _attend(ctx: ConvertContext, q: Value, k: Value, v: Value, groups: int, scale: float,
            softcap: float, bias: Value | None, guard: bool, mode: int):
    """softmax(softcap(scores) + bias) @ v, and the qk_matmul_output chosen by `mode`."""
    b = ctx.b
    raw = _scores(b, q, k, groups, math.sqrt(scale))
    capped = raw
    if softcap > 0:  # before the bias, so that masked scores stay -inf
        capped = b.mul(b.tanh(b.div(raw, softcap)), softcap)
    logits = capped if bias is None else b.add(capped, bias)
    qk = {0: raw, 1: capped, 2: logits}.get(mode)
    precision = _precision(ctx, q.dtype)
    if precision is not q.dtype:
        logits = b.cast(logits, to=precision)
    probs = b.softmax(logits, axis=-1)
    if guard:  # a query whose every key is masked gets zero weights, not NaN
        rank = bias.type.rank
        row_max = b.reduce_max(bias, axes=(rank - 1,), keepdims=True)
        probs = b.where(b.eq(row_max, -math.inf), scalar(b, 0, precision), probs)
    if precision is not q.dtype:
        probs = b.cast(probs, to=q.dtype)
    if mode == 3:
        qk = probs
    return _weighted_values(b, probs, v, groups), qk


# -- FlexAttention ---------------------------------------------------------------------------
@converter("FlexAttention", domain="ai.onnx.preview", since=1)
def flex_attention(ctx: ConvertContext):
    """softmax(score_mod(q @ k^T * scale)) -> prob_mod -> @ v, the modifiers being
    subgraphs inlined here; scores and probabilities are in softmax_precision (f32 for
    half inputs by default)."""
    b = ctx.b
    q, k, v = ctx.require(0), ctx.require(1), ctx.require(2)
    groups = _check_heads(ctx, q, k, v)
    scale = ctx.attr("scale") if ctx.has_attr("scale") else 1 / math.sqrt(max(q.shape[3], 1))
    precision = _precision(ctx, DType.f32 if q.dtype in HALF else q.dtype)
    scores = b.cast(_scores(b, q, k, groups, math.sqrt(np.float32(scale))), to=precision)
    scores = _modify(ctx, "score_mod", scores)
    probs = _modify(ctx, "prob_mod", b.softmax(scores, axis=-1))
    y = _weighted_values(b, probs, b.cast(v, to=precision), groups)
    return b.cast(y, to=v.dtype)


def _modify(ctx: ConvertContext, name: str, x: Value) -> Value:
    graph = ctx.attr(name)
    if graph is None:
        return x
    results = ctx.subgraph(graph, ctx.b, [x])
    if len(results) != 1 or results[0].shape != x.shape:
        raise ctx.error(f"{name} must yield one tensor of the shape of its input {x.type}")
    return ctx.b.cast(results[0], to=x.dtype)


# -- RotaryEmbedding -------------------------------------------------------------------------
@converter("RotaryEmbedding", since=23)
def rotary_embedding(ctx: ConvertContext):
    """Rotate pairs (x1, x2) of the first rotary_embedding_dim features of each head by the
    angle of the token's position: halves of the rotated block, or even/odd features when
    interleaved."""
    b = ctx.b
    x, cos, sin, positions = ctx.require(0), ctx.require(1), ctx.require(2), ctx.input(3)
    shape = x.shape
    if x.type.rank == 3:  # [B, S, H*D] -> [B, S, H, D]; the caches broadcast over H
        heads = ctx.attr("num_heads", 0)
        if heads <= 0 or shape[2] % heads:
            raise ctx.error(f"X {x.type}: the last dim must split into {heads} heads")
        x = b.reshape(x, shape=(*shape[:2], heads, shape[2] // heads))
    if x.type.rank != 4:
        raise ctx.error(f"X {x.type} must be rank 3 or 4")
    # Work on [B, S, H, D] for 3-D input, on [B, H, S, D] for 4-D: head_axis says which.
    head_axis = 2 if len(shape) == 3 else 1
    dim = x.shape[3]
    rotary = ctx.attr("rotary_embedding_dim", 0) or dim
    half = rotary // 2
    if rotary % 2 or rotary > dim:
        raise ctx.error(f"rotary_embedding_dim {rotary} must be even and at most {dim}")
    if positions is not None:  # caches [max_position, half] -> [B, S, half]
        cos, sin = (b.gather(c, positions, axis=0) for c in (cos, sin))
    if cos.type.rank != 3 or cos.shape[-1] != half or sin.shape != cos.shape:
        raise ctx.error(f"cos/sin caches {cos.type}, {sin.type} must be [B, S, {half}]")
    batch, seq = cos.shape[:2]
    cos, sin = (b.reshape(c, shape=(batch, 1, seq, half) if head_axis == 1 else
                          (batch, seq, 1, half)) for c in (cos, sin))
    if ctx.attr("interleaved", 0):
        x1, x2 = _last(b, x, 0, rotary, 2), _last(b, x, 1, rotary, 2)
    else:
        x1, x2 = _last(b, x, 0, half), _last(b, x, half, rotary)
    real = b.sub(b.mul(cos, x1), b.mul(sin, x2))
    imag = b.add(b.mul(sin, x1), b.mul(cos, x2))
    if ctx.attr("interleaved", 0):  # [..., half, 2] -> [..., rotary]: real, imag, real, ...
        pair = (*real.shape, 1)
        rotated = b.concat(b.reshape(real, shape=pair), b.reshape(imag, shape=pair), axis=4)
        rotated = b.reshape(rotated, shape=(*real.shape[:3], rotary))
    else:
        rotated = b.concat(real, imag, axis=3)
    if rotary < dim:
        rotated = b.concat(rotated, _last(b, x, rotary, dim), axis=3)
    return b.reshape(rotated, shape=shape)


def _last(b: Builder, x: Value, start: int, end: int, step: int = 1) -> Value:
    """x[..., start:end:step]."""
    rank = x.type.rank
    return b.slice(x, starts=(0,) * (rank - 1) + (start,), ends=(*x.shape[:-1], end),
                   steps=(1,) * (rank - 1) + (step,))


# -- SwiGLU ----------------------------------------------------------------------------------
@converter("SwiGLU", since=28)
def swiglu(ctx: ConvertContext):
    """a * sigmoid(alpha * a) * b, with a and b of one shape."""
    b = ctx.b
    gate, linear = ctx.require(0), ctx.require(1)
    if gate.type != linear.type:
        raise ctx.error(f"A {gate.type} and B {linear.type} must have the same type")
    alpha = ctx.attr("alpha", 1.0)
    swish = b.silu(gate) if alpha == 1.0 else b.mul(gate, b.sigmoid(b.mul(gate, alpha)))
    return b.mul(swish, linear)
