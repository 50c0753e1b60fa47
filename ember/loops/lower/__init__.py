"""Lowering the graph IR to the loop IR (level 1 -> level 2)."""

from ember.loops.lower.core import LowerContext, find_lowering, lowered_ops, lowering
from ember.loops.lower.program import lower_graph

__all__ = ["LowerContext", "find_lowering", "lower_graph", "lowered_ops", "lowering"]
