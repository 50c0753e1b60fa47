"""The graph IR's text form: `print_graph` and `parse_graph` round-trip exactly."""

from ember.graph.text.parser import parse_graph
from ember.graph.text.printer import print_graph

__all__ = ["parse_graph", "print_graph"]
