"""Converters of ONNX elementwise ops: arithmetic, comparisons, logic, bit ops, unary math,
casts, constants and the variadic Max/Min/Sum/Mean.

Activations, the softmax family, Dropout and the generators (Range, EyeLike, Trilu,
windows) are in `activation.py` and `generator.py`.
"""

from __future__ import annotations

import numpy as np

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter, onnx_dtype
from ember.graph.ir import Value

# -- binary ops ------------------------------------------------------------------------------

BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div",
    "Equal": "eq", "Greater": "gt", "Less": "lt", "GreaterOrEqual": "ge", "LessOrEqual": "le",
    "And": "and", "Or": "or", "Xor": "xor",
    "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
}


def binary_operands(ctx: ConvertContext) -> tuple[Value, Value]:
    """Inputs 0 and 1, with the explicit broadcasting of opsets before 7 applied.

    Before opset 7 a binary op broadcast only with `broadcast=1`, aligning B's dims with A's
    from `axis` on (suffix alignment, NumPy's rule, when `axis` is absent).
    """
    a, b = ctx.require(0), ctx.require(1)
    if ctx.opset < 7 and ctx.attr("broadcast", 0) and ctx.has_attr("axis"):
        axis = ctx.attr("axis")
        axis = axis + a.type.rank if axis < 0 else axis
        trailing = a.type.rank - axis - b.type.rank
        if trailing < 0:
            raise ctx.error(f"B {b.type} does not fit in A {a.type} from axis {axis}")
        b = ctx.b.reshape(b, shape=(*b.type.shape, *(1,) * trailing))
    return a, b


@converter(*BINARY)
def binary(ctx: ConvertContext):
    return getattr(ctx.b, BINARY[ctx.op_type])(*binary_operands(ctx))


@converter("Pow")
def pow_(ctx: ConvertContext):
    """base ** exponent in the base's type; the exponent may have another type."""
    base, exponent = binary_operands(ctx)
    if base.dtype == exponent.dtype:
        return ctx.b.pow(base, exponent)
    b = ctx.b
    if exponent.dtype.is_float and (base.dtype.is_int
                                    or exponent.dtype.itemsize > base.dtype.itemsize):
        # A fractional or wider exponent would lose precision cast to the base's type:
        # compute in the exponent's float type (f64 for an integer base), then cast back.
        wide = DType.f64 if base.dtype.is_int else exponent.dtype
        result = b.pow(b.cast(base, to=wide), cast(ctx, exponent, wide))
        return b.cast(result, to=base.dtype)
    return b.pow(base, b.cast(exponent, to=base.dtype))


@converter("Mod")
def mod(ctx: ConvertContext):
    # fmod=1: C's fmod (sign of the dividend); fmod=0: Python's % (sign of the divisor).
    op = "fmod" if ctx.attr("fmod", 0) else "mod"
    return getattr(ctx.b, op)(ctx.require(0), ctx.require(1))


@converter("BitShift")
def bit_shift(ctx: ConvertContext):
    """x << y or x >> y; shifts outside [0, bits) give 0 (or -1 for negative x shifted right)."""
    x, y = ctx.require(0), ctx.require(1)
    direction = ctx.attr("direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.error(f"direction must be LEFT or RIGHT, got '{direction}'")
    bits = x.dtype.itemsize * 8
    b = ctx.b
    valid = b.lt(y, bits)
    if x.dtype.is_signed:
        valid = getattr(b, "and")(valid, b.ge(y, 0))
    if direction == "RIGHT" and x.dtype.is_signed:
        # An arithmetic shift by bits - 1 is exactly the out-of-range result (0 or -1).
        return b.shr(x, b.where(valid, y, b.constant(np.asarray(bits - 1, x.dtype.np))))
    shift = b.shl if direction == "LEFT" else b.shr
    zero = b.constant(np.zeros((), x.dtype.np))
    return b.where(valid, shift(x, b.where(valid, y, zero)), zero)


# -- unary ops -------------------------------------------------------------------------------

UNARY = {
    "Abs": "abs", "Neg": "neg", "Sign": "sign", "Reciprocal": "reciprocal",
    "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Erf": "erf",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
    "Sinh": "sinh", "Cosh": "cosh", "Tanh": "tanh",
    "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Floor": "floor", "Ceil": "ceil", "Round": "round",  # ONNX Round rounds half to even
    "Sigmoid": "sigmoid", "IsNaN": "isnan", "Not": "not", "BitwiseNot": "bitwise_not",
}


@converter(*UNARY)
def unary(ctx: ConvertContext):
    return getattr(ctx.b, UNARY[ctx.op_type])(ctx.require(0))


@converter("Identity")
def identity(ctx: ConvertContext):
    return ctx.require(0)


@converter("IsInf")
def is_inf(ctx: ConvertContext):
    x = ctx.require(0)
    positive, negative = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if positive and negative:
        return ctx.b.isinf(x)
    if positive or negative:
        return ctx.b.eq(x, np.inf if positive else -np.inf)
    return ctx.b.broadcast(ctx.b.constant(np.asarray(False)), shape=x.type.shape)


# -- casts -----------------------------------------------------------------------------------

def cast(ctx: ConvertContext, x: Value, to: DType) -> Value:
    # float8 is outside Ember's types (onnx_dtype refuses it), so `saturate` never matters.
    return x if x.dtype == to else ctx.b.cast(x, to=to)


@converter("Cast")
def cast_(ctx: ConvertContext):
    return cast(ctx, ctx.require(0), onnx_dtype(ctx.attr("to"), "Cast's 'to'"))


@converter("CastLike")
def cast_like(ctx: ConvertContext):
    return cast(ctx, ctx.require(0), ctx.require(1).dtype)


# -- constants -------------------------------------------------------------------------------

CONSTANT_FORMS = {  # attribute: the NumPy dtype of its value
    "value_float": np.float32, "value_floats": np.float32,
    "value_int": np.int64, "value_ints": np.int64,
}


@converter("Constant")
def constant(ctx: ConvertContext):
    if ctx.has_attr("value"):
        return ctx.constant(ctx.attr("value"))
    for name, dtype in CONSTANT_FORMS.items():
        if ctx.has_attr(name):
            return ctx.constant(np.asarray(ctx.attr(name), dtype))
    for name in ("sparse_value", "value_string", "value_strings"):
        if ctx.has_attr(name):
            raise ctx.unsupported(f"Constant's '{name}' form is not supported")
    raise ctx.error("Constant has no value attribute")


@converter("ConstantOfShape")
def constant_of_shape(ctx: ConvertContext):
    shape = tuple(int(d) for d in ctx.const(0, "the shape"))
    value = ctx.attr("value", np.zeros(1, np.float32))
    if value.size != 1:
        raise ctx.error(f"'value' must have one element, got shape {list(value.shape)}")
    if any(d < 0 for d in shape):
        raise ctx.error(f"the shape {list(shape)} has a negative dim")
    return ctx.b.broadcast(ctx.constant(value.reshape(())), shape=shape)


# -- variadic ops ----------------------------------------------------------------------------

VARIADIC = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}


@converter(*VARIADIC)
def variadic(ctx: ConvertContext):
    """Fold the inputs left to right with NumPy broadcasting; Mean divides the sum by n."""
    inputs = [v for v in ctx.inputs if v is not None]
    if not inputs:
        raise ctx.error("needs at least one input")
    result = inputs[0]
    for value in inputs[1:]:
        result = getattr(ctx.b, VARIADIC[ctx.op_type])(result, value)
    if ctx.op_type == "Mean" and len(inputs) > 1:
        result = ctx.b.div(result, len(inputs))
    return result


@converter("Where")
def where(ctx: ConvertContext):
    return ctx.b.where(ctx.require(0), ctx.require(1), ctx.require(2))
