"""Printing the graph IR as MLIR-like text. The parser reads exactly what this writes.

    graph @main(%x: f32[2,3]) -> (f32[2,3]) {
      %0 = graph.constant {value = dense<f32[] [1.0]>} : f32[]
      %1 = graph.add %x, %0 : f32[2,3]
      return %1
    }

Values print under their name hint when they have one, else as %0, %1, ... in order of
definition. Attributes equal to their default are left out. Large constants print as
`{name = @w}` references to the `constants { ... }` section at the end.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from ember.dtypes import DType, from_numpy
from ember.graph.ir import Graph, Op, Region, TensorType, Value
from ember.lexer import quote

CONSTANT_MODES = ("table", "inline", "elide", "omit")


def format_float(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(float(value))


def format_element(value: Any, dtype: DType) -> str:
    """One tensor element in the shortest text that reads back to the same value."""
    if dtype is DType.bool:
        return "true" if value else "false"
    if dtype.is_int:
        return str(int(value))
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if dtype is DType.f64:
        return repr(float(value))
    text = str(dtype.np.type(value))  # NumPy's shortest round-trip form for this width
    return text if any(c in text for c in ".en") else text + ".0"


def format_dense(array: np.ndarray, *, binary: bool = False) -> str:
    dtype = from_numpy(array.dtype)
    head = f"dense<{TensorType(dtype, array.shape)}"
    flat = array.reshape(-1)
    if flat.size > 1 and bool(np.all(flat.view(np.uint8).reshape(flat.size, -1)
                                      == flat[:1].view(np.uint8))):
        return f"{head} splat {format_element(flat[0], dtype)}>"
    if binary:
        data = array.astype(array.dtype.newbyteorder("<"), copy=False)
        return f'{head} base64 "{base64.b64encode(data.tobytes()).decode()}">'
    return f"{head} [{', '.join(format_element(v, dtype) for v in flat)}]>"


def format_attr(kind: str, value: Any) -> str:
    if kind == "int":
        return str(value)
    if kind == "float":
        return format_float(value)
    if kind == "bool":
        return "true" if value else "false"
    if kind == "str":
        return quote(value)
    if kind == "dtype":
        return value.value
    if kind == "ints":
        return "[" + ", ".join(str(v) for v in value) + "]"
    if kind == "floats":
        return "[" + ", ".join(format_float(v) for v in value) + "]"
    if kind == "dense":
        return format_dense(value)
    if kind == "symbol":
        return "@" + value
    raise AssertionError(kind)


class Printer:
    def __init__(self, graph: Graph, constants: str = "table"):
        if constants not in CONSTANT_MODES:
            raise ValueError(f"constants must be one of {CONSTANT_MODES}, got {constants!r}")
        self.graph = graph
        self.constants_mode = constants
        self.names: dict[Value, str] = {}
        self.used: set[str] = set()
        self.counter = 0
        self.lines: list[str] = []

    def name(self, value: Value) -> str:
        if value not in self.names:
            if value.name:
                name, suffix = value.name, 0
                while name in self.used:
                    suffix += 1
                    name = f"{value.name}_{suffix}"
            else:
                while str(self.counter) in self.used:  # cannot happen with sanitized hints
                    self.counter += 1
                name = str(self.counter)
                self.counter += 1
            self.used.add(name)
            self.names[value] = name
        return "%" + self.names[value]

    def ref(self, value: Value) -> str:
        name = self.names.get(value)
        return "%" + name if name is not None else "%<undefined:" + repr(value) + ">"

    def print(self) -> str:
        g = self.graph
        args = ", ".join(f"{self.name(a)}: {a.type}" for a in g.inputs)
        results = ", ".join(str(v.type) + (f" in {self.ref(g.inputs[g.aliases[k]])}"
                                           if k in g.aliases else "")
                            for k, v in enumerate(g.outputs))
        bounds = ", ".join(f"?{name} <= {bound}" for name, bound in sorted(g.size_bounds.items()))
        where = f" where {bounds}" if bounds else ""
        self.lines.append(f"graph @{g.name}({args}) -> ({results}){where} {{")
        self.region_body(g.body, "  ", "return")
        self.lines.append("}")
        text = "\n".join(self.lines) + "\n"
        if self.constants_mode in ("table", "elide"):
            text += format_constant_table(g.constants, elide=self.constants_mode == "elide")
        return text

    def region_body(self, region: Region, indent: str, terminator: str) -> None:
        for op in region.ops:
            self.op(op, indent)
        outs = ", ".join(self.ref(v) for v in region.outputs)
        self.lines.append(f"{indent}{terminator}" + (f" {outs}" if outs else ""))

    def op(self, op: Op, indent: str) -> None:
        operands = ", ".join(self.ref(v) for v in op.operands)
        results = ", ".join(self.name(v) for v in op.results)
        text = indent + (f"{results} = " if results else "") + f"graph.{op.name}"
        if operands:
            text += " " + operands
        attrs = self.attrs(op)
        if attrs:
            text += " {" + attrs + "}"
        text += " : " + (", ".join(str(v.type) for v in op.results) if op.results else "()")
        if not op.regions:
            self.lines.append(text + self.loc(op))
            return
        for i, region in enumerate(op.regions):
            args = ", ".join(f"{self.name(a)}: {a.type}" for a in region.args)
            head = text if i == 0 else indent + "}"
            self.lines.append(head + (f" ({args})" if region.args else "") + " {")
            self.region_body(region, indent + "  ", "yield")
        self.lines.append(indent + "}" + self.loc(op))

    def attrs(self, op: Op) -> str:
        specs = op.opdef.attrs
        parts = []
        for key, spec in specs.items():
            value = op.attrs.get(key)
            if op.name == "constant" and key == "name" and value is not None:
                if self.constants_mode == "inline":
                    parts.append(f"value = {format_dense(self.graph.constants[value])}")
                    continue
            if _equal_default(value, spec.default):
                continue
            parts.append(f"{key} = {format_attr(spec.kind, value)}")
        return ", ".join(parts)

    @staticmethod
    def loc(op: Op) -> str:
        return f" loc({quote(op.loc)})" if op.loc else ""


def _equal_default(value: Any, default: Any) -> bool:
    if isinstance(value, np.ndarray) or isinstance(default, np.ndarray):
        return False
    if isinstance(value, float) and isinstance(default, float):
        return value == default or (math.isnan(value) and math.isnan(default))
    return type(value) is type(default) and value == default


def format_constant_table(constants: dict[str, np.ndarray], elide: bool = False) -> str:
    """The `constants { ... }` section that follows a graph (empty for no constants)."""
    if not constants:
        return ""
    lines = ["", "constants {"]
    for key, data in constants.items():
        if elide:
            text = f"dense<{TensorType(from_numpy(data.dtype), data.shape)} elided>"
        else:
            text = format_dense(data, binary=True)
        lines.append(f"  @{key} = {text}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_graph(graph: Graph, constants: str = "table") -> str:
    """The text form of `graph`.

    constants: 'table' (default) prints large constants in a section after the graph;
    'inline' prints every constant in place; 'elide' prints the table without the data
    (readable, but not parseable back); 'omit' leaves the section out.
    """
    return Printer(graph, constants).print()
