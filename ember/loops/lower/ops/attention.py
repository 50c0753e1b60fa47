"""Scaled dot-product attention, softmax(q @ kt * scale + mask) @ v over the last axis, as
one kernel: the plain nest of an online softmax, one key at a time
(ember/loops/schedules/attention.py, `plain_attention`), which the scheduling stage's
`attention` step takes in blocks of keys and groups of rows. f32 only: the graph pass
that forms this op (ember/graph/passes/attention.py) makes it for f32 attention only.
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.errors import UnsupportedOpError
from ember.loops.ir import Const, Expr, Stmt, Store
from ember.loops.lower.core import LowerContext, lowering
from ember.loops.schedules.attention import Attention, plain_attention


@lowering("attention")
def attention(ctx: LowerContext) -> list[Stmt]:
    q, kt, v = ctx.inputs[:3]
    mask = ctx.inputs[3] if len(ctx.inputs) == 4 else None
    out = ctx.outputs[0]
    if any(b.dtype is not DType.f32 for b in (*ctx.inputs, out)):
        raise UnsupportedOpError(f"graph.attention lowers for f32 only, not {q.dtype}")
    *batch, rows, dim = q.shape

    def masked(index: list[Expr]) -> Expr:
        """The mask at [*batch, row, key], its batch dims of size 1 broadcast."""
        *b, row, key = index
        return ctx.load(3, [*(Const(0) if m == 1 else i for m, i in zip(mask.shape, b)),
                            row, key])

    return plain_attention(ctx, Attention(
        tuple(batch), rows, dim, kt.shape[-1], v.shape[-1], ctx.attrs["scale"],
        ctx.attrs["empty_rows_zero"], lambda i: ctx.load(0, i), lambda i: ctx.load(1, i),
        lambda i: ctx.load(2, i), masked if mask is not None else None,
        lambda index, value: Store(out.name, tuple(index), value)))
