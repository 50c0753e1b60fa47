"""Converters of ONNX sampling ops (GridSample, AffineGrid, RoiAlign) and BitCast."""

from __future__ import annotations

import numpy as np

from ember.frontends.onnx.context import ConvertContext, converter, onnx_dtype

GRID_MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic",
              "nearest": "nearest"}


@converter("GridSample", since=16)
def grid_sample(ctx: ConvertContext):
    x, grid = ctx.require(0), ctx.require(1)
    mode = ctx.attr("mode", "bilinear" if ctx.opset < 20 else "linear")
    if mode not in GRID_MODES:
        raise ctx.unsupported(f"mode '{mode}'")
    return ctx.b.grid_sample(x, grid, mode=GRID_MODES[mode],
                             padding_mode=ctx.attr("padding_mode", "zeros"),
                             align_corners=bool(ctx.attr("align_corners", 0)))


@converter("AffineGrid", since=20)
def affine_grid(ctx: ConvertContext):
    """grid[n, *pos] = theta[n] @ (x, y[, z], 1): the base grid is a constant."""
    theta = ctx.require(0)
    size = [int(s) for s in ctx.const(1, "size")]
    spatial = size[2:]
    if len(spatial) not in (2, 3) or theta.shape != (size[0], len(spatial), len(spatial) + 1):
        raise ctx.error(f"theta {theta.type} does not match size {size}")
    align = bool(ctx.attr("align_corners", 0))
    axes = [np.linspace(-1, 1, s) if align else (np.arange(s) * 2 + 1) / s - 1
            for s in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")  # one array per spatial axis, D/H/W order
    base = np.stack([*mesh[::-1], np.ones(spatial)], axis=-1)  # (x, y[, z], 1)
    base = ctx.constant(base.reshape(-1, len(spatial) + 1), theta.dtype)
    theta_t = ctx.b.transpose(theta, perm=(0, 2, 1))  # [N, r + 1, r]
    grid = ctx.b.matmul(base, theta_t)  # [N, prod(spatial), r]
    return ctx.b.reshape(grid, shape=(size[0], *spatial, len(spatial)))


@converter("RoiAlign", since=10)
def roi_align(ctx: ConvertContext):
    x, rois, indices = ctx.require(0), ctx.require(1), ctx.require(2)
    # Opset 10 had no coordinate_transformation_mode and behaved as output_half_pixel.
    ctm = ctx.attr("coordinate_transformation_mode",
                   "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ctx.unsupported(f"coordinate_transformation_mode '{ctm}'")
    return ctx.b.roi_align(x, rois, indices, mode=ctx.attr("mode", "avg"),
                           output_height=ctx.attr("output_height", 1),
                           output_width=ctx.attr("output_width", 1),
                           sampling_ratio=ctx.attr("sampling_ratio", 0),
                           spatial_scale=ctx.attr("spatial_scale", 1.0),
                           half_pixel=ctm == "half_pixel")


@converter("BitCast", since=26)
def bitcast(ctx: ConvertContext):
    return ctx.b.bitcast(ctx.require(0), to=onnx_dtype(ctx.attr("to"), "BitCast's 'to'"))
