"""The driver's interface to the API layer: a graph in, something that runs it out.

The wrappers in `ember.api` (a compiled nn.Module, an ONNX backend rep, the torch.compile
backend) call this; the driver knows none of them and no frontend.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.config import Config
from ember.errors import EmberError, ShapeError
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
    SymbolicShapeError; `why_specialized` keeps the reason), the sizes it names are fixed
    per call (`fixed`) and the rest stay symbolic: a nested SizeSpecialized per value of the
    fixed ones, which tries code of every other size in turn. When the error names no
    size, or every one, the graph is specialized (every size a number) and made into a
    runner by `make`. Either way once per binding, keeping the `limit` most recent;
    `compilations` and `evictions` count them (nested ones included), and a call with
    shapes seen before costs one lookup.

    Code of every size makes its choices at one hint, which a size far from it pays for
    (a 5-row MLP ran 1.9x its own code's time). Calls that go through `run` are timed,
    and a size whose calls have spent as long in the code of every size as that code took
    to compile gets code of its own (`hot`, made by `make`; `hot_compilations`): like a
    JIT's tiering, the compile then costs at most what the size has run already. Only for
    graphs of at most HOT_CONSTANT_BYTES of constants (each such code holds its own packed
    weights), and at most HOT_SIZES sizes."""

    def __init__(self, graph: Graph, make: Callable[[Graph], Any], limit: int,
                 make_generic: Callable[[Graph], Any] | None = None):
        self.graph = graph
        self.symbols = sorted(graph_symbols(graph))
        self.make = make
        self.make_generic = make_generic
        self.limit = limit
        self.runners: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.fixed = tuple(self.symbols)  # the sizes a runner is made for: their values
        self._made = 0  # runners made here, and what dropped nested ones had made
        self._evicted = 0
        self.generic: Any = None
        self.why_specialized = "no code for every size was asked for"
        self.hot: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.hot_compilations = 0
        self._budget: float | None = None  # the seconds a size runs before it is hot
        self._spent: dict[tuple[int, ...], float] = {}
        if make_generic is not None:
            try:
                start = time.perf_counter()
                self.generic = make_generic(graph)
                self._made = 1
                self.why_specialized = ""
                if sum(a.nbytes for a in graph.constants.values()) <= HOT_CONSTANT_BYTES:
                    self._budget = _compile_seconds(self.generic,
                                                    time.perf_counter() - start)
            except SymbolicShapeError as e:
                self.why_specialized = str(e)
                needed = sorted(e.symbols & set(self.symbols))
                if needed and len(needed) < len(self.symbols):
                    self.fixed = tuple(needed)
        # shapes -> (the fixed sizes' values, the env): what a call binds, once per shapes
        self._bound: dict[tuple, tuple[tuple[int, ...], dict[str, int]]] = {}

    @property
    def compilations(self) -> int:
        return self._made + sum(r.compilations for r in self.runners.values()
                                if isinstance(r, SizeSpecialized))

    @property
    def evictions(self) -> int:
        return self._evicted + sum(r.evictions for r in self.runners.values()
                                   if isinstance(r, SizeSpecialized))

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

    def run(self, shapes: Sequence[Sequence[int]], call: Callable[[Any], Any]) -> Any:
        """`call(runner)` with the runner for inputs of these shapes, timed where it is the
        code of every size: what makes a size hot. The shapes are bound once."""
        if self.generic is None:
            entry = self._entry(shapes)
            return entry.run(shapes, call) if isinstance(entry, SizeSpecialized) else \
                call(entry)
        if self._budget is None and not self.hot:
            return call(self.generic)
        key, env = self._bind(shapes)
        hot = self.hot.get(key)
        if hot is not None:
            return call(hot)
        if self._budget is None:
            return call(self.generic)
        start = time.perf_counter()
        result = call(self.generic)
        spent = self._spent.get(key, 0.0) + time.perf_counter() - start
        self._spent[key] = spent
        if spent >= self._budget:
            self._specialize_hot(key, env)
        return result

    def _specialize_hot(self, key: tuple[int, ...], env: dict[str, int]) -> None:
        del self._spent[key]
        try:
            self.hot[key] = self.make(specialize(self.graph, env))
        except EmberError:  # (the code of every size serves it, as it did)
            self._budget = None
            return
        self.hot_compilations += 1
        if len(self.hot) > HOT_SIZES:
            self.hot.popitem(last=False)
        if len(self._spent) > 16 * self.limit:  # (a ragged stream of sizes)
            self._spent.clear()

    def runner(self, shapes: Sequence[Sequence[int]]) -> Any:
        """The runner for inputs of these shapes, made at the first call that binds them."""
        if self.generic is not None:
            if self.hot:
                hot = self.hot.get(self._bind(shapes)[0])
                if hot is not None:
                    return hot
            return self.generic  # (which checks the shapes itself, as it binds them)
        entry = self._entry(shapes)
        return entry.runner(shapes) if isinstance(entry, SizeSpecialized) else entry

    def _entry(self, shapes: Sequence[Sequence[int]]) -> Any:
        """The runner, or the nested SizeSpecialized, for the fixed sizes' values of these
        shapes: made at the first call that has them, the `limit` most recent kept."""
        key, env = self._bind(shapes)
        entry = self.runners.get(key)
        if entry is not None:
            self.runners.move_to_end(key)
            return entry
        entry = self._runner_for(env)
        self.runners[key] = entry
        if len(self.runners) > self.limit:
            dropped = self.runners.popitem(last=False)[1]
            if isinstance(dropped, SizeSpecialized):
                self._made += dropped.compilations
                self._evicted += dropped.evictions
            self._evicted += 1
        return entry

    def _runner_for(self, env: dict[str, int]) -> Any:
        if len(self.fixed) == len(self.symbols):
            self._made += 1
            return self.make(specialize(self.graph, env))
        partly = specialize(self.graph, {s: env[s] for s in self.fixed})
        return SizeSpecialized(partly, self.make, self.limit, self.make_generic)

    def _bind(self, shapes: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], dict[str, int]]:
        shapes = tuple(tuple(s) for s in shapes)
        bound = self._bound.get(shapes)
        if bound is None:
            env = bind_sizes(self.graph, shapes)
            bound = tuple(env[s] for s in self.fixed), env
            if len(self._bound) >= 16 * self.limit:  # a bound on what a ragged stream keeps
                self._bound.clear()
            self._bound[shapes] = bound
        return bound

    def __call__(self, *arrays: Any, **kwargs: Any) -> Any:
        arrays = tuple(np.asarray(a) for a in arrays)
        return self.run([a.shape for a in arrays], lambda runner: runner(*arrays, **kwargs))


def _compile_seconds(runner: Any, measured: float) -> float:
    """What compiling `runner`'s code took: its build's stage timings (kept in the caches,
    so a warm start does not make every size hot at once), else `measured`."""
    timings = getattr(getattr(runner, "run", runner), "notes", {}).get("timings")
    return max(measured, sum(timings.values())) if timings else measured


# Hot sizes (SizeSpecialized.run): the most graph constants a graph may hold for its hot
# sizes to get code of their own (each copy packs its weights anew), and the most sizes.
HOT_CONSTANT_BYTES = 64 << 20
HOT_SIZES = 4
