"""Lowering of pad and the data-dependent indexing ops: gather, gather_elements, gather_nd,
scatter_elements, scatter_nd, one_hot."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, DType
from ember.loops.interp import run_program
from ember.loops.lower import lower_graph
from ember.target import Target
from tests.loops.lowering_check import check_lowering

HOST = Target.host()

RNG = np.random.default_rng(7)
REDUCTIONS = ("none", "add", "mul", "max", "min")


def values(dtype: DType, shape) -> np.ndarray:
    if dtype.is_float:
        return RNG.uniform(-2, 2, shape).astype(dtype.np)
    return RNG.integers(-50, 50, shape).astype(dtype.np)


def graph_of(name: str, operands, **attrs):
    """A graph applying op `name` to inputs [(dtype, shape), ...]."""
    b = Builder("g")
    xs = [b.input(f"x{i}", dtype, shape) for i, (dtype, shape) in enumerate(operands)]
    b.output(getattr(b, name)(*xs, **attrs))
    return b.build()


# -- pad ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("dtype", [DType.f32, DType.i16, DType.f16])
def test_pad_modes(mode, dtype) -> None:
    x = values(dtype, (3, 4))
    for pads in ((1, 0, 2, 3), (0, 0, 0, 0), (2, 3, 0, 1)):
        check_lowering(graph_of("pad", [(dtype, (3, 4))], pads=pads, mode=mode, value=2.5), [x])


def test_pad_wrap_wider_than_the_axis_and_empty_axes() -> None:
    x = values(DType.f32, (2, 3))
    check_lowering(graph_of("pad", [(DType.f32, (2, 3))], pads=(3, 7, 1, 4), mode="wrap"), [x])
    e = np.zeros((0, 3), np.float32)
    check_lowering(graph_of("pad", [(DType.f32, (0, 3))], pads=(1, 0, 2, 1), value=-1.0), [e])


def test_pad_bool() -> None:
    x = np.array([[True, False], [False, True]])
    check_lowering(graph_of("pad", [(DType.bool, (2, 2))], pads=(1, 0, 0, 1), value=1.0), [x])


# -- gathers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", [DType.i32, DType.i64])
def test_gather(axis, index_dtype) -> None:
    data = values(DType.f32, (3, 4, 5))
    dim = data.shape[axis]
    indices = RNG.integers(-dim, dim, (2, 3)).astype(index_dtype.np)
    check_lowering(graph_of("gather", [(DType.f32, (3, 4, 5)), (index_dtype, (2, 3))],
                            axis=axis), [data, indices])


def test_gather_scalar_index_and_halves() -> None:
    data = values(DType.bf16, (4, 3))
    check_lowering(graph_of("gather", [(DType.bf16, (4, 3)), (DType.i64, ())], axis=0),
                   [data, np.array(-1, np.int64)])


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_elements(axis) -> None:
    data = values(DType.i32, (3, 4))
    indices = RNG.integers(-data.shape[axis], data.shape[axis], (2, 3)).astype(np.int64)
    check_lowering(graph_of("gather_elements", [(DType.i32, (3, 4)), (DType.i64, (2, 3))],
                            axis=axis), [data, indices])


@pytest.mark.parametrize("batch_dims,data_shape,indices", [
    (0, (3, 4, 2), [[0, 1], [-1, 3], [2, -4]]),            # slices of the last dim
    (0, (3, 4), [[[1], [2]], [[0], [-1]]]),                 # whole rows
    (0, (3, 4), [[2, 3], [0, 0]]),                          # scalars
    (1, (2, 3, 4), [[[1, 2]], [[2, -1]]]),                  # one batch dim
])
def test_gather_nd(batch_dims, data_shape, indices) -> None:
    data = values(DType.f32, data_shape)
    indices = np.array(indices, np.int32)
    check_lowering(graph_of("gather_nd", [(DType.f32, data_shape), (DType.i32, indices.shape)],
                            batch_dims=batch_dims), [data, indices])


# -- scatters ----------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [DType.f32, DType.i8, DType.f16])
def test_scatter_elements_with_repeated_indices(reduction, dtype) -> None:
    data = values(dtype, (4, 3))
    indices = np.array([[1, -1, 0], [1, 3, 0]], np.int64)  # repeats in columns 0 and 2
    updates = values(dtype, (2, 3))
    graph = graph_of("scatter_elements", [(dtype, (4, 3)), (DType.i64, (2, 3)),
                                          (dtype, (2, 3))], axis=0, reduction=reduction)
    check_lowering(graph, [data, indices, updates], rtol=1e-3)


def test_scatter_elements_along_the_last_axis() -> None:
    data = values(DType.f32, (2, 5))
    indices = np.array([[4, -5], [2, 2]], np.int32)
    updates = values(DType.f32, (2, 2))
    graph = graph_of("scatter_elements", [(DType.f32, (2, 5)), (DType.i32, (2, 2)),
                                          (DType.f32, (2, 2))], axis=-1, reduction="add")
    check_lowering(graph, [data, indices, updates])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [DType.f32, DType.i64, DType.bf16])
def test_scatter_nd_with_repeated_tuples(reduction, dtype) -> None:
    data = values(dtype, (4, 3))
    indices = np.array([[[1], [-1]], [[1], [0]]], np.int64)  # rows 1, 3, 1, 0
    updates = values(dtype, (2, 2, 3))
    graph = graph_of("scatter_nd", [(dtype, (4, 3)), (DType.i64, (2, 2, 1)),
                                    (dtype, (2, 2, 3))], reduction=reduction)
    check_lowering(graph, [data, indices, updates], rtol=1e-2)


def test_scatter_nd_elements() -> None:
    data = values(DType.f32, (2, 3, 2))
    indices = np.array([[0, 1, 1], [1, -1, 0], [0, 1, 1]], np.int32)
    updates = values(DType.f32, (3,))
    graph = graph_of("scatter_nd", [(DType.f32, (2, 3, 2)), (DType.i32, (3, 3)),
                                    (DType.f32, (3,))], reduction="mul")
    check_lowering(graph, [data, indices, updates])


# -- one_hot -----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis) -> None:
    indices = np.array([[0, 3, -1], [-4, 5, -6]], np.int64)  # 5 and -6 match nothing
    hot = np.array([-1.5, 2.0], np.float32)
    check_lowering(graph_of("one_hot", [(DType.i64, (2, 3)), (DType.f32, (2,))], depth=4,
                            axis=axis), [indices, hot])
    check_lowering(graph_of("one_hot", [(DType.i32, (2, 3)), (DType.i8, (2,))], depth=4,
                            axis=axis), [indices.astype(np.int32), np.array([0, 7], np.int8)])


# -- out-of-range indices stay in bounds -------------------------------------------------------

def test_out_of_range_indices_are_clamped_not_read_out_of_bounds() -> None:
    # The reference raises; the generated code clamps, and never leaves the buffers.
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    bad = np.array([[7, -9]], np.int64)
    cases = [
        ("gather", [(DType.f32, (3, 4)), (DType.i64, (1, 2))], {"axis": 0}, [data, bad],
         data[[2, 0]][None]),
        ("gather_elements", [(DType.f32, (3, 4)), (DType.i64, (1, 2))], {"axis": 1},
         [data, bad], np.array([[3, 0]], np.float32)),
        ("scatter_elements", [(DType.f32, (3, 4)), (DType.i64, (1, 2)), (DType.f32, (1, 2))],
         {"axis": 0}, [data, bad, np.array([[-1, -2]], np.float32)], None),
    ]
    for name, operands, attrs, inputs, want in cases:
        got = run_program(lower_graph(graph_of(name, operands, **attrs), target=HOST), inputs)[0]
        if want is not None:
            np.testing.assert_array_equal(got, want)
    empty = graph_of("gather", [(DType.f32, (0, 4)), (DType.i64, (1, 2))], axis=0)
    got_empty = run_program(lower_graph(empty, target=HOST), [np.zeros((0, 4), np.float32), bad])[0]
    np.testing.assert_array_equal(got_empty, np.zeros((1, 2, 4), np.float32))
    expected = data.copy()
    expected[2, 0], expected[0, 1] = -1, -2
    np.testing.assert_array_equal(got, expected)
