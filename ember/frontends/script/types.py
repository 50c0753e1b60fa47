"""The values a scripted function computes on, their types, and specialization keys.

At compile time a name holds a Python constant (int, float, bool, str, None, a dtype, a
tuple of these: folded), an `ArrayValue` (an IR value), a tuple mixing both, or
`Undefined`. Python scalars that become IR values stay *weak* (NEP 50): they take the
dtype of the arrays they meet, so `x * 1.5` stays float32 for a float32 `x`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.dtypes import DType, from_numpy
from ember.graph.ir import TensorType, Value

# A Python scalar's kind, ordered as NumPy promotes them: bool < int < float.
KIND_ORDER = {"b": 0, "i": 1, "u": 1, "f": 2}
DEFAULT_OF_KIND = {0: DType.bool, 1: DType.i64, 2: DType.f64}


@dataclass(eq=False)
class ArrayValue:
    """An IR value with what the frontend knows of it beyond its type.

    weak: a Python scalar made a tensor (its dtype yields to a strong operand's).
    origin: the statement that bound it, for the second location of an error.
    argument: the argument's name when this is an argument itself (not a copy of it):
    setitem on it would mutate the caller's array.
    partial: the assignment of a name that one branch of an `if` did not bind.
    """

    value: Value
    weak: bool = False
    origin: ast.AST | None = None
    argument: str | None = None
    partial: ast.AST | None = None

    @property
    def type(self) -> TensorType:
        return self.value.type

    @property
    def dtype(self) -> DType:
        return self.value.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    def describe(self) -> str:
        return describe_type(self.type, self.weak)


@dataclass(frozen=True)
class Undefined:
    """A name with no value on some path (first bound inside a loop or a guarded block)."""

    origin: ast.AST | None = None


def describe_type(t: TensorType, weak: bool = False) -> str:
    """`float32[4, 8]` (NumPy's names, as the user knows them); weak scalars as `float`."""
    if weak and t.shape == ():
        return {0: "bool", 1: "int", 2: "float"}[kind_rank(t.dtype)]
    return f"{t.dtype.np.name}[{', '.join(map(str, t.shape))}]"


def describe(value: Any) -> str:
    if isinstance(value, ArrayValue):
        return value.describe()
    if isinstance(value, tuple):
        return "(" + ", ".join(describe(v) for v in value) + ")"
    if isinstance(value, Undefined):
        return "undefined"
    return f"{type(value).__name__} {value!r}"


def kind_rank(dtype: DType) -> int:
    return KIND_ORDER[dtype.np.kind]


def is_python_scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def promote(a: tuple[DType, bool], b: tuple[DType, bool]) -> tuple[DType, bool]:
    """The (dtype, weak) of a binary op's result by NumPy 2's rules (NEP 50): a weak
    operand of a kind no higher than the strong one's takes the strong dtype."""
    (da, wa), (db, wb) = a, b
    if wa == wb:
        dtype = from_numpy(np.result_type(da.np, db.np))
        return dtype, wa
    strong, weak = (da, db) if wb else (db, da)
    if kind_rank(weak) <= kind_rank(strong):
        return strong, False
    return DEFAULT_OF_KIND[kind_rank(weak)], False


def python_dtype(x: Any) -> DType:
    """The dtype a Python scalar gets as a weak tensor."""
    if isinstance(x, bool):
        return DType.bool
    if isinstance(x, int):
        return DType.i64
    return DType.f64


def to_dtype(x: Any) -> DType | None:
    """`x` read as an element type (np.float32, "float32", ember's DType, float), or None."""
    if isinstance(x, DType):
        return x
    if x is float:
        return DType.f64
    if x is int:
        return DType.i64
    if x is bool:
        return DType.bool
    try:
        return from_numpy(np.dtype(x))
    except Exception:
        return None


@dataclass
class Env:
    """A function's names: their values and the statement that last bound each."""

    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, ast.AST] = field(default_factory=dict)

    def copy(self) -> Env:
        return Env(dict(self.values), dict(self.origins))

    def bind(self, name: str, value: Any, origin: ast.AST) -> None:
        self.values[name] = value
        self.origins[name] = origin


# -- annotations -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorSpec:
    """An argument annotation `ember.Tensor[dtype, shape]`: with one on every argument, the
    function compiles when it is decorated."""

    dtype: DType
    shape: tuple[int, ...]

    def key(self) -> tuple:
        return ("array", self.dtype, self.shape)


class Tensor:
    """`ember.Tensor[ember.f32, (4, 8)]` (or `Tensor[np.float32, (4, 8)]`): an array
    argument's dtype and shape, for ahead-of-time compilation."""

    def __class_getitem__(cls, item: Any) -> TensorSpec:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError("Tensor[dtype, shape]: e.g. ember.Tensor[ember.f32, (4, 8)]")
        dtype, shape = item
        resolved = to_dtype(dtype)
        if resolved is None:
            raise TypeError(f"Tensor[...]: {dtype!r} is not a dtype")
        return TensorSpec(resolved, tuple(int(d) for d in shape))


@dataclass(frozen=True)
class RuntimeInput:
    """A parameter that becomes a graph input: an array, or a weak scalar (a Python float,
    a `dynamic` int)."""

    dtype: DType
    shape: tuple[int, ...]
    weak: bool = False


# -- specialization keys -----------------------------------------------------------------------

def arg_key(x: Any, dynamic: bool = False) -> tuple:
    """How argument value `x` specializes a compile: arrays by dtype and shape; Python ints,
    bools, strings, dtypes and tuples of them by value; floats (and `dynamic` ints) as
    runtime scalars. A TypeError for anything else."""
    if isinstance(x, TensorSpec):
        return x.key()
    if isinstance(x, np.ndarray):
        return ("array", from_numpy(x.dtype), x.shape)
    if isinstance(x, np.generic):
        return ("array", from_numpy(x.dtype), ())
    if isinstance(x, bool):
        return ("const", bool, x)
    if isinstance(x, int):
        return ("int",) if dynamic else ("const", int, x)
    if isinstance(x, float):
        return ("float",)
    if x is None or isinstance(x, str):
        return ("const", type(x), x)
    if isinstance(x, tuple):
        return ("tuple", tuple(arg_key(v, dynamic) for v in x))
    if isinstance(x, np.dtype):
        return ("const", "dtype", from_numpy(x))
    dtype = to_dtype(x) if isinstance(x, type) else None
    if dtype is not None:
        return ("const", "dtype", dtype)
    raise TypeError(type(x).__name__)
