"""`ember.compile`: the one entry point for every frontend.

    fast = ember.compile(model)                 # an nn.Module
    out = fast(x)                               # same output structure as model(x)
    run = ember.compile("model.onnx")           # an ONNX model: run([x]) -> outputs
    fn = ember.compile(graph)                   # a graph: fn(*arrays) -> list of arrays

A graph runs as it is; a module is compiled per input signature (ember/api/torch_module.py);
an ONNX model per input signature and shape-deciding input values (ember/api/onnx_backend.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from ember.config import Config
from ember.driver.compile import executor_for
from ember.driver.pipeline import resolve
from ember.errors import EmberError
from ember.graph.ir import Graph


def compile(obj: Any, example_inputs: Any = None, *, config: Config | None = None,
            strict: bool = False, tune: bool | None = None, dynamic: Any = None) -> Any:
    """Compile a torch.nn.Module, an ONNX model (ModelProto, path or bytes) or a Graph.
    `tune=True` searches matmul schedules on this machine (see Config.tune). `dynamic`
    (a module): the input sizes that may change from call to call, captured once as
    symbols: True for every dim, or per input `{"x": {0: "batch"}}`
    (ember/frontends/torch/export.py, `dynamic_shapes`)."""
    config = config or Config()
    if tune is not None:
        config = dataclasses.replace(config, tune=tune)
    config = resolve(config)  # the target, once: every stage and cache key sees it
    if dynamic is not None and not is_torch_module(obj):
        raise EmberError("dynamic= applies to a torch.nn.Module; a graph's sizes are"
                         " symbolic in its types (f32[?b,128])")
    if isinstance(obj, Graph):
        return CompiledGraph(obj, config)
    if is_torch_module(obj):
        from ember.api.torch_module import CompiledModule

        compiled = CompiledModule(obj, config, strict, dynamic)
        if example_inputs is not None:
            args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
            compiled.specialize(args, {})
        return compiled
    if is_onnx(obj):
        from ember.api.onnx_backend import EmberRep
        from ember.frontends.onnx.importer import load_model

        return EmberRep(load_model(obj), config=config)
    raise EmberError(f"cannot compile a {type(obj).__name__}: expected a torch.nn.Module,"
                     " an ONNX model or path, or an ember Graph")


def is_torch_module(obj: Any) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(obj, torch.nn.Module)


def is_onnx(obj: Any) -> bool:
    if isinstance(obj, (str, os.PathLike)):
        return str(obj).endswith(".onnx")
    if isinstance(obj, (bytes, bytearray)):
        return True
    return type(obj).__name__ == "ModelProto"


class CompiledGraph:
    """A graph as a function of NumPy arrays (inputs checked against the graph's types)."""

    def __init__(self, graph: Graph, config: Config | None = None):
        self.graph = graph
        self.run = executor_for(graph, config or Config())

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        return self.run(*arrays)
