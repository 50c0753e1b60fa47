"""Elementwise ops: unary math, binary ops with NumPy broadcasting, `where`, `cast`, `constant`.

Half-precision floats compute in f32 and round at the op's output (the interpreter does
the widening), so references here see f32, f64, integers and bools only.
"""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import ALL_TYPES, FLOAT_TYPES, INT_TYPES, NUMERIC_TYPES, DType, from_numpy
from ember.errors import ShapeError
from ember.graph.ir import TensorType
from ember.graph.ops.common import broadcast_shapes, require_dtype, same_dtype
from ember.graph.ops.registry import Attr, define

SIGNED_NUMERIC = FLOAT_TYPES | {DType.i8, DType.i16, DType.i32, DType.i64}
BOOL = frozenset({DType.bool})
INT_OR_BOOL = INT_TYPES | BOOL

_erf_ufunc = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, exact to double precision (NumPy has none)."""
    return np.asarray(_erf_ufunc(x), np.float64).astype(x.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Split by sign so that exp never overflows.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


# Cost traits (see registry.TRAITS): what fusion must not recompute, and what it stores once.
EXPENSIVE = ("expensive",)
TRANSCENDENTAL = ("expensive", "transcendental")


def _unary_infer(allowed, result_dtype=None):
    def infer(types, attrs):
        require_dtype(types[0], allowed)
        return types[0].with_dtype(result_dtype) if result_dtype else types[0]

    return infer


UNARY_OPS = {
    # name: (reference, allowed dtypes, result dtype or None for "same", traits, summary)
    "neg": (np.negative, SIGNED_NUMERIC, None, (), "-x"),
    "abs": (np.abs, NUMERIC_TYPES, None, (), "|x|"),
    "sign": (np.sign, NUMERIC_TYPES, None, (), "-1, 0 or 1 by the sign of x"),
    "exp": (np.exp, FLOAT_TYPES, None, TRANSCENDENTAL, "e**x"),
    "expm1": (np.expm1, FLOAT_TYPES, None, TRANSCENDENTAL, "e**x - 1"),
    "log": (np.log, FLOAT_TYPES, None, TRANSCENDENTAL, "natural logarithm"),
    "log1p": (np.log1p, FLOAT_TYPES, None, TRANSCENDENTAL, "log(1 + x)"),
    "sqrt": (np.sqrt, FLOAT_TYPES, None, EXPENSIVE, "square root"),
    "rsqrt": (lambda x: 1 / np.sqrt(x), FLOAT_TYPES, None, EXPENSIVE, "1 / sqrt(x)"),
    "reciprocal": (lambda x: 1 / x, FLOAT_TYPES, None, EXPENSIVE, "1 / x"),
    "sin": (np.sin, FLOAT_TYPES, None, TRANSCENDENTAL, "sine"),
    "cos": (np.cos, FLOAT_TYPES, None, TRANSCENDENTAL, "cosine"),
    "tan": (np.tan, FLOAT_TYPES, None, EXPENSIVE, "tangent"),
    "asin": (np.arcsin, FLOAT_TYPES, None, EXPENSIVE, "arc sine"),
    "acos": (np.arccos, FLOAT_TYPES, None, EXPENSIVE, "arc cosine"),
    "atan": (np.arctan, FLOAT_TYPES, None, EXPENSIVE, "arc tangent"),
    "sinh": (np.sinh, FLOAT_TYPES, None, EXPENSIVE, "hyperbolic sine"),
    "cosh": (np.cosh, FLOAT_TYPES, None, EXPENSIVE, "hyperbolic cosine"),
    "tanh": (np.tanh, FLOAT_TYPES, None, TRANSCENDENTAL, "hyperbolic tangent"),
    "asinh": (np.arcsinh, FLOAT_TYPES, None, EXPENSIVE, "inverse hyperbolic sine"),
    "acosh": (np.arccosh, FLOAT_TYPES, None, EXPENSIVE, "inverse hyperbolic cosine"),
    "atanh": (np.arctanh, FLOAT_TYPES, None, EXPENSIVE, "inverse hyperbolic tangent"),
    "erf": (erf, FLOAT_TYPES, None, TRANSCENDENTAL, "the error function"),
    "sigmoid": (_sigmoid, FLOAT_TYPES, None, TRANSCENDENTAL, "1 / (1 + e**-x)"),
    "floor": (np.floor, FLOAT_TYPES, None, (), "round toward -inf"),
    "ceil": (np.ceil, FLOAT_TYPES, None, (), "round toward +inf"),
    "round": (np.round, FLOAT_TYPES, None, (), "round half to even"),
    "trunc": (np.trunc, FLOAT_TYPES, None, (), "round toward zero"),
    "not": (np.logical_not, BOOL, None, (), "logical not"),
    "bitwise_not": (np.invert, INT_TYPES, None, (), "bitwise complement"),
    "isnan": (np.isnan, FLOAT_TYPES, DType.bool, (), "x is NaN"),
    "isinf": (np.isinf, FLOAT_TYPES, DType.bool, (), "x is +inf or -inf"),
}

for _name, (_ref, _allowed, _result, _traits, _summary) in UNARY_OPS.items():
    define(_name, arity=1, infer=_unary_infer(_allowed, _result), reference=_ref,
           traits=("elementwise", "pure", *_traits), summary=_summary, family="elementwise",
           category="elementwise")


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero, as C and LLVM's sdiv/udiv do; x/0 gives 0."""
    if a.dtype.kind == "u":
        return np.floor_divide(a, b)
    q = np.floor_divide(a, b)
    inexact = (q * b != a) & ((a < 0) != (b < 0)) & (b != 0)
    return q + inexact.astype(q.dtype)


def _div(a, b):
    return _int_div(a, b) if a.dtype.kind in "iu" else np.true_divide(a, b)


def _pow(a, b):
    if a.dtype.kind in "iu":
        return _int_pow(a, b)
    return np.power(a, b)


def _int_pow(a, b):
    """a ** b for integers, exact and wrapping on overflow as repeated multiplication does
    (ATen's; NumPy refuses negative exponents). A negative exponent gives 1 for a base of 1,
    +-1 for -1 and 0 for any other base (the integer part of the true power)."""
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    result, base = np.ones(a.shape, a.dtype), a.copy()
    exponent = np.where(b < 0, 0, b).astype(b.dtype)
    with np.errstate(over="ignore"):
        while np.any(exponent):
            result = np.where(exponent & 1, result * base, result).astype(a.dtype)
            base = (base * base).astype(a.dtype)
            exponent = exponent >> 1
    if a.dtype.kind == "i":
        tiny = np.where(a == 1, 1, np.where(a == -1, np.where(b & 1, -1, 1), 0))
        result = np.where(b < 0, tiny, result).astype(a.dtype)
    return result


def _shift_right(a, b):
    return np.right_shift(a, b)


def _binary_infer(allowed, result_dtype=None):
    def infer(types, attrs):
        dtype = same_dtype(types)
        require_dtype(types[0], allowed)
        shape = broadcast_shapes(types[0].shape, types[1].shape)
        return TensorType(result_dtype or dtype, shape)

    return infer


BINARY_OPS = {
    # name: (reference, allowed dtypes, result dtype or None, traits, summary)
    "add": (np.add, NUMERIC_TYPES, None, ("commutative",), "a + b"),
    "sub": (np.subtract, NUMERIC_TYPES, None, (), "a - b"),
    "mul": (np.multiply, NUMERIC_TYPES, None, ("commutative",), "a * b"),
    "div": (_div, NUMERIC_TYPES, None, EXPENSIVE, "a / b; integers truncate toward zero"),
    "pow": (_pow, NUMERIC_TYPES, None, TRANSCENDENTAL, "a ** b"),
    "max": (np.maximum, NUMERIC_TYPES, None, ("commutative",), "larger of a, b; NaN wins"),
    "min": (np.minimum, NUMERIC_TYPES, None, ("commutative",), "smaller of a, b; NaN wins"),
    "mod": (np.mod, NUMERIC_TYPES, None, EXPENSIVE, "remainder with the sign of b (floor)"),
    "fmod": (np.fmod, NUMERIC_TYPES, None, EXPENSIVE, "remainder with the sign of a (truncate)"),
    "eq": (np.equal, ALL_TYPES, DType.bool, ("commutative",), "a == b"),
    "ne": (np.not_equal, ALL_TYPES, DType.bool, ("commutative",), "a != b"),
    "lt": (np.less, NUMERIC_TYPES, DType.bool, (), "a < b"),
    "le": (np.less_equal, NUMERIC_TYPES, DType.bool, (), "a <= b"),
    "gt": (np.greater, NUMERIC_TYPES, DType.bool, (), "a > b"),
    "ge": (np.greater_equal, NUMERIC_TYPES, DType.bool, (), "a >= b"),
    "and": (np.logical_and, BOOL, None, ("commutative",), "logical and"),
    "or": (np.logical_or, BOOL, None, ("commutative",), "logical or"),
    "xor": (np.logical_xor, BOOL, None, ("commutative",), "logical exclusive or"),
    "bitwise_and": (np.bitwise_and, INT_OR_BOOL, None, ("commutative",), "a & b"),
    "bitwise_or": (np.bitwise_or, INT_OR_BOOL, None, ("commutative",), "a | b"),
    "bitwise_xor": (np.bitwise_xor, INT_OR_BOOL, None, ("commutative",), "a ^ b"),
    "shl": (np.left_shift, INT_TYPES, None, (), "a << b"),
    "shr": (_shift_right, INT_TYPES, None, (), "a >> b; arithmetic for signed types"),
}

for _name, (_ref, _allowed, _result, _traits, _summary) in BINARY_OPS.items():
    define(_name, arity=2, infer=_binary_infer(_allowed, _result), reference=_ref,
           traits=("elementwise", "pure", *_traits), summary=_summary, family="elementwise",
           category="elementwise")


def _where_infer(types, attrs):
    cond, a, b = types
    require_dtype(cond, BOOL, "condition")
    dtype = same_dtype([a, b], "the two branches")
    return TensorType(dtype, broadcast_shapes(cond.shape, a.shape, b.shape))


define("where", arity=3, infer=_where_infer, reference=np.where,
       traits=("elementwise", "pure"), summary="cond ? a : b, broadcasting",
       family="elementwise", category="elementwise")


def _cast_reference(x, to):
    if to is DType.bool:
        return x != 0
    if x.dtype.kind == "f" and to.is_int:
        return float_to_int(x, to)
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(to.np)


def float_to_int(x: np.ndarray, to: DType) -> np.ndarray:
    """Floats to integers as PyTorch, NumPy and ONNX Runtime convert them on x86-64 (where C
    leaves it undefined), on every target: truncated toward zero into i32 (for targets of
    at most 32 bits but u32) or i64, a value outside that type or NaN giving its minimum,
    then wrapped to the target's width (300.0 -> i8 44, -1.0 -> u8 255). u64 also takes the
    values of [2**63, 2**64) exactly."""
    bits = 32 if to.itemsize < 4 or to is DType.i32 else 64
    low, high = -2.0 ** (bits - 1), 2.0 ** (bits - 1)
    with np.errstate(invalid="ignore"):
        t = np.trunc(x.astype(np.float64))
        inside = (t >= low) & (t < high)
        wide = np.where(inside, t, low).astype(np.int32 if bits == 32 else np.int64)
        out = wide.astype(to.np)
        if to is DType.u64:
            top = (t >= high) & (t < 2.0 * high)
            out = np.where(top, np.where(top, t, 0).astype(np.uint64), out)
    return out


define("cast", arity=1, attrs={"to": Attr("dtype")},
       infer=lambda types, attrs: types[0].with_dtype(attrs["to"]),
       reference=_cast_reference, traits=("elementwise", "pure"),
       summary="convert the element type (floats to integers truncate)", family="elementwise",
       category="elementwise")


def _constant_infer(types, attrs):
    value = attrs["value"]
    if (value is None) == (attrs["name"] is None):
        raise ShapeError("a constant has exactly one of 'value' (inline) and 'name' (table)")
    if value is None:
        raise ShapeError("the type of a table constant comes from the graph's constant table")
    return TensorType(from_numpy(value.dtype), value.shape)


define("constant", arity=0, attrs={"value": Attr("dense", None), "name": Attr("symbol", None)},
       infer=_constant_infer, reference=None, traits=("pure",),
       summary="a constant tensor, inline (`value`) or from the graph's table (`name`)",
       family="elementwise")


def _bitcast_infer(types, attrs):
    (x,) = types
    if x.dtype.itemsize != attrs["to"].itemsize:
        raise ShapeError(f"cannot bitcast {x.dtype} ({8 * x.dtype.itemsize} bits) to"
                         f" {attrs['to']} ({8 * attrs['to'].itemsize} bits)")
    return x.with_dtype(attrs["to"])


def _bitcast(x, to):
    if to is DType.bool:
        return x.view(np.uint8) != 0  # Ember's bools are 0 or 1
    return (x if x.flags.c_contiguous else x.copy()).view(to.np)


# raw_bits: the interpreter passes f16/bf16 operands as they are, not widened to f32.
define("bitcast", arity=1, attrs={"to": Attr("dtype")}, infer=_bitcast_infer,
       reference=_bitcast, traits=("elementwise", "pure", "raw_bits"), family="elementwise",
       category="elementwise",
       summary="reinterpret the bits of each element as `to`, a type of the same width")
