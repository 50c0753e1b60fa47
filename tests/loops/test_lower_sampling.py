"""Lowering of grid_sample and roi_align to loops."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, DType
from tests.loops.lowering_check import check_lowering

RNG = np.random.default_rng(11)


def grid_values(shape, dtype=np.float32):
    # Mostly inside [-1, 1], some well outside, and a few exact pixel centres and corners.
    g = RNG.uniform(-1.6, 1.6, shape)
    flat = g.reshape(-1)
    flat[:4] = [-1.0, 1.0, 0.0, 3.7]
    return g.astype(dtype)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_2d(mode, padding, align) -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (1, 2, 3, 4))
    grid = b.input("grid", DType.f32, (1, 3, 2, 2))
    b.output(b.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align))
    check_lowering(b.build(), [RNG.standard_normal((1, 2, 3, 4)).astype(np.float32),
                               grid_values((1, 3, 2, 2))], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_grid_sample_1d_3d_and_dtypes(mode) -> None:
    b = Builder("g")
    x = b.input("x", DType.i32, (2, 1, 5))
    grid = b.input("grid", DType.f32, (2, 3, 1))
    y = b.input("y", DType.f16, (1, 1, 2, 2, 3))
    grid3 = b.input("grid3", DType.f16, (1, 2, 1, 2, 3))
    b.output(b.grid_sample(x, grid, mode=mode, padding_mode="reflection"),
             b.grid_sample(y, grid3, mode=mode, padding_mode="zeros", align_corners=True))
    check_lowering(b.build(), [RNG.integers(-50, 50, (2, 1, 5)).astype(np.int32),
                               grid_values((2, 3, 1)),
                               RNG.standard_normal((1, 1, 2, 2, 3)).astype(np.float16),
                               grid_values((1, 2, 1, 2, 3), np.float16)], rtol=1e-3,
                   atol=1e-3)


def test_grid_sample_size_one_axis() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (1, 1, 1, 3))
    grid = b.input("grid", DType.f32, (1, 2, 2, 2))
    b.output(b.grid_sample(x, grid, mode="linear", padding_mode="reflection",
                           align_corners=True))
    check_lowering(b.build(), [RNG.standard_normal((1, 1, 1, 3)).astype(np.float32),
                               grid_values((1, 2, 2, 2))], rtol=1e-5, atol=1e-6)


ROIS = np.array([[0.5, 0.7, 3.2, 2.9], [1.0, 0.0, 1.3, 0.2], [-1.5, -0.5, 5.5, 6.0],
                 [2.0, 2.0, 1.0, 1.0]], np.float32)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("half_pixel", [True, False])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roi_align(mode, half_pixel, sampling_ratio) -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (2, 2, 4, 5))
    rois = b.input("rois", DType.f32, (4, 4))
    batch = b.input("batch", DType.i64, (4,))
    b.output(b.roi_align(x, rois, batch, mode=mode, output_height=2, output_width=3,
                         sampling_ratio=sampling_ratio, spatial_scale=0.9,
                         half_pixel=half_pixel))
    check_lowering(b.build(), [RNG.standard_normal((2, 2, 4, 5)).astype(np.float32), ROIS,
                               np.array([1, 0, -1, 1], np.int64)], rtol=1e-5, atol=1e-6)


def test_roi_align_f16() -> None:
    b = Builder("g")
    x = b.input("x", DType.f16, (1, 1, 3, 3))
    rois = b.input("rois", DType.f16, (2, 4))
    batch = b.input("batch", DType.i32, (2,))
    b.output(b.roi_align(x, rois, batch, output_height=2, output_width=2))
    check_lowering(b.build(), [RNG.standard_normal((1, 1, 3, 3)).astype(np.float16),
                               ROIS[:2].astype(np.float16), np.zeros(2, np.int32)],
                   rtol=1e-3, atol=1e-3)
