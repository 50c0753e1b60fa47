"""The check ops (ops/checks.py): type inference, semantics in the reference, text round
trip. How compiled code reports them: tests/runtime/test_checks.py."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, DType, InterpreterError, ShapeError, interpret, parse_graph, print_graph
from ember.graph.symbolic import symbol


def checked(shape, dtype, build):
    b = Builder("t")
    x = b.input("x", dtype, shape)
    b.output(build(b, x))
    graph = b.build()
    text = print_graph(graph)
    assert print_graph(parse_graph(text)) == text
    return graph


def test_check_index_returns_its_indices_or_fails_outside_the_axis():
    graph = checked((2, 3), DType.i64, lambda b, x: b.check_index(x, dims=[5]))
    good = np.array([[0, 4, -5], [-1, 2, 3]])
    np.testing.assert_array_equal(interpret(graph, [good])[0], good)
    for bad in (5, -6):
        with pytest.raises(InterpreterError, match="graph.check_index.*out of range"):
            interpret(graph, [np.where(good == 4, bad, good)])


def test_check_index_nd_checks_each_position_against_its_axis():
    graph = checked((2, 2), DType.i32, lambda b, x: b.check_index(x, dims=[3, 7], nd=True))
    np.testing.assert_array_equal(interpret(graph, [np.array([[2, 6], [-3, -7]], np.int32)])[0],
                                  [[2, 6], [-3, -7]])
    with pytest.raises(InterpreterError, match="out of range"):
        interpret(graph, [np.array([[3, 0], [0, 0]], np.int32)])


def test_check_index_takes_sizes_known_at_call_time():
    n = symbol("n")
    graph = checked((4,), DType.i64, lambda b, x: b.check_index(x, dims=[n]))
    assert "dims = [?n]" in print_graph(graph)


def test_check_index_types():
    with pytest.raises(ShapeError, match="indices has dtype f32"):
        checked((3,), DType.f32, lambda b, x: b.check_index(x, dims=[4]))
    with pytest.raises(ShapeError, match="address one axis"):
        checked((3,), DType.i64, lambda b, x: b.check_index(x, dims=[4, 5]))
    with pytest.raises(ShapeError, match="address one axis"):  # nd: a dim per position
        checked((3, 2), DType.i64, lambda b, x: b.check_index(x, dims=[4], nd=True))


def test_check_nonzero_returns_its_divisor_or_fails_on_zero():
    graph = checked((3,), DType.i32, lambda b, x: b.check_nonzero(x))
    np.testing.assert_array_equal(interpret(graph, [np.array([1, -2, 3], np.int32)])[0],
                                  [1, -2, 3])
    with pytest.raises(InterpreterError, match="integer division by zero"):
        interpret(graph, [np.array([1, 0, 3], np.int32)])
    with pytest.raises(ShapeError, match="divisor has dtype f32"):
        checked((3,), DType.f32, lambda b, x: b.check_nonzero(x))
