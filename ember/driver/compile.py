"""The driver's interface to the API layer: a graph in, something that runs it out.

The wrappers in `ember.api` (a compiled nn.Module, an ONNX backend rep, the torch.compile
backend) call this; the driver knows none of them and no frontend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.config import Config
from ember.graph.interp import interpret
from ember.graph.ir import Graph


def executor_for(graph: Graph, config: Config) -> Callable[..., Any]:
    """A function running `graph` on arrays: the compiled `Executable` (config.executor ==
    "cpu"), or the reference interpreter."""
    if config.executor == "cpu":
        from ember.driver.pipeline import compile_graph

        return compile_graph(graph, config)
    return lambda *arrays: interpret(graph, list(arrays))
