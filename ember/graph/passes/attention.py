"""Find scaled dot-product attention and make it one `graph.attention` op, which lowers to
a kernel with an online softmax (ember/loops/schedules/attention.py).

The pattern is what torch.export makes of `F.scaled_dot_product_attention` (BERT, GPT-2),
with the scale already multiplied into q and k, and what ONNX exports of BERT hold:

    s = matmul(q, kt)                    [*B, L, S] (for torch, a view with leading 1s follows)
    x = s + mask                         optional; an f32 mask that broadcasts to [.., L, S]
    p = softmax(x, axis=-1)
    p = where(all(x == -inf along the row), 0, p)    optional ("safe" softmax)
    o = matmul(p, v)                     [*B, L, E] (for torch, through the view back)

    ->  o = attention(q, kt, v, mask [1s or B, L, S]) {empty_rows_zero = whether the where
        was}

The `sdpa` composite (ONNX's Attention, torch.compile's graphs) becomes the same op, its
scale an attribute (`attention_of_sdpa`).

It runs before `decompose`, which would split the softmax. Only f32 attention is formed
(the kernel's dtype); the ops it replaces are left to dce. Compiles run it unless
`Config(fuse_attention=False)`: the kernel keeps a group of rows' scores instead of all of
them and measured faster than the unfused GEMMs and softmax at sequence lengths 128 to
2048 (12 heads of 64, one thread: 0.58 against 0.64 ms at 128, 140 against 168 ms at
2048; BERT and GPT-2 1% faster on one thread, 1-7% on two).
"""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import DType
from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Value
from ember.graph.passes import graph_pass
from ember.graph.passes.fold import constant_value
from ember.graph.rewrite import PatternTable, apply_patterns

attention_patterns = PatternTable()


def _producer(value: Value, name: str) -> Op | None:
    op = value.producer
    return op if op is not None and op.name == name else None


def _unview(value: Value) -> Value:
    """`value` before a reshape that only regroups its leading (batch) dims: adds or drops
    leading 1s, or merges [B, H] into [B*H] as torch's bmm does (a pure view: the
    matrices stay whole and in order)."""
    op = _producer(value, "reshape")
    if op is None:
        return value
    source = op.operands[0].shape
    if _strip(value.shape) == _strip(source) or (
            len(value.shape) >= 2 and len(source) >= 2
            and tuple(value.shape[-2:]) == tuple(source[-2:])
            and math.prod(value.shape[:-2]) == math.prod(source[:-2])):
        return op.operands[0]
    return value


def _strip(shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` without its leading 1s."""
    first = next((i for i, d in enumerate(shape) if d != 1), len(shape))
    return tuple(shape[first:])


def _is_constant(graph: Graph, value: Value, target: float) -> bool:
    data = constant_value(graph, value)
    if data is None and (op := _producer(value, "broadcast")) is not None:
        data = constant_value(graph, op.operands[0])
    return data is not None and data.size > 0 and bool(np.all(data == target))


def _all_masked_test(graph: Graph, cond: Value, x: Value) -> bool:
    """Whether `cond` is not(any(x != -inf along the last axis)), as torch exports it:
    not(cast(reduce_max(cast(not(eq(x, -inf)), u8), [-1], keepdims), bool))."""
    chain = []
    for name in ("not", "cast", "reduce_max", "cast", "not", "eq"):
        op = _producer(cond, name)
        if op is None:
            return False
        chain.append(op)
        cond = op.operands[0]
    reduce, eq = chain[2], chain[5]
    axes = [a % len(x.shape) for a in reduce.attrs["axes"]]
    return (axes == [len(x.shape) - 1] and reduce.attrs["keepdims"]
            and eq.operands[0] is x and _is_constant(graph, eq.operands[1], -math.inf))


def _attention(b: Builder, q: Value, kt: Value, v: Value, mask: Value | None,
               batch: list[int], scale: float, empty_rows_zero: bool,
               loc: str | None) -> Value | None:
    """attention(q, kt, v, mask) {scale} on the batch dims `batch`: q [.., L, D], kt
    [.., D, S] and v [.., S, E] broadcast to them, an additive f32 mask given their rank
    (leading 1s). None when the mask does not broadcast to [*batch, L, S]."""
    if not batch:  # the op has a batch dim at least: one of 1
        lifted = [None if x is None else b.reshape(x, shape=[1, *x.shape], loc=loc)
                  for x in (q, kt, v, mask)]
        out = _attention(b, *lifted, [1], scale, empty_rows_zero, loc)
        return None if out is None else b.reshape(out, shape=list(out.shape[1:]), loc=loc)

    def full(x: Value) -> Value:
        shape = [*batch, *x.shape[-2:]]
        return x if list(x.shape) == shape else b.broadcast(x, shape=shape, loc=loc)

    operands = [full(q), full(kt), full(v)]
    if mask is not None:
        scores = [*batch, q.shape[-2], kt.shape[-1]]
        aligned = list(mask.shape)
        while len(aligned) > len(scores) and aligned[0] == 1:
            aligned.pop(0)
        aligned = [1] * (len(scores) - len(aligned)) + aligned
        if len(aligned) != len(scores) or any(m not in (1, n) for m, n in zip(aligned, scores)):
            return None
        target = aligned[:-2] + scores[-2:]  # batch dims stay 1 where every head shares it
        if list(mask.shape) != aligned:
            mask = b.reshape(mask, shape=aligned, loc=loc)
        if aligned != target:
            mask = b.broadcast(mask, shape=target, loc=loc)
        operands.append(mask)
    return b.op("attention", operands, {"scale": scale, "empty_rows_zero": empty_rows_zero},
                loc=loc).result


@attention_patterns.on("matmul")
def form_attention(op: Op, b: Builder) -> list[Value] | None:
    weights, v = op.operands
    if len(weights.shape) < 3 or op.result.dtype is not DType.f32:
        return None
    p = _unview(weights)
    empty_rows_zero = False
    if (where := _producer(p, "where")) is not None:
        cond, zeros, p = where.operands
        softmax = _producer(p, "softmax")
        if softmax is None or not _is_constant(b.graph, zeros, 0.0) or \
                not _all_masked_test(b.graph, cond, softmax.operands[0]):
            return None
        empty_rows_zero = True
    softmax = _producer(p, "softmax")
    if softmax is None or softmax.attrs["axis"] % len(p.shape) != len(p.shape) - 1:
        return None
    x, mask = softmax.operands[0], None
    if (add := _producer(x, "add")) is not None:
        for scores, other in (add.operands, add.operands[::-1]):
            if _producer(_unview(scores), "matmul") is not None and scores.shape == x.shape:
                x, mask = scores, other
                break
        else:
            return None
    scores_op = _producer(_unview(x), "matmul")
    if scores_op is None or scores_op.result.shape != weights.shape:
        return None
    q, kt = scores_op.operands
    *batch, rows, keys = weights.shape
    if any(tuple(t.shape[:-2]) != tuple(batch) for t in (q, kt, v)) or v.shape[-2] != keys:
        return None
    if mask is not None and mask.dtype is not DType.f32:
        return None
    viewed = [_unview(t) for t in (q, kt, v)]
    outer = list(viewed[0].shape[:-2])
    if len(outer) > len(batch) and all(list(t.shape[:-2]) == outer for t in viewed):
        # The batched matmuls read [1, H, L, D] operands through views that drop the 1
        # (torch's bmm); the op reads them in place, where the views would be copies.
        q, kt, v, batch = *viewed, outer
    out = _attention(b, q, kt, v, mask, batch, 1.0, empty_rows_zero, softmax.loc)
    if out is not None and out.shape != op.result.shape:
        out = b.reshape(out, shape=list(op.result.shape), loc=softmax.loc)
    return None if out is None else [out]


@attention_patterns.on("sdpa")
def attention_of_sdpa(op: Op, b: Builder) -> list[Value] | None:
    """The `sdpa` composite (ONNX's Attention, torch.compile's graphs, @ember.script) as
    one attention op on its batch dims: k transposed, a causal or boolean mask as an
    additive one of 0 and -inf. A row that sees no key gives NaN, as the composite's
    softmax does."""
    q, k, v, *masks = op.operands
    if op.result.dtype is not DType.f32:
        return None
    rows, dim = q.shape[-2:]
    keys = k.shape[-2]
    scale = 1 / math.sqrt(dim) if math.isnan(op.attrs["scale"]) else op.attrs["scale"]
    rank = len(k.shape)
    kt = b.transpose(k, perm=[*range(rank - 2), rank - 1, rank - 2], loc=op.loc)
    mask = masks[0] if masks else None
    if op.attrs["is_causal"]:
        causal = np.where(np.tri(rows, keys, dtype=bool), 0, -np.inf).astype(np.float32)
        mask = b.constant(causal, name="causal_mask")
    elif mask is not None and mask.dtype is DType.bool:
        mask = b.where(mask, b.constant(np.float32(0)), b.constant(np.float32(-np.inf)),
                       loc=op.loc)
    out = _attention(b, q, kt, v, mask, list(op.result.shape[:-2]), scale, False, op.loc)
    return None if out is None else [out]


@graph_pass("fuse_attention", "make softmax(q @ kt + mask) @ v one graph.attention op")
def fuse_attention(graph: Graph) -> Graph:
    apply_patterns(graph, attention_patterns)
    return graph
