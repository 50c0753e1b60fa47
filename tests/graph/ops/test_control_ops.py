"""`if` and `loop`: type inference with its error cases, and semantics against Python."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, DType, ShapeError, interpret, parse_graph, print_graph
from ember.graph.ir import Region, TensorType


def test_if_infers_branch_types_and_rejects_mismatches() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (3,))
    c = b.input("c", DType.bool, ())
    (r,) = b.if_(c, lambda t: [t.exp(x)], lambda e: [x])
    assert r.type == x.type
    with pytest.raises(ShapeError, match=r"graph.if: then region yields \(f32\[3\]\) but else"):
        b.if_(c, lambda t: [x], lambda e: [e.reduce_sum(x, axes=(0,))])
    with pytest.raises(ShapeError, match="condition must be a scalar"):
        b.if_(b.input("cv", DType.bool, (2,)), lambda t: [x], lambda e: [x])
    with pytest.raises(ShapeError, match="condition has dtype f32"):
        b.if_(b.input("cf", DType.f32, ()), lambda t: [x], lambda e: [x])
    with pytest.raises(ShapeError, match="the then region takes no arguments"):
        b.op("if", [c], {}, [Region([x.type]), Region()])


def test_if_semantics() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (3,))
    c = b.input("c", DType.bool, ())
    b.output(*b.if_(c, lambda t: [t.exp(x), t.neg(x)], lambda e: [e.neg(x), x]))
    graph = parse_graph(print_graph(b.build()))
    xv = np.array([0.0, 1.0, -2.0], np.float32)
    then = interpret(graph, [xv, np.array(True)])
    np.testing.assert_allclose(then[0], np.exp(xv), rtol=1e-6)
    np.testing.assert_array_equal(then[1], -xv)
    other = interpret(graph, [xv, np.array(False)])
    np.testing.assert_array_equal(other[0], -xv)
    np.testing.assert_array_equal(other[1], xv)


def test_loop_infers_carried_and_scan_types_and_rejects_bad_bodies() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (2,))
    n = b.input("n", DType.i64, ())
    t = b.constant(True)
    out = b.loop(n, t, [x], lambda lb, i, acc: [t, acc, lb.reduce_sum(acc, axes=(0,))],
                 num_scan=1, scan_length=5)
    assert [v.type for v in out] == [x.type, TensorType(DType.f32, (5,))]
    with pytest.raises(ShapeError, match="trip count must be a scalar"):
        b.loop(x, t, [], lambda lb, i: [t])
    with pytest.raises(ShapeError, match="body region yields 1 values, expected 1 condition"
                                         r" \+ 1 carried"):
        b.loop(n, t, [x], lambda lb, i, acc: [t])
    with pytest.raises(ShapeError, match="body yields carried values"):
        b.loop(n, t, [x], lambda lb, i, acc: [t, lb.reduce_sum(acc, axes=(0,))])
    with pytest.raises(ShapeError, match="yielded condition has dtype f32"):
        b.loop(n, t, [x], lambda lb, i, acc: [lb.reduce_sum(acc, axes=(0,)), acc])


def test_loop_semantics_against_python() -> None:
    """A while loop with two carried values and a scan output, like ONNX Loop."""
    b = Builder("g")
    x = b.input("x", DType.f32, ())
    n = b.input("n", DType.i64, ())
    t = b.constant(True)

    def body(lb, i, total, prod):
        total = lb.add(total, lb.cast(i, to=DType.f32))
        prod = lb.mul(prod, x)
        return [lb.lt(total, 100.0), total, prod, lb.add(total, prod)]

    b.output(*b.loop(n, t, [x, x], body, num_scan=1, scan_length=4))
    graph = parse_graph(print_graph(b.build()))

    def python(xv: float, trips: int):
        total, prod, scans = xv, xv, []
        for i in range(trips):
            total, prod = total + i, prod * xv
            scans.append(total + prod)
            if not total < 100:
                break
        return total, prod, scans

    got = interpret(graph, [np.float32(1.5), np.int64(4)])
    total, prod, scans = python(1.5, 4)
    np.testing.assert_allclose([got[0], got[1]], [total, prod], rtol=1e-6)
    np.testing.assert_allclose(got[2], scans, rtol=1e-6)
