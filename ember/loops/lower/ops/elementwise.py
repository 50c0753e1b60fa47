"""Lowerings of elementwise graph ops: the value at an output index is an expression over
the operands' values at the same (broadcast) index."""

from __future__ import annotations

from ember.dtypes import DType
from ember.graph.ops.elementwise import BINARY_OPS, UNARY_OPS
from ember.loops.ir import ZERO_DIVISOR, Binary, Bitcast, Cast, Select, Store, Unary
from ember.loops.lower.core import LowerContext, lowering

# Graph unary ops the loop IR has under the same name; the rest are spelled out below.
SAME_UNARY = set(UNARY_OPS) - {"reciprocal", "sigmoid"}


@lowering(*SAME_UNARY)
def unary(ctx: LowerContext):
    return ctx.store_each(lambda i: Unary(ctx.op.name, ctx.load_broadcast(0, i)))


@lowering("reciprocal")
def reciprocal(ctx: LowerContext):
    one = ctx.const(1, ctx.inputs[0].dtype)
    return ctx.store_each(lambda i: Binary("div", one, ctx.load_broadcast(0, i)))


@lowering("sigmoid")
def sigmoid(ctx: LowerContext):
    dtype = ctx.inputs[0].dtype
    one, zero = ctx.const(1, dtype), ctx.const(0, dtype)

    def value(i):
        # With e = exp(-|x|) (never overflows): 1 / (1 + e) for x >= 0, e / (1 + e) below,
        # so that very negative x gives the tiny (denormal) value, not 0.
        x = ctx.load(0, i)
        e = Unary("exp", Unary("neg", Unary("abs", x)))
        denominator = Binary("add", one, e)
        return Select(Binary("ge", x, zero), Binary("div", one, denominator),
                      Binary("div", e, denominator))

    return ctx.store_each(value)


@lowering(*BINARY_OPS)
def binary(ctx: LowerContext):
    return ctx.store_each(lambda i: Binary(ctx.op.name, ctx.load_broadcast(0, i),
                                           ctx.load_broadcast(1, i)))


@lowering("where")
def where(ctx: LowerContext):
    return ctx.store_each(lambda i: Select(*(ctx.load_broadcast(k, i) for k in range(3))))


@lowering("cast")
def cast(ctx: LowerContext):
    to = ctx.attrs["to"]
    if to is DType.bool:
        zero = ctx.const(0, ctx.inputs[0].dtype)
        return ctx.store_each(lambda i: Binary("ne", ctx.load(0, i), zero))
    return ctx.store_each(lambda i: Cast(to, ctx.load(0, i)))


@lowering("bitcast")
def bitcast(ctx: LowerContext):
    return ctx.store_each(lambda i: Bitcast(ctx.attrs["to"], ctx.load(0, i)))


@lowering("check_nonzero")
def check_nonzero(ctx: LowerContext):
    """y = x; the status word says ZERO_DIVISOR where an element is 0."""
    zero = ctx.const(0, ctx.inputs[0].dtype)
    y = ctx.outputs[0]

    def body(i):
        x = ctx.load(0, i)
        return [ctx.fail_if(Binary("eq", x, zero), ZERO_DIVISOR), Store(y.name, tuple(i), x)]

    return ctx.nest(y.shape, body)
