"""The interface between the FX importer and the ATen op converters.

A converter is `fn(ctx, *args, **kwargs)` registered for ATen overloads with
`@aten("add.Tensor", "add.Scalar")`; it receives the FX node's arguments with tensor
nodes replaced by graph IR Values (Python scalars, lists, dtypes stay as they are), emits
ops with `ctx.b` and returns the node's result (a Value, or a tuple/list of them).
`ctx.result_type(i)` is the type PyTorch's tracing recorded for the result, which settles
dtype promotion and shapes.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import numpy as np
import torch

from ember.dtypes import DType
from ember.errors import EmberError, UnsupportedOpError
from ember.graph.builder import Builder
from ember.graph.ir import TensorType, Value
from ember.graph.symbolic import (
    Dim,
    SymbolicShapeError,
    dim_max,
    dim_min,
    floor_div,
    modulo,
    symbol,
)
from ember.util.keys import known_digest, remember_digest

T = TypeVar("T")

Converter = Callable[..., Any]
_CONVERTERS: dict[str, Converter] = {}

_TORCH_TO_DTYPE = {
    torch.float16: DType.f16, torch.bfloat16: DType.bf16, torch.float32: DType.f32,
    torch.float64: DType.f64, torch.int8: DType.i8, torch.int16: DType.i16,
    torch.int32: DType.i32, torch.int64: DType.i64, torch.uint8: DType.u8,
    torch.uint16: DType.u16, torch.uint32: DType.u32, torch.uint64: DType.u64,
    torch.bool: DType.bool,
}
_DTYPE_TO_TORCH = {v: k for k, v in _TORCH_TO_DTYPE.items()}


def aten(*overloads: str) -> Callable[[Converter], Converter]:
    """Register a converter for ATen overloads named like "add.Tensor" or "relu.default"."""

    def register(fn: Converter) -> Converter:
        for name in overloads:
            assert name not in _CONVERTERS, f"two converters for aten.{name}"
            _CONVERTERS[name] = fn
        return fn

    return register


def overload_name(target: Any) -> str:
    """"add.Tensor" for torch.ops.aten.add.Tensor; the python name for other callables."""
    if isinstance(target, torch._ops.OpOverload):
        packet = target._overloadpacket.__name__
        return f"{packet}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def find_converter(target: Any) -> Converter | None:
    _load()
    if isinstance(target, torch._ops.OpOverload) and target.namespace != "aten":
        return None
    return _CONVERTERS.get(overload_name(target))


def supported_overloads() -> list[str]:
    _load()
    return sorted(_CONVERTERS)


def _load() -> None:
    from ember.frontends.torch import aten_ops  # noqa: F401  (registration)


def to_dtype(dtype: torch.dtype, what: str = "tensor") -> DType:
    try:
        return _TORCH_TO_DTYPE[dtype]
    except KeyError:
        raise UnsupportedOpError(f"{what} has dtype {dtype}, which Ember does not support"
                                 ) from None


def to_torch_dtype(dtype: DType) -> torch.dtype:
    return _DTYPE_TO_TORCH[dtype]


def tensor_type(val: Any, what: str = "tensor") -> TensorType:
    """The TensorType of a (fake) tensor from an FX node's meta; its symbolic sizes (a
    graph exported with dynamic shapes, Dynamo's after a shape change) become Dims."""
    if not isinstance(val, torch.Tensor):
        raise UnsupportedOpError(f"{what} is a {type(val).__name__}, not a tensor")
    return TensorType(to_dtype(val.dtype, what), tuple(to_dim(d, what) for d in val.shape))


# The sizes an import takes as numbers (name -> value), where Ember needs them so: the
# other symbols stay symbolic (`fixed_sizes`).
_FIXED: ContextVar[Mapping[str, int]] = ContextVar(
    "ember_fixed_sizes", default=types.MappingProxyType({}))


@contextmanager
def fixed_sizes(values: Mapping[str, int]) -> Iterator[None]:
    """Within: PyTorch's size symbols named in `values` import as those numbers."""
    token = _FIXED.set(dict(values))
    try:
        yield
    finally:
        _FIXED.reset(token)


def fixing_sizes(importer: Callable[[], T], values: Mapping[str, int],
                 fixable: Iterable[str] | None = None) -> tuple[T, dict[str, int]]:
    """`importer()`'s result, where the sizes that an op needs as numbers (its
    SymbolicShapeError names them) are fixed to their `values` and the import tried again;
    with the sizes fixed. The error stands when it names none, one without a value or not
    `fixable` (default: any), or every size."""
    fixed: dict[str, int] = {}
    allowed = values.keys() if fixable is None else set(fixable) & values.keys()
    while True:
        try:
            with fixed_sizes(fixed):
                return importer(), fixed
        except SymbolicShapeError as e:
            needed = e.symbols - fixed.keys()
            if not needed or not needed <= allowed or \
                    len(fixed) + len(needed) == len(values):
                raise
            fixed.update((name, values[name]) for name in needed)


def size_values(vals: Sequence[Any]) -> dict[str, int]:
    """The example value PyTorch traced with for each size symbol in these (fake) tensors'
    shapes and SymInts."""
    values: dict[str, int] = {}
    for val in vals:
        for size in val.shape if isinstance(val, torch.Tensor) else [val]:
            if isinstance(size, torch.SymInt):
                env = size.node.shape_env
                known = getattr(env, "backed_var_to_val", None) or env.var_to_val
                values.update((s.name, int(known[s])) for s in size.node.expr.free_symbols
                              if s in known)
    return values


def to_dim(size: Any, what: str = "a size") -> int | Dim:
    """An int, or a SymInt's expression as a Dim (its symbols keep PyTorch's names)."""
    if isinstance(size, int):
        return size
    if isinstance(size, torch.SymInt):
        expr = size.node.expr
        if expr.is_number:
            return int(expr)
        return _sympy_dim(expr, what)
    raise UnsupportedOpError(f"{what}: {size!r} is not a size")


def size_bounds_of(vals: Sequence[Any]) -> dict[str, int]:
    """The upper bounds PyTorch knows of the symbols in these (fake) tensors' shapes and
    SymInts (a guard such as `seq <= 512` that tracing added): name -> bound."""
    bounds: dict[str, int] = {}
    for val in vals:
        sizes = val.shape if isinstance(val, torch.Tensor) else [val]
        for size in sizes:
            if not isinstance(size, torch.SymInt):
                continue
            ranges = size.node.shape_env.var_to_range
            for sym in size.node.expr.free_symbols:
                if sym.name in _FIXED.get():
                    continue
                upper = ranges[sym].upper if sym in ranges else None
                if upper is not None and upper.is_Integer:  # (int_oo says it is finite)
                    bounds[sym.name] = int(upper)
    return bounds


def _sympy_dim(expr: Any, what: str) -> int | Dim:
    """A sympy size expression (torch's symbolic shapes) as a Dim."""
    import sympy

    args = [_sympy_dim(a, what) for a in expr.args]
    name = type(expr).__name__
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        fixed = _FIXED.get()
        return fixed[expr.name] if expr.name in fixed else symbol(expr.name)
    if isinstance(expr, sympy.Add):
        return sum(args[1:], args[0])
    if isinstance(expr, sympy.Mul):
        return math.prod(args[1:], start=args[0])
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) >= 0:
        return math.prod([args[0]] * int(expr.exp), start=1)
    functions = {"FloorDiv": floor_div, "Mod": modulo, "PythonMod": modulo,
                 "Max": dim_max, "Min": dim_min}
    if name in functions and len(args) == 2:
        return functions[name](*args)
    if name in ("Max", "Min") and len(args) > 2:
        return functools.reduce(functions[name], args)
    raise UnsupportedOpError(f"{what} has the size {expr} ({name}), which Ember cannot"
                             " express symbolically")


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A read-only NumPy copy of a real tensor (bf16 through ml_dtypes): no one else holds
    it, so a graph's constant table keeps it as it is (`Builder.constant` copies an array
    that someone could change: a model's weights were copied twice)."""
    source, tensor = tensor, tensor.detach().cpu().contiguous()
    dtype = to_dtype(tensor.dtype)
    if dtype is DType.bf16:
        array = tensor.view(torch.int16).numpy().view(DType.bf16.np).copy()
    else:
        array = tensor.numpy().copy()
    array.flags.writeable = False
    hashed = known_digest(source)  # (version, digest) when the fingerprint hashed it
    if hashed is not None and hashed[0] == source._version:
        remember_digest(array, hashed[1])
    return array


class ConvertContext:
    """What a converter sees of one FX node."""

    def __init__(self, node: torch.fx.Node, builder: Builder):
        self.node = node
        self.b = builder

    @property
    def where(self) -> str:
        return self.b.loc or f"FX node {self.node.name}"

    def unsupported(self, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"aten.{overload_name(self.node.target)} ({self.where}):"
                                  f" {why}")

    def result_type(self, index: int | None = None) -> TensorType:
        """The type of the node's result (of result `index` for tuple results)."""
        val = self.node.meta.get("val")
        if index is not None:
            val = val[index]
        return tensor_type(val, f"result of {self.node.name}")

    def arg_meta(self, index: int) -> Any:
        arg = self.node.args[index]
        return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg

    def constant(self, value: Any, dtype: DType) -> Value:
        if isinstance(value, int) and not isinstance(value, bool) and dtype.is_int:
            # A scalar outside an integer dtype's range wraps, as ATen's conversion of a
            # Scalar does (`x.clamp(min=-3)` of uint8 bounds it by 253).
            bits = 8 * dtype.itemsize
            value %= 1 << bits
            if dtype.is_signed and value >= 1 << (bits - 1):
                value -= 1 << bits
        return self.b.constant(np.asarray(value, dtype=dtype.np))

    def as_value(self, x: Any, dtype: DType) -> Value:
        """`x` (a Value or a Python scalar) as a Value of `dtype`, cast when needed."""
        if isinstance(x, Value):
            return x if x.dtype is dtype else self.b.cast(x, to=dtype)
        if isinstance(x, (bool, int, float)):
            return self.constant(x, dtype)
        if isinstance(x, Dim):  # a size used as a number: bound when a call gives it
            size = self.b.size(value=x)
            return size if dtype is DType.i64 else self.b.cast(size, to=dtype)
        raise self.unsupported(f"expected a tensor or a number, got {type(x).__name__}")

    def promoted(self, a: Any, b: Any) -> DType:
        """The dtype PyTorch computes a binary op on `a` and `b` (tensors or scalars) in."""
        metas = [x.meta.get("val") if isinstance(x, torch.fx.Node) else x for x in (a, b)]
        return to_dtype(torch.result_type(*metas))


def check_result(ctx: ConvertContext, results: Sequence[Value]) -> None:
    """Each result must have the type that PyTorch recorded for it."""
    val = ctx.node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    for i, (value, meta) in enumerate(zip(results, vals)):
        if value is None or not isinstance(meta, torch.Tensor):
            continue
        want = tensor_type(meta, f"result {i} of {ctx.node.name}")
        if value.type != want:
            raise EmberError(f"internal: the converter of aten.{overload_name(ctx.node.target)}"
                             f" ({ctx.where}) produced {value.type}, PyTorch says {want}")

