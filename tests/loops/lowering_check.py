"""Shared check for lowering tests: a graph lowered to loops computes what the graph
interpreter computes (through the loop interpreter, and, once present, compiled code)."""

from __future__ import annotations

import numpy as np

from ember import interpret
from ember.graph.ir import Graph
from ember.loops.interp import run_program
from ember.loops.lower import lower_graph
from ember.loops.text import parse_program, print_program
from ember.loops.verify import verify_program
from ember.target import Target

HOST = Target.host()


def check_lowering(graph: Graph, inputs, rtol: float = 1e-6, atol: float = 1e-6) -> None:
    program = verify_program(lower_graph(graph, target=HOST))
    text = print_program(program)
    assert print_program(parse_program(text)) == text
    want = interpret(graph, inputs)
    got = run_program(program, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind in "fc" or w.dtype.name == "bfloat16":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                       atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
