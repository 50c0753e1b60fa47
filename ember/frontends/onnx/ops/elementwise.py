"""Converters of ONNX elementwise ops (math, logic, casts, activations) and constants."""

from __future__ import annotations

from ember.frontends.onnx.context import ConvertContext, converter

BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


@converter(*BINARY, since=7)
def binary(ctx: ConvertContext):
    return getattr(ctx.b, BINARY[ctx.op_type])(ctx.require(0), ctx.require(1))


@converter("Identity")
def identity(ctx: ConvertContext):
    return ctx.require(0)


@converter("Relu")
def relu(ctx: ConvertContext):
    return ctx.b.relu(ctx.require(0))


@converter("Constant")
def constant(ctx: ConvertContext):
    if ctx.has_attr("value"):
        return ctx.constant(ctx.attr("value"))
    raise ctx.unsupported("only the 'value' form of Constant is supported so far")
