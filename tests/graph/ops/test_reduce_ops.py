"""Reductions: type inference, errors, semantics against PyTorch, and the text round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import BadAttributeError, Builder, DType, ShapeError, interpret, parse_graph, print_graph
from ember.dtypes import from_numpy

REDUCE_OPS = ["reduce_sum", "reduce_prod", "reduce_max", "reduce_min"]
rng = np.random.default_rng(0)


def result_type(op: str, dtype: DType, shape, **attrs):
    b = Builder()
    out = getattr(b, op)(b.input("x", dtype, shape), **attrs)
    return out.type


def run(op: str, x: np.ndarray, **attrs) -> list[np.ndarray]:
    """Build x -> op(x), check the text round trip, and interpret it on x."""
    b = Builder("t")
    out = getattr(b, op)(b.input("x", from_numpy(x.dtype), x.shape), **attrs)
    b.output(*(out if isinstance(out, tuple) else (out,)))
    graph = b.build()
    text = print_graph(graph)
    assert print_graph(parse_graph(text)) == text
    return interpret(graph, [x])


def sample(dtype: DType, shape) -> np.ndarray:
    if dtype.is_float:
        return rng.uniform(-2, 2, shape).astype(dtype.np)
    return rng.integers(-3, 4, shape).astype(dtype.np)


# -- reduce_* -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_types(op):
    assert str(result_type(op, DType.f32, (2, 3, 4), axes=(0, -1))) == "f32[3]"
    assert str(result_type(op, DType.i8, (2, 3, 4), axes=(2, 0), keepdims=True)) == "i8[1,3,1]"
    assert str(result_type(op, DType.f16, (2, 3), axes=())) == "f16[2,3]"
    assert str(result_type(op, DType.u8, (), axes=())) == "u8[]"


@pytest.mark.parametrize("attrs, error, match", [
    ({"axes": (0, -2)}, ShapeError, "repeat an axis"),
    ({"axes": (2,)}, ShapeError, "axis 2 is out of range for rank 2"),
    ({}, BadAttributeError, "needs attribute 'axes'"),
    ({"axes": (0,), "keep": True}, BadAttributeError, "no attribute"),
])
def test_reduce_errors(attrs, error, match):
    with pytest.raises(error, match=match):
        result_type("reduce_sum", DType.f32, (2, 3), **attrs)


def test_reduce_rejects_bool_and_scalar_axes():
    with pytest.raises(ShapeError, match=r"graph.reduce_max: operand has dtype bool"):
        result_type("reduce_max", DType.bool, (2,), axes=(0,))
    with pytest.raises(ShapeError, match="out of range for rank 0"):
        result_type("reduce_min", DType.f32, (), axes=(0,))


def torch_reduce(op: str, t: torch.Tensor, axes, keepdims: bool) -> torch.Tensor:
    if op == "reduce_prod":  # torch.prod takes one dim at a time
        for axis in sorted((a % t.ndim for a in axes), reverse=True):
            t = torch.prod(t, dim=axis, keepdim=keepdims)
        return t
    fn = {"reduce_sum": torch.sum, "reduce_max": torch.amax, "reduce_min": torch.amin}[op]
    return fn(t, dim=axes, keepdim=keepdims)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", [DType.f32, DType.f16, DType.i32, DType.u8])
@pytest.mark.parametrize("axes, keepdims", [((1,), False), ((0, -1), True), ((0, 1, 2), False)])
def test_reduce_matches_torch(op, dtype, axes, keepdims):
    x = sample(dtype, (3, 4, 5))
    (got,) = run(op, x, axes=axes, keepdims=keepdims)
    # torch computes in f32 or i64; integer results wrap to the same value mod 2**bits.
    wide = torch.from_numpy(x.astype(np.float32 if dtype.is_float else np.int64))
    want = torch_reduce(op, wide, axes, keepdims).numpy().astype(dtype.np)
    assert got.dtype == dtype.np and got.shape == want.shape
    rtol = 2e-3 if dtype is DType.f16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=rtol)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_no_axes_is_identity(op):
    x = sample(DType.i16, (2, 3))
    (got,) = run(op, x, axes=())
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("dtype", [DType.f32, DType.i32, DType.u8])
def test_reduce_empty_axis_gives_identity(dtype):
    x = np.zeros((2, 0), dtype.np)
    lo, hi = ((-np.inf, np.inf) if dtype.is_float
              else (np.iinfo(dtype.np).min, np.iinfo(dtype.np).max))
    for op, want in [("reduce_sum", 0), ("reduce_prod", 1), ("reduce_max", lo),
                     ("reduce_min", hi)]:
        (got,) = run(op, x, axes=(1,))
        np.testing.assert_array_equal(got, np.full(2, want, dtype.np))


def test_reduce_integer_sum_wraps_in_its_dtype():
    (got,) = run("reduce_sum", np.full(3, 100, np.int8), axes=(0,))
    assert got == np.int8(44)  # 300 mod 256, not widened to i64


def test_reduce_max_propagates_nan():
    x = np.array([[1, np.nan, 3], [4, 5, 6]], np.float32)
    (got,) = run("reduce_max", x, axes=(1,))
    want = torch.amax(torch.from_numpy(x), dim=1).numpy()
    np.testing.assert_array_equal(got, want)


# -- argmax, argmin -------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_types(op):
    assert str(result_type(op, DType.f32, (2, 3))) == "i64[3]"
    assert str(result_type(op, DType.f16, (2, 3), axis=-1, keepdims=True)) == "i64[2,1]"
    assert str(result_type(op, DType.u16, (4,), select_last_index=True)) == "i64[]"


@pytest.mark.parametrize("shape, attrs, match", [
    ((2, 0), {"axis": 1}, "along axis 1 of length 0"),
    ((), {}, "must have rank >= 1"),
    ((2, 3), {"axis": -3}, "axis -3 is out of range for rank 2"),
])
def test_arg_errors(shape, attrs, match):
    with pytest.raises(ShapeError, match=match):
        result_type("argmax", DType.f32, shape, **attrs)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", [DType.f32, DType.f16, DType.i32])
@pytest.mark.parametrize("axis, keepdims", [(0, False), (-1, True)])
@pytest.mark.parametrize("last", [False, True])
def test_arg_matches_torch(op, dtype, axis, keepdims, last):
    x = rng.integers(0, 3, (4, 5)).astype(dtype.np)  # few values, so many ties
    (got,) = run(op, x, axis=axis, keepdims=keepdims, select_last_index=last)
    fn = torch.argmax if op == "argmax" else torch.argmin
    t = torch.from_numpy(x.astype(np.float32))
    if last:  # torch returns the first of equal extremes; search the flipped axis
        want = x.shape[axis] - 1 - fn(torch.flip(t, [axis]), dim=axis, keepdim=keepdims)
    else:
        want = fn(t, dim=axis, keepdim=keepdims)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want.numpy())
