"""Sampling ops (and bitcast): type inference with its errors, semantics against PyTorch (and
the ONNX reference where PyTorch differs or lacks the op), and the text round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import helper
from onnx.reference import ReferenceEvaluator

from ember import Builder, DType, ShapeError, interpret, parse_graph, print_graph
from ember.dtypes import from_numpy

rng = np.random.default_rng(0)
F32, I32, I64 = DType.f32, DType.i32, DType.i64


def result_types(op: str, *types, **attrs) -> list[str]:
    b = Builder()
    out = getattr(b, op)(*(b.input(f"x{i}", d, s) for i, (d, s) in enumerate(types)), **attrs)
    return [str(v.type) for v in (out if isinstance(out, tuple) else (out,))]


def run(op: str, *inputs: np.ndarray, **attrs) -> np.ndarray:
    """Build op(*inputs), check the text round trip, and interpret it on the inputs."""
    b = Builder("t")
    args = [b.input(f"x{i}", from_numpy(a.dtype), a.shape) for i, a in enumerate(inputs)]
    b.output(getattr(b, op)(*args, **attrs))
    graph = b.build()
    text = print_graph(graph)
    assert print_graph(parse_graph(text)) == text
    (result,) = interpret(parse_graph(text), list(inputs))
    return result


def onnx_reference(op_type: str, inputs: dict[str, np.ndarray], **attrs) -> np.ndarray:
    node = helper.make_node(op_type, list(inputs), ["y"], **attrs)
    return ReferenceEvaluator(node).run(None, inputs)[0]


# -- bitcast --------------------------------------------------------------------------------

def test_bitcast_types_and_errors():
    assert result_types("bitcast", (F32, (2, 3)), to=I32) == ["i32[2,3]"]
    assert result_types("bitcast", (DType.bool, ()), to=DType.u8) == ["u8[]"]
    assert result_types("bitcast", (DType.i16, (4,)), to=DType.bf16) == ["bf16[4]"]
    with pytest.raises(ShapeError, match=r"cannot bitcast f32 \(32 bits\) to i64 \(64 bits\)"):
        result_types("bitcast", (F32, (2,)), to=I64)


@pytest.mark.parametrize("src, dst", [(np.float32, np.int32), (np.int64, np.float64),
                                      (np.uint32, np.int32), (np.int8, np.uint8),
                                      (np.int16, np.float16), (np.bool_, np.uint8),
                                      (np.float16, np.int16)])
def test_bitcast_matches_numpy_view(src, dst):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    x = (x > 0) if src is np.bool_ else (x * 1000).astype(src)
    got = run("bitcast", x, to=from_numpy(np.dtype(dst)))
    np.testing.assert_array_equal(got.view(np.uint8), x.view(np.uint8))
    assert got.dtype == dst
    scalar = run("bitcast", np.array(1.0, np.float32), to=I32)
    assert scalar.shape == () and scalar == np.array(1.0, np.float32).view(np.int32)


def test_bitcast_to_bool_keeps_bools_zero_or_one():
    np.testing.assert_array_equal(run("bitcast", np.array([0, 1, 7], np.uint8), to=DType.bool),
                                  [False, True, True])


# -- grid_sample ----------------------------------------------------------------------------

def test_grid_sample_types_and_errors():
    assert result_types("grid_sample", (F32, (2, 3, 8, 9)), (F32, (2, 4, 5, 2))) == \
        ["f32[2,3,4,5]"]
    assert result_types("grid_sample", (F32, (1, 2, 4, 5, 6)), (F32, (1, 3, 3, 3, 3)),
                        mode="nearest") == ["f32[1,2,3,3,3]"]
    with pytest.raises(ShapeError, match=r"grid must be \[N, \*out, 2\]"):
        result_types("grid_sample", (F32, (2, 3, 8, 9)), (F32, (2, 4, 5, 3)))
    with pytest.raises(ShapeError, match="grid has dtype i32"):
        result_types("grid_sample", (F32, (2, 3, 8, 9)), (I32, (2, 4, 5, 2)))


TORCH_MODES = {"nearest": "nearest", "linear": "bilinear", "cubic": "bicubic"}


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d_matches_torch(mode, padding_mode, align_corners):
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    grid = rng.uniform(-1.3, 1.3, (2, 4, 3, 2)).astype(np.float32)
    got = run("grid_sample", x, grid, mode=mode, padding_mode=padding_mode,
              align_corners=align_corners)
    if mode == "cubic" and padding_mode == "border":
        # ONNX clamps the sample position before taking the cubic taps; PyTorch clamps
        # each tap. Ember follows ONNX.
        want = onnx_reference("GridSample", {"x": x, "grid": grid}, mode=mode,
                              padding_mode=padding_mode, align_corners=int(align_corners))
    else:
        want = F.grid_sample(torch.from_numpy(x), torch.from_numpy(grid),
                             mode=TORCH_MODES[mode], padding_mode=padding_mode,
                             align_corners=align_corners).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_3d_matches_torch(mode, padding_mode):
    x = rng.standard_normal((1, 2, 4, 5, 3)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (1, 2, 3, 4, 3)).astype(np.float32)
    got = run("grid_sample", x, grid, mode=mode, padding_mode=padding_mode)
    want = F.grid_sample(torch.from_numpy(x), torch.from_numpy(grid),
                         mode=TORCH_MODES[mode], padding_mode=padding_mode,
                         align_corners=False).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grid_sample_1d_cubic_matches_onnx():
    x = rng.standard_normal((2, 2, 7)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (2, 5, 1)).astype(np.float32)
    got = run("grid_sample", x, grid, mode="cubic", padding_mode="reflection")
    want = onnx_reference("GridSample", {"x": x, "grid": grid}, mode="cubic",
                          padding_mode="reflection")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- roi_align ------------------------------------------------------------------------------

def test_roi_align_types_and_errors():
    assert result_types("roi_align", (F32, (2, 3, 8, 9)), (F32, (5, 4)), (I64, (5,)),
                        output_height=2, output_width=3) == ["f32[5,3,2,3]"]
    with pytest.raises(ShapeError, match=r"rois must be \[num_rois, 4\]"):
        result_types("roi_align", (F32, (2, 3, 8, 9)), (F32, (5, 5)), (I64, (5,)))
    with pytest.raises(ShapeError, match=r"batch_indices must be \[5\]"):
        result_types("roi_align", (F32, (2, 3, 8, 9)), (F32, (5, 4)), (I64, (4,)))


ROIS = np.array([[0, 0, 9, 9], [1.5, 2.2, 6.1, 8.7], [-3, -2, 4, 12], [5, 5, 5.2, 5.1],
                 [20, 20, 30, 30]], np.float32)
BATCH = np.array([0, 1, 1, 0, 1], np.int64)


@pytest.mark.parametrize("sampling_ratio", [0, 2])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.5])
def test_roi_align_avg_matches_onnx(sampling_ratio, spatial_scale):
    x = rng.standard_normal((2, 3, 10, 8)).astype(np.float32)
    got = run("roi_align", x, ROIS, BATCH, output_height=3, output_width=4,
              sampling_ratio=sampling_ratio, spatial_scale=spatial_scale)
    # PyTorch's core has no roi_align (torchvision's is the same op): compare with ONNX's.
    want = onnx_reference("RoiAlign", {"x": x, "rois": ROIS, "batch_indices": BATCH},
                          output_height=3, output_width=4, sampling_ratio=sampling_ratio,
                          spatial_scale=spatial_scale)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_roi_align_single_sample_is_bilinear_interpolation():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    # One bin over [1, 2] x [1, 2]; shifted by half a pixel, its one sample (the bin's
    # centre, 1.5 - 0.5) lands on pixel (1, 1).
    rois = np.array([[1.0, 1.0, 2.0, 2.0]], np.float32)
    got = run("roi_align", x, rois, np.array([0], np.int64), sampling_ratio=1)
    np.testing.assert_allclose(got.ravel(), [x[0, 0, 1, 1]])  # pixel (1, 1) exactly


@pytest.mark.parametrize("half_pixel", [False, True])
def test_roi_align_max_matches_onnx(half_pixel):
    x = rng.standard_normal((2, 2, 6, 7)).astype(np.float32)
    got = run("roi_align", x, ROIS, BATCH, mode="max", output_height=2, output_width=2,
              half_pixel=half_pixel)
    ctm = "half_pixel" if half_pixel else "output_half_pixel"
    want = onnx_reference("RoiAlign", {"x": x, "rois": ROIS, "batch_indices": BATCH},
                          mode="max", output_height=2, output_width=2,
                          coordinate_transformation_mode=ctm)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
