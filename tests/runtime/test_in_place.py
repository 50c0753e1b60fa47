"""Outputs computed in an input's memory (`Graph.aliases`, `-> (f32[4,3] in %cache)`): a
scatter into a cache writes its updates only, and every way of running the code still
gives the graph's values (a copy first when the output is not the input's memory)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.driver.pipeline import compile_graph, lower_to_program
from ember.errors import ShapeError, UnsupportedOpError, VerificationError
from ember.graph.text import parse_graph, print_graph
from ember.graph.verify import verify_graph
from ember.loops.text import parse_program, print_kernel, print_program

CPU = ember.Config(executor="cpu", disk_cache=False)
TEXT = """graph @cache(%cache: f32[4,3], %at: i64[1,3], %rows: f32[1,3]) -> (f32[4,3] in %cache) {
  %0 = graph.scatter_elements %cache, %at, %rows : f32[4,3]
  return %0
}
"""


def _inputs():
    cache = np.arange(12, dtype=np.float32).reshape(4, 3)
    return cache, np.full((1, 3), 2, np.int64), np.full((1, 3), -1, np.float32)


def _expected():
    cache = _inputs()[0]
    cache[2] = -1
    return cache


def test_the_text_names_the_input_and_round_trips() -> None:
    graph = parse_graph(TEXT)
    assert graph.aliases == {0: 0}
    assert print_graph(graph) == TEXT
    with pytest.raises(ember.ParseError, match="not an input"):
        parse_graph(TEXT.replace("in %cache", "in %nothing"))


def test_only_a_scatter_that_is_its_inputs_only_reader_may_alias() -> None:
    g = ember.Builder("g")
    x = g.input("x", "f32", (4,))
    g.output(g.neg(x))
    graph = g.build()
    graph.aliases = {0: 0}
    with pytest.raises(VerificationError, match="only right for a scatter"):
        verify_graph(graph)


def test_the_scatter_writes_the_updates_only() -> None:
    program, _ = lower_to_program(parse_graph(TEXT), CPU)
    text = print_program(program, constants="omit")
    assert "output %out: f32[4,3] in %cache" in text
    scatter = next(k for k in program.kernels if "scatter" in k.name)
    assert print_kernel(scatter).count("= %x0[") == 0  # no copy of the cache into itself
    assert parse_program(text).aliases == program.aliases


def test_every_call_gives_the_graph_values() -> None:
    run = compile_graph(parse_graph(TEXT), CPU)
    assert run.interface.aliases == ((0, 0),)
    cache, at, rows = _inputs()
    np.testing.assert_array_equal(run(cache, at, rows)[0], _expected())  # a copy first
    np.testing.assert_array_equal(cache, _inputs()[0])  # (the input is left as it was)
    out = np.zeros_like(cache)
    run(cache, at, rows, out=[out])
    np.testing.assert_array_equal(out, _expected())
    assert run(cache, at, rows, out=[cache])[0] is cache  # in place: the new row only
    np.testing.assert_array_equal(cache, _expected())
    memory = np.zeros(15, np.float32)
    overlapping = memory[:12].reshape(4, 3), memory[3:].reshape(4, 3)
    with pytest.raises(ShapeError, match="give that array itself"):
        run(overlapping[0], at, rows, out=[overlapping[1]])
    with pytest.raises(ShapeError, match="computes outputs in its inputs' memory"):
        run.run_addresses([cache.ctypes.data, at.ctypes.data, rows.ctypes.data])


def test_a_library_refuses_it(tmp_path) -> None:
    with pytest.raises(UnsupportedOpError, match="in its inputs' memory"):
        ember.export(parse_graph(TEXT), None, tmp_path / "lib")
