"""NumPy semantics on IR values: promotion (NEP 50), casts, indexing and functional setitem.

`ArrayOps` wraps the Builder of the region being emitted. Its methods take Python
constants or `ArrayValue`s and return `ArrayValue`s. Type errors raise `ScriptOpError`
with a message for the user; the emitter positions it at the expression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.errors import EmberError
from ember.frontends.script.types import (
    ArrayValue,
    describe,
    is_python_scalar,
    kind_rank,
    promote,
    python_dtype,
)
from ember.graph.builder import Builder


@dataclass(frozen=True)
class DynamicSlice:
    """`x[start:start + length]` with a runtime start (an i64 scalar) and a length known
    now; it must stay in bounds (its shape cannot depend on the data)."""

    start: ArrayValue
    length: int


class ScriptOpError(Exception):
    """A user-level type or value error; the emitter adds the position."""


def check_error(e: EmberError) -> ScriptOpError:
    """An op's type error for the user: `matmul: contracted dims differ: ...`."""
    return ScriptOpError(str(e).removeprefix("graph."))


class ArrayOps:
    def __init__(self, builder: Builder):
        self.b = builder

    # -- making values ---------------------------------------------------------------------
    def op(self, name: str, *operands: ArrayValue, weak: bool = False, **attrs: Any) -> ArrayValue:
        try:
            result = self.b.op(name, [o.value for o in operands], attrs).results[0]
        except EmberError as e:
            raise check_error(e) from None
        return ArrayValue(result, weak=weak)

    def constant(self, array: np.ndarray, weak: bool = False) -> ArrayValue:
        return ArrayValue(self.b.constant(array), weak=weak)

    def array(self, x: Any) -> ArrayValue:
        """`x` as an ArrayValue: Python scalars weak, NumPy arrays strong constants."""
        if isinstance(x, ArrayValue):
            return x
        if is_python_scalar(x):
            return self.constant(np.asarray(x, python_dtype(x).np), weak=True)
        if isinstance(x, (np.ndarray, np.generic)):
            return self.constant(np.asarray(x))
        if isinstance(x, tuple) and all(is_python_scalar(v) for v in x):
            return self.constant(np.asarray(x))
        raise ScriptOpError(f"expected an array or a number, got {describe(x)}")

    def cast(self, a: ArrayValue, dtype: DType, weak: bool = False) -> ArrayValue:
        if a.dtype is dtype:
            return a if a.weak == weak else ArrayValue(a.value, weak=weak)
        if dtype is DType.bool:
            return self.op("ne", a, self.constant(np.zeros((), a.dtype.np)), weak=weak)
        return self.op("cast", a, to=dtype, weak=weak)

    def broadcast_to(self, a: ArrayValue, shape: tuple[int, ...]) -> ArrayValue:
        if a.shape == tuple(shape):
            return a
        return self.op("broadcast", a, shape=tuple(shape), weak=a.weak)

    def reshape(self, a: ArrayValue, shape: tuple[int, ...]) -> ArrayValue:
        shape = resolve_shape(shape, math.prod(a.shape))
        if a.shape == shape:
            return a
        return self.op("reshape", a, shape=shape, weak=a.weak)

    # -- arithmetic ------------------------------------------------------------------------
    def promoted(self, *operands: Any) -> tuple[list[ArrayValue], DType, bool]:
        values = [self.array(x) for x in operands]
        dtype, weak = values[0].dtype, values[0].weak
        for v in values[1:]:
            dtype, weak = promote((dtype, weak), (v.dtype, v.weak))
        return [self.cast(v, dtype, v.weak) for v in values], dtype, weak

    def binary(self, name: str, a: Any, b: Any) -> ArrayValue:
        (a, b), dtype, weak = self.promoted(a, b)
        if dtype is DType.bool and name in BOOL_OPS:
            name = BOOL_OPS[name]
        return self.op(name, a, b, weak=weak)

    def compare(self, name: str, a: Any, b: Any) -> ArrayValue:
        (a, b), _, weak = self.promoted(a, b)
        return self.op(name, a, b, weak=weak)

    def true_divide(self, a: Any, b: Any) -> ArrayValue:
        (a, b), dtype, weak = self.promoted(a, b)
        if kind_rank(dtype) < 2:
            a, b = self.cast(a, DType.f64), self.cast(b, DType.f64)
        return self.op("div", a, b, weak=weak)

    def floor_divide(self, a: Any, b: Any) -> ArrayValue:
        (a, b), dtype, weak = self.promoted(a, b)
        if kind_rank(dtype) == 2:
            return self.op("floor", self.op("div", a, b), weak=weak)
        # Integers: (a - a mod b) / b divides exactly, so truncation is the floor.
        return self.op("div", self.op("sub", a, self.op("mod", a, b)), b, weak=weak)

    def matmul(self, a: Any, b: Any) -> ArrayValue:
        (a, b), _, _ = self.promoted(a, b)
        return self.op("matmul", a, b)

    def unary(self, name: str, a: Any, float_only: bool = False) -> ArrayValue:
        a = self.array(a)
        if float_only and kind_rank(a.dtype) < 2:
            a = self.cast(a, DType.f64, a.weak)
        return self.op(name, a, weak=a.weak)

    def logical_not(self, a: Any) -> ArrayValue:
        return self.op("not", self.cast(self.array(a), DType.bool))

    def truth(self, a: Any) -> ArrayValue:
        """A 0-d bool for a value used as a condition (Python's truth of a 1-element array)."""
        a = self.array(a)
        if math.prod(a.shape) != 1:
            raise ScriptOpError(
                f"the truth value of an array of shape {a.shape} is ambiguous: use np.any(...)"
                " or np.all(...)")
        return self.cast(self.reshape(a, ()), DType.bool)

    def where(self, cond: Any, a: Any, b: Any) -> ArrayValue:
        cond = self.cast(self.array(cond), DType.bool)
        (a, b), _, weak = self.promoted(a, b)
        return self.op("where", cond, a, b, weak=weak and cond.shape == ())

    # -- reductions ------------------------------------------------------------------------
    def reduce(self, name: str, a: Any, axis: Any, keepdims: bool) -> ArrayValue:
        a = self.array(a)
        axes = normalize_axes(axis, len(a.shape))
        if name in ("reduce_sum", "reduce_prod") and kind_rank(a.dtype) < 2 \
                and a.dtype.np.itemsize < 8:
            a = self.cast(a, DType.u64 if a.dtype.np.kind == "u" else DType.i64)
        if name == "reduce_mean" and kind_rank(a.dtype) < 2:
            a = self.cast(a, DType.f64)
        if a.dtype is DType.bool:  # max/min of bools: through integers
            return self.cast(self.op(name, self.cast(a, DType.i32), axes=axes,
                                     keepdims=keepdims), DType.bool)
        return self.op(name, a, axes=axes, keepdims=keepdims)

    def any_all(self, which: str, a: Any, axis: Any, keepdims: bool) -> ArrayValue:
        bits = self.cast(self.cast(self.array(a), DType.bool), DType.i32)
        reduce = "reduce_max" if which == "any" else "reduce_min"
        axes = normalize_axes(axis, len(bits.shape))
        return self.cast(self.op(reduce, bits, axes=axes, keepdims=keepdims), DType.bool)

    def arg_reduce(self, name: str, a: Any, axis: Any, keepdims: bool) -> ArrayValue:
        a = self.array(a)
        if axis is None:
            a, axis = self.reshape(a, (-1,)), 0
        if a.dtype is DType.bool:
            a = self.cast(a, DType.i32)
        return self.op(name, a, axis=int(axis), keepdims=keepdims)

    def concatenate(self, values: Any, axis: int) -> ArrayValue:
        if not isinstance(values, tuple) or not values:
            raise ScriptOpError("np.concatenate takes a tuple of arrays")
        values, _, weak = self.promoted(*values)
        if any(len(v.shape) == 0 for v in values):
            raise ScriptOpError("zero-dimensional arrays cannot be concatenated")
        return self.op("concat", *values, axis=axis)

    def stack(self, values: Any, axis: int) -> ArrayValue:
        if not isinstance(values, tuple) or not values:
            raise ScriptOpError("np.stack takes a tuple of arrays")
        values, _, _ = self.promoted(*values)
        rank = len(values[0].shape) + 1
        axis = axis % rank
        expanded = [self.reshape(v, v.shape[:axis] + (1,) + v.shape[axis:]) for v in values]
        return self.op("concat", *expanded, axis=axis)

    def full(self, shape: Any, fill: Any, dtype: DType | None) -> ArrayValue:
        shape = as_shape(shape)
        value = self.array(fill)
        dtype = dtype or value.dtype
        return self.broadcast_to(self.cast(value, dtype), shape)

    # -- indexing --------------------------------------------------------------------------
    def getitem(self, a: ArrayValue, index: Any) -> ArrayValue:
        items = expand_index(index, len(a.shape))
        leading = self.leading_scalars(items, a.shape)
        if leading is not None and any(isinstance(item, ArrayValue)
                                       for item in items[:len(leading)]):
            # Runtime scalars on the leading axes pick their part first, by one gather_nd:
            # the rest then works on that part alone (`x[i, j]` in a loop reads one element,
            # where a gather an axis would copy a row or a column a step).
            rest = a.shape[len(leading):]
            part = self.op("gather_nd", a, self.index_tuple(leading), batch_dims=0)
            return self.getitem(self.reshape(part, rest), tuple(items[len(leading):]))
        bounds, gathers, final = [], [], []  # (start, stop, step) per axis; the result's shape
        axis = 0
        for item in items:
            if item is None:
                final.append(1)
                continue
            dim = a.shape[axis]
            if isinstance(item, slice):
                bounds.append(item.indices(dim))
                final.append(len(range(*bounds[-1])))
            elif isinstance(item, DynamicSlice):
                bounds.append((0, dim, 1))
                gathers.append((axis, self.window(item)))
                final.append(item.length)
            elif isinstance(item, int):
                k = item + dim if item < 0 else item
                if not 0 <= k < dim:
                    raise ScriptOpError(f"index {item} is out of bounds for axis {axis} with"
                                        f" size {dim}")
                bounds.append((k, k + 1, 1))
            else:  # an integer array (a 0-d one: a runtime index)
                bounds.append((0, dim, 1))
                gathers.append((axis, item))
                final.extend(item.shape)
            axis += 1
        arrays = [item for item in items if isinstance(item, ArrayValue)]
        if len(arrays) > 1 and any(index.shape != () for index in arrays):
            # NumPy broadcasts several array indices together: not supported yet.
            raise ScriptOpError("an array index (not a scalar) must be the only array in a"
                                " subscript")
        result = a
        if any(b != (0, d, 1) for b, d in zip(bounds, a.shape)):
            starts, ends, steps = zip(*bounds)
            result = self.op("slice", a, starts=starts, ends=ends, steps=steps)
        for axis, index_value in reversed(gathers):
            # Each gather replaces one axis, so later axes go first and earlier stay put.
            result = self.op("gather", result, index_value, axis=axis)
        return self.reshape(result, tuple(final))

    def window(self, item: DynamicSlice) -> ArrayValue:
        """The indices start, start + 1, ... of a dynamic slice."""
        steps = self.op("iota", shape=[item.length], dtype=DType.i64)
        return self.op("add", steps, item.start)

    def setitem(self, a: ArrayValue, index: Any, value: Any) -> ArrayValue:
        """`a` with `a[index] = value` done: a scatter of one element (or one row, ...)
        where scalars index the leading axes and the rest are whole, else where(in the
        indexed box, value, a)."""
        items = expand_index(index, len(a.shape))
        if any(item is None for item in items):
            raise ScriptOpError("np.newaxis (None) cannot be assigned to")
        leading = self.leading_scalars(items, a.shape)
        if leading is not None and all(
                isinstance(item, slice) and item.indices(dim) == (0, dim, 1)
                for item, dim in zip(items[len(leading):], a.shape[len(leading):])):
            return self.scatter_item(a, leading, value)
        rank = len(a.shape)
        box, view, mask = [], [], None
        pads = [0] * (2 * rank)
        windows = []  # (axis, dynamic slice): the value is spread over the axis by a gather
        for axis, (item, dim) in enumerate(zip(items, a.shape)):
            # The index along this axis, shaped to broadcast against `a`.
            along = [dim] + [1] * (rank - axis - 1)
            if isinstance(item, slice):
                start, stop, step = item.indices(dim)
                if step != 1:
                    raise ScriptOpError("assignment to a slice with a step is not supported")
                stop = max(stop, start)
                box.append(stop - start)
                view.append(stop - start)
                pads[axis], pads[rank + axis] = start, dim - stop
                if (start, stop) == (0, dim):
                    continue
                positions = self.op("iota", shape=along, dtype=DType.i64)
                inside = self.op("and", self.op("ge", positions, self.index(start)),
                                 self.op("lt", positions, self.index(stop)))
            elif isinstance(item, DynamicSlice):
                box.append(item.length)
                view.append(item.length)
                windows.append((axis, item))
                positions = self.op("iota", shape=along, dtype=DType.i64)
                end = self.op("add", item.start, self.index(item.length))
                inside = self.op("and", self.op("ge", positions, item.start),
                                 self.op("lt", positions, end))
            else:
                box.append(1)
                if isinstance(item, int):
                    k = item + dim if item < 0 else item
                    if not 0 <= k < dim:
                        raise ScriptOpError(f"index {item} is out of bounds for axis {axis}"
                                            f" with size {dim}")
                    target = self.index(k)
                else:
                    if item.shape != ():
                        raise ScriptOpError("assignment through an array index is not"
                                            " supported")
                    target = self.cast(item, DType.i64)
                    negative = self.op("lt", target, self.index(0))
                    target = self.op("where", negative, self.op("add", target,
                                                                self.index(dim)), target)
                inside = self.op("eq", self.op("iota", shape=along, dtype=DType.i64), target)
            mask = inside if mask is None else self.op("and", mask, inside)
        value = self.cast(self.array(value), a.dtype)
        try:
            value = self.broadcast_to(value, tuple(view))
        except ScriptOpError:
            raise ScriptOpError(f"cannot assign {describe(value)} to a part of shape"
                                f" {tuple(view)}") from None
        value = self.reshape(value, tuple(box))
        if any(pads):
            value = self.op("pad", value, pads=pads)
        for axis, item in windows:
            # Position p of the axis takes value[p - start], clipped into the window (the
            # mask keeps only the positions inside it).
            positions = self.op("iota", shape=[a.shape[axis]], dtype=DType.i64)
            offset = self.op("sub", positions, item.start)
            offset = self.op("max", self.op("min", offset, self.index(item.length - 1)),
                             self.index(0))
            value = self.op("gather", value, offset, axis=axis)
        if mask is None:
            return self.broadcast_to(value, a.shape)
        return ArrayValue(self.op("where", mask, value, a).value)

    def leading_scalars(self, items: list[Any], shape: tuple[int, ...]
                        ) -> list[ArrayValue] | None:
        """The i64 positions of the scalars (Python ints, 0-d arrays) that index the leading
        axes of an array of `shape` (`x[i]`, `x[i, j]`, `x[i, 1:3]`), None when the first
        item is not one. A Python int out of its axis is an error here; a runtime one
        counts from the end when negative (gathers and scatters clamp what is still
        outside)."""
        positions = []
        for axis, (item, dim) in enumerate(zip(items, shape)):
            if isinstance(item, int):
                k = item + dim if item < 0 else item
                if not 0 <= k < dim:
                    raise ScriptOpError(f"index {item} is out of bounds for axis {axis}"
                                        f" with size {dim}")
                positions.append(self.index(k))
            elif isinstance(item, ArrayValue) and item.shape == ():
                positions.append(self.cast(item, DType.i64))
            else:
                break
        return positions or None

    def index_tuple(self, positions: list[ArrayValue]) -> ArrayValue:
        """i64[1, k]: one index tuple of k positions, for gather_nd and scatter_nd."""
        column = [self.reshape(p, (1,)) for p in positions]
        joined = column[0] if len(column) == 1 else self.op("concat", *column, axis=0)
        return self.reshape(joined, (1, len(positions)))

    def scatter_item(self, a: ArrayValue, positions: list[ArrayValue], value: Any
                     ) -> ArrayValue:
        """`a` with the part at `positions` (its leading axes) set to `value`: one
        scatter_nd, which a loop can run in the carried array's memory (O(1) a step where
        a where() would rewrite the whole array)."""
        rest = a.shape[len(positions):]
        value = self.cast(self.array(value), a.dtype)
        try:
            value = self.broadcast_to(value, rest)
        except ScriptOpError:
            raise ScriptOpError(f"cannot assign {describe(value)} to a part of shape"
                                f" {rest}") from None
        return ArrayValue(self.op("scatter_nd", a, self.index_tuple(positions),
                                  self.reshape(value, (1, *rest)), reduction="none").value)

    def index(self, k: int) -> ArrayValue:
        return self.constant(np.asarray(k, np.int64))


BOOL_OPS = {"add": "or", "mul": "and", "bitwise_and": "and", "bitwise_or": "or",
            "bitwise_xor": "xor", "max": "or", "min": "and"}


def expand_index(index: Any, rank: int) -> list[Any]:
    """The items of a subscript, `...` expanded and missing trailing axes as full slices."""
    items = list(index) if isinstance(index, tuple) else [index]
    for item in items:
        ok = item is None or item is Ellipsis or isinstance(item, (int, slice, DynamicSlice)) \
            or (isinstance(item, ArrayValue) and item.dtype.np.kind in "iu")
        if not ok or isinstance(item, bool):
            raise ScriptOpError(f"cannot index with {describe(item)}: use ints, slices with"
                                " constant bounds, or an integer array")
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    if consumed > rank:
        raise ScriptOpError(f"too many indices ({consumed}) for an array of rank {rank}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (rank - consumed)
    else:
        items += [slice(None)] * (rank - consumed)
    return items


def normalize_axes(axis: Any, rank: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(rank))
    axes = axis if isinstance(axis, tuple) else (axis,)
    if not all(isinstance(a, int) for a in axes):
        raise ScriptOpError("axis must be a Python int or a tuple of ints")
    for a in axes:
        if not -rank <= a < max(rank, 1):
            raise ScriptOpError(f"axis {a} is out of bounds for an array of rank {rank}")
    return tuple(sorted(a % max(rank, 1) for a in axes))


def as_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape):
        return shape
    raise ScriptOpError(f"a shape must be Python ints, got {describe(shape)}")


def resolve_shape(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    """`shape` with a -1 dim resolved for `size` elements."""
    shape = as_shape(shape)
    if shape.count(-1) == 1:
        known = math.prod(d for d in shape if d != -1)
        shape = tuple(size // known if d == -1 and known else d for d in shape)
    if math.prod(shape) != size:
        raise ScriptOpError(f"cannot reshape an array of size {size} into shape {shape}")
    return shape
