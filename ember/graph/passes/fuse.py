"""Fusion: outline groups of ops that can share a kernel into `graph.fused` ops.

See ember/graph/fusion for the policy (what may fuse, and why not), the planner (which
groups, ranked by bytes saved) and the outlining. Regions of `if` and `loop` are fused on
their own. EMBER_FUSION_FUEL=N caps the number of merges (to bisect a wrong fusion).
"""

from __future__ import annotations

from ember.graph.fusion.outline import outline
from ember.graph.fusion.planner import FusionPlanner, fusion_fuel
from ember.graph.fusion.policy import classify
from ember.graph.ir import Graph, Region
from ember.graph.passes import graph_pass


def fuse_region(graph: Graph, region: Region, fuel: list[int | None]) -> None:
    for op in region.ops:
        if op.name == "fused":  # already one kernel
            continue
        for inner in op.regions:
            fuse_region(graph, inner, fuel)
    planner = FusionPlanner(region, fuel[0])
    groups = planner.run()
    if fuel[0] is not None:
        fuel[0] -= planner.merges
    for ops in groups:
        members = set(ops)
        plan = classify(ops, planner.outputs(members))
        assert plan, f"the planner accepted a group that does not classify: {plan}"
        outline(graph, region, ops, plan, planner.users)


@graph_pass("fuse", "outline groups of ops that share a kernel into graph.fused ops")
def fuse(graph: Graph) -> Graph:
    fuse_region(graph, graph.body, [fusion_fuel()])
    return graph
