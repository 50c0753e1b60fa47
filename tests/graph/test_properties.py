"""Property tests over random well-typed graphs: the text form round-trips exactly, the
parsed graph computes the same values, and every graph pass preserves the values."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from ember import interpret, parse_graph, print_graph, verify_graph
from ember.driver.pass_manager import run_passes
from ember.graph.bind import bind_sizes, specialize
from ember.graph.passes import DEFAULT_PIPELINE, all_passes
from tests.graph.random_graphs import random_graphs

PROPERTY = settings(max_examples=250, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def assert_same(got, want, exact=True):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@PROPERTY
@given(random_graphs())
def test_print_parse_round_trip(case) -> None:
    graph, inputs = case
    text = print_graph(graph)
    parsed = parse_graph(text)
    assert print_graph(parsed) == text
    verify_graph(parsed)
    assert_same(interpret(parsed, inputs), interpret(graph, inputs))


def assert_passes_preserve_values(graph, inputs) -> None:
    """Each graph pass alone, then the default pipeline, computes the graph's values.
    Folding evaluates ops by the interpreter's own semantics, so the values match exactly
    (NaN positions and all)."""
    text = print_graph(graph)
    want = interpret(graph, inputs)
    for graph_pass in [*all_passes(), None]:
        names = [graph_pass.name] if graph_pass else DEFAULT_PIPELINE
        optimized = run_passes(parse_graph(text), names, verify_each=True)
        assert_same(interpret(optimized, inputs), want)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_graphs())
def test_passes_preserve_values(case) -> None:
    assert_passes_preserve_values(*case)


# -- symbolic sizes ------------------------------------------------------------------------
@PROPERTY
@given(random_graphs(symbolic=True))
def test_symbolic_graphs_round_trip_and_bind(case) -> None:
    """A graph whose inputs lead with the size ?n prints and parses back exactly, and
    computes what its specialization to the inputs' ?n computes."""
    graph, inputs = case
    text = print_graph(graph)
    parsed = parse_graph(text)
    assert print_graph(parsed) == text
    verify_graph(parsed)
    env = bind_sizes(graph, [a.shape for a in inputs])
    specialized = specialize(graph, env)
    verify_graph(specialized)
    assert specialized.inputs and all(v.type.is_static for v in specialized.inputs)
    assert_same(interpret(parsed, inputs), interpret(specialized, inputs))


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_graphs(symbolic=True))
def test_passes_preserve_values_on_symbolic_graphs(case) -> None:
    """Every graph pass runs on a graph of symbolic sizes, and the values it computes at
    the inputs' sizes are the unoptimized graph's."""
    assert_passes_preserve_values(*case)
