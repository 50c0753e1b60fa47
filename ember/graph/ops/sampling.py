"""Sampling ops, whose reads depend on data: `grid_sample` and `roi_align`.

References compute coordinates and weights in f64 and round once at the output.
"""

from __future__ import annotations

import itertools

import numpy as np

from ember.dtypes import FLOAT_TYPES, NUMERIC_TYPES
from ember.errors import ShapeError
from ember.graph.ir import TensorType
from ember.graph.ops.common import require_dtype, require_rank
from ember.graph.ops.registry import Attr, define
from ember.graph.ops.shape import INDEX_TYPES

# -- grid_sample --------------------------------------------------------------------------

def _grid_sample_infer(types, attrs):
    x, grid = types
    require_dtype(x, NUMERIC_TYPES, "x")
    require_dtype(grid, FLOAT_TYPES, "grid")
    if x.rank < 3:
        raise ShapeError(f"x must be [N, C, *spatial] with at least one spatial axis, got {x}")
    r = x.rank - 2
    if grid.rank != r + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != r:
        raise ShapeError(f"grid must be [N, *out, {r}] for x {x}, got {grid}")
    return x.with_shape((*x.shape[:2], *grid.shape[1:-1]))


def _reflect(x, lo, hi):
    """Reflect coordinates by the borders [lo, hi] until they fall inside (ONNX GridSample)."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, np.where(above, x - hi, 0.0))
    n = np.trunc(dx / span)
    r = dx - n * span
    even = n % 2 == 0
    from_lo = np.where(even, lo + r, hi - r)
    from_hi = np.where(even, hi - r, lo + r)
    return np.where(below, from_lo, np.where(above, from_hi, x))


def _cubic_weights(t):
    """Keys cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 from floor(x)."""
    a = -0.75

    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _grid_sample(x, grid, mode, padding_mode, align_corners):
    n, c, *dims = x.shape
    out_shape = grid.shape[1:-1]
    r = len(dims)
    taps_per_axis = []  # per spatial axis: list of (index, weight), arrays of shape [N, *out]
    for axis, size in enumerate(dims):
        g = grid[..., r - 1 - axis]  # the grid lists the last spatial axis first
        lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        # Denormalize in the grid's own precision, as the ONNX reference does.
        pos = ((g + 1) / 2 * (size - 1) if align_corners else ((g + 1) * size - 1) / 2)
        pos = pos.astype(np.float64)
        if mode == "nearest":
            pos = np.rint(pos)
        outside = (pos < lo) | (pos > hi)
        if padding_mode == "border":
            pos = np.where(outside, np.clip(pos, 0, size - 1), pos)
        elif padding_mode == "reflection":
            pos = np.where(outside, _reflect(pos, lo, hi), pos)
        if mode == "nearest":
            taps = [(np.trunc(pos), np.ones_like(pos))]
        else:
            base = np.floor(pos)
            t = pos - base
            weights = [1 - t, t] if mode == "linear" else _cubic_weights(t)
            first = 0 if mode == "linear" else -1
            taps = [(base + first + k, w) for k, w in enumerate(weights)]
        taps_per_axis.append([_pixel(index, size, lo, hi, padding_mode) + (w,)
                              for index, w in taps])
    flat = x.reshape(n, c, -1).astype(np.float64)
    strides = [int(np.prod(dims[a + 1:])) for a in range(r)]
    total = np.zeros((n, c, int(np.prod(out_shape))))
    for combo in itertools.product(*taps_per_axis):
        index = sum(i.astype(np.int64) * s for (i, _, _), s in zip(combo, strides))
        valid = np.logical_and.reduce([v for _, v, _ in combo])
        weight = np.prod([w for _, _, w in combo], axis=0)
        index = index.reshape(n, 1, -1)
        values = np.take_along_axis(flat, np.broadcast_to(index, (n, c, index.shape[-1])), 2)
        contribution = np.where(valid.reshape(n, 1, -1), values * weight.reshape(n, 1, -1), 0)
        total += contribution
    result = total.reshape(n, c, *out_shape)
    return result if x.dtype.kind == "f" else np.trunc(result)


def _pixel(index, size, lo, hi, padding_mode):
    """The in-bounds index to read for tap `index`, and whether it reads a pixel at all
    (zeros padding reads 0 outside)."""
    if padding_mode == "zeros":
        valid = (index >= 0) & (index < size)
    else:
        valid = np.ones(index.shape, bool)
        if padding_mode == "reflection":
            index = np.trunc(_reflect(index, lo, hi))
    return np.clip(index, 0, size - 1), valid


define("grid_sample", arity=2, infer=_grid_sample_infer, reference=_grid_sample,
       attrs={"mode": Attr("str", "linear", ("nearest", "linear", "cubic")),
              "padding_mode": Attr("str", "zeros", ("zeros", "border", "reflection")),
              "align_corners": Attr("bool", False)},
       traits=("pure",), family="sampling",
       summary="sample x [N,C,*S] at the normalized positions grid [N,*out,r] (ONNX"
               " GridSample): nearest, N-linear or N-cubic")


# -- roi_align ----------------------------------------------------------------------------

def _roi_align_infer(types, attrs):
    x, rois, batch_indices = types
    require_dtype(x, FLOAT_TYPES, "x")
    require_rank(x, 4, "x")
    require_dtype(rois, FLOAT_TYPES, "rois")
    require_dtype(batch_indices, INDEX_TYPES, "batch_indices")
    if rois.rank != 2 or rois.shape[1] != 4:
        raise ShapeError(f"rois must be [num_rois, 4], got {rois}")
    if batch_indices.shape != rois.shape[:1]:
        raise ShapeError(f"batch_indices must be [{rois.shape[0]}], got {batch_indices}")
    if attrs["output_height"] < 1 or attrs["output_width"] < 1 or attrs["sampling_ratio"] < 0:
        raise ShapeError("output_height and output_width must be positive and sampling_ratio"
                         " non-negative")
    return TensorType(x.dtype, (rois.shape[0], x.shape[1], attrs["output_height"],
                                attrs["output_width"]))


def _roi_axis(start, size, bins, grid, length):
    """Sample positions along one axis of a roi, as (low, high, weight of low, weight of
    high, inside) arrays of shape [bins, grid]."""
    step = size / bins
    pos = (start + np.arange(bins)[:, None] * step
           + (np.arange(grid)[None, :] + 0.5) * step / grid)
    inside = (pos >= -1.0) & (pos <= length)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    at_end = low >= length - 1
    low = np.where(at_end, length - 1, low)
    high = np.where(at_end, length - 1, low + 1)
    frac = np.where(at_end, 0.0, pos - low)
    return low, high, 1.0 - frac, frac, inside


def _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio,
               spatial_scale, half_pixel):
    num_rois, (_, c, height, width) = rois.shape[0], x.shape
    out = np.zeros((num_rois, c, output_height, output_width))
    offset = 0.5 if half_pixel else 0.0
    for k in range(num_rois):
        x0, y0, x1, y1 = (float(v) * spatial_scale - offset for v in rois[k])
        roi_w, roi_h = x1 - x0, y1 - y0
        if not half_pixel:  # malformed rois become 1x1
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        grid_h = sampling_ratio or int(np.ceil(roi_h / output_height))
        grid_w = sampling_ratio or int(np.ceil(roi_w / output_width))
        ylo, yhi, wyl, wyh, yin = _roi_axis(y0, roi_h, output_height, grid_h, height)
        xlo, xhi, wxl, wxh, xin = _roi_axis(x0, roi_w, output_width, grid_w, width)
        image = x[int(batch_indices[k])].astype(np.float64)  # [C, H, W]
        # Broadcast to [C, out_h, grid_h, out_w, grid_w].
        ys = [(a[:, :, None, None]) for a in (ylo, yhi, wyl, wyh, yin)]
        xs = [(a[None, None, :, :]) for a in (xlo, xhi, wxl, wxh, xin)]
        inside = ys[4] & xs[4]
        corners = [np.where(inside, wy * wx, 0.0) * image[:, iy, ix]
                   for iy, wy in ((ys[0], ys[2]), (ys[1], ys[3]))
                   for ix, wx in ((xs[0], xs[2]), (xs[1], xs[3]))]
        if mode == "avg":
            out[k] = sum(corners).sum(axis=(2, 4)) / max(grid_h * grid_w, 1)
        else:  # the max of the weighted corners, as ONNX Runtime and the reference do
            out[k] = np.max(np.maximum.reduce(corners), axis=(2, 4), initial=-np.inf) \
                if grid_h * grid_w else 0.0
    return out


define("roi_align", arity=3, infer=_roi_align_infer, reference=_roi_align,
       attrs={"mode": Attr("str", "avg", ("avg", "max")),
              "output_height": Attr("int", 1), "output_width": Attr("int", 1),
              "sampling_ratio": Attr("int", 0), "spatial_scale": Attr("float", 1.0),
              "half_pixel": Attr("bool", True)},
       traits=("pure",), family="sampling",
       summary="pool each roi [x1,y1,x2,y2] of x [N,C,H,W] to [C,out_h,out_w] by bilinear"
               " samples (ONNX RoiAlign); sampling_ratio 0 adapts to the roi size")

