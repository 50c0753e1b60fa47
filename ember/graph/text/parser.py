"""Parsing the graph IR's text form (see printer.py for the syntax).

Every op is rebuilt through the op registry, so the parser checks attributes and types
as it goes: a declared result type that disagrees with inference, a use of an undefined
value or a malformed token is a ParseError with the line and column where it happened.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.errors import EmberError, ParseError
from ember.graph.builder import Builder
from ember.graph.ir import Graph, Region, TensorType, Value
from ember.graph.ops.registry import get_opdef, has_op
from ember.graph.symbolic import Dim, read_dim
from ember.lexer import Token, TokenStream, describe, parse_number

MAX_RANK = 64


class GraphParser:
    def __init__(self, text: str, source_name: str = "<text>"):
        self.ts = TokenStream(text, source_name)
        self.scopes: list[dict[str, Value]] = []
        # constant table references seen in the body: name -> token, resolved at the end
        self.table_refs: dict[str, Token] = {}

    def error(self, message: str, token: Token | None = None) -> ParseError:
        return self.ts.error(message, token)

    # -- values and types -------------------------------------------------------------
    def define(self, token: Token, value: Value) -> None:
        name = token.text[1:]
        for scope in self.scopes:
            if name in scope:
                raise self.error(f"value %{name} is defined twice", token)
        self.scopes[-1][name] = value
        value.name = None if name.isdigit() else name

    def use(self) -> Value:
        token = self.ts.expect_kind("value", "a value (%name)")
        name = token.text[1:]
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise self.error(f"use of undefined value %{name}", token)

    def dtype(self) -> DType:
        token = self.ts.expect_kind("ident", "an element type")
        try:
            return DType(token.text)
        except ValueError:
            raise self.error(f"unknown element type '{token.text}'", token) from None

    def tensor_type(self) -> TensorType:
        dtype = self.dtype()
        self.ts.expect("[")
        dims: list[int | Dim] = []
        if not self.ts.at("]"):
            while True:
                token = self.ts.peek
                dim = read_dim(self.ts)
                if isinstance(dim, int) and dim < 0:
                    raise self.error(f"negative dimension {dim}", token)
                dims.append(dim)
                if len(dims) > MAX_RANK:
                    raise self.error(f"rank above {MAX_RANK}", token)
                if not self.ts.accept(","):
                    break
        self.ts.expect("]")
        return TensorType(dtype, tuple(dims))

    def int_or_dim(self) -> int | Dim:
        """An integer, or a symbolic size where one may stand (`64*?b`)."""
        return read_dim(self.ts)

    def comma_list(self, item, close: str) -> list[Any]:
        items = []
        if self.ts.at(close):
            return items
        while True:
            items.append(item())
            if not self.ts.accept(","):
                return items

    # -- attributes ---------------------------------------------------------------------
    def scalar(self, dtype: DType | None = None) -> Any:
        token = self.ts.peek
        if token.kind == "ident" and token.text in ("true", "false"):
            self.ts.next()
            return token.text == "true"
        if token.kind == "number":
            self.ts.next()
            return parse_number(token.text)
        raise self.error(f"expected a number or a bool, found {describe(token)}")

    def dense(self) -> np.ndarray | TensorType:
        """`dense<T [..]>`, `dense<T splat v>`, `dense<T base64 "...">`; `elided` gives the type."""
        self.ts.expect("dense")
        self.ts.expect("<")
        type_token = self.ts.peek
        t = self.tensor_type()
        if t.numel > 1 << 31:
            raise self.error(f"constant of {t.numel} elements is too large", type_token)
        token = self.ts.peek
        if self.ts.accept("elided"):
            self.ts.expect(">")
            return t
        if self.ts.accept("splat"):
            array = np.full(t.shape, self._element(self.scalar(), t.dtype, token), t.dtype.np)
        elif self.ts.accept("base64"):
            text_token = self.ts.peek
            text = self.ts.expect_string()
            try:
                raw = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                raise self.error("malformed base64 data", text_token) from None
            if len(raw) != t.nbytes:
                raise self.error(f"{t} needs {t.nbytes} bytes of data, got {len(raw)}",
                                 text_token)
            array = np.frombuffer(raw, t.dtype.np.newbyteorder("<")).astype(t.dtype.np)
            array = array.reshape(t.shape)
        else:
            self.ts.expect("[")
            items = self.comma_list(self.scalar, "]")
            self.ts.expect("]")
            if len(items) != t.numel:
                raise self.error(f"{t} needs {t.numel} elements, got {len(items)}", token)
            array = np.array([self._element(v, t.dtype, token) for v in items],
                             dtype=t.dtype.np).reshape(t.shape)
        self.ts.expect(">")
        array.flags.writeable = False
        return array

    def _element(self, value: Any, dtype: DType, token: Token) -> Any:
        if dtype is DType.bool:
            if not isinstance(value, bool):
                raise self.error("bool tensors hold true or false", token)
            return value
        if isinstance(value, bool):
            raise self.error(f"{dtype} tensors hold numbers, not true/false", token)
        if dtype.is_int:
            info = np.iinfo(dtype.np)
            if not isinstance(value, int) or not info.min <= value <= info.max:
                raise self.error(f"{value} is not a valid {dtype} value", token)
            return value
        return float(value)

    def attr_value(self, kind: str) -> Any:
        ts = self.ts
        token = ts.peek
        if kind in ("int", "float"):
            return self.int_or_dim() if kind == "int" else ts.expect_number()
        if kind == "bool":
            value = self.scalar()
            if not isinstance(value, bool):
                raise self.error("expected true or false", token)
            return value
        if kind == "str":
            return ts.expect_string()
        if kind == "dtype":
            return self.dtype()
        if kind in ("ints", "floats"):
            ts.expect("[")
            items = self.comma_list(self.int_or_dim if kind == "ints" else ts.expect_number, "]")
            ts.expect("]")
            return items
        if kind == "dense":
            value = self.dense()
            if isinstance(value, TensorType):
                raise self.error("an inline constant cannot be elided", token)
            return value
        if kind == "symbol":
            return ts.expect_kind("symbol", "a constant name (@name)").text[1:]
        raise AssertionError(kind)

    def attrs(self, opname: str, op_token: Token) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        if not self.ts.accept("{"):
            return attrs
        specs = get_opdef(opname).attrs
        while not self.ts.at("}"):
            key_token = self.ts.expect_kind("ident", "an attribute name")
            key = key_token.text
            if key not in specs:
                raise self.error(f"graph.{opname} has no attribute '{key}'", key_token)
            if key in attrs:
                raise self.error(f"attribute '{key}' given twice", key_token)
            self.ts.expect("=")
            attrs[key] = self.attr_value(specs[key].kind)
            if not self.ts.accept(","):
                break
        self.ts.expect("}")
        return attrs

    # -- ops and regions ----------------------------------------------------------------
    def region_body(self, builder: Builder, terminator: str) -> None:
        while not self.ts.at(terminator):
            if self.ts.peek.kind == "eof" or self.ts.at("}"):
                raise self.error(
                    f"expected an op or '{terminator}', found {describe(self.ts.peek)}")
            self.op(builder)
        self.ts.expect(terminator)
        outputs = [] if self.ts.at("}") else self.comma_list(self.use, "}")
        builder.region.outputs = outputs

    def region(self, builder: Builder) -> Region:
        arg_tokens, arg_types = [], []
        if self.ts.accept("("):
            while not self.ts.at(")"):
                arg_tokens.append(self.ts.expect_kind("value", "a region argument"))
                self.ts.expect(":")
                arg_types.append(self.tensor_type())
                if not self.ts.accept(","):
                    break
            self.ts.expect(")")
        region = Region(arg_types)
        self.ts.expect("{")
        self.scopes.append({})
        for token, arg in zip(arg_tokens, region.args):
            self.define(token, arg)
        self.region_body(builder.region_builder(region), "yield")
        self.scopes.pop()
        self.ts.expect("}")
        return region

    def op(self, builder: Builder) -> None:
        result_tokens = []
        if self.ts.peek.kind == "value":
            result_tokens = self.comma_list(
                lambda: self.ts.expect_kind("value", "a result name"), "=")
            self.ts.expect("=")
        op_token = self.ts.expect_kind("ident", "an op name")
        if not op_token.text.startswith("graph."):
            raise self.error(f"expected an op name 'graph.<op>', found '{op_token.text}'",
                             op_token)
        opname = op_token.text[len("graph."):]
        if not has_op(opname):
            raise self.error(f"unknown op 'graph.{opname}'", op_token)
        operands = [] if not self.ts.peek.kind == "value" else self.comma_list(self.use, ":")
        attrs = self.attrs(opname, op_token)
        self.ts.expect(":")
        if self.ts.at("(") and self.ts.peek_at(1).text == ")":
            self.ts.next()
            self.ts.next()
            declared = []
        else:
            declared = self.comma_list(self.tensor_type, "")
        regions = []
        while self.ts.at("{") or (self.ts.at("(") and self.ts.peek_at(1).kind == "value"):
            regions.append(self.region(builder))
        loc = None
        if self.ts.accept("loc"):
            self.ts.expect("(")
            loc = self.ts.expect_string()
            self.ts.expect(")")
        opdef = get_opdef(opname)
        if len(regions) != opdef.num_regions:
            raise self.error(f"graph.{opname} takes {opdef.num_regions} regions, got"
                             f" {len(regions)}", op_token)
        if opname == "constant" and isinstance(attrs.get("name"), str):
            self.table_refs.setdefault(attrs["name"], op_token)
            if attrs["name"] not in builder.graph.constants:
                # A placeholder of the declared type; the constants section fills it in.
                if len(declared) != 1:
                    raise self.error("graph.constant has one result", op_token)
                builder.graph.constants[attrs["name"]] = _Pending(declared[0])
        try:
            op = builder.op(opname, operands, attrs, regions, loc=loc)
        except EmberError as e:
            raise self.error(str(e), op_token) from None
        inferred = [v.type for v in op.results]
        if declared != inferred:
            raise self.error(
                f"graph.{opname} declares result types ({', '.join(map(str, declared))}) but"
                f" they infer as ({', '.join(map(str, inferred))})", op_token)
        if len(result_tokens) != len(op.results):
            raise self.error(f"graph.{opname} has {len(op.results)} results, but"
                             f" {len(result_tokens)} names are given", op_token)
        for token, value in zip(result_tokens, op.results):
            self.define(token, value)

    # -- the graph and its constant table ---------------------------------------------------
    def graph(self) -> Graph:
        ts = self.ts
        ts.expect("graph")
        name = ts.expect_kind("symbol", "the graph name (@name)").text[1:]
        builder = Builder(name)
        self.scopes.append({})
        ts.expect("(")
        while not ts.at(")"):
            token = ts.expect_kind("value", "an input (%name)")
            ts.expect(":")
            self.define(token, builder.input(token.text[1:], *_split(self.tensor_type())))
            if not ts.accept(","):
                break
        ts.expect(")")
        ts.expect("->")
        ts.expect("(")
        header_token = ts.peek
        declared, aliases = [], {}
        if not ts.at(")"):
            while True:  # a type, and `in %input` for an output computed in its memory
                declared.append(self.tensor_type())
                if ts.accept("in"):
                    token = ts.expect_kind("value", "an input (%name)")
                    names = [v.name for v in builder.graph.inputs]
                    if token.text[1:] not in names:
                        raise self.error(f"{token.text} is not an input of the graph", token)
                    aliases[len(declared) - 1] = names.index(token.text[1:])
                if not ts.accept(","):
                    break
        ts.expect(")")
        if ts.accept("where"):  # `where ?s <= 512, ...`: the sizes' bounds
            while True:
                token = ts.expect_kind("dim", "a size (?name)")
                ts.expect("<")
                ts.expect("=")
                bound_token = ts.peek
                bound = ts.expect_int("a bound")
                if bound < 1:
                    raise self.error(f"the bound of {token.text} is {bound}; sizes are at"
                                     " least 1", bound_token)
                builder.graph.size_bounds[token.text[1:]] = bound
                if not ts.accept(","):
                    break
        ts.expect("{")
        self.region_body(builder, "return")
        ts.expect("}")
        graph = builder.graph
        graph.aliases = aliases
        actual = [v.type for v in graph.outputs]
        if declared != actual:
            raise self.error(f"the graph declares outputs ({', '.join(map(str, declared))}) but"
                             f" returns ({', '.join(map(str, actual))})", header_token)
        if ts.accept("constants"):
            self.constants_section(graph)
        if ts.peek.kind != "eof":
            raise self.error(f"expected end of input, found {describe(ts.peek)}")
        for key, token in self.table_refs.items():
            if isinstance(graph.constants.get(key), _Pending):
                raise self.error(f"constant @{key} is missing from the constants section", token)
        return graph

    def constants_section(self, graph: Graph) -> None:
        self.ts.expect("{")
        seen: set[str] = set()
        while not self.ts.at("}"):
            token = self.ts.expect_kind("symbol", "a constant name (@name)")
            key = token.text[1:]
            if key in seen:
                raise self.error(f"constant @{key} is defined twice", token)
            seen.add(key)
            self.ts.expect("=")
            data_token = self.ts.peek
            data = self.dense()
            if isinstance(data, TensorType):
                raise self.error(f"constant @{key} was printed with its data elided", data_token)
            pending = graph.constants.get(key)
            if isinstance(pending, _Pending):
                t = TensorType(pending.type.dtype, data.shape)
                if np.dtype(data.dtype) != pending.type.dtype.np or t != pending.type:
                    raise self.error(f"constant @{key} is used as {pending.type} but holds"
                                     f" {TensorType(DType(_dtype_name(data)), data.shape)}",
                                     data_token)
            graph.constants[key] = data
        self.ts.expect("}")


class _Pending:
    """A table constant that the body used before the constants section defined it."""

    def __init__(self, type: TensorType):
        self.type = type
        self.dtype = type.dtype.np
        self.shape = type.shape


def _dtype_name(array: np.ndarray) -> str:
    from ember.dtypes import from_numpy

    return from_numpy(array.dtype).value


def _split(t: TensorType) -> tuple[DType, tuple[int, ...]]:
    return t.dtype, t.shape


def parse_graph(text: str, source_name: str = "<text>") -> Graph:
    """Parse the text form of a graph; raises ParseError with a line and column."""
    try:
        return GraphParser(text, source_name).graph()
    except RecursionError:
        raise ParseError("nesting too deep", 1, 1, source_name) from None
