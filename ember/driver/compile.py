"""The driver's interface to the API layer: a graph in, something that runs it out.

The wrappers in `ember.api` (a compiled nn.Module, an ONNX backend rep, the torch.compile
backend) call this; the driver knows none of them and no frontend.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.config import Config
from ember.errors import ShapeError
from ember.graph.bind import bind_sizes, graph_symbols, is_symbolic, specialize
from ember.graph.interp import interpret
from ember.graph.ir import Graph
from ember.graph.symbolic import SymbolicShapeError


def executor_for(graph: Graph, config: Config) -> Callable[..., Any]:
    """A function running `graph` on arrays: the compiled `Executable` (config.executor ==
    "cpu"), or the reference interpreter. A graph with symbolic sizes runs through
    `SizeSpecialized`: compiled once for every size where it can be, else code (or an
    interpreter) per binding of its sizes."""
    if is_symbolic(graph):
        generic = None
        if config.executor == "cpu":
            from ember.driver.pipeline import compile_graph

            generic = lambda g: compile_graph(g, config)  # noqa: E731
        return SizeSpecialized(graph, lambda g: executor_for(g, config),
                               config.max_specializations, generic)
    if config.executor == "cpu":
        from ember.driver.pipeline import compile_graph

        return compile_graph(graph, config)
    return lambda *arrays: interpret(graph, list(arrays))


class SizeSpecialized:
    """A graph with symbolic sizes, run by binding them to each call's shapes.

    First choice: one runner for every size, `make_generic(graph)` (code whose kernels take
    the sizes as arguments), made here. Where a stage needs a size as a number (a schedule
    or a lowering that is not written for sizes known at call time raises
    SymbolicShapeError; `why_specialized` keeps the reason), the graph is specialized
    (every size a number) and made into a runner by `make` once per binding, keeping the
    `limit` most recent. `compilations` and `evictions` count them; a call with shapes
    seen before costs one lookup."""

    def __init__(self, graph: Graph, make: Callable[[Graph], Any], limit: int,
                 make_generic: Callable[[Graph], Any] | None = None):
        self.graph = graph
        self.symbols = sorted(graph_symbols(graph))
        self.make = make
        self.limit = limit
        self.runners: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.compilations = 0
        self.evictions = 0
        self.generic: Any = None
        self.why_specialized = "no code for every size was asked for"
        if make_generic is not None:
            try:
                self.generic = make_generic(graph)
                self.compilations = 1
                self.why_specialized = ""
            except SymbolicShapeError as e:
                self.why_specialized = str(e)
        # shapes -> (the symbols' values, their env): what a call binds, once per shapes
        self._bound: dict[tuple, tuple[tuple[int, ...], dict[str, int]]] = {}

    def binding(self, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        """The symbols' values for inputs of these shapes (a ShapeError when they do not
        fit the graph's types)."""
        return self._bind(shapes)[1]

    def accepts(self, shapes: Sequence[Sequence[int]]) -> bool:
        try:
            self._bind(shapes)
        except ShapeError:
            return False
        return True

    def runner(self, shapes: Sequence[Sequence[int]]) -> Any:
        """The runner for inputs of these shapes, made at the first call that binds them."""
        if self.generic is not None:
            return self.generic  # (which checks the shapes itself, as it binds them)
        key, env = self._bind(shapes)
        runner = self.runners.get(key)
        if runner is not None:
            self.runners.move_to_end(key)
            return runner
        runner = self.make(specialize(self.graph, env))
        self.compilations += 1
        self.runners[key] = runner
        if len(self.runners) > self.limit:
            self.runners.popitem(last=False)
            self.evictions += 1
        return runner

    def _bind(self, shapes: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], dict[str, int]]:
        shapes = tuple(tuple(s) for s in shapes)
        bound = self._bound.get(shapes)
        if bound is None:
            env = bind_sizes(self.graph, shapes)
            bound = tuple(env[s] for s in self.symbols), env
            if len(self._bound) >= 16 * self.limit:  # a bound on what a ragged stream keeps
                self._bound.clear()
            self._bound[shapes] = bound
        return bound

    def __call__(self, *arrays: Any, **kwargs: Any) -> Any:
        arrays = tuple(np.asarray(a) for a in arrays)
        return self.runner([a.shape for a in arrays])(*arrays, **kwargs)
