"""Ember: an ML compiler written in Python.

    fast = ember.compile(model)            # a torch.nn.Module, an ONNX model, or a Graph
    @ember.script                          # a Python function on NumPy arrays, loops and all
    graph = ember.torch.export(model, (x,))  # or ember.onnx.import_model("model.onnx")

Graphs are built with `Builder`, printed and parsed (`print_graph`, `parse_graph`),
verified, run by the reference interpreter (`interpret`) and optimized by the passes in
`ember.graph.passes` (run with `ember.driver.pass_manager`).
"""

from ember import _openmp_env  # noqa: F401  (first: before anything loads libgomp)
from ember.api.compile import compile
from ember.api.script import script
from ember.config import Config
from ember.dtypes import DType
from ember.errors import (
    BadAttributeError,
    DataError,
    DeviceError,
    EmberError,
    InternalError,
    InterpreterError,
    ParseError,
    PassError,
    ResourceError,
    ScriptError,
    ScriptNameError,
    ScriptSyntaxError,
    ScriptTypeError,
    ShapeError,
    UnsupportedOpError,
    VerificationError,
)
from ember.explain import explain
from ember.export import export, load
from ember.frontends.script import Tensor
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

# Element types by their short names, for annotations: `x: ember.Tensor[ember.f32, (4, 8)]`.
f32, f64, i32, i64 = DType.f32, DType.f64, DType.i32, DType.i64

__version__ = "0.1.0"

__all__ = [
    "BadAttributeError",
    "Builder",
    "Config",
    "DType",
    "DataError",
    "DeviceError",
    "EmberError",
    "Graph",
    "InternalError",
    "InterpreterError",
    "ParseError",
    "PassError",
    "ResourceError",
    "ScriptError",
    "ScriptNameError",
    "ScriptSyntaxError",
    "ScriptTypeError",
    "ShapeError",
    "Target",
    "Tensor",
    "TensorType",
    "UnsupportedOpError",
    "VerificationError",
    "compile",
    "explain",
    "export",
    "f32",
    "f64",
    "i32",
    "i64",
    "interpret",
    "load",
    "parse_graph",
    "print_graph",
    "script",
    "verify_graph",
]


def __getattr__(name: str):
    # `ember.torch` and `ember.onnx` import their (optional, heavy) frameworks on first use.
    if name in ("torch", "onnx"):
        import importlib

        return importlib.import_module(f"ember.{name}")
    raise AttributeError(f"module 'ember' has no attribute '{name}'")
