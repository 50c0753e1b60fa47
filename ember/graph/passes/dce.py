"""Dead-code elimination: drop ops whose results nothing uses, and unused table constants."""

from __future__ import annotations

from ember.graph.ir import Graph, Region, Value
from ember.graph.passes import graph_pass


def _sweep_region(region: Region, live: set[Value]) -> None:
    """Keep the ops of `region` that feed its outputs; marks the values they read as live."""
    live.update(region.outputs)
    kept = []
    for op in reversed(region.ops):
        if not any(r in live for r in op.results):
            continue
        for inner in op.regions:
            _sweep_region(inner, live)
        live.update(op.operands)
        kept.append(op)
    kept.reverse()
    region.ops = kept


@graph_pass("dce", "remove ops whose results are unused and constants nothing references")
def eliminate_dead_code(graph: Graph) -> Graph:
    _sweep_region(graph.body, set())
    used = {op.attrs["name"] for op in graph.walk() if op.name == "constant"}
    for key in [k for k in graph.constants if k not in used]:
        del graph.constants[key]
    return graph
