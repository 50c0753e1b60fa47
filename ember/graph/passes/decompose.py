"""Decompose composite ops (softmax, layer_norm, gelu, ...) into primitives, by the
decomposition each registers in its op definition."""

from __future__ import annotations

from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Value
from ember.graph.passes import graph_pass
from ember.graph.rewrite import ANY, PatternTable, apply_patterns

decompose_patterns = PatternTable()


@decompose_patterns.on(ANY)
def expand_composite(op: Op, b: Builder) -> list[Value] | None:
    decompose = op.opdef.decompose
    if decompose is None:
        return None
    return list(decompose(b, list(op.operands), dict(op.attrs)))


@graph_pass("decompose", "expand composite ops into primitive ops")
def decompose_composites(graph: Graph) -> Graph:
    apply_patterns(graph, decompose_patterns)
    return graph
