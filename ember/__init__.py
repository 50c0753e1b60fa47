"""Ember: an ML compiler written in Python.

The graph IR (level 1) is the entry point in this release: build a graph with `Builder`,
print and parse it, verify it, run it with the reference interpreter, and optimize it
with the passes in `ember.passes`.
"""

from ember.dtypes import DType
from ember.errors import (
    BadAttributeError,
    EmberError,
    InterpreterError,
    ParseError,
    PassError,
    ShapeError,
    UnsupportedOpError,
    VerificationError,
)
from ember.graph import (
    Builder,
    Graph,
    TensorType,
    interpret,
    parse_graph,
    print_graph,
    verify_graph,
)

__version__ = "0.1.0"

__all__ = [
    "BadAttributeError",
    "Builder",
    "DType",
    "EmberError",
    "Graph",
    "InterpreterError",
    "ParseError",
    "PassError",
    "ShapeError",
    "TensorType",
    "UnsupportedOpError",
    "VerificationError",
    "interpret",
    "parse_graph",
    "print_graph",
    "verify_graph",
]
