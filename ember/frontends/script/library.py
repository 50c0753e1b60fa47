"""What a scripted function may call: NumPy functions, array methods and attributes, and a
few builtins, each a table entry from the Python object (or name) to its emission.

A handler takes (ops, args, kwargs) with ops an ArrayOps and returns the result value;
Python constants in, Python constants out where Python would compute them (builtins on
ints, shapes).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.frontends.script.arrays import ArrayOps, ScriptOpError, as_shape
from ember.frontends.script.types import ArrayValue, describe, is_python_scalar, to_dtype

Handler = Callable[[ArrayOps, list, dict], Any]


def _params(args: list, kwargs: dict, names: tuple[str, ...], defaults: dict[str, Any],
            what: str) -> list[Any]:
    """The arguments of a call bound to `names` (positional first), defaults filled in."""
    if len(args) > len(names):
        raise ScriptOpError(f"{what} takes at most {len(names)} arguments")
    bound = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names or key in bound:
            raise ScriptOpError(f"{what} got an unexpected or repeated argument `{key}`")
        bound[key] = value
    missing = [n for n in names if n not in bound and n not in defaults]
    if missing:
        raise ScriptOpError(f"{what} needs the argument `{missing[0]}`")
    return [bound.get(n, defaults.get(n)) for n in names]


def _dtype_arg(x: Any, what: str) -> DType | None:
    if x is None:
        return None
    dtype = to_dtype(x)
    if dtype is None:
        raise ScriptOpError(f"{what}: {describe(x)} is not a dtype")
    return dtype


def _const_bool(x: Any, what: str) -> bool:
    if not isinstance(x, bool):
        raise ScriptOpError(f"{what} must be a Python bool, got {describe(x)}")
    return x


# -- handler factories --------------------------------------------------------------------------

def unary(name: str, float_only: bool = False) -> Handler:
    def handle(ops, args, kwargs):
        (x,) = _params(args, kwargs, ("x",), {}, name)
        return ops.unary(name, x, float_only)
    return handle


def binary(name: str) -> Handler:
    def handle(ops, args, kwargs):
        a, b = _params(args, kwargs, ("a", "b"), {}, name)
        return ops.binary(name, a, b)
    return handle


def compare(name: str) -> Handler:
    def handle(ops, args, kwargs):
        a, b = _params(args, kwargs, ("a", "b"), {}, name)
        return ops.compare(name, a, b)
    return handle


def axis_reduction(emit: str, name: str) -> Handler:
    """np.<f>(a, axis=None, keepdims=False), emitted by the ArrayOps method `emit`
    (reduce, any_all, arg_reduce) with `name`."""
    def handle(ops, args, kwargs):
        x, axis, keepdims = _params(args, kwargs, ("a", "axis", "keepdims"),
                                    {"axis": None, "keepdims": False}, name)
        return getattr(ops, emit)(name, x, axis, _const_bool(keepdims, "keepdims"))
    return handle


def filled(name: str, value: float | None) -> Handler:
    """np.zeros / np.ones / np.full (value None: the fill is an argument)."""
    def handle(ops, args, kwargs):
        if value is None:
            shape, fill, dtype = _params(args, kwargs, ("shape", "fill_value", "dtype"),
                                         {"dtype": None}, name)
            return ops.full(shape, fill, _dtype_arg(dtype, name))
        shape, dtype = _params(args, kwargs, ("shape", "dtype"), {"dtype": float}, name)
        return ops.full(shape, float(value), _dtype_arg(dtype, name))
    return handle


def filled_like(name: str, value: float | None) -> Handler:
    def handle(ops, args, kwargs):
        if value is None:
            x, fill, dtype = _params(args, kwargs, ("a", "fill_value", "dtype"),
                                     {"dtype": None}, name)
        else:
            (x, dtype), fill = _params(args, kwargs, ("a", "dtype"), {"dtype": None}, name), \
                value
        x = ops.array(x)
        return ops.full(x.shape, fill, _dtype_arg(dtype, name) or x.dtype)
    return handle


def _where(ops, args, kwargs):
    cond, a, b = _params(args, kwargs, ("condition", "x", "y"), {}, "np.where")
    return ops.where(cond, a, b)


def _concatenate(ops, args, kwargs):
    values, axis = _params(args, kwargs, ("arrays", "axis"), {"axis": 0}, "np.concatenate")
    return ops.concatenate(values, axis)


def _stack(ops, args, kwargs):
    values, axis = _params(args, kwargs, ("arrays", "axis"), {"axis": 0}, "np.stack")
    return ops.stack(values, axis)


def _clip(ops, args, kwargs):
    x, lo, hi = _params(args, kwargs, ("a", "a_min", "a_max"), {}, "np.clip")
    out = x
    if lo is not None:
        out = ops.binary("max", out, lo)
    if hi is not None:
        out = ops.binary("min", out, hi)
    return out


def _square(ops, args, kwargs):
    (x,) = _params(args, kwargs, ("x",), {}, "np.square")
    return ops.binary("mul", x, x)


def _matmul(ops, args, kwargs):
    a, b = _params(args, kwargs, ("a", "b"), {}, "np.matmul")
    return ops.matmul(a, b)


def _transpose(ops, args, kwargs):
    x, axes = _params(args, kwargs, ("a", "axes"), {"axes": None}, "np.transpose")
    x = ops.array(x)
    perm = tuple(reversed(range(len(x.shape)))) if axes is None else as_shape(axes)
    return ops.op("transpose", x, perm=perm)


def _reshape(ops, args, kwargs):
    x, shape = _params(args, kwargs, ("a", "newshape"), {}, "np.reshape")
    return ops.reshape(ops.array(x), as_shape(shape))


def _asarray(ops, args, kwargs):
    x, dtype = _params(args, kwargs, ("a", "dtype"), {"dtype": None}, "np.asarray")
    x = ops.array(x)
    x = ArrayValue(x.value)  # a Python number made an array is strong
    dtype = _dtype_arg(dtype, "dtype")
    return ops.cast(x, dtype) if dtype else x


def _copy(ops, args, kwargs):
    (x,) = _params(args, kwargs, ("a",), {}, "copy")
    x = ops.array(x)
    return ArrayValue(x.value, weak=x.weak)  # a new binding, not the argument itself


def _arange(ops, args, kwargs):
    if kwargs or not all(isinstance(a, int) for a in args):
        raise ScriptOpError("np.arange takes Python ints only (start, stop, step)")
    return ops.constant(np.arange(*args))


def scalar_type(dtype: DType) -> Handler:
    """np.float32(x) and friends: a cast."""
    def handle(ops, args, kwargs):
        (x,) = _params(args, kwargs, ("x",), {}, dtype.np.name)
        return ops.cast(ArrayValue(ops.array(x).value), dtype)
    return handle


NUMPY_NAMES: dict[str, Handler] = {
    **{n: unary(n, float_only=True) for n in (
        "exp", "log", "sqrt", "tanh", "sin", "cos", "tan", "sinh", "cosh", "expm1", "log1p",
        "floor", "ceil", "trunc")},
    "arcsin": unary("asin", True), "arccos": unary("acos", True), "arctan": unary("atan", True),
    "round": unary("round", True), "rint": unary("round", True),
    "abs": unary("abs"), "absolute": unary("abs"), "negative": unary("neg"),
    "sign": unary("sign"), "isnan": unary("isnan"), "isinf": unary("isinf"),
    "logical_not": unary("not"),
    "add": binary("add"), "subtract": binary("sub"), "multiply": binary("mul"),
    "maximum": binary("max"), "minimum": binary("min"), "power": binary("pow"),
    "mod": binary("mod"), "remainder": binary("mod"), "fmod": binary("fmod"),
    "logical_and": binary("and"), "logical_or": binary("or"), "logical_xor": binary("xor"),
    "equal": compare("eq"), "not_equal": compare("ne"), "less": compare("lt"),
    "less_equal": compare("le"), "greater": compare("gt"), "greater_equal": compare("ge"),
    "divide": lambda ops, args, kwargs: ops.true_divide(*_params(args, kwargs, ("a", "b"), {},
                                                                 "np.divide")),
    "sum": axis_reduction("reduce", "reduce_sum"),
    "prod": axis_reduction("reduce", "reduce_prod"),
    "mean": axis_reduction("reduce", "reduce_mean"),
    "max": axis_reduction("reduce", "reduce_max"),
    "amax": axis_reduction("reduce", "reduce_max"),
    "min": axis_reduction("reduce", "reduce_min"),
    "amin": axis_reduction("reduce", "reduce_min"),
    "any": axis_reduction("any_all", "any"),
    "all": axis_reduction("any_all", "all"),
    "argmax": axis_reduction("arg_reduce", "argmax"),
    "argmin": axis_reduction("arg_reduce", "argmin"),
    "where": _where, "concatenate": _concatenate, "stack": _stack, "clip": _clip,
    "square": _square, "matmul": _matmul, "dot": _matmul, "transpose": _transpose,
    "reshape": _reshape, "asarray": _asarray, "array": _asarray, "copy": _copy,
    "arange": _arange,
    **{name: filled(f"np.{name}", fill) for name, fill in (
        ("zeros", 0.0), ("ones", 1.0), ("empty", 0.0), ("full", None))},
    **{f"{name}_like": filled_like(f"np.{name}_like", fill) for name, fill in (
        ("zeros", 0.0), ("ones", 1.0), ("empty", 0.0), ("full", None))},
    **{d.np.name: scalar_type(d) for d in (DType.f32, DType.f64, DType.i32, DType.i64,
                                          DType.bool)},
}
NUMPY: dict[Any, Handler] = {getattr(np, n): h for n, h in NUMPY_NAMES.items()
                             if hasattr(np, n)}
NUMPY[np.bool_] = scalar_type(DType.bool)


# -- builtins: on Python values as Python computes them, on arrays as NumPy -------------------

def _builtin_len(ops, args, kwargs):
    (x,) = args
    if isinstance(x, ArrayValue):
        if not x.shape:
            raise ScriptOpError("len() of a zero-dimensional array")
        return x.shape[0]
    return len(x)


def _builtin_minmax(which: str) -> Handler:
    def handle(ops, args, kwargs):
        if kwargs or len(args) < 2:
            raise ScriptOpError(f"{which}() takes two or more values in a scripted function")
        if all(is_python_scalar(a) for a in args):
            return getattr(builtins, which)(*args)
        out = args[0]
        for a in args[1:]:
            out = ops.binary(which, out, a)
        return out
    return handle


def _builtin_convert(kind: type) -> Handler:
    dtype = {float: DType.f64, int: DType.i64, bool: DType.bool}[kind]

    def handle(ops, args, kwargs):
        (x,) = args
        if not isinstance(x, ArrayValue):
            return kind(x)
        if math.prod(x.shape) != 1:
            raise ScriptOpError(f"{kind.__name__}() of an array of shape {x.shape}")
        return ops.cast(ops.reshape(x, ()), dtype, weak=True)  # a Python scalar: weak
    return handle


def _builtin_abs(ops, args, kwargs):
    (x,) = args
    return abs(x) if is_python_scalar(x) else ops.unary("abs", x)


BUILTINS: dict[Any, Handler] = {
    len: _builtin_len, min: _builtin_minmax("min"), max: _builtin_minmax("max"),
    float: _builtin_convert(float), int: _builtin_convert(int), bool: _builtin_convert(bool),
    abs: _builtin_abs,
}


# -- array methods and attributes ---------------------------------------------------------------

def _method(handler: Handler) -> Callable[..., Any]:
    """An ndarray method as a NumPy function taking the array first."""
    return lambda ops, x, args, kwargs: handler(ops, [x, *args], kwargs)


def _astype(ops, x, args, kwargs):
    (dtype,) = _params(args, kwargs, ("dtype",), {}, "astype")
    return ops.cast(x, _dtype_arg(dtype, "astype"))


def _method_reshape(ops, x, args, kwargs):
    shape = args[0] if len(args) == 1 and isinstance(args[0], tuple) else tuple(args)
    return ops.reshape(x, as_shape(shape))


def _method_transpose(ops, x, args, kwargs):
    axes = args[0] if len(args) == 1 and isinstance(args[0], tuple) else (tuple(args) or None)
    return _transpose(ops, [x, axes], {})


METHODS: dict[str, Callable[..., Any]] = {
    "astype": _astype, "reshape": _method_reshape, "transpose": _method_transpose,
    "flatten": lambda ops, x, args, kwargs: ops.reshape(x, (-1,)),
    "ravel": lambda ops, x, args, kwargs: ops.reshape(x, (-1,)),
    **{name: _method(NUMPY_NAMES[name]) for name in (
        "sum", "prod", "mean", "max", "min", "any", "all", "argmax", "argmin", "copy", "clip")},
}

ATTRIBUTES: dict[str, Callable[[ArrayOps, ArrayValue], Any]] = {
    "shape": lambda ops, x: x.shape,
    "ndim": lambda ops, x: len(x.shape),
    "size": lambda ops, x: math.prod(x.shape),
    "dtype": lambda ops, x: x.dtype.np,  # NumPy's, so that `x.dtype == np.float32` holds
    "T": lambda ops, x: _transpose(ops, [x], {}),
}


def is_known_callable(obj: Any) -> bool:
    """Whether a global that a scripted function calls is in these tables (or is range)."""
    try:
        return obj in NUMPY or obj in BUILTINS or obj is range
    except TypeError:  # unhashable
        return False
