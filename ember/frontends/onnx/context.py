"""The interface between the ONNX importer and the per-op converters.

A converter is a function `fn(ctx: ConvertContext) -> Value | Sequence[Value]` registered
for an ONNX op type with `@converter("Add")`. It reads the node's inputs, attributes and
opset from `ctx`, emits graph ops with `ctx.b` (a Builder whose ops carry the node as their
origin) and returns the node's outputs in order.

Shapes are static in Ember. Inputs that decide a result's shape (Reshape's `shape`,
Slice's `starts`, TopK's `k`, ...) must have known values: `ctx.const(i)` returns them,
folding constant subexpressions, or raises a clear error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

from ember.dtypes import DType, from_numpy
from ember.errors import EmberError, UnsupportedOpError
from ember.graph.builder import Builder
from ember.graph.interp import evaluate_op
from ember.graph.ir import Value
from ember.graph.symbolic import size_hint

if TYPE_CHECKING:
    from ember.frontends.onnx.importer import Importer

Converter = Callable[["ConvertContext"], "Value | Sequence[Value | None]"]


@dataclass(frozen=True)
class ConverterSpec:
    op_type: str
    domain: str
    fn: Converter
    since: int  # the first opset version this converter handles


_CONVERTERS: dict[tuple[str, str], list[ConverterSpec]] = {}


def converter(*op_types: str, domain: str = "", since: int = 1) -> Callable[[Converter], Converter]:
    """Register `fn` as the converter of `op_types` (in `domain`) from opset `since` on."""

    def register(fn: Converter) -> Converter:
        for op_type in op_types:
            specs = _CONVERTERS.setdefault((domain, op_type), [])
            specs.append(ConverterSpec(op_type, domain, fn, since))
            specs.sort(key=lambda s: s.since)
        return fn

    return register


@functools.cache
def _declared_kind(op_type: str, domain: str, opset: int, name: str) -> int | None:
    """The attribute kind (AttributeProto.AttributeType) that ONNX's schema of `op_type` at
    `opset` declares for attribute `name`, or None where no schema says."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    declared = schema.attributes.get(name)
    return None if declared is None else int(declared.type.value)  # (AttributeType's numbers)


@functools.cache
def _declared_attributes(op_type: str, domain: str, opset: int) -> frozenset[str] | None:
    """The attribute names that ONNX's schema of `op_type` at `opset` declares, or None
    where no schema says."""
    try:
        return frozenset(onnx.defs.get_schema(op_type, opset, domain).attributes)
    except onnx.defs.SchemaError:
        return None


def find_converter(op_type: str, domain: str, opset: int) -> Converter | None:
    """The converter for `op_type` at `opset`: the registered one with the highest `since`."""
    _load_converters()
    domain = "" if domain == "ai.onnx" else domain
    found = None
    for spec in _CONVERTERS.get((domain, op_type), []):
        if spec.since <= opset:
            found = spec.fn
    return found


def supported_op_types() -> dict[tuple[str, str], list[int]]:
    _load_converters()
    return {key: [s.since for s in specs] for key, specs in sorted(_CONVERTERS.items())}


def _load_converters() -> None:
    from ember.frontends.onnx import ops  # noqa: F401  (registration)


def onnx_dtype(elem_type: int, what: str = "tensor") -> DType:
    """The Ember dtype of an ONNX element type, or UnsupportedOpError."""
    try:
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        return from_numpy(np_dtype)
    except (KeyError, ValueError, EmberError):
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in \
            onnx.TensorProto.DataType.values() else str(elem_type)
        raise UnsupportedOpError(f"{what} has element type {name}, which Ember does not"
                                 " support") from None


def tensor_to_array(tensor: onnx.TensorProto, base_dir: str = "") -> np.ndarray:
    onnx_dtype(tensor.data_type, f"tensor '{tensor.name}'")
    try:
        return numpy_helper.to_array(tensor, base_dir)
    except Exception as e:  # onnx raises many kinds on malformed tensors
        raise EmberError(f"cannot read tensor '{tensor.name}': {e}") from None


class ConvertContext:
    """What a converter sees of one ONNX node."""

    def __init__(self, importer: Importer, node: onnx.NodeProto, inputs: list[Value | None],
                 opset: int, builder: Builder, scope: Any = None):
        self.importer = importer
        self.scope = scope  # ONNX names visible here; subgraph converters extend it
        self.node = node
        self.inputs = inputs
        self.opset = opset
        self.b = builder
        self._attrs = {a.name: a for a in node.attribute}

    # -- identity ---------------------------------------------------------------------------
    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def where(self) -> str:
        return self.importer.describe_node(self.node, self.opset)

    def unsupported(self, why: str) -> UnsupportedOpError:
        """An error to raise for a case this converter does not handle."""
        return UnsupportedOpError(f"{self.where}: {why}")

    def error(self, why: str) -> EmberError:
        """An error to raise for a malformed node."""
        from ember.errors import ShapeError

        return ShapeError(f"{self.where}: {why}")

    # -- inputs and outputs -------------------------------------------------------------------
    def input(self, index: int) -> Value | None:
        """Input `index`, or None when it is absent (past the end or named '')."""
        return self.inputs[index] if index < len(self.inputs) else None

    def require(self, index: int) -> Value:
        value = self.input(index)
        if value is None:
            raise self.error(f"input {index} is required")
        return value

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def output_used(self, index: int) -> bool:
        return index < len(self.node.output) and self.node.output[index] != ""

    def const(self, index: int, what: str | None = None) -> np.ndarray:
        """The value of input `index`, which must be computable before run time."""
        value = self.require(index)
        data = self.importer.constant_value(value)
        if data is None:
            label = what or f"input {index} ('{self.node.input[index]}')"
            raise self.unsupported(f"{label} must be a constant: it decides a shape")
        return data

    def maybe_const(self, index: int) -> np.ndarray | None:
        value = self.input(index)
        return None if value is None else self.importer.constant_value(value)

    # -- attributes -----------------------------------------------------------------------------
    def check_attributes(self) -> None:
        """Refuse an attribute that the operator does not declare at this opset (ReduceMax's
        `axes` at opset 18, where it became an input): ignored, it would change the result
        in silence."""
        declared = _declared_attributes(self.node.op_type, self.node.domain, self.opset)
        unknown = sorted(set(self._attrs) - declared) if declared is not None else []
        if unknown:
            raise self.error(f"attribute '{unknown[0]}' is not one that {self.node.op_type}"
                             f" declares at opset {self.opset} (it declares"
                             f" {', '.join(sorted(declared)) or 'none'})")

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute as a Python value: int, float, str, list, ndarray or GraphProto."""
        proto = self._attrs.get(name)
        if proto is None:
            return default
        if proto.ref_attr_name:
            raise self.unsupported(f"attribute '{name}' refers to a function attribute")
        kind = proto.type
        A = onnx.AttributeProto
        expected = _declared_kind(self.node.op_type, self.node.domain, self.opset, name)
        if expected is not None and kind != expected:
            raise self.error(f"attribute '{name}' is {A.AttributeType.Name(kind)}; the"
                             f" operator declares it {A.AttributeType.Name(expected)}")
        if kind == A.INT:
            return int(proto.i)
        if kind == A.FLOAT:
            return float(proto.f)
        if kind == A.STRING:
            return proto.s.decode("utf-8", errors="replace")
        if kind == A.INTS:
            return [int(v) for v in proto.ints]
        if kind == A.FLOATS:
            return [float(v) for v in proto.floats]
        if kind == A.STRINGS:
            return [s.decode("utf-8", errors="replace") for s in proto.strings]
        if kind == A.TENSOR:
            return tensor_to_array(proto.t)
        if kind == A.GRAPH:
            return proto.g
        if kind == A.GRAPHS:
            return list(proto.graphs)
        raise self.unsupported(f"attribute '{name}' has an unsupported kind")

    # -- helpers for converters ------------------------------------------------------------------
    def constant(self, array: Any, dtype: DType | None = None) -> Value:
        return self.b.constant(np.asarray(array, dtype=dtype.np if dtype else None))

    def subgraph(self, graph: onnx.GraphProto, builder: Builder, args: Sequence[Value]
                 ) -> list[Value]:
        """Convert a body graph (If branch, Loop/Scan body) into `builder`'s region, its
        inputs bound to `args`; it sees the names of the graphs around it."""
        return self.importer.convert_subgraph(graph, builder, self.scope, args)


def evaluate_constant(value: Value, graph_constants: dict, cache: dict[Value, Any],
                      known: dict[Value, np.ndarray]) -> np.ndarray | None:
    """The value of `value` if every op it depends on has constant operands, else None.

    `known` holds values fixed from outside (graph inputs the backend specialized on).
    """
    if value in known:
        return known[value]
    if value in cache:
        return cache[value]
    op = value.producer
    result = None
    if op is not None and not op.regions:
        if op.name == "constant":
            result = (op.attrs["value"] if op.attrs["value"] is not None
                      else graph_constants[op.attrs["name"]])
        elif op.name == "size":  # a size of a symbolic import: an object array of it
            result = np.array(op.attrs["value"], dtype=object)
        elif op.opdef.reference is not None:
            args = []
            for operand in op.operands:
                data = evaluate_constant(operand, graph_constants, cache, known)
                if data is None:
                    break
                args.append(data)
            else:
                if any(a.dtype == object for a in args):
                    result = _evaluate_sizes(op, args, value.index)
                elif sum(size_hint(r.type.numel) for r in op.results) <= (1 << 22):
                    result = evaluate_op(op, args)[value.index]
    cache[value] = result
    return result


def _evaluate_sizes(op, args: list[np.ndarray], index: int) -> np.ndarray | None:
    """An op of a shape computation on sizes known at call time (Shape, Gather, Concat,
    arithmetic): its reference on object arrays of Dims, or None where that does not go
    (the value is then not known before run time)."""
    if not all(r.type.is_static for r in op.results) or op.results[index].dtype.is_float:
        return None
    try:
        results = op.opdef.reference(*args, **op.attrs)
        results = results if isinstance(results, (tuple, list)) else (results,)
        result = np.asarray(results[index], dtype=object)
    except Exception:  # noqa: BLE001  (a reference written for numbers: not a size's)
        return None
    return result if result.shape == op.results[index].shape else None
