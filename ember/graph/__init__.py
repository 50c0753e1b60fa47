"""Level 1: the graph IR, its ops, text form, verifier, interpreter and passes."""

from ember.graph import ops  # noqa: F401  (registers every op)
from ember.graph.builder import Builder
from ember.graph.interp import interpret
from ember.graph.ir import Graph, Op, Region, TensorType, Value
from ember.graph.text import parse_graph, print_graph
from ember.graph.verify import verify_graph

__all__ = ["Builder", "Graph", "Op", "Region", "TensorType", "Value", "interpret",
           "parse_graph", "print_graph", "verify_graph"]
