"""The reference interpreter: runs any graph in NumPy. It is the oracle for every pass
and backend.

f16 and bf16 values are widened to f32 before an op runs and every result is rounded to
its declared type, so each op computes as if in f32 and rounds once at its output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.errors import EmberError, InterpreterError, ShapeError
from ember.graph.bind import bind_sizes, is_symbolic, specialize
from ember.graph.builder import located
from ember.graph.ir import Graph, Op, Region, Value

_HALF = (np.dtype(DType.f16.np), np.dtype(DType.bf16.np))


def interpret(graph: Graph, inputs: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
    """Run `graph` on `inputs` (a sequence, or a mapping by input name); returns the outputs.
    A graph with symbolic sizes runs with them bound to the inputs' shapes."""
    if is_symbolic(graph):
        given = _ordered(graph, inputs)
        graph = specialize(graph, bind_sizes(graph, [np.shape(a) for a in given]))
        inputs = given
    arrays = check_inputs(graph, inputs)
    return Interpreter(graph).run_region(graph.body, arrays)


def _ordered(graph: Graph, inputs: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
    """The inputs in the graph's order: as given, or from a mapping by input name."""
    if isinstance(inputs, Mapping):
        names = [v.name for v in graph.inputs]
        missing = [n for n in names if n not in inputs]
        extra = [k for k in inputs if k not in names]
        if missing or extra:
            raise ShapeError(f"graph @{graph.name} inputs: missing {missing}, unexpected {extra}")
        return [inputs[n] for n in names]
    return list(inputs)


def check_inputs(graph: Graph, inputs: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
    """The inputs as arrays of exactly the declared dtypes and shapes, or a clear error."""
    inputs = _ordered(graph, inputs)
    if len(inputs) != len(graph.inputs):
        raise ShapeError(
            f"graph @{graph.name} takes {len(graph.inputs)} inputs, got {len(inputs)}")
    arrays = []
    for i, (value, given) in enumerate(zip(graph.inputs, inputs)):
        array = np.asarray(given)
        label = f"input {i} (%{value.name})" if value.name else f"input {i}"
        if array.dtype != value.dtype.np:
            raise ShapeError(f"graph @{graph.name} {label}: expected {value.dtype}, got"
                             f" {array.dtype}")
        if array.shape != value.shape:
            raise ShapeError(f"graph @{graph.name} {label}: expected shape"
                             f" {list(value.shape)}, got {list(array.shape)}")
        arrays.append(array)
    return arrays


class Interpreter:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.env: dict[Value, np.ndarray] = {}

    def run_region(self, region: Region, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        for value, array in zip(region.args, args):
            self.env[value] = array
        for op in region.ops:
            try:
                results = self.run_op(op)
            except EmberError as e:
                if op.where() in str(e):
                    raise
                raise located(e, op.where()) from None
            for value, array in zip(op.results, results):
                self.env[value] = array
        return [self.env[v] for v in region.outputs]

    def run_op(self, op: Op) -> list[np.ndarray]:
        if op.name == "constant":
            return [self.graph.constant_data(op)]
        if op.name == "if":
            branch = op.regions[0] if bool(self.env[op.operands[0]]) else op.regions[1]
            return self.run_region(branch, [])
        if op.name == "loop":
            return self.run_loop(op)
        if op.name == "fused":
            return self.run_region(op.regions[0], [self.env[v] for v in op.operands])
        return evaluate_op(op, [self.env[v] for v in op.operands])

    def run_loop(self, op: Op) -> list[np.ndarray]:
        trip_count, cond, *carried = (self.env[v] for v in op.operands)
        body = op.regions[0]
        num_carried = len(carried)
        scans: list[list[np.ndarray]] = [[] for _ in range(op.attrs["num_scan"])]
        i = 0
        while i < int(trip_count) and bool(cond):
            outs = self.run_region(body, [np.array(i, np.int64), *carried])
            cond, carried = outs[0], outs[1:1 + num_carried]
            for scan, value in zip(scans, outs[1 + num_carried:]):
                scan.append(value)
            i += 1
        if scans and i != op.attrs["scan_length"]:
            raise InterpreterError(f"{op.where()}: ran {i} iterations, but its scan outputs are"
                                   f" typed for scan_length = {op.attrs['scan_length']}")
        stacked = [np.stack(s) if s else np.zeros(r.shape, r.dtype.np)
                   for s, r in zip(scans, op.results[num_carried:])]
        return [*carried, *stacked]


def evaluate_op(op: Op, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run one op without regions on arrays by its reference semantics (used by folding too)."""
    reference = op.opdef.reference
    if reference is None:
        raise InterpreterError(f"{op.where()}: has no reference semantics")
    if "raw_bits" not in op.opdef.traits:
        args = [a.astype(np.float32) if a.dtype in _HALF else a for a in args]
    try:
        with np.errstate(all="ignore"):
            results = reference(*args, **op.attrs)
    except EmberError:
        raise
    except (ArithmeticError, IndexError, ValueError, TypeError) as e:
        raise InterpreterError(f"{op.where()}: {type(e).__name__}: {e}") from None
    results = results if isinstance(results, (tuple, list)) else (results,)
    if len(results) != len(op.results):
        raise InterpreterError(f"{op.where()}: the reference returned {len(results)} results,"
                               f" expected {len(op.results)}")
    return [_as_result(op, i, r) for i, r in enumerate(results)]


def _as_result(op: Op, index: int, array: Any) -> np.ndarray:
    value = op.results[index]
    array = np.asarray(array)
    if array.dtype != value.dtype.np:
        with np.errstate(all="ignore"):
            array = array.astype(value.dtype.np)
    if array.shape != value.shape:
        raise InterpreterError(f"{op.where()}: the reference produced result {index} of shape"
                               f" {list(array.shape)}, but its type is {value.type}")
    return array
