"""Shape and data-movement ops: type inference, errors, semantics against PyTorch (NumPy
where torch lacks the op), and the text round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import (
    BadAttributeError,
    DType,
    InterpreterError,
    ShapeError,
)
from tests.graph.ops.op_testing import result_types, run

rng = np.random.default_rng(0)




def sample(dtype, shape) -> np.ndarray:
    if np.dtype(dtype).kind == "f":
        return rng.uniform(-2, 2, shape).astype(dtype)
    return rng.integers(0, 50, shape).astype(dtype)


def check(got: np.ndarray, want) -> None:
    want = want.numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want.astype(got.dtype))


F32, F16, I32, I64 = DType.f32, DType.f16, DType.i32, DType.i64


# -- reshape, broadcast, transpose ----------------------------------------------------------

def test_reshape_types_and_errors():
    assert result_types("reshape", (F32, (2, 6)), shape=(3, 1, 4)) == ["f32[3,1,4]"]
    assert result_types("reshape", (DType.bool, (1,)), shape=()) == ["bool[]"]
    with pytest.raises(ShapeError, match=r"negative dim \(-1 is not allowed"):
        result_types("reshape", (F32, (2, 6)), shape=(-1, 4))
    with pytest.raises(ShapeError, match=r"reshape f32\[2,6\] \(12 elements\) to \[5\]"):
        result_types("reshape", (F32, (2, 6)), shape=(5,))


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.bool_])
def test_reshape_matches_torch(dtype):
    x = sample(np.float32, (2, 3, 4)).astype(dtype)
    (got,) = run("reshape", x, shape=(4, 6))
    check(got, torch.from_numpy(x).reshape(4, 6))


def test_broadcast_types_and_errors():
    assert result_types("broadcast", (I32, (3, 1)), shape=(2, 3, 4)) == ["i32[2,3,4]"]
    with pytest.raises(ShapeError, match=r"cannot broadcast f32\[3\] to \[4\]"):
        result_types("broadcast", (F32, (3,)), shape=(4,))
    with pytest.raises(ShapeError, match="cannot broadcast"):
        result_types("broadcast", (F32, (1, 3)), shape=(3,))


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_broadcast_matches_torch(dtype):
    x = sample(dtype, (3, 1))
    (got,) = run("broadcast", x, shape=(2, 3, 4))
    check(got, torch.from_numpy(x).expand(2, 3, 4))
    assert got.flags.writeable


def test_transpose_types_and_errors():
    assert result_types("transpose", (F32, (2, 3, 4)), perm=(2, 0, 1)) == ["f32[4,2,3]"]
    with pytest.raises(ShapeError, match=r"perm \[0, 0, 1\] is not a permutation"):
        result_types("transpose", (F32, (2, 3, 4)), perm=(0, 0, 1))
    with pytest.raises(BadAttributeError, match="needs attribute 'perm'"):
        result_types("transpose", (F32, (2, 3)))


@pytest.mark.parametrize("dtype", [np.float16, np.int64])
def test_transpose_matches_torch(dtype):
    x = sample(dtype, (2, 3, 4))
    (got,) = run("transpose", x, perm=(2, 0, 1))
    check(got, torch.from_numpy(x).permute(2, 0, 1))


# -- slice ----------------------------------------------------------------------------------

SLICES = {  # (starts, ends, steps) on a (5, 6) input, and the NumPy index they mean
    "inner": ((1, 0), (4, 6), (1, 2), np.s_[1:4, 0:6:2]),
    "reverse through 0": ((4, 5), (-1, 0), (-2, -1), np.s_[4::-2, 5:0:-1]),
    "empty": ((3, 2), (3, -1), (1, 1), np.s_[3:3, 2:2]),
    "step past the end": ((4, 5), (5, 6), (1, 7), np.s_[4:5, 5:6]),
}


def test_slice_types():
    assert result_types("slice", (F32, (5, 6)), starts=(1, 0), ends=(4, 6),
                        steps=(1, 2)) == ["f32[3,3]"]
    assert result_types("slice", (I64, (5,)), starts=(4,), ends=(-1,), steps=(-1,)) == ["i64[5]"]
    assert result_types("slice", (I64, (5,)), starts=(9,), ends=(2,), steps=(1,)) == ["i64[0]"]


@pytest.mark.parametrize("starts, ends, steps, match", [
    ((0,), (2,), (1,), "starts must have 2 entries, got 1"),
    ((0, 0), (2, 2), (1, 0), "the step of axis 1 is 0"),
    ((0, 0), (6, 2), (1, 1), r"axis 0 of size 5 is read at indices 0 to 5"),
    ((0, 5), (2, -3), (1, -2), r"axis 1 of size 6 is read at indices 5 to -1"),
])
def test_slice_errors(starts, ends, steps, match):
    with pytest.raises(ShapeError, match=match):
        result_types("slice", (F32, (5, 6)), starts=starts, ends=ends, steps=steps)


@pytest.mark.parametrize("case", SLICES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_slice_semantics(case, dtype):
    starts, ends, steps, index = SLICES[case]
    x = sample(dtype, (5, 6))
    (got,) = run("slice", x, starts=starts, ends=ends, steps=steps)
    check(got, x[index])
    if min(steps) > 0:  # torch slicing has no negative steps
        check(got, torch.from_numpy(x)[index])


# -- concat, pad ----------------------------------------------------------------------------

def test_concat_types_and_errors():
    assert result_types("concat", (F32, (2, 3)), (F32, (2, 5)), axis=-1) == ["f32[2,8]"]
    assert result_types("concat", (I64, (4,)), axis=0) == ["i64[4]"]
    with pytest.raises(ShapeError, match="must have one dtype"):
        result_types("concat", (F32, (2, 3)), (F16, (2, 3)), axis=0)
    with pytest.raises(ShapeError, match=r"along axis 1: the other dims differ"):
        result_types("concat", (F32, (2, 3)), (F32, (3, 3)), axis=1)
    with pytest.raises(ShapeError, match="other dims differ"):
        result_types("concat", (F32, (2, 3)), (F32, (2, 3, 1)), axis=0)
    with pytest.raises(ShapeError, match="takes at least 1 operands, got 0"):
        result_types("concat", axis=0)


@pytest.mark.parametrize("dtype", [np.float16, np.int64])
@pytest.mark.parametrize("axis", [0, -1])
def test_concat_matches_torch(dtype, axis):
    shapes = [(2, 3), (2, 3), (2, 3)]
    shapes[1] = (4, 3) if axis == 0 else (2, 1)
    xs = [sample(dtype, s) for s in shapes]
    (got,) = run("concat", *xs, axis=axis)
    check(got, torch.cat([torch.from_numpy(x) for x in xs], dim=axis))


def test_pad_types_and_errors():
    assert result_types("pad", (F32, (2, 3)), pads=(1, 0, 2, 3)) == ["f32[5,6]"]
    assert result_types("pad", (F32, (2, 3)), pads=(1, 2, 1, 2), mode="reflect") == ["f32[4,7]"]
    with pytest.raises(ShapeError, match="pads must have 4 entries"):
        result_types("pad", (F32, (2, 3)), pads=(1, 1))
    with pytest.raises(ShapeError, match="must be non-negative"):
        result_types("pad", (F32, (2, 3)), pads=(0, -1, 0, 0))
    with pytest.raises(ShapeError, match="reflect padding of axis 0 must be less than its size 2"):
        result_types("pad", (F32, (2, 3)), pads=(0, 0, 2, 0), mode="reflect")
    with pytest.raises(ShapeError, match="edge padding of axis 1 needs elements"):
        result_types("pad", (F32, (2, 0)), pads=(0, 1, 0, 0), mode="edge")
    with pytest.raises(BadAttributeError, match="expected one of constant, reflect"):
        result_types("pad", (F32, (2, 3)), pads=(0, 0, 0, 0), mode="symmetric")


@pytest.mark.parametrize("mode, torch_mode", [("constant", "constant"), ("reflect", "reflect"),
                                              ("edge", "replicate"), ("wrap", "circular")])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_pad_matches_torch(mode, torch_mode, dtype):
    x = sample(dtype, (1, 2, 4, 5))
    pads = (0, 0, 1, 3, 0, 0, 2, 4)  # begins of the four axes, then their ends
    (got,) = run("pad", x, pads=pads, mode=mode, value=1.5)
    # torch lists (begin, end) pairs from the last axis backwards, and pads only in f32.
    t = torch.from_numpy(x.astype(np.float32))
    want = F.pad(t, (3, 4, 1, 2), mode=torch_mode, **({"value": 1.5} if mode == "constant"
                                                        else {}))
    check(got, want)


def test_pad_value_is_cast_to_the_dtype():
    (got,) = run("pad", np.array([[1, 2]], np.int32), pads=(1, 0, 0, 1), value=-2.7)
    check(got, [[-2, -2, -2], [1, 2, -2]])  # -2.7 truncates, as a cast does
    (got,) = run("pad", np.array([False]), pads=(1, 1), value=0.5)
    check(got, [True, False, True])


# -- gather, gather_elements, scatter_elements ----------------------------------------------

def test_gather_types_and_errors():
    assert result_types("gather", (F32, (3, 4)), (I64, (2, 5)), axis=1) == ["f32[3,2,5]"]
    assert result_types("gather", (F16, (3, 4)), (I32, ())) == ["f16[4]"]
    with pytest.raises(ShapeError, match="indices has dtype f32, expected one of i32, i64"):
        result_types("gather", (F32, (3, 4)), (F32, (2,)))
    with pytest.raises(ShapeError, match=r"data must have rank >= 1, got f32\[\]"):
        result_types("gather", (F32, ()), (I64, (2,)))


@pytest.mark.parametrize("dtype", [np.float16, np.int32])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_matches_torch(dtype, axis):
    data = sample(dtype, (3, 4, 5))
    dim = data.shape[axis]
    indices = rng.integers(-dim, dim, (2, 3)).astype(np.int64)
    (got,) = run("gather", data, indices, axis=axis)
    flat = torch.from_numpy(indices % dim).reshape(-1)  # torch takes no negative indices
    picked = torch.index_select(torch.from_numpy(data), axis, flat)
    axis %= 3
    want = picked.reshape(data.shape[:axis] + indices.shape + data.shape[axis + 1:])
    check(got, want)


@pytest.mark.parametrize("op", ["gather", "gather_elements"])
def test_gather_out_of_range_index_is_an_interpreter_error(op):
    data = np.zeros((2, 3), np.float32)
    indices = np.array([[0, -4]], np.int32) if op == "gather" else np.array([[0, 3]], np.int32)
    with pytest.raises(InterpreterError, match=f"graph.{op}.*out of range for an axis of size"):
        run(op, data, indices, axis=1)


def test_gather_elements_types_and_errors():
    assert result_types("gather_elements", (F32, (3, 4)), (I64, (2, 7)), axis=1) == ["f32[2,7]"]
    with pytest.raises(ShapeError, match=r"must have the rank of data f32\[3,4\]"):
        result_types("gather_elements", (F32, (3, 4)), (I64, (3,)))
    with pytest.raises(ShapeError, match="no larger dims off axis 0"):
        result_types("gather_elements", (F32, (3, 4)), (I64, (2, 5)))


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("axis", [0, -1])
def test_gather_elements_matches_torch(dtype, axis):
    data = sample(dtype, (3, 4))
    dim = data.shape[axis]
    index_shape = (5, 4) if axis == 0 else (2, 6)  # longer along axis, shorter off it
    indices = rng.integers(-dim, dim, index_shape).astype(np.int32)
    (got,) = run("gather_elements", data, indices, axis=axis)
    want = torch.gather(torch.from_numpy(data), axis, torch.from_numpy(indices % dim).long())
    check(got, want)


def test_scatter_elements_types_and_errors():
    f, i = (F32, (3, 4)), (I64, (2, 4))
    assert result_types("scatter_elements", f, i, (F32, (2, 4))) == ["f32[3,4]"]
    with pytest.raises(ShapeError, match=r"updates f32\[2,3\] must have the shape of indices"):
        result_types("scatter_elements", f, i, (F32, (2, 3)))
    with pytest.raises(ShapeError, match="data and updates must have one dtype"):
        result_types("scatter_elements", f, i, (F16, (2, 4)))
    with pytest.raises(BadAttributeError, match="expected one of none, add, mul, max, min"):
        result_types("scatter_elements", f, i, (F32, (2, 4)), reduction="mean")


@pytest.mark.parametrize("reduction, torch_reduce", [
    ("add", "sum"), ("mul", "prod"), ("max", "amax"), ("min", "amin")])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements_reductions_match_torch(reduction, torch_reduce, dtype, axis):
    data = sample(dtype, (3, 4))
    dim = data.shape[axis]
    indices = rng.integers(-dim, dim, (6, 2) if axis == 0 else (2, 7))  # with repeats
    updates = sample(dtype, indices.shape)
    before = data.copy()
    (got,) = run("scatter_elements", data, indices, updates, axis=axis, reduction=reduction)
    want = torch.from_numpy(data).scatter_reduce(
        axis, torch.from_numpy(indices % dim), torch.from_numpy(updates), torch_reduce)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(data, before)  # the input array is left alone


def test_scatter_elements_none_matches_torch():
    data = sample(np.float16, (3, 4))
    indices = np.array([[2, 0, 1, -1], [0, 1, 2, 0]], np.int64)  # a permutation per column
    updates = sample(np.float16, (2, 4))
    (got,) = run("scatter_elements", data, indices, updates)
    want = torch.from_numpy(data).scatter(0, torch.from_numpy(indices % 3),
                                          torch.from_numpy(updates))
    check(got, want)


# -- iota, cumsum, topk, one_hot ------------------------------------------------------------

def test_iota_types_and_errors():
    assert result_types("iota", shape=(2, 3)) == ["i64[2,3]"]
    assert result_types("iota", shape=(2, 3), axis=-1, dtype=DType.bf16) == ["bf16[2,3]"]
    with pytest.raises(ShapeError, match="dtype must be numeric, got bool"):
        result_types("iota", shape=(2,), dtype=DType.bool)
    with pytest.raises(ShapeError, match="axis 2 is out of range for rank 2"):
        result_types("iota", shape=(2, 3), axis=2)
    with pytest.raises(ShapeError, match=r"the result must have rank >= 1"):
        result_types("iota", shape=())
    with pytest.raises(ShapeError, match="graph.iota: shape.*has a negative dim"):
        result_types("iota", shape=(2, -1))


@pytest.mark.parametrize("dtype", [DType.i64, DType.f16, DType.u8])
@pytest.mark.parametrize("axis", [0, -1])
def test_iota_semantics(dtype, axis):
    (got,) = run("iota", shape=(3, 4, 2), axis=axis, dtype=dtype)
    want = np.moveaxis(np.indices((3, 4, 2)), 0, -1)[..., axis]
    assert got.dtype == dtype.np
    check(got, want)


def test_cumsum_types_and_errors():
    assert result_types("cumsum", (I32, (2, 3)), axis=-1, reverse=True) == ["i32[2,3]"]
    with pytest.raises(ShapeError, match="operand has dtype bool"):
        result_types("cumsum", (DType.bool, (2,)), axis=0)
    with pytest.raises(BadAttributeError, match="needs attribute 'axis'"):
        result_types("cumsum", (F32, (2,)))


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype, axis", [(np.int32, 1), (np.float32, -1), (np.int64, 0)])
def test_cumsum_matches_torch(exclusive, reverse, dtype, axis):
    x = sample(dtype, (3, 4))
    (got,) = run("cumsum", x, axis=axis, exclusive=exclusive, reverse=reverse)
    t = torch.from_numpy(x)
    t = t.flip(axis) if reverse else t
    want = torch.cumsum(t, axis) - (t if exclusive else 0)
    want = want.flip(axis) if reverse else want
    np.testing.assert_allclose(got, want.numpy().astype(dtype), rtol=1e-6, atol=1e-6)


def test_topk_types_and_errors():
    assert result_types("topk", (F32, (3, 5)), k=2) == ["f32[3,2]", "i64[3,2]"]
    assert result_types("topk", (I32, (3, 5)), k=0, axis=0) == ["i32[0,5]", "i64[0,5]"]
    with pytest.raises(ShapeError, match=r"k = 6 is outside \[0, 5\], the size of axis 1"):
        result_types("topk", (F32, (3, 5)), k=6)
    with pytest.raises(BadAttributeError, match="needs attribute 'k'"):
        result_types("topk", (F32, (3, 5)))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_topk_matches_torch(largest, axis, dtype):
    x = rng.permutation(24).reshape(4, 6).astype(dtype)  # distinct, so the order is unique
    values, indices = run("topk", x, k=3, axis=axis, largest=largest)
    want = torch.topk(torch.from_numpy(x), 3, dim=axis, largest=largest)
    check(values, want.values)
    check(indices, want.indices)


@pytest.mark.parametrize("largest, want", [(True, [1, 2, 4, 3]), (False, [0, 3, 1, 2])])
@pytest.mark.parametrize("sorted", [True, False])
def test_topk_ties_put_the_lower_index_first(largest, want, sorted):
    x = np.array([1, 3, 3, 2, 3], np.int32)
    values, indices = run("topk", x, k=4, largest=largest, sorted=sorted)
    check(indices, want)
    check(values, x[want])


def test_one_hot_types_and_errors():
    ix, on_off = (I64, (2, 3)), (F32, (2,))
    assert result_types("one_hot", ix, on_off, depth=4) == ["f32[2,3,4]"]
    assert result_types("one_hot", ix, (I32, (2,)), depth=4, axis=0) == ["i32[4,2,3]"]
    assert result_types("one_hot", ix, on_off, depth=4, axis=-3) == ["f32[4,2,3]"]
    with pytest.raises(ShapeError, match=r"values must hold \[off, on\] with shape \[2\]"):
        result_types("one_hot", ix, (F32, (3,)), depth=4)
    with pytest.raises(ShapeError, match="depth must be positive, got 0"):
        result_types("one_hot", ix, on_off, depth=0)
    with pytest.raises(ShapeError, match="axis 3 is out of range for rank 3"):
        result_types("one_hot", ix, on_off, depth=4, axis=3)
    with pytest.raises(ShapeError, match="indices has dtype f32"):
        result_types("one_hot", (F32, (2,)), on_off, depth=4)


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_one_hot_matches_torch(axis, dtype):
    depth = 5
    indices = rng.integers(-depth, depth, (2, 3)).astype(np.int32)
    values = np.array([-1, 7], dtype)
    (got,) = run("one_hot", indices, values, depth=depth, axis=axis)
    hot = F.one_hot(torch.from_numpy(indices % depth).long(), depth).movedim(-1, axis)
    check(got, np.where(hot.numpy() == 1, values[1], values[0]))


def test_one_hot_out_of_range_index_gives_an_off_row():
    (got,) = run("one_hot", np.array([5, -6, -1], np.int64), np.array([0, 1], np.float16),
                 depth=5)
    check(got, [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
