"""Operator fusion: which ops may share a kernel (policy), which groups to form (planner),
and how a group becomes one `graph.fused` op (outline). The `fuse` pass strings them
together; the loop lowering turns each fused op into one kernel."""

from ember.graph.fusion.planner import FusionPlanner, fusion_fuel, plan_groups
from ember.graph.fusion.policy import (
    Decision,
    FusionPlan,
    Refusal,
    category,
    classify,
)

__all__ = ["Decision", "FusionPlan", "FusionPlanner", "Refusal", "category", "classify",
           "fusion_fuel", "plan_groups"]
