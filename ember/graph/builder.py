"""Building graphs from Python: `Builder` creates ops with checked attributes and types.

    b = Builder("mlp")
    x = b.input("x", DType.f32, (1, 64))
    w = b.constant(np.ones((64, 8), np.float32), name="w")
    b.output(b.relu(b.matmul(x, w)))
    graph = b.build()

Every registered op is a method: `b.add(x, y)`, `b.transpose(x, perm=(1, 0))`. Python
numbers as operands become scalar constants of the other operand's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.dtypes import DType, from_numpy
from ember.errors import EmberError
from ember.graph.ir import Graph, Op, Region, TensorType, Value
from ember.graph.ops.registry import get_opdef, has_op
from ember.graph.symbolic import size_bounds

# Constants with at most this many elements print inline; larger ones go to the table.
INLINE_CONSTANT_LIMIT = 16


def located(error: EmberError, where: str) -> EmberError:
    """The same error class with `where` (an op and its origin) in front of the message."""
    new = type(error).__new__(type(error))
    new.__dict__.update(error.__dict__)
    new.args = (f"{where}: {error}",)
    return new


class Builder:
    """Appends ops to one region of a graph; `region_builder` makes one for a nested region."""

    def __init__(self, name: str = "main", *, graph: Graph | None = None,
                 region: Region | None = None, loc: str | None = None):
        self.graph = graph if graph is not None else Graph(name)
        self.region = region if region is not None else self.graph.body
        self.loc = loc  # default origin of the ops created, for frontends
        self.insert_at: int | None = None  # None appends; an index inserts there

    # -- graph interface ---------------------------------------------------------------
    def input(self, name: str, dtype: DType | str, shape: Sequence[int]) -> Value:
        value = Value(TensorType(DType(dtype), tuple(shape)), self.region, len(self.region.args),
                      name)
        self.region.args.append(value)
        return value

    def output(self, *values: Value) -> None:
        self.region.outputs.extend(values)

    def build(self, verify: bool = True) -> Graph:
        if verify:
            from ember.graph.verify import verify_graph

            verify_graph(self.graph)
        return self.graph

    # -- ops ---------------------------------------------------------------------------
    def op(self, name: str, operands: Sequence[Value], attrs: dict[str, Any] | None = None,
           regions: Sequence[Region] = (), *, loc: str | None = None,
           result_names: Sequence[str | None] | None = None) -> Op:
        """Create an op: attributes are checked and completed, result types inferred."""
        loc = loc or self.loc
        where = f"graph.{name}" + (f" ({loc})" if loc else "")
        try:
            opdef = get_opdef(name)
            attrs = opdef.normalize_attrs(attrs or {})
            if name == "constant" and attrs["name"] is not None:
                result_types = [constant_table_type(self.graph, attrs["name"])]
            else:
                with size_bounds(self.graph.size_bounds):
                    result_types = opdef.infer_types([v.type for v in operands], attrs,
                                                     regions)
        except EmberError as e:
            raise located(e, where) from None
        op = Op(name, operands, attrs, result_types, regions, loc, result_names)
        if self.insert_at is None:
            self.region.ops.append(op)
        else:
            self.region.ops.insert(self.insert_at, op)
            self.insert_at += 1
        return op

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_") or not has_op(name):
            raise AttributeError(f"Builder has no op or attribute '{name}'")

        def make(*operands: Any, loc: str | None = None, name_hint: str | None = None,
                 **attrs: Any) -> Any:
            values = self._operands(operands)
            op = self.op(name, values, attrs, loc=loc,
                         result_names=[name_hint] if name_hint else None)
            return op.results[0] if len(op.results) == 1 else tuple(op.results)

        make.__name__ = name
        return make

    def _operands(self, operands: Sequence[Any]) -> list[Value]:
        # Numbers take the dtype of a non-bool operand when there is one (`where(c, x, 0.0)`).
        values = [v for v in operands if isinstance(v, Value)]
        like = next((v for v in values if v.dtype is not DType.bool), values[0] if values else None)
        values = []
        for v in operands:
            if isinstance(v, Value):
                values.append(v)
            elif isinstance(v, np.ndarray):
                values.append(self.constant(v))
            elif isinstance(v, (bool, int, float, np.number)):
                dtype = like.dtype.np if like is not None else np.asarray(v).dtype
                values.append(self.constant(np.asarray(v, dtype=dtype)))
            else:
                raise EmberError(f"cannot use {type(v).__name__} as an operand")
        return values

    def constant(self, array: Any, name: str | None = None, dtype: DType | None = None) -> Value:
        """A constant tensor: inline when small, else in the graph's table under `name`
        (a copy, unless no one can change `array`: then it is kept, a view included)."""
        array = np.asarray(array, dtype=dtype.np if dtype else None)
        from_numpy(array.dtype)
        if array.size <= INLINE_CONSTANT_LIMIT and name is None:
            return self.op("constant", [], {"value": array}).result
        key = self.graph.fresh_constant_name(name or "cst")
        data = array if _immutable(array) else array.copy(order="C")
        data.flags.writeable = False
        self.graph.constants[key] = data
        return self.op("constant", [], {"name": key}, result_names=[name]).result

    # -- structured control flow ---------------------------------------------------------
    def region_builder(self, region: Region) -> Builder:
        return Builder(graph=self.graph, region=region, loc=self.loc)

    def if_(self, cond: Value, then_fn: Callable[[Builder], Sequence[Value]],
            else_fn: Callable[[Builder], Sequence[Value]], *, loc: str | None = None):
        """`if` whose regions are filled by then_fn(builder) and else_fn(builder)."""
        regions = []
        for fn in (then_fn, else_fn):
            region = Region()
            region.outputs = list(fn(self.region_builder(region)))
            regions.append(region)
        op = self.op("if", [cond], {}, regions, loc=loc)
        return op.results

    def loop(self, trip_count: Value, cond: Value, carried: Sequence[Value],
             body_fn: Callable[..., Sequence[Value]], *, num_scan: int = 0,
             scan_length: int = 0, loc: str | None = None) -> list[Value]:
        """`loop`; body_fn(builder, i, *carried) returns (cond, *carried_next, *scans)."""
        region = Region([trip_count.type, *(v.type for v in carried)])
        region.outputs = list(body_fn(self.region_builder(region), *region.args))
        op = self.op("loop", [trip_count, cond, *carried],
                     {"num_scan": num_scan, "scan_length": scan_length}, [region], loc=loc)
        return op.results


def _immutable(array: np.ndarray) -> bool:
    """Whether no one can change `array`'s data: it and every array it views are read-only
    (a graph's constants, and views of them, are; a table keeps them without a copy)."""
    base: Any = array
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    return base is None or isinstance(base, bytes)


def constant_table_type(graph: Graph, name: str) -> TensorType:
    from ember.errors import VerificationError

    if name not in graph.constants:
        raise VerificationError(f"constant @{name} is not in the graph's constant table")
    data = graph.constants[name]
    return TensorType(from_numpy(data.dtype), data.shape)
