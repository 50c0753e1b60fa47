"""Lowering of elementwise and data-movement ops, and whole programs with control flow."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, DType
from ember.graph.ops.elementwise import BINARY_OPS, UNARY_OPS
from tests.loops.lowering_check import check_lowering

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("name", sorted(set(UNARY_OPS) - {"not", "bitwise_not"}))
def test_unary(name: str) -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (2, 3))
    b.output(getattr(b, name)(x))
    data = RNG.uniform(0.1, 0.9, (2, 3)).astype(np.float32)
    check_lowering(b.build(), [data])


@pytest.mark.parametrize("name", sorted(set(BINARY_OPS) - {"and", "or", "xor", "shl", "shr",
                                                         "bitwise_and", "bitwise_or",
                                                         "bitwise_xor"}))
def test_binary_with_broadcasting(name: str) -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (2, 1, 3))
    y = b.input("y", DType.f32, (4, 1))
    b.output(getattr(b, name)(x, y))
    check_lowering(b.build(), [RNG.uniform(0.5, 2, (2, 1, 3)).astype(np.float32),
                               RNG.uniform(0.5, 2, (4, 1)).astype(np.float32)])


def test_integer_and_bool_ops() -> None:
    b = Builder("g")
    x = b.input("x", DType.i32, (5,))
    y = b.input("y", DType.i32, (5,))
    t = b.lt(x, y)
    b.output(b.div(x, y), b.mod(x, y), b.shl(x, b.constant(np.full(5, 2, np.int32))),
             getattr(b, "and")(t, b.ne(x, y)), b.where(t, x, y), b.bitwise_xor(x, y))
    check_lowering(b.build(), [np.array([7, -7, 7, -7, 0], np.int32),
                               np.array([2, 2, -2, -2, 3], np.int32)])


def test_movement_ops() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (2, 3, 4))
    t = b.transpose(x, perm=(2, 0, 1))
    r = b.reshape(t, shape=(4, 6))
    s = b.slice(x, starts=(1, 2, 3), ends=(-1, -1, 0), steps=(-1, -2, -2))
    c = b.concat(x, x, b.slice(x, starts=(0, 0, 0), ends=(2, 1, 4), steps=(1, 1, 1)), axis=1)
    e = b.broadcast(b.reshape(x, shape=(2, 1, 12)), shape=(3, 2, 5, 12))
    b.output(r, s, c, e, b.iota(shape=(3, 4), axis=1, dtype=DType.f32))
    check_lowering(b.build(), [RNG.standard_normal((2, 3, 4)).astype(np.float32)])


def test_casts_and_half_precision() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (6,))
    h = b.cast(x, to=DType.f16)
    b.output(b.cast(x, to=DType.i8), b.cast(x, to=DType.bool), b.exp(h),
             b.cast(b.cast(x, to=DType.bf16), to=DType.f32))
    check_lowering(b.build(), [np.array([0.0, 1.7, -2.6, 3.0, 0.3, -0.0], np.float32)])


def test_outputs_that_are_inputs_constants_or_repeated() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (3,))
    w = b.constant(np.arange(20, dtype=np.float32), name="w")
    y = b.neg(x)
    b.output(y, x, w, y)
    check_lowering(b.build(), [np.array([1, 2, 3], np.float32)])


def test_if_and_loop_programs() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (3,))
    c = b.input("c", DType.bool, ())
    (r,) = b.if_(c, lambda t: [t.exp(x)], lambda e: [e.neg(x)])
    n = b.constant(np.int64(4))
    true = b.constant(True)

    def body(lb, i, acc, other):
        nxt = lb.add(acc, lb.cast(i, to=DType.f32))
        return [true, other, nxt, lb.mul(nxt, 2.0), acc]  # swaps the carried values

    outs = b.loop(n, true, [r, x], body, num_scan=2, scan_length=4)
    b.output(r, *outs)
    graph = b.build()
    for cond in (True, False):
        check_lowering(graph, [np.array([1.0, -2.0, 0.5], np.float32), np.array(cond)])


def test_bitcast() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (4,))
    h = b.input("h", DType.f16, (2,))
    b.output(b.bitcast(x, to=DType.i32), b.bitcast(h, to=DType.i16))
    check_lowering(b.build(), [np.array([1.0, -2.5, 0.0, np.inf], np.float32),
                               np.array([1.5, -0.25], np.float16)])
