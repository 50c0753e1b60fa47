"""Converters of ONNX Resize (opsets 10-19) and Upsample.

The output sizes and scales are resolved at import (scales or sizes, axes,
keep_aspect_ratio_policy) and most nodes become one IR `resize`. What that op does not
model (tf_crop_and_resize with its roi and extrapolation, tf_half_pixel_for_nn, antialiased
downsampling) is applied as one constant interpolation matrix per resized axis, built here
from ONNX's definitions.
"""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter
from ember.frontends.onnx.ops.nn import normalize_axes
from ember.graph.ir import Value

IR_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                       "align_corners", "asymmetric")


def output_plan(ctx: ConvertContext, shape, scales, sizes, axes, policy):
    """(output sizes, per-axis scales) for every axis. Scales are None when `sizes`
    decide them (scale = size / input size, stretching each axis on its own)."""
    rank = len(shape)
    if scales is not None:
        if len(scales) != len(axes):
            raise ctx.error(f"scales has {len(scales)} entries for {len(axes)} axes")
        full = [1.0] * rank
        for a, s in zip(axes, scales):
            if not s > 0:
                raise ctx.error(f"scales must be positive, got {list(scales)}")
            full[a] = float(s)
        return [int(math.floor(s * d)) for s, d in zip(full, shape)], full
    if sizes is None:
        raise ctx.error("one of scales and sizes is required")
    if len(sizes) != len(axes):
        raise ctx.error(f"sizes has {len(sizes)} entries for {len(axes)} axes")
    out = list(shape)
    for a, s in zip(axes, sizes):
        out[a] = int(s)
    if policy == "stretch":
        return out, None
    if policy not in ("not_larger", "not_smaller"):
        raise ctx.error(f"unknown keep_aspect_ratio_policy '{policy}'")
    # One scale for all the axes, the largest that fits (or the smallest that covers).
    ratios = [out[a] / shape[a] for a in axes]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    out = [int(scale * d + 0.5) if a in axes else d for a, d in enumerate(shape)]
    return out, [scale if a in axes else 1.0 for a in range(rank)]


def resize_inputs(ctx: ConvertContext, rank: int):
    """(scales, sizes, roi, axes) of a Resize node, as known values."""
    if ctx.opset < 11:
        return ctx.const(1, "scales").tolist(), None, None, list(range(rank))
    axes = list(range(rank))
    if ctx.has_attr("axes"):
        normalize_axes(ctx, ctx.attr("axes"), rank)  # checks them
        axes = [a % rank for a in ctx.attr("axes")]  # in the given order, as scales are

    def known(i: int, what: str):
        if ctx.input(i) is None:
            return None
        value = ctx.const(i, what).reshape(-1)
        return value.tolist() if value.size else None

    return known(2, "scales"), known(3, "sizes"), known(1, "roi"), axes


@converter("Resize", since=10)
def resize(ctx: ConvertContext):
    x = ctx.require(0)
    rank = len(x.shape)
    scales, sizes, roi, axes = resize_inputs(ctx, rank)
    out, full_scales = output_plan(ctx, x.shape, scales, sizes, axes,
                                   ctx.attr("keep_aspect_ratio_policy", "stretch"))
    attrs = dict(mode=ctx.attr("mode", "nearest"),
                 coordinate_transformation_mode=ctx.attr("coordinate_transformation_mode",
                                                         "half_pixel"),
                 nearest_mode=ctx.attr("nearest_mode", "round_prefer_floor"),
                 cubic_coeff_a=ctx.attr("cubic_coeff_a", -0.75),
                 exclude_outside=bool(ctx.attr("exclude_outside", 0)))
    if ctx.opset < 11:
        attrs.update(legacy_attrs(ctx, full_scales))
    if roi is not None and len(roi) != 2 * len(axes):
        raise ctx.error(f"roi has {len(roi)} entries for {len(axes)} axes")
    return emit_resize(ctx, x, out, full_scales, attrs, roi, axes,
                       bool(ctx.attr("antialias", 0)), ctx.attr("extrapolation_value", 0.0))


def legacy_attrs(ctx: ConvertContext, scales) -> dict:
    """Resize-10 and Upsample: asymmetric coordinates; nearest takes the floor when
    upsampling and the ceiling when downsampling (as ONNX Runtime does)."""
    mode = {"bilinear": "linear"}.get(ctx.attr("mode", "nearest"), ctx.attr("mode", "nearest"))
    if mode not in ("nearest", "linear"):
        raise ctx.error(f"unknown mode '{mode}'")
    up, down = any(s > 1 for s in scales), any(s < 1 for s in scales)
    if mode == "nearest" and up and down:
        raise ctx.unsupported("nearest resizing that upsamples some axes and downsamples"
                              " others before opset 11")
    return dict(mode=mode, coordinate_transformation_mode="asymmetric",
                nearest_mode="ceil" if down else "floor")


@converter("Upsample", since=7)
def upsample(ctx: ConvertContext):
    x = ctx.require(0)
    scales = ctx.attr("scales") if ctx.opset < 9 else ctx.const(1, "scales").tolist()
    out, full_scales = output_plan(ctx, x.shape, scales, None, list(range(len(x.shape))),
                                   "stretch")
    attrs = dict(cubic_coeff_a=-0.75, exclude_outside=False, **legacy_attrs(ctx, full_scales))
    return emit_resize(ctx, x, out, full_scales, attrs, None, None, False, 0.0)


def emit_resize(ctx: ConvertContext, x: Value, out, scales, attrs, roi, axes, antialias,
                extrapolation) -> Value:
    b = ctx.b
    dtype = x.dtype
    if not dtype.is_float:  # integers interpolate in a float wide enough to hold them
        x = b.cast(x, to=DType.f32 if dtype.itemsize < 4 else DType.f64)
    coordinates = attrs["coordinate_transformation_mode"]
    downsamples = any(o < d for o, d in zip(out, x.shape))
    # ONNX's align_corners and pytorch_half_pixel use the fractional output size
    # scale * size, where the IR op uses the integer one.
    fractional = scales is not None and any(s * d != o for s, d, o in zip(scales, x.shape, out))
    if (coordinates in IR_COORDINATE_MODES and not (antialias and downsamples)
            and not (fractional and coordinates in ("align_corners", "pytorch_half_pixel"))):
        y = b.resize(x, sizes=out, scales=scales or (), **attrs)
    else:
        if antialias and attrs["mode"] == "nearest":
            raise ctx.error("antialias does not apply to nearest resizing")
        y = matrix_resize(ctx, x, out, scales, attrs, roi, axes, antialias, extrapolation)
    if y.dtype is dtype:
        return y
    # Integer results round and saturate, as ONNX's reference does.
    info = np.iinfo(dtype.np)
    y = b.clip(b.round(y), min=float(info.min), max=float(info.max))
    return b.cast(y, to=dtype)


# -- interpolation matrices ----------------------------------------------------------------


def source_coords(mode: str, n_in: int, n_out: int, scale: float, roi) -> np.ndarray:
    """ONNX's x_original of each output index along one axis."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in  # ONNX uses the fractional output width here
    if mode == "align_corners":
        return np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if width == 1:
            return np.full(n_out, (end - start) * (n_in - 1) / 2 + start * (n_in - 1))
        return y * (end - start) * (n_in - 1) / (width - 1) + start * (n_in - 1)
    if mode == "pytorch_half_pixel":
        return np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5
    raise ValueError(f"unknown coordinate_transformation_mode '{mode}'")


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def axis_matrix(n_in: int, n_out: int, scale: float, roi, attrs, antialias: bool):
    """(W [n_out, n_in], extrapolated [n_out] or None): out = W @ in along one axis."""
    mode = attrs["coordinate_transformation_mode"]
    x = source_coords(mode, n_in, n_out, scale, roi)
    base = np.ceil(x) - 1  # the left neighbour strictly below x, so t is in (0, 1]
    t = x - base
    kind = attrs["mode"]
    if kind == "nearest":
        offsets = np.arange(2)
        right = {"round_prefer_floor": t > 0.5, "round_prefer_ceil": t >= 0.5,
                 "floor": t == 1, "ceil": np.ones_like(t, bool)}[attrs["nearest_mode"]]
        right = right | (t == 1)
        weights = np.stack([~right, right], axis=1).astype(np.float64)
    else:
        # Antialiasing stretches the filter by 1/scale when downsampling.
        stretch = min(scale, 1.0) if antialias else 1.0
        reach = 1 if kind == "linear" else 2
        start = int(np.floor(-reach / stretch) + 1)
        offsets = np.arange(start, 2 - start)
        d = (offsets[None, :] - t[:, None]) * stretch
        weights = (np.clip(1 - np.abs(d), 0, 1) if kind == "linear"
                   else _cubic(d, attrs["cubic_coeff_a"]))
        if antialias:
            weights = weights / weights.sum(axis=1, keepdims=True)
    index = base[:, None].astype(np.int64) + offsets[None, :]
    if attrs["exclude_outside"]:
        weights = np.where((index >= 0) & (index < n_in), weights, 0.0)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    matrix = np.zeros((n_out, n_in))
    rows = np.broadcast_to(np.arange(n_out)[:, None], index.shape)
    np.add.at(matrix, (rows, np.clip(index, 0, n_in - 1)), weights)
    outside = None
    if mode == "tf_crop_and_resize":
        outside = (x < 0) | (x > n_in - 1)
        matrix[outside] = 0.0
    return matrix, outside


def matrix_resize(ctx: ConvertContext, x: Value, out, scales, attrs, roi, axes, antialias,
                  extrapolation) -> Value:
    b = ctx.b
    rank = len(x.shape)
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize" and roi is None:
        raise ctx.error("tf_crop_and_resize needs the roi input")
    full_roi = [(0.0, 1.0)] * rank
    for i, a in enumerate(axes or ()):
        if roi is not None:
            full_roi[a] = (roi[i], roi[len(axes) + i])
    for axis in range(rank):
        n_in, n_out = x.shape[axis], out[axis]
        scale = scales[axis] if scales else n_out / n_in
        if n_in == n_out and scale == 1.0 and full_roi[axis] == (0.0, 1.0):
            continue
        matrix, outside = axis_matrix(n_in, n_out, scale, full_roi[axis], attrs, antialias)
        # Move the axis last, multiply by W^T, move it back.
        perm = (*(i for i in range(rank) if i != axis), axis)
        inverse = tuple(int(i) for i in np.argsort(perm))
        moved = b.transpose(x, perm=perm)
        y = b.matmul(moved, b.constant(matrix.T.astype(x.dtype.np)))
        if outside is not None and outside.any():
            y = b.add(y, b.constant((outside * extrapolation).astype(x.dtype.np)))
        x = b.transpose(y, perm=inverse)
    return x
