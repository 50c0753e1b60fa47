"""Level 1, the graph IR: typed SSA values, ops with attributes and regions, graphs.

A `Graph` owns one top-level `Region` whose arguments are the graph inputs and whose
outputs are the graph outputs. Ops may own regions of their own (`if`, `loop`, `fused`);
a region sees the values of the regions that enclose it, defined before its op.
Large constant tensors live in the graph's constant table and are referenced by name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.dtypes import DType
from ember.graph.symbolic import Dim, is_static_shape, size_bounds

if TYPE_CHECKING:
    from ember.graph.ops.registry import OpDef


@dataclass(frozen=True, slots=True)
class TensorType:
    """A tensor's element type and shape. Scalars have shape (). A dim is an int or a
    symbolic `Dim` (ember/graph/symbolic.py: `f32[?b,128]`), bound when a call gives the
    sizes."""

    dtype: DType
    shape: tuple[int | Dim, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            raise TypeError(f"TensorType dtype must be a DType, got {self.dtype!r}")
        object.__setattr__(self, "shape", tuple(
            d if isinstance(d, Dim) else int(d) for d in self.shape))

    @property
    def is_static(self) -> bool:
        """Whether every dim is a number."""
        return is_static_shape(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int | Dim:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def with_shape(self, shape: Sequence[int]) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.shape))}]"

    def __repr__(self) -> str:
        return f"TensorType({self})"


_NAME_OK = re.compile(r"[A-Za-z_][A-Za-z0-9_.$]*\Z")
_NAME_BAD_CHAR = re.compile(r"[^A-Za-z0-9_.$]")


def sanitize_name(name: str | None) -> str | None:
    """A name hint usable in the text form: letters, digits, `_ . $`, not starting with a digit."""
    if not name:
        return None
    if _NAME_OK.match(name):
        return name
    cleaned = _NAME_BAD_CHAR.sub("_", name)
    return cleaned if _NAME_OK.match(cleaned) else "_" + cleaned


class Value:
    """An SSA value: the result of an op or an argument of a region."""

    __slots__ = ("type", "owner", "index", "name")

    def __init__(self, type: TensorType, owner: Op | Region | None, index: int, name: str | None):
        self.type = type
        self.owner = owner
        self.index = index
        self.name = sanitize_name(name)

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def producer(self) -> Op | None:
        """The op that defines this value, or None for a region argument."""
        return self.owner if isinstance(self.owner, Op) else None

    def __repr__(self) -> str:
        return f"Value(%{self.name or '?'}: {self.type})"


class Op:
    """One operation: a registered op name, operand values, attributes, regions, results.

    `attrs` holds every attribute of the op's schema, defaults filled in. `loc` says
    where the op came from (an ONNX node, an FX node, a source line) for error messages.
    """

    __slots__ = ("name", "operands", "attrs", "regions", "results", "loc")

    def __init__(
        self,
        name: str,
        operands: Sequence[Value],
        attrs: dict[str, Any],
        result_types: Sequence[TensorType],
        regions: Sequence[Region] = (),
        loc: str | None = None,
        result_names: Sequence[str | None] | None = None,
    ):
        self.name = name
        self.operands = list(operands)
        self.attrs = attrs
        self.regions = list(regions)
        names = result_names or [None] * len(result_types)
        self.results = [Value(t, self, i, n) for i, (t, n) in enumerate(zip(result_types, names))]
        self.loc = loc

    @property
    def opdef(self) -> OpDef:
        from ember.graph.ops.registry import get_opdef

        return get_opdef(self.name)

    @property
    def result(self) -> Value:
        """The only result of a single-result op."""
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    def where(self) -> str:
        """`graph.conv (onnx node 'Conv_3')`: the op and its origin, for messages."""
        return f"graph.{self.name}" + (f" ({self.loc})" if self.loc else "")

    def __repr__(self) -> str:
        return f"Op({self.name}, {len(self.operands)} operands, {len(self.results)} results)"


class Region:
    """A straight-line block of ops with arguments and yielded outputs."""

    __slots__ = ("args", "ops", "outputs")

    def __init__(self, arg_types: Sequence[TensorType] = (), arg_names: Sequence[str | None] = ()):
        names = list(arg_names) + [None] * (len(arg_types) - len(arg_names))
        self.args = [Value(t, self, i, n) for i, (t, n) in enumerate(zip(arg_types, names))]
        self.ops: list[Op] = []
        self.outputs: list[Value] = []

    @property
    def arg_types(self) -> list[TensorType]:
        return [a.type for a in self.args]

    @property
    def output_types(self) -> list[TensorType]:
        return [v.type for v in self.outputs]

    def walk(self) -> Iterator[Op]:
        """Every op of this region and of the regions nested in it, in program order."""
        for op in self.ops:
            yield op
            for region in op.regions:
                yield from region.walk()


def replace_uses(region: Region, replaced: dict[Value, Value]) -> None:
    """Make every read of a key of `replaced` in `region` (nested regions and the
    yielded outputs included) read its value instead."""
    for op in region.ops:
        op.operands = [replaced.get(v, v) for v in op.operands]
        for inner in op.regions:
            replace_uses(inner, replaced)
    region.outputs = [replaced.get(v, v) for v in region.outputs]


class Graph:
    """A function from input tensors to output tensors, with a table of named constants."""

    def __init__(self, name: str = "main", body: Region | None = None,
                 constants: dict[str, np.ndarray] | None = None):
        self.name = name
        self.body = body if body is not None else Region()
        self.constants: dict[str, np.ndarray] = constants if constants is not None else {}
        # The most each symbolic size of the graph can be (`?s <= 512`); unnamed: no bound.
        self.size_bounds: dict[str, int] = {}
        # Outputs computed in the memory of an input (output position -> input position;
        # `-> (f32[8] in %cache)`): the caller passes the input's memory as the output's,
        # so a scatter into it writes its updates only (`may_update_in_place`).
        self.aliases: dict[int, int] = {}

    @property
    def inputs(self) -> list[Value]:
        return self.body.args

    @property
    def outputs(self) -> list[Value]:
        return self.body.outputs

    @property
    def ops(self) -> list[Op]:
        return self.body.ops

    def walk(self) -> Iterator[Op]:
        return self.body.walk()

    def constant_data(self, op: Op) -> np.ndarray:
        """The tensor a `constant` op stands for, inline or from the table."""
        if op.attrs.get("value") is not None:
            return op.attrs["value"]
        return self.constants[op.attrs["name"]]

    def fresh_constant_name(self, hint: str = "cst") -> str:
        hint = sanitize_name(hint) or "cst"
        if hint not in self.constants:
            return hint
        i = 0
        while f"{hint}_{i}" in self.constants:
            i += 1
        return f"{hint}_{i}"

    def __str__(self) -> str:
        from ember.graph.text import print_graph

        return print_graph(self)

    def __repr__(self) -> str:
        n = sum(1 for _ in self.walk())
        return f"Graph(@{self.name}, {len(self.inputs)} inputs, {n} ops)"


def clone_graph(graph: Graph, retype: Callable[[TensorType], TensorType] | None = None,
                reattr: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Graph:
    """A copy of `graph` whose ops and values are new (passes mutate graphs in place);
    the constant arrays are shared, since nothing writes to them. `retype` and `reattr`
    map each value's type and each op's attributes on the way (binding sizes)."""
    retype = retype or (lambda t: t)
    reattr = reattr or dict
    mapping: dict[Value, Value] = {}

    def clone_region(region: Region) -> Region:
        new = Region([retype(t) for t in region.arg_types], [a.name for a in region.args])
        mapping.update(zip(region.args, new.args))
        for op in region.ops:
            regions = [clone_region(r) for r in op.regions]
            copy = Op(op.name, [mapping[v] for v in op.operands], reattr(op.attrs),
                      [retype(r.type) for r in op.results], regions, op.loc,
                      [r.name for r in op.results])
            mapping.update(zip(op.results, copy.results))
            new.ops.append(copy)
        new.outputs = [mapping[v] for v in region.outputs]
        return new

    with size_bounds(graph.size_bounds):
        body = clone_region(graph.body)
    copy = Graph(graph.name, body, dict(graph.constants))
    copy.size_bounds = dict(graph.size_bounds)
    copy.aliases = dict(graph.aliases)
    return copy


def may_update_in_place(graph: Graph, output: int, input: int) -> bool:
    """Whether output `output` may be computed in the memory of input `input`: it is a
    scatter of that input (which keeps every element but the updated ones), and the
    scatter is the input's only reader, so nothing reads an old value after the new one
    is written."""
    value, source = graph.outputs[output], graph.inputs[input]
    op = value.producer
    if op is None or op.name not in ("scatter_elements", "scatter_nd") or \
            op.operands[0] is not source or any(v is source for v in op.operands[1:]):
        return False
    readers = [user for user in graph.walk() if any(v is source for v in user.operands)]
    return readers == [op] and sum(v is value for v in graph.outputs) == 1
