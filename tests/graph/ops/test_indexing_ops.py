"""N-d indexing ops and cumprod: type inference, errors, semantics against PyTorch (plain
loops where torch lacks the op), and the text round trip."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from ember import (
    BadAttributeError,
    DType,
    InterpreterError,
    ShapeError,
)
from tests.graph.ops.op_testing import result_types, run

rng = np.random.default_rng(0)
F32, F16, I32, I64 = DType.f32, DType.f16, DType.i32, DType.i64




def sample(dtype, shape) -> np.ndarray:
    if np.dtype(dtype).kind == "f":
        return rng.uniform(-2, 2, shape).astype(dtype)
    return rng.integers(1, 6, shape).astype(dtype)


def random_tuples(data_shape, lead_shape, k) -> np.ndarray:
    """Index tuples of length k into data_shape, negative ones included."""
    cols = [rng.integers(-d, d, lead_shape) for d in data_shape[:k]]
    return np.stack(cols, axis=-1).astype(np.int64)


# -- gather_nd ------------------------------------------------------------------------------

def test_gather_nd_types_and_errors():
    assert result_types("gather_nd", (F32, (3, 4, 5)), (I64, (2, 2))) == ["f32[2,5]"]
    assert result_types("gather_nd", (F32, (3, 4, 5)), (I32, (6, 3))) == ["f32[6]"]
    assert result_types("gather_nd", (F16, (3, 4, 5)), (I64, (3, 7, 1)),
                        batch_dims=1) == ["f16[3,7,5]"]
    with pytest.raises(ShapeError, match=r"index tuples of length 4 .* must address 1 to 3"):
        result_types("gather_nd", (F32, (3, 4, 5)), (I64, (2, 4)))
    with pytest.raises(ShapeError, match="differ in their first 1 .batch. dims"):
        result_types("gather_nd", (F32, (3, 4, 5)), (I64, (2, 1)), batch_dims=1)
    with pytest.raises(ShapeError, match="batch_dims 2 must be less than the ranks"):
        result_types("gather_nd", (F32, (3, 4)), (I64, (3, 4, 1)), batch_dims=2)
    with pytest.raises(ShapeError, match="indices has dtype f32"):
        result_types("gather_nd", (F32, (3, 4)), (F32, (2, 1)))


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_gather_nd_matches_torch_indexing(k, dtype):
    data = sample(dtype, (3, 4, 5))
    indices = random_tuples(data.shape, (2, 3), k)
    (got,) = run("gather_nd", data, indices)
    t = torch.from_numpy(data)
    want = t[tuple(torch.from_numpy(indices[..., j]) for j in range(k))]  # torch wraps too
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.parametrize("batch_dims", [1, 2])
def test_gather_nd_batch_dims_matches_loops(batch_dims):
    data = sample(np.float16, (2, 3, 4, 5))
    indices = random_tuples(data.shape[batch_dims:], (2, 3)[:batch_dims] + (4,), 1)
    (got,) = run("gather_nd", data, indices, batch_dims=batch_dims)
    for batch in itertools.product(*map(range, data.shape[:batch_dims])):
        for i in range(4):
            (j,) = indices[batch + (i,)]
            np.testing.assert_array_equal(got[batch + (i,)], data[batch + (j,)])


def test_gather_nd_out_of_range_index_is_an_interpreter_error():
    with pytest.raises(InterpreterError, match="graph.gather_nd.*out of range"):
        run("gather_nd", np.zeros((2, 3), np.float32), np.array([[1, 3]], np.int64))


# -- scatter_nd -----------------------------------------------------------------------------

def test_scatter_nd_types_and_errors():
    d, i = (F32, (3, 4, 5)), (I64, (2, 2))
    assert result_types("scatter_nd", d, i, (F32, (2, 5))) == ["f32[3,4,5]"]
    assert result_types("scatter_nd", d, (I64, (6, 3)), (F32, (6,)), reduction="max") == \
        ["f32[3,4,5]"]
    with pytest.raises(ShapeError, match=r"updates f32\[2,4\] must have shape \[2, 5\]"):
        result_types("scatter_nd", d, i, (F32, (2, 4)))
    with pytest.raises(ShapeError, match="data and updates must have one dtype"):
        result_types("scatter_nd", d, i, (F16, (2, 5)))
    with pytest.raises(BadAttributeError, match="expected one of none, add, mul, max, min"):
        result_types("scatter_nd", d, i, (F32, (2, 5)), reduction="mean")


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("dtype", [np.float16, np.int64])
def test_scatter_nd_none_matches_torch(k, dtype):
    data = sample(dtype, (3, 4, 5))
    # distinct tuples, so which repeat wins does not matter
    flat = rng.permutation(np.prod(data.shape[:k]))[:3]
    indices = np.stack(np.unravel_index(flat, data.shape[:k]), axis=-1).astype(np.int64)
    updates = sample(dtype, (3,) + data.shape[k:])
    before = data.copy()
    (got,) = run("scatter_nd", data, indices, updates)
    want = torch.from_numpy(data.copy())
    want[tuple(torch.from_numpy(indices[:, j]) for j in range(k))] = torch.from_numpy(updates)
    np.testing.assert_array_equal(got, want.numpy())
    np.testing.assert_array_equal(data, before)  # the input array is left alone


@pytest.mark.parametrize("reduction, combine", [
    ("add", np.add), ("mul", np.multiply), ("max", np.maximum), ("min", np.minimum)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_scatter_nd_reductions_apply_every_repeat(reduction, combine, dtype):
    data = sample(dtype, (3, 4))
    indices = np.array([[1, 2], [-2, 2], [0, 0], [1, -2]], np.int64)  # [1, 2] three times
    updates = sample(dtype, (4,))
    (got,) = run("scatter_nd", data, indices, updates, reduction=reduction)
    want = data.copy()
    for (r, c), u in zip(indices, updates):
        want[r, c] = combine(want[r, c], u)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_scatter_nd_add_of_slices_matches_torch():
    data = sample(np.float32, (3, 4))
    indices = np.array([[2], [0], [2]], np.int64)
    updates = sample(np.float32, (3, 4))
    (got,) = run("scatter_nd", data, indices, updates, reduction="add")
    want = torch.from_numpy(data.copy()).index_put_((torch.from_numpy(indices[:, 0]),),
                                                    torch.from_numpy(updates), accumulate=True)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


# -- cumprod --------------------------------------------------------------------------------

def test_cumprod_types_and_errors():
    assert result_types("cumprod", (I32, (2, 3)), axis=-1, exclusive=True) == ["i32[2,3]"]
    assert result_types("cumprod", (F16, (0, 3)), axis=0) == ["f16[0,3]"]
    with pytest.raises(ShapeError, match="operand has dtype bool"):
        result_types("cumprod", (DType.bool, (2,)), axis=0)
    with pytest.raises(ShapeError, match="axis 2 is out of range for rank 2"):
        result_types("cumprod", (F32, (2, 3)), axis=2)
    with pytest.raises(BadAttributeError, match="needs attribute 'axis'"):
        result_types("cumprod", (F32, (2,)))


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype, axis", [(np.int32, 1), (np.float32, -1), (np.int64, 0),
                                         (np.float16, 0)])
def test_cumprod_matches_torch(exclusive, reverse, dtype, axis):
    x = sample(dtype, (3, 4))
    (got,) = run("cumprod", x, axis=axis, exclusive=exclusive, reverse=reverse)
    t = torch.from_numpy(x.astype(np.float64) if dtype == np.float16 else x)
    t = t.flip(axis) if reverse else t
    if exclusive:  # shift right behind a 1
        t = torch.cat([torch.ones_like(t.narrow(axis, 0, 1)),
                       t.narrow(axis, 0, t.shape[axis] - 1)], axis)
    want = torch.cumprod(t, axis)
    want = want.flip(axis) if reverse else want
    np.testing.assert_allclose(got, want.numpy().astype(dtype), rtol=2e-3)


def test_cumprod_is_exact_on_integers_and_zeros():
    x = np.array([3, -2, 0, 5, 7], np.int64)
    (got,) = run("cumprod", x, axis=0)
    np.testing.assert_array_equal(got, [3, -6, 0, 0, 0])
    (got,) = run("cumprod", np.zeros((0, 2), np.float32), axis=0, exclusive=True)
    assert got.shape == (0, 2)
