"""Ember: an ML compiler written in Python.

    fast = ember.compile(model)            # a torch.nn.Module, an ONNX model, or a Graph
    graph = ember.torch.export(model, (x,))  # or ember.onnx.import_model("model.onnx")

Graphs are built with `Builder`, printed and parsed (`print_graph`, `parse_graph`),
verified, run by the reference interpreter (`interpret`) and optimized by the passes in
`ember.graph.passes` (run with `ember.driver.pass_manager`).
"""

from ember import _openmp_env  # noqa: F401  (first: before anything loads libgomp)
from ember.api.compile import compile
from ember.config import Config
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
from ember.explain import explain
from ember.export import export, load
from ember.graph import (
    Builder,
    Graph,
    TensorType,
    interpret,
    parse_graph,
    print_graph,
    verify_graph,
)
from ember.target import Target

__version__ = "0.1.0"

__all__ = [
    "BadAttributeError",
    "Builder",
    "Config",
    "DType",
    "EmberError",
    "Graph",
    "InterpreterError",
    "ParseError",
    "PassError",
    "ShapeError",
    "Target",
    "TensorType",
    "UnsupportedOpError",
    "VerificationError",
    "compile",
    "explain",
    "export",
    "interpret",
    "load",
    "parse_graph",
    "print_graph",
    "verify_graph",
]


def __getattr__(name: str):
    # `ember.torch` and `ember.onnx` import their (optional, heavy) frameworks on first use.
    if name in ("torch", "onnx"):
        import importlib

        return importlib.import_module(f"ember.{name}")
    raise AttributeError(f"module 'ember' has no attribute '{name}'")
