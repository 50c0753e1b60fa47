"""Constant folding: an op whose operands are all constants becomes a constant.

The result is computed by the op's reference semantics (the interpreter's). A size cap
keeps folding from inflating the model: a result is folded only when it has at most
`FOLD_MIN_ELEMENTS` elements or no more than its constant operands together.
"""

from __future__ import annotations

import numpy as np

from ember.graph.builder import Builder
from ember.graph.interp import evaluate_op
from ember.graph.ir import Graph, Op, Value
from ember.graph.passes import graph_pass
from ember.graph.rewrite import ANY, PatternTable, apply_patterns
from ember.graph.symbolic import symbols_in

FOLD_MIN_ELEMENTS = 1 << 16

fold_patterns = PatternTable()


def constant_value(graph: Graph, value: Value) -> np.ndarray | None:
    """The data of `value` when a constant op defines it, else None."""
    producer = value.producer
    if producer is None or producer.name != "constant":
        return None
    return graph.constant_data(producer)


@fold_patterns.on(ANY)
def fold_constant_operands(op: Op, b: Builder) -> list[Value] | None:
    if op.name == "constant" or op.regions or op.opdef.reference is None:
        return None
    if not all(r.type.is_static for r in op.results) or symbols_in(list(op.attrs.values())):
        return None  # sizes known at call time: folded once a call binds them
    inputs = [constant_value(b.graph, v) for v in op.operands]
    if any(a is None for a in inputs):
        return None
    budget = max(FOLD_MIN_ELEMENTS, sum(a.size for a in inputs))
    if sum(r.type.numel for r in op.results) > budget:
        return None
    results = [np.asarray(array) for array in evaluate_op(op, inputs)]
    for array in results:
        # The table keeps a result as it is, not a copy, where no one else can change it:
        # a transpose of weights stays a view until a pass or the lowering lays it out.
        array.flags.writeable = False
    return [b.constant(array, name=r.name if array.size > 16 else None)
            for array, r in zip(results, op.results)]


@graph_pass("fold", "evaluate ops whose operands are all constants (size-capped)")
def fold_constants(graph: Graph) -> Graph:
    apply_patterns(graph, fold_patterns)
    return graph
