"""Converters of core ATen ops to the graph IR (a first set; the families grow in
aten_*.py modules imported below)."""

from __future__ import annotations

from ember.frontends.torch.context import ConvertContext, aten

ELEMENTWISE_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div"}


@aten("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar")
def add_sub(ctx: ConvertContext, x, y, alpha=1):
    dtype = ctx.result_type().dtype
    x, y = ctx.as_value(x, dtype), ctx.as_value(y, dtype)
    if alpha != 1:
        y = ctx.b.mul(y, ctx.constant(alpha, dtype))
    op = "add" if ctx.node.target.__name__.startswith("add") else "sub"
    return getattr(ctx.b, op)(x, y)


@aten("mul.Tensor", "mul.Scalar")
def mul(ctx: ConvertContext, x, y):
    dtype = ctx.result_type().dtype
    return ctx.b.mul(ctx.as_value(x, dtype), ctx.as_value(y, dtype))


@aten("relu.default")
def relu(ctx: ConvertContext, x):
    return ctx.b.relu(x)


@aten("permute.default")
def permute(ctx: ConvertContext, x, dims):
    return ctx.b.transpose(x, perm=[d % max(x.type.rank, 1) for d in dims])


@aten("addmm.default")
def addmm(ctx: ConvertContext, bias, a, b, beta=1, alpha=1):
    product = ctx.b.matmul(a, b)
    if alpha != 1:
        product = ctx.b.mul(product, ctx.constant(alpha, product.dtype))
    if beta != 1:
        bias = ctx.b.mul(bias, ctx.constant(beta, bias.dtype))
    return ctx.b.add(product, bias)


@aten("_softmax.default")
def softmax(ctx: ConvertContext, x, dim, half_to_float=False):
    return ctx.b.softmax(x, axis=dim)
