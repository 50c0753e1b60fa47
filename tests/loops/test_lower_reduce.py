"""Lowering of reductions and scans: reduce_*, argmax/argmin, cumsum/cumprod, topk."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, DType, interpret
from ember.loops.interp import run_program
from ember.loops.lower import lower_graph
from ember.target import Target
from tests.loops.lowering_check import check_lowering

HOST = Target.host()

RNG = np.random.default_rng(5)
REDUCTIONS = ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min")


def data(dtype: DType, shape, low=-3, high=4) -> np.ndarray:
    if dtype.is_float:
        return RNG.uniform(low, high, shape).astype(dtype.np)
    return RNG.integers(low, high, shape).astype(dtype.np)


def unary_graph(name: str, dtype: DType, shape, **attrs):
    b = Builder("g")
    x = b.input("x", dtype, shape)
    results = getattr(b, name)(x, **attrs)
    b.output(*(results if isinstance(results, (list, tuple)) else [results]))
    return b.build()


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("axes,keepdims", [((1,), False), ((0, 2), True), ((-1, 0, 1), False),
                                           ((), False), ((1,), True)])
def test_reductions_f32(name, axes, keepdims) -> None:
    x = data(DType.f32, (3, 4, 5), 0.5, 1.5)
    check_lowering(unary_graph(name, DType.f32, (3, 4, 5), axes=axes, keepdims=keepdims), [x],
                   rtol=1e-5)


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("dtype", [DType.i8, DType.u16, DType.i64])
def test_reductions_integers_wrap(name, dtype) -> None:
    x = data(dtype, (4, 6), 0 if dtype is DType.u16 else -100, 100)
    check_lowering(unary_graph(name, dtype, (4, 6), axes=(1,)), [x])


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
def test_reductions_half_precision(name, dtype) -> None:
    x = data(dtype, (2, 40), 0.9, 1.1)
    check_lowering(unary_graph(name, dtype, (2, 40), axes=(1,), keepdims=True), [x], rtol=1e-2)


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("dtype", [DType.f32, DType.i32])
def test_reductions_over_an_empty_axis_give_the_identity(name, dtype) -> None:
    check_lowering(unary_graph(name, dtype, (3, 0, 2), axes=(1,)), [np.zeros((3, 0, 2),
                                                                             dtype.np)])


@pytest.mark.parametrize("name,attrs", [
    ("reduce_max", {"axes": (1,)}), ("reduce_min", {"axes": (1,)}),
    ("reduce_sum", {"axes": (1,)}), ("reduce_sum", {"axes": ()}),
    ("cumsum", {"axis": 1}), ("cumsum", {"axis": 1, "exclusive": True})])
def test_nans_propagate_and_zeros_keep_their_sign(name, attrs) -> None:
    x = np.array([[1.0, np.nan, 3.0], [-0.0, -0.0, -0.0], [np.inf, 2.0, np.nan]], np.float32)
    graph = unary_graph(name, DType.f32, (3, 3), **attrs)
    check_lowering(graph, [x])
    got = run_program(lower_graph(graph, target=HOST), [x])[0]
    assert np.array_equal(np.signbit(got), np.signbit(interpret(graph, [x])[0]))


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("keepdims", [False, True])
def test_arg_extremes_with_ties(name, last, keepdims) -> None:
    x = RNG.integers(0, 3, (3, 5, 2)).astype(np.int32)  # many ties
    for axis in (1, -1):
        graph = unary_graph(name, DType.i32, (3, 5, 2), axis=axis, keepdims=keepdims,
                            select_last_index=last)
        check_lowering(graph, [x])


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("dtype", [DType.f32, DType.f16])
def test_arg_extremes_nan_wins(name, last, dtype) -> None:
    x = np.array([[1, np.nan, 3, np.nan], [2, 2, -1, -1], [np.nan, 5, 5, 0],
                  [-np.inf, np.inf, 1, 1]], dtype.np)
    check_lowering(unary_graph(name, dtype, (4, 4), axis=1, select_last_index=last), [x])


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumulative(name, exclusive, reverse) -> None:
    x = data(DType.f32, (3, 4, 2), 0.5, 1.5)
    for axis in (0, 1, -1):
        graph = unary_graph(name, DType.f32, (3, 4, 2), axis=axis, exclusive=exclusive,
                            reverse=reverse)
        check_lowering(graph, [x], rtol=1e-5)


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", [DType.i8, DType.f16, DType.i64])
def test_cumulative_dtypes(name, dtype) -> None:
    x = data(dtype, (2, 12), -5 if dtype.is_int else 0.7, 6 if dtype.is_int else 1.3)
    check_lowering(unary_graph(name, dtype, (2, 12), axis=1, reverse=True), [x], rtol=1e-3)


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_cumulative_over_an_empty_axis(name) -> None:
    check_lowering(unary_graph(name, DType.f32, (2, 0), axis=1), [np.zeros((2, 0), np.float32)])


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k,axis", [(3, -1), (0, 1), (6, 1), (2, 0)])
def test_topk_with_ties(largest, k, axis) -> None:
    x = RNG.integers(0, 4, (3, 6)).astype(np.int64)
    graph = unary_graph("topk", DType.i64, (3, 6), k=k, axis=axis, largest=largest)
    check_lowering(graph, [x])


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16])
def test_topk_floats_with_nans(largest, dtype) -> None:
    x = np.array([[1, np.nan, 3, np.nan, -2, 3], [0.5, -0.0, 0.0, 7, -np.inf, np.inf]],
                 dtype.np)
    graph = unary_graph("topk", dtype, (2, 6), k=4, axis=1, largest=largest, sorted=False)
    check_lowering(graph, [x])


# -- long sums: blocks added in f64 (reduce.accumulate) -------------------------------------

def _compiled(graph):
    import ember

    return ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))


def test_a_long_sum_is_as_accurate_as_eagers_cascade() -> None:
    """50M floats: blocks of CASCADE_BLOCK summed in f32, the blocks in f64. One f32
    accumulator was off by 5e-7 relative here (eager, a cascade: 1.5e-8)."""
    n = 50_000_000
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    (got,) = _compiled(unary_graph("reduce_sum", DType.f32, (n,), axes=[0]))(x)
    exact = x.astype(np.float64).sum()
    assert abs(float(got) - exact) <= 1e-7 * exact


def test_a_mean_over_a_billion_broadcast_elements_does_not_stall() -> None:
    """A sum past 2^24 in one f32 accumulator stops growing (adding 1 to 2^24 rounds back):
    a mean over 10^9 broadcast ones gave 0.97; blocks in f64 give 1 within f32's rounding."""
    b = Builder("mean")
    v = b.input("v", "f32", (100_000,))
    b.output(b.reduce_mean(b.broadcast(v, shape=[10_000, 100_000]), axes=[0, 1]))
    (got,) = _compiled(b.build())(np.ones(100_000, np.float32))
    assert abs(float(got) - 1.0) <= 1e-7


@pytest.mark.parametrize("shape, axes", [
    ((300, 400, 5), [0, 1, 2]),  # blocks of whole trailing axes (400 x 5 = 2000 > a block)
    ((70, 3000), [1]),  # a row longer than a block, under the threshold: one accumulator
    ((3, 70_001), [1]),  # chunks of a long last axis, a short last chunk
    ((70, 30, 40), [0, 2]),  # reduced axes around a kept one
])
def test_long_sums_in_blocks_match_f64(shape, axes) -> None:
    x = RNG.uniform(-1, 2, shape).astype(np.float32)
    for keepdims in (False, True):
        graph = unary_graph("reduce_sum", DType.f32, shape, axes=axes, keepdims=keepdims)
        (got,) = _compiled(graph)(x)
        want = x.astype(np.float64).sum(axis=tuple(axes), keepdims=keepdims)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-3)


def test_a_fused_long_sum_adds_its_blocks_in_f64() -> None:
    """sum(x * x) fuses into one kernel; its long sum takes blocks too."""
    import ember
    from ember.driver.pipeline import lower_to_program

    n = 1 << 20
    b = Builder("sumsq")
    x = b.input("x", "f32", (n,))
    b.output(b.reduce_sum(b.mul(x, x), axes=[0]))
    graph = b.build()
    program, _ = lower_to_program(graph, ember.Config(executor="cpu"))
    (kernel,) = program.kernels
    assert any(buf.dtype is DType.f64 for buf in kernel.locals)
    data = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    (got,) = _compiled(graph)(data)
    exact = (data.astype(np.float64) ** 2).sum()
    assert abs(float(got) - exact) <= 1e-7 * exact
