"""Graph passes: each a named function from graph to graph, registered by name.

Pipelines are plain lists of names (`["decompose", "canonicalize", "fold", "cse", "dce"]`)
run by `ember.driver.pass_manager.PassManager`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ember.errors import EmberError
from ember.graph.ir import Graph


@dataclass(frozen=True)
class GraphPass:
    name: str
    run: Callable[[Graph], Graph]
    summary: str

    def configured(self, **options) -> GraphPass:
        """This pass with keyword options bound (facts of the target that a layout pass
        shapes its output for, given by the driver)."""
        return GraphPass(self.name, functools.partial(self.run, **options), self.summary)


_PASSES: dict[str, GraphPass] = {}


def graph_pass(name: str, summary: str) -> Callable[[Callable[[Graph], Graph]], GraphPass]:
    """Decorator registering `fn(graph) -> graph` as the pass `name`."""

    def register(fn: Callable[[Graph], Graph]) -> GraphPass:
        assert name not in _PASSES, f"pass {name} registered twice"
        _PASSES[name] = GraphPass(name, fn, summary)
        return _PASSES[name]

    return register


def get_pass(name: str) -> GraphPass:
    _load()
    if name not in _PASSES:
        raise EmberError(f"unknown pass '{name}' (known: {', '.join(sorted(_PASSES))})")
    return _PASSES[name]


def all_passes() -> list[GraphPass]:
    _load()
    return sorted(_PASSES.values(), key=lambda p: p.name)


def _load() -> None:
    from ember.graph.passes import (  # noqa: F401  (registration)
        attention,
        canonicalize,
        checks,
        convs_2d,
        cse,
        dce,
        decompose,
        fold,
        fold_affine,
        fuse,
        group_convs,
        pack_convs,
        pack_matmuls,
        pad_convs,
        sink,
        winograd_convs,
    )


# The default graph pipeline: expand composites, simplify, fold (constants, then batch-norm
# into weights), share, clean up.
DEFAULT_PIPELINE = ["decompose", "canonicalize", "fold", "fold_affine", "cse", "dce"]
