"""Converters of the ONNX recurrent sequence-mixing ops: LinearAttention and
CausalConvWithState (the state-carrying blocks of Gated DeltaNet / Mamba style models)."""

from __future__ import annotations

import math

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter
from ember.frontends.onnx.ops.attention import split_heads
from ember.graph.builder import Builder
from ember.graph.ir import Value

UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


# -- LinearAttention -------------------------------------------------------------------------
@converter("LinearAttention", since=27)
def linear_attention(ctx: ConvertContext):
    """A loop over time carrying the state S [B, Hkv, dk, dv], in f32:

        S = exp(g_t) * S                          (gated rules)
        v_t = beta_t * (v_t - S^T k_t)            (delta rules)
        S = S + k_t (x) v_t;  o_t = scale * q_t^T S
    """
    b = ctx.b
    rule = ctx.attr("update_rule", "gated_delta")
    if rule not in UPDATE_RULES:
        raise ctx.error(f"update_rule '{rule}' is not one of {', '.join(UPDATE_RULES)}")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    query, key, value = ctx.require(0), ctx.require(1), ctx.require(2)
    past, decay, beta = ctx.input(3), ctx.input(4), ctx.input(5)
    if (decay is not None) != gated or (beta is not None) != delta:
        raise ctx.error(f"update_rule '{rule}' takes {'a' if gated else 'no'} decay and"
                        f" {'a' if delta else 'no'} beta input")
    if not query.type.rank == key.type.rank == value.type.rank == 3:
        raise ctx.error("query, key and value must be rank 3 [B, T, H*D]")
    q_heads, kv_heads = ctx.attr("q_num_heads", 0), ctx.attr("kv_num_heads", 0)
    if kv_heads <= 0 or q_heads <= 0 or q_heads % kv_heads:
        raise ctx.error(f"q_num_heads {q_heads} must be a positive multiple of kv_num_heads"
                        f" {kv_heads}")
    q, k, v = (_time_major(b, split_heads(ctx, x, h, what)) for x, h, what in (
        (query, q_heads, "query"), (key, kv_heads, "key"), (value, kv_heads, "value")))
    steps, batch, _, dk = q.shape
    dv = v.shape[3]
    if k.shape[1:] != (batch, kv_heads, dk) or v.shape[:3] != (steps, batch, kv_heads):
        raise ctx.error(f"query {query.type}, key {key.type} and value {value.type} disagree")
    state_shape = (batch, kv_heads, dk, dv)
    if past is None:
        state = b.broadcast(b.constant(0.0, dtype=DType.f32), shape=state_shape)
    elif past.shape == state_shape:
        state = _f32(b, past)
    else:
        raise ctx.error(f"past_state {past.type} must be [{', '.join(map(str, state_shape))}]")
    if decay is not None:  # per head [B, T, Hkv] or per key dim [B, T, Hkv*dk]
        if decay.type.rank != 3 or decay.shape[2] not in (kv_heads, kv_heads * dk):
            raise ctx.error(f"decay {decay.type} must be [B, T, {kv_heads}] or"
                            f" [B, T, {kv_heads * dk}]")
        decay = _time_major(b, split_heads(ctx, decay, kv_heads, "decay"))  # [T, B, H, 1|dk]
    if beta is not None:
        if beta.type.rank != 3 or beta.shape[2] not in (kv_heads, 1):
            raise ctx.error(f"beta {beta.type} must be [B, T, {kv_heads}] or [B, T, 1]")
        beta = _time_major(b, split_heads(ctx, beta, beta.shape[2], "beta"))  # [T, B, H|1, 1]
    scale = ctx.attr("scale", 0.0) or 1 / math.sqrt(dk)
    groups = q_heads // kv_heads

    def step(body: Builder, t: Value, state: Value):
        def at(x: Value) -> Value:  # x[t], as f32
            return _f32(body, body.gather(x, t, axis=0))

        k_t, v_t = at(k), at(v)  # [B, Hkv, dk], [B, Hkv, dv]
        if decay is not None:
            g = body.exp(at(decay))  # [B, Hkv, 1|dk] -> over the rows dk of S
            state = body.mul(state, body.reshape(g, shape=(*g.shape, 1)))
        if beta is not None:
            recalled = body.matmul(body.reshape(k_t, shape=(batch, kv_heads, 1, dk)), state)
            v_t = body.mul(at(beta), body.sub(v_t, body.reshape(recalled, shape=v_t.shape)))
        outer = body.mul(body.reshape(k_t, shape=(batch, kv_heads, dk, 1)),
                         body.reshape(v_t, shape=(batch, kv_heads, 1, dv)))
        state = body.add(state, outer)
        # Query heads h = kv * groups + g read the state of kv head h // groups.
        q_t = body.reshape(at(q), shape=(batch, kv_heads, groups, dk))
        out = body.reshape(body.matmul(q_t, state), shape=(batch, q_heads, dv))
        return [body.constant(True), state, body.mul(out, scale)]

    state, outs = b.loop(b.constant(steps, dtype=DType.i64), b.constant(True), [state], step,
                         num_scan=1, scan_length=steps)
    y = b.reshape(b.transpose(outs, perm=(1, 0, 2, 3)), shape=(batch, steps, q_heads * dv))
    present_dtype = query.dtype if past is None else past.dtype
    return [_cast(b, y, query.dtype), _cast(b, state, present_dtype)]


def _time_major(b: Builder, x: Value) -> Value:
    """[B, H, T, D] -> [T, B, H, D], so that step t gathers x[t]."""
    return b.transpose(x, perm=(2, 0, 1, 3))


def _f32(b: Builder, x: Value) -> Value:
    return _cast(b, x, DType.f32)


def _cast(b: Builder, x: Value, dtype: DType) -> Value:
    return x if x.dtype is dtype else b.cast(x, to=dtype)


# -- CausalConvWithState ---------------------------------------------------------------------
@converter("CausalConvWithState", since=27)
def causal_conv_with_state(ctx: ConvertContext):
    """Depthwise conv1d over [past_state (or zeros), input], with optional SiLU; the new
    state is the last k - 1 steps of that padded sequence."""
    b = ctx.b
    x, weight, bias, past = ctx.require(0), ctx.require(1), ctx.input(2), ctx.input(3)
    activation = ctx.attr("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise ctx.error(f"activation '{activation}' is not one of none, silu, swish")
    if x.type.rank != 3 or weight.type.rank != 3:
        raise ctx.error(f"input {x.type} and weight {weight.type} must be rank 3")
    batch, channels, length = x.shape
    kernel = weight.shape[2]
    if weight.shape[:2] != (channels, 1) or kernel < 1:
        raise ctx.error(f"weight {weight.type} must be [{channels}, 1, k]")
    if past is None:
        padded = b.pad(x, pads=(0, 0, kernel - 1, 0, 0, 0))
    elif past.shape == (batch, channels, kernel - 1):
        padded = b.concat(past, x, axis=2)
    else:
        raise ctx.error(f"past_state {past.type} must be [{batch}, {channels}, {kernel - 1}]")
    conv = b.conv(padded, weight, *([bias] if bias is not None else []), groups=channels)
    y = b.silu(conv) if activation != "none" else conv
    total = length + kernel - 1
    state = b.slice(padded, starts=(0, 0, length), ends=(batch, channels, total),
                    steps=(1, 1, 1))
    return [y, state]
