"""Importing ONNX models into the graph IR.

    graph = import_model("resnet50.onnx", input_shapes={"data": (1, 3, 224, 224)})

Initializers become table constants; `If`, `Loop` and `Scan` become regions; every node
goes through the converter registered for its op type (ember/frontends/onnx/ops/).
Symbolic dims are specialized to the shapes given, or kept as sizes (`symbolic=True`,
import_model's default: Shape gives `graph.size` ops, and shape computations on them
are evaluated on the sizes). Before converting anything the importer checks that every
op of the model (subgraphs included) has a converter, and reports all the missing ones
at once.
"""

from __future__ import annotations

import os
import re
from collections import ChainMap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx.backend.test.case.node import function_expand_helper

from ember.errors import EmberError, InternalError, ShapeError, UnsupportedOpError
from ember.frontends.onnx.context import (
    ConvertContext,
    evaluate_constant,
    find_converter,
    onnx_dtype,
    tensor_to_array,
)
from ember.graph.builder import Builder, located
from ember.graph.ir import Graph, Value, sanitize_name
from ember.graph.symbolic import symbol
from ember.util.memory import compiling

Scope = ChainMap  # ONNX name -> Value, with the enclosing graphs' names behind


def load_model(model_or_path: Any) -> onnx.ModelProto:
    """A ModelProto from a ModelProto, a path, or serialized bytes; EmberError otherwise."""
    if isinstance(model_or_path, onnx.ModelProto):
        return _check_text(model_or_path, "<model>")
    if isinstance(model_or_path, (bytes, bytearray)):
        model = onnx.ModelProto()
        try:
            model.ParseFromString(bytes(model_or_path))
        except (DecodeError, RuntimeError, ValueError) as e:
            raise EmberError(f"not a valid ONNX model: {e}") from None
        return _check_model(model, "<bytes>")
    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        if not os.path.isfile(path):
            raise EmberError(f"no ONNX model at '{path}'")
        try:
            model = onnx.load(path)
        except (DecodeError, RuntimeError, ValueError, OSError, UnicodeDecodeError) as e:
            raise EmberError(f"'{path}' is not a valid ONNX model: {e}") from None
        return _check_model(model, path)
    raise EmberError(f"expected an ONNX model or a path, got {type(model_or_path).__name__}")


def _check_model(model: onnx.ModelProto, source: str) -> onnx.ModelProto:
    if not model.HasField("graph") or not (model.graph.node or model.graph.output):
        raise EmberError(f"'{source}' is not a valid ONNX model: it has no graph")
    return _check_text(model, source)


def _check_text(model: onnx.ModelProto, source: str) -> onnx.ModelProto:
    bad = _undecodable_text(model)
    if bad:
        raise EmberError(f"'{source}' is not a valid ONNX model: its {bad} is not UTF-8 text")
    return model


def _undecodable_text(message, path: str = "model") -> str | None:
    """The path of a string field that holds bytes that are not UTF-8 (protobuf's upb
    parser hands those back as `bytes`), or None."""
    for field, value in message.ListFields():
        where = f"{path}.{field.name}"
        if field.type == field.TYPE_STRING:
            texts = value if field.is_repeated else [value]
            if any(isinstance(t, bytes) for t in texts):
                return where
        elif field.type == field.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                continue  # (no ONNX message has a map of strings)
            for item in value if field.is_repeated else [value]:
                bad = _undecodable_text(item, where)
                if bad:
                    return bad
    return None


def import_model(model_or_path: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 *, input_values: Mapping[str, np.ndarray] | None = None) -> Graph:
    """Import an ONNX model (a ModelProto, a path or bytes) as a graph.

    input_shapes: concrete shapes for inputs whose dims are symbolic or unknown; the dims
    they leave out stay symbolic (a dim_param `batch` is the size `?batch`).
    input_values: values of graph inputs that decide shapes (a Reshape's target shape fed
    as an input, say); the graph is then specialized to them (see `Importer.specialized`).
    """
    return Importer(load_model(model_or_path), input_shapes, input_values,
                    symbolic=True).run()


class Importer:
    def __init__(self, model: onnx.ModelProto, input_shapes=None, input_values=None,
                 symbolic: bool = False):
        self.model = model
        # Symbolic: a dim_param (or an unnamed dim) of an input becomes a size symbol.
        self.symbolic = symbolic
        self.input_shapes = {k: tuple(v) for k, v in (input_shapes or {}).items()}
        self.input_values = dict(input_values or {})
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version
                       for o in model.opset_import}
        self.builder = Builder(_graph_name(model.graph.name))
        self.constant_cache: dict[Value, Any] = {}
        self.known: dict[Value, np.ndarray] = {}  # graph inputs fixed by input_values
        self.specialized: set[str] = set()  # names of the inputs whose values were used
        self._input_names: dict[Value, str] = {}

    # -- entry ------------------------------------------------------------------------------
    @compiling()
    def run(self) -> Graph:
        graph = self.model.graph
        self.check_supported()
        scope: Scope = ChainMap()
        initializers = {t.name for t in graph.initializer}
        for info in graph.input:
            if info.name in initializers:
                continue  # old models list initializers as inputs too: they are constants
            value = self.builder.input(info.name, *self._input_type(info))
            scope[info.name] = value
            self._input_names[value] = info.name
            if info.name in self.input_values:
                self.known[value] = np.asarray(self.input_values[info.name])
        self.add_initializers(graph.initializer, self.builder, scope)
        self.convert_nodes(graph.node, self.builder, scope)
        outputs = [self.lookup(scope, o.name, "graph output") for o in graph.output]
        self.builder.output(*outputs)
        return self.builder.build()

    def check_supported(self) -> None:
        """Raise one UnsupportedOpError naming every op of the model without a converter."""
        missing: dict[tuple[str, str, int], list[str]] = {}
        for node in _all_nodes(self.model.graph):
            domain = "" if node.domain == "ai.onnx" else node.domain
            opset = self.opsets.get(domain)
            if opset is None or (find_converter(node.op_type, domain, opset) is None
                                 and function_schema(node, opset) is None):
                missing.setdefault((domain or "ai.onnx", node.op_type, opset or 0),
                                   []).append(node.name or "(unnamed)")
        if missing:
            lines = [f"  {op} (domain {dom}, opset {ver}): nodes {', '.join(names[:5])}"
                     + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                     for (dom, op, ver), names in sorted(missing.items())]
            raise UnsupportedOpError(f"the model uses {len(missing)} op(s) that Ember does"
                                     " not support:\n" + "\n".join(lines))

    # -- graphs, nodes, values -------------------------------------------------------------------
    def _input_type(self, info: onnx.ValueInfoProto):
        if info.type.WhichOneof("value") != "tensor_type":
            raise UnsupportedOpError(f"graph input '{info.name}' is not a tensor")
        tensor = info.type.tensor_type
        dtype = onnx_dtype(tensor.elem_type, f"graph input '{info.name}'")
        if info.name in self.input_shapes:
            return dtype, self.input_shapes[info.name]
        if info.name in self.input_values:
            return dtype, np.shape(self.input_values[info.name])
        if not tensor.HasField("shape"):
            raise ShapeError(f"graph input '{info.name}' has no shape; pass input_shapes")
        dims = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value >= 0:
                dims.append(dim.dim_value)
            elif self.symbolic:
                dims.append(symbol(_symbol_name(dim.dim_param or f"{info.name}_{len(dims)}")))
            else:
                name = dim.dim_param or "?"
                raise ShapeError(f"graph input '{info.name}' has the symbolic dim '{name}';"
                                 " pass its concrete shape in input_shapes")
        return dtype, tuple(dims)

    def add_initializers(self, tensors: Iterable[onnx.TensorProto], builder: Builder,
                         scope: Scope) -> None:
        for tensor in tensors:
            array = tensor_to_array(tensor)
            scope[tensor.name] = builder.constant(array, name=tensor.name or None)

    def convert_nodes(self, nodes: Iterable[onnx.NodeProto], builder: Builder,
                      scope: Scope) -> None:
        for node in nodes:
            self.convert_node(node, builder, scope)

    def convert_node(self, node: onnx.NodeProto, builder: Builder, scope: Scope,
                     opsets: Mapping[str, int] | None = None) -> None:
        domain = "" if node.domain == "ai.onnx" else node.domain
        opsets = opsets or self.opsets
        if domain not in opsets:
            raise UnsupportedOpError(f"{node.op_type}: the model imports no opset of domain"
                                     f" '{domain or 'ai.onnx'}'")
        opset = opsets[domain]
        inputs = [self.lookup(scope, name, f"{self.describe_node(node, opset)} input")
                  if name else None for name in node.input]
        fn = find_converter(node.op_type, domain, opset)
        if fn is None:
            self.expand_function(node, opset, inputs, builder, scope)
            return
        loc = f"onnx {node.op_type} '{node.name}'" if node.name else f"onnx {node.op_type}"
        node_builder = Builder(graph=builder.graph, region=builder.region, loc=loc)
        ctx = ConvertContext(self, node, inputs, opset, node_builder, scope)
        try:
            ctx.check_attributes()
            results = fn(ctx)
        except EmberError as e:
            where = self.describe_node(node, opset)
            raise e if where in str(e) else located(e, where) from None
        except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as e:
            # A node the converter did not expect (a malformed model, or a bug): an error
            # naming the node, not a Python traceback from inside the converter.
            raise InternalError(f"{self.describe_node(node, opset)}: the converter failed on"
                                f" this node ({type(e).__name__}: {e}); the node may be"
                                " malformed") from e
        results = [results] if isinstance(results, Value) else list(results)
        for index, name in enumerate(node.output):
            if not name:
                continue
            if index >= len(results) or results[index] is None:
                raise UnsupportedOpError(f"{self.describe_node(node, opset)}: output {index}"
                                         f" ('{name}') is not supported")
            value = results[index]
            if value.name is None:
                value.name = sanitize_name(name)
            scope[name] = value

    def expand_function(self, node: onnx.NodeProto, opset: int, inputs: list[Value | None],
                        builder: Builder, scope: Scope) -> None:
        """Convert an op that has no converter through the function body of its ONNX schema
        (Gelu, Celu, Range, ... are defined as functions of primitive ops)."""
        schema = function_schema(node, opset)
        if schema is None:
            raise UnsupportedOpError(f"{self.describe_node(node, opset)}: no converter")
        plain = [v for v in schema.function_opset_versions if v <= opset]
        contextual = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        version = max(plain or contextual)
        if plain:
            body = schema.get_function_with_opset_version(version)
        else:
            types = [onnx.helper.make_tensor_type_proto(
                onnx.helper.np_dtype_to_tensor_dtype(v.dtype.np), v.shape).SerializeToString()
                if v is not None else onnx.TypeProto().SerializeToString() for v in inputs]
            body = schema.get_context_dependent_function_with_opset_version(
                version, node.SerializeToString(), types)
        function = onnx.FunctionProto.FromString(body)
        expanded = onnx.NodeProto()
        expanded.CopyFrom(node)
        given = {a.name for a in node.attribute}
        for name, attr in schema.attributes.items():
            if name not in given and attr.default_value.name:
                expanded.attribute.append(attr.default_value)
        prefix = f"{node.name or node.output[0]}::{node.op_type}::"
        body_opsets = {**self.opsets, **{("" if o.domain == "ai.onnx" else o.domain): o.version
                                         for o in function.opset_import}}
        for inner in function_expand_helper(expanded, function, prefix):
            self.convert_node(inner, builder, scope, body_opsets)

    def convert_subgraph(self, graph: onnx.GraphProto, builder: Builder, scope: Scope,
                         args: Sequence[Value]) -> list[Value]:
        """Convert an If/Loop/Scan body into `builder`'s region; `args` bind its inputs."""
        inner = scope.new_child()
        if len(args) != len(graph.input):
            raise ShapeError(f"subgraph '{graph.name}' takes {len(graph.input)} inputs,"
                             f" given {len(args)}")
        for info, value in zip(graph.input, args):
            inner[info.name] = value
        self.add_initializers(graph.initializer, builder, inner)
        self.convert_nodes(graph.node, builder, inner)
        return [self.lookup(inner, o.name, f"subgraph '{graph.name}' output")
                for o in graph.output]

    def lookup(self, scope: Scope, name: str, what: str) -> Value:
        if name not in scope:
            raise EmberError(f"{what} '{name}' is not defined by any node, input or"
                             " initializer")
        return scope[name]

    def constant_value(self, value: Value) -> np.ndarray | None:
        """The value of `value` when it is known before run time (see evaluate_constant)."""
        data = evaluate_constant(value, self.builder.graph.constants, self.constant_cache,
                                 _Recorder(self.known, self._input_names, self.specialized))
        return data

    def describe_node(self, node: onnx.NodeProto, opset: int) -> str:
        domain = node.domain or "ai.onnx"
        name = f"'{node.name}'" if node.name else f"producing '{next(iter(node.output), '')}'"
        return f"ONNX node {name} ({domain}.{node.op_type}, opset {opset})"


def _symbol_name(name: str) -> str:
    """A dim_param as a size's name (letters, digits and _)."""
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return cleaned if re.match(r"[A-Za-z_]", cleaned) else "d_" + cleaned


class _Recorder(dict):
    """The known input values, recording which of them an import actually used."""

    def __init__(self, known, names, used):
        super().__init__(known)
        self.names, self.used = names, used

    def __getitem__(self, key):
        self.used.add(self.names[key])
        return super().__getitem__(key)


def function_schema(node: onnx.NodeProto, opset: int):
    """The ONNX schema of `node` when it defines the op as a function body, else None."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return None
    versions = list(schema.function_opset_versions) + list(
        schema.context_dependent_function_opset_versions)
    return schema if any(v <= opset for v in versions) else None


def _all_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            for g in attr.graphs:
                yield from _all_nodes(g)


def _graph_name(name: str) -> str:
    return sanitize_name(name) or "main"
