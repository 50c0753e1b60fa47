"""A scripted function as the frontend keeps it: its checked, exit-transformed AST with
liveness, read once when it is decorated."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ember.frontends.script.checks import check_function
from ember.frontends.script.exits import transform_exits
from ember.frontends.script.library import is_known_callable
from ember.frontends.script.liveness import annotate_liveness
from ember.frontends.script.source import FunctionSource, read_source


class ScriptedFunction:
    """A function read, checked and exit-transformed at decoration: ready to specialize."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.name = fn.__name__
        self.signature = inspect.signature(fn)
        self.source: FunctionSource = read_source(fn)
        check_function(self.source, lambda obj: is_known_callable(obj) or is_scripted(obj))
        transform_exits(self.source)
        annotate_liveness(self.source.tree)


def is_scripted(obj: Any) -> bool:
    return isinstance(getattr(obj, "__ember_script__", None), ScriptedFunction)
