"""Helpers shared by the op tests: the result types of one op, and one op run through the
text round trip and the interpreter."""

from __future__ import annotations

import numpy as np

from ember import Builder, interpret, parse_graph, print_graph
from ember.dtypes import from_numpy


def result_types(op: str, *types, **attrs) -> list[str]:
    """The printed result types of `op` on inputs of the given (dtype, shape) types."""
    b = Builder()
    out = getattr(b, op)(*(b.input(f"x{i}", d, s) for i, (d, s) in enumerate(types)), **attrs)
    return [str(v.type) for v in (out if isinstance(out, tuple) else (out,))]


def run(op: str, *inputs: np.ndarray, **attrs) -> list[np.ndarray]:
    """Build op(*inputs), check the text round trip, and interpret it on the inputs."""
    b = Builder("t")
    args = [b.input(f"x{i}", from_numpy(a.dtype), a.shape) for i, a in enumerate(inputs)]
    out = getattr(b, op)(*args, **attrs)
    b.output(*(out if isinstance(out, tuple) else (out,)))
    graph = b.build()
    text = print_graph(graph)
    assert print_graph(parse_graph(text)) == text
    return interpret(graph, list(inputs))
