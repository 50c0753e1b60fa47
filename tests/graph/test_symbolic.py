"""Symbolic sizes (ember/graph/symbolic.py, ember/graph/bind.py): the algebra's normal form,
the text form, shape inference on symbols, binding a call's shapes, and compiled code per
binding (ember/driver/compile.py's SizeSpecialized)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember import Builder, DType, interpret, parse_graph, print_graph, verify_graph
from ember.errors import ParseError, ShapeError
from ember.graph.bind import bind_sizes, graph_symbols, specialize
from ember.graph.symbolic import (
    Dim,
    SymbolicShapeError,
    dim_max,
    dim_min,
    floor_div,
    modulo,
    parse_dim,
    size_bounds,
    size_hint,
    symbol,
)

B, S = symbol("b"), symbol("s")


# -- the algebra ---------------------------------------------------------------------------
def test_equal_expressions_have_one_form() -> None:
    assert B * 2 + S == S + B + B
    assert hash(B * S) == hash(S * B)
    assert (B + 1) * (B - 1) == B * B - 1
    assert B - B == 0 and isinstance(B - B, int)
    assert B * 0 == 0 and (B + 3) - B == 3
    assert B != S and B != 1 and B != B + 1


def test_division_is_exact_where_the_terms_divide() -> None:
    assert (B * 4 + 2) // 2 == B * 2 + 1
    assert (B * 4 + 3) // 2 == B * 2 + 1  # floor((4b + 3) / 2)
    assert (B * 8 * S) // (B * 8) == S
    assert (B * S) % S == 0 and (B * 6 + 4) % 3 == 1
    assert str(floor_div(S + 1, 2)) == "div(?s+1,2)"
    assert str(modulo(S, 4)) == "mod(?s,4)"


def test_comparisons_are_decided_from_the_bounds_or_raise() -> None:
    assert B >= 1 and B > 0 and B * 128 >= 128 and B + 1 > B
    assert not (B < 1) and not (B * 2 < B)
    assert dim_min(B, B + 1) == B and dim_max(B, B * 2) == B * 2
    assert str(dim_min(B, S)) == "min(?b,?s)"
    with pytest.raises(SymbolicShapeError, match=r"\?b >= 2"):
        B >= 2  # noqa: B015
    with pytest.raises(SymbolicShapeError, match="known only at call time"):
        range(B)


def test_hints_stand_for_sizes_in_cost_models_only() -> None:
    assert size_hint(B * 2 + 1) == 2 * 64 + 1 and size_hint(7) == 7


# A random expression over b and s, and the same computation on numbers.
_leaf = st.one_of(st.integers(-3, 5).map(lambda n: (n, lambda env, n=n: n)),
                  st.sampled_from(["b", "s"]).map(
                      lambda name: (symbol(name), lambda env, name=name: env[name])))


def _combine(children):
    def build(pair):
        (x, fx), (y, fy), op = pair
        if op == "+":
            return x + y, lambda env: fx(env) + fy(env)
        if op == "-":
            return x - y, lambda env: fx(env) - fy(env)
        if op == "*":
            return x * y, lambda env: fx(env) * fy(env)
        return floor_div(x, 3), lambda env: fx(env) // 3

    return st.tuples(children, children, st.sampled_from("+-*/")).map(build)


_expressions = st.recursive(_leaf, _combine, max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(_expressions, st.integers(1, 9), st.integers(1, 9))
def test_expressions_evaluate_print_and_parse_as_numbers_do(case, b, s) -> None:
    dim, on_numbers = case
    env = {"b": b, "s": s}
    value = dim.evaluate(env) if isinstance(dim, Dim) else dim
    assert value == on_numbers(env)
    parsed = parse_dim(str(dim))
    assert parsed == dim
    assert (parsed.evaluate(env) if isinstance(parsed, Dim) else parsed) == value


# -- graphs ----------------------------------------------------------------------------------
def _mlp() -> ember.Graph:
    g = Builder("mlp")
    x = g.input("x", DType.f32, (B, 16))
    w = g.constant(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
    h = g.relu(g.matmul(x, w))
    g.output(g.softmax(g.reshape(h, shape=(B * 2, 4)), axis=1))
    return g.build()


def test_symbolic_types_and_attributes_print_and_parse() -> None:
    graph = _mlp()
    text = print_graph(graph)
    assert "%x: f32[?b,16]" in text and "shape = [2*?b, 4]" in text
    assert ": f32[2*?b,4]" in text
    parsed = parse_graph(text)
    verify_graph(parsed)
    assert print_graph(parsed) == text


def test_a_declared_type_that_disagrees_with_the_symbols_is_a_parse_error() -> None:
    text = print_graph(_mlp()).replace(": f32[2*?b,4]", ": f32[?b,4]", 1)
    with pytest.raises(ParseError, match=r"declares result types \(f32\[\?b,4\]\) but they"
                                         r" infer as \(f32\[2\*\?b,4\]\)"):
        parse_graph(text)


def test_shape_inference_on_symbols() -> None:
    g = Builder("shapes")
    x = g.input("x", DType.f32, (B, S, 4))
    y = g.input("y", DType.f32, (1, S, 1))
    assert g.add(x, y).type.shape == (B, S, 4)  # ?b with 1 broadcasts
    assert g.concat(x, x, axis=1).type.shape == (B, S * 2, 4)
    assert g.transpose(x, perm=(2, 0, 1)).type.shape == (4, B, S)
    assert g.reduce_sum(x, axes=(1,), keepdims=False).type.shape == (B, 4)
    assert g.slice(x, starts=(0, 1, 0), ends=(B, S, 4), steps=(1, 1, 2)).type.shape == \
        (B, S - 1, 2)
    other = g.input("z", DType.f32, (S, S, 4))
    with pytest.raises(ShapeError, match="broadcast"):
        g.add(x, other)  # ?b against ?s: not decided, not broadcast


def test_binding_reads_the_symbols_from_the_inputs() -> None:
    g = Builder("two")
    x = g.input("x", DType.f32, (B, 4))
    y = g.input("y", DType.f32, (B * 2 + 1, S))
    g.output(g.reduce_sum(x, axes=(1,)), g.reduce_sum(y, axes=(0,)))
    graph = g.build()
    assert graph_symbols(graph) == {"b", "s"}
    assert bind_sizes(graph, [(3, 4), (7, 5)]) == {"b": 3, "s": 5}
    with pytest.raises(ShapeError, match=r"input 1 \(%y\): dim 0 is 8, expected 2\*\?b\+1 = 7"
                                          r" with \?b = 3 \(from input 0 \(%x\) dim 0\)"):
        bind_sizes(graph, [(3, 4), (8, 5)])
    with pytest.raises(ShapeError, match=r"input 0 \(%x\): dim 1 is 5, expected 4"):
        bind_sizes(graph, [(3, 5), (7, 5)])
    with pytest.raises(ShapeError, match="2 dims"):
        bind_sizes(graph, [(3,), (7, 5)])
    with pytest.raises(ShapeError, match="at least 1"):
        bind_sizes(graph, [(0, 4), (1, 5)])


def test_a_linear_size_binds_its_symbol() -> None:
    g = Builder("odd")
    x = g.input("x", DType.f32, (B * 2 + 1,))
    g.output(g.neg(x))
    graph = g.build()
    assert bind_sizes(graph, [(9,)]) == {"b": 4}
    with pytest.raises(ShapeError, match="no input's shape gives"):
        bind_sizes(graph, [(8,)])


def test_specialization_has_numbers_for_sizes_and_computes_the_same() -> None:
    graph = _mlp()
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    static = specialize(graph, {"b": 3})
    verify_graph(static)
    assert all(v.type.is_static for v in static.inputs) and static.outputs[0].shape == (6, 4)
    assert "?" not in print_graph(static)
    np.testing.assert_array_equal(interpret(graph, [x])[0], interpret(static, [x])[0])


def _padded() -> ember.Graph:
    """A graph whose lowering needs its size as a number (a pad along ?b): compiled per
    binding (tests/driver/test_every_size.py has the code of every size)."""
    g = Builder("padded")
    g.output(g.pad(g.input("x", DType.f32, (B, 16)), pads=[1, 0, 1, 0]))
    return g.build()


def test_compiled_code_per_binding_is_cached_and_bounded() -> None:
    graph = _padded()
    run = ember.compile(graph, config=ember.Config(executor="cpu", max_specializations=2)).run
    assert run.generic is None
    rng = np.random.default_rng(2)
    for n in (1, 3, 1, 5, 3):
        x = rng.standard_normal((n, 16)).astype(np.float32)
        np.testing.assert_allclose(run(x)[0], interpret(graph, [x])[0], rtol=1e-5, atol=1e-6)
    assert run.compilations == 4  # 1, 3, (1 again), 5 (evicts 3), 3 again (evicts 1)
    assert run.evictions == 2 and len(run.runners) == 2
    with pytest.raises(ShapeError, match=r"dim 1 is 15, expected 16"):
        run(np.zeros((2, 15), np.float32))


# -- bounds ----------------------------------------------------------------------------------
def test_bounds_decide_what_the_size_alone_does_not() -> None:
    with pytest.raises(SymbolicShapeError):
        S <= 512  # noqa: B015
    with size_bounds({"s": 512}):
        assert S <= 512 and min(S, 512) == S and dim_min(S, 600) == S
        assert floor_div(S, 2) <= 256 and modulo(S, 8) < 8
        with pytest.raises(SymbolicShapeError, match=r"\?s <= 100"):
            S <= 100  # noqa: B015
    assert B < 9223372036854775807  # every size fits an i64 index (x[i:sys.maxsize])


def _bounded() -> ember.Graph:
    g = Builder("bounded")
    g.graph.size_bounds["s"] = 512
    x = g.input("x", DType.f32, (B, S))
    table = g.constant(np.arange(512, dtype=np.float32).reshape(1, 512))
    with size_bounds(g.graph.size_bounds):  # as an importer converts: end = min(?s, 512)
        end = min(S, 512)
    g.output(g.add(x, g.slice(table, starts=(0, 0), ends=(1, end), steps=(1, 1))))
    return g.build()


def test_a_graph_declares_its_bounds_in_its_text_and_calls_are_checked() -> None:
    graph = _bounded()
    text = print_graph(graph)
    assert ") where ?s <= 512 {" in text
    parsed = parse_graph(text)
    assert parsed.size_bounds == {"s": 512} and print_graph(parsed) == text
    x = np.ones((2, 7), np.float32)
    np.testing.assert_array_equal(interpret(parsed, [x])[0], 1 + np.tile(np.arange(7), (2, 1)))
    with pytest.raises(ShapeError, match=r"the size \?s is 513 .*above its bound 512"):
        bind_sizes(parsed, [(2, 513)])
    with pytest.raises(ParseError, match="at least 1"):
        parse_graph(text.replace("<= 512", "<= 0"))
    assert "where" not in print_graph(specialize(graph, {"b": 2, "s": 7}))


def test_ahead_of_time_code_of_every_size_needs_bounds(tmp_path) -> None:
    with pytest.raises(ShapeError, match=r"largest value of each size, and \?b has none"):
        ember.export(_mlp(), None, tmp_path)
    static = specialize(_mlp(), {"b": 2})
    assert (ember.export(static, None, tmp_path / "static") / "model.h").exists()


def test_an_ahead_of_time_library_takes_the_sizes_at_each_run(tmp_path) -> None:
    """A graph with bounded sizes exports once; the library binds each run's sizes (its
    arena packed at the bounds), refuses sizes past them, and its C API takes them."""
    graph = _mlp()
    graph.size_bounds = {"b": 32}
    out = ember.export(graph, None, tmp_path)
    header = (out / "model.h").read_text()
    assert "model_run_sized(model_t *model, const int64_t *sizes" in header
    assert "#define MODEL_NUM_SIZES 1" in header and "?b <= 32" in header
    run = ember.load(out)
    rng = np.random.default_rng(3)
    for n in (1, 5, 32, 2):
        x = rng.standard_normal((n, 16)).astype(np.float32)
        np.testing.assert_allclose(run(x)[0], interpret(graph, [x])[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError, match=r"\?b is 33 .* above its bound 32"):
        run(np.zeros((33, 16), np.float32))
    with pytest.raises(ShapeError, match="dim 1 is 15, expected 16"):
        run(np.zeros((2, 15), np.float32))
