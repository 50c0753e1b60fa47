"""Common-subexpression elimination: equal ops on equal operands compute once.

Two ops are equal when their names, operands, attributes and result types are. An op
may reuse a value from its own region or an enclosing one (unless the region is
isolated, as graph.fused's is), never from a sibling region.
Ops with regions are left alone.
"""

from __future__ import annotations

from collections import ChainMap
from typing import Any

import numpy as np

from ember.graph.ir import Graph, Op, Region, Value
from ember.graph.passes import graph_pass


def attr_key(value: Any) -> Any:
    """A hashable stand-in for an attribute value (arrays compare by dtype, shape and bytes)."""
    if isinstance(value, np.ndarray):
        return ("dense", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, float) and value != value:
        return ("nan",)  # NaN != NaN, but two NaN attributes are the same attribute
    return value


def op_key(op: Op) -> tuple:
    return (op.name, tuple(id(v) for v in op.operands),
            tuple((k, attr_key(v)) for k, v in op.attrs.items()),
            tuple(r.type for r in op.results))


def _cse_region(region: Region, seen: ChainMap, replaced: dict[Value, Value]) -> int:
    removed = 0
    kept = []
    for op in region.ops:
        op.operands = [replaced.get(v, v) for v in op.operands]
        if op.regions:
            # An isolated region (graph.fused) may reuse nothing from outside.
            scope = ChainMap() if "isolated" in op.opdef.traits else seen
            for inner in op.regions:
                removed += _cse_region(inner, scope.new_child(), replaced)
            kept.append(op)
            continue
        key = op_key(op)
        twin = seen.get(key)
        if twin is None:
            seen[key] = op
            kept.append(op)
            continue
        for old, new in zip(op.results, twin.results):
            replaced[old] = new
        removed += 1
    region.ops = kept
    region.outputs = [replaced.get(v, v) for v in region.outputs]
    return removed


@graph_pass("cse", "merge ops equal in name, operands, attributes and types")
def eliminate_common_subexpressions(graph: Graph) -> Graph:
    _cse_region(graph.body, ChainMap(), {})
    return graph
