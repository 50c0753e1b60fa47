"""Pooling and resampling ops: N-d `max_pool`, `avg_pool` and ONNX `resize`.

Pools reduce a strided window view of the padded input (see linalg.py for the geometry).
`resize` interpolates one axis at a time: for each output index it gathers a few input
neighbours and sums them with weights, which covers nearest, (multi)linear and cubic.
"""

from __future__ import annotations

import numpy as np

from ember.dtypes import FLOAT_TYPES, NUMERIC_TYPES
from ember.errors import ShapeError
from ember.graph.ops.common import require_dtype, require_len
from ember.graph.ops.linalg import per_axis, window_count, window_params, windows
from ember.graph.ops.registry import Attr, define

# -- max_pool / avg_pool -----------------------------------------------------------------


def _pool_geometry(shape, kernel, strides, pads, dilations, ceil_mode):
    """(kernel, strides, pads_begin, pads_end, dilations, output spatial sizes), checked."""
    nd = len(shape) - 2
    if nd < 1:
        raise ShapeError(f"x must be [N, C, *spatial] with at least one spatial axis, got"
                         f" shape {list(shape)}")
    if not kernel:
        raise ShapeError("kernel must not be empty")
    kernel = per_axis(kernel, nd, 1, "kernel")
    strides, pb, pe, dilations = window_params(nd, strides, pads, dilations)
    out = [window_count(*args, ceil_mode, axis=i) for i, args in
           enumerate(zip(shape[2:], kernel, strides, pb, pe, dilations))]
    return kernel, strides, pb, pe, dilations, out


def _pool_windows(x, fill, geometry):
    """The [N, C, *out, *kernel] windows of x padded with `fill`, also past the end pads
    where a ceil_mode window hangs over."""
    kernel, strides, pb, pe, dilations, out = geometry
    ends = [max(e, (o - 1) * s + d * (k - 1) + 1 - b - i) for i, k, s, b, e, d, o
            in zip(x.shape[2:], kernel, strides, pb, pe, dilations, out)]
    padded = np.pad(x, [(0, 0), (0, 0), *zip(pb, ends)], constant_values=fill)
    return windows(padded, out, kernel, strides, dilations)


def _pool_infer(allowed):
    def infer(types, attrs):
        x = types[0]
        require_dtype(x, allowed)
        geometry = _pool_geometry(x.shape, attrs["kernel"], attrs["strides"], attrs["pads"],
                                  attrs.get("dilations", ()), attrs["ceil_mode"])
        return x.with_shape((*x.shape[:2], *geometry[-1]))

    return infer


def _max_pool_reference(x, *, kernel, strides, pads, dilations, ceil_mode):
    geometry = _pool_geometry(x.shape, kernel, strides, pads, dilations, ceil_mode)
    # Padding never wins: it is the smallest value of the type.
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    view = _pool_windows(x, fill, geometry)
    return view.max(axis=tuple(range(-len(kernel), 0)))


define("max_pool", arity=1, infer=_pool_infer(NUMERIC_TYPES), reference=_max_pool_reference,
       attrs={"kernel": Attr("ints"), "strides": Attr("ints", ()), "pads": Attr("ints", ()),
              "dilations": Attr("ints", ()), "ceil_mode": Attr("bool", False)},
       traits=("pure",), summary="N-d max pooling over x [N,C,*S] (ONNX MaxPool)",
       family="pool", category="contraction")


def _avg_divisor(size, kernel, stride, pad_begin, pad_end, out, include_pad):
    """Per output index along one axis, how many elements its window averages."""
    start = np.arange(out) * stride - pad_begin
    if include_pad:  # explicit padding counts, the overhang of a ceil_mode window does not
        return np.minimum(start + kernel, size + pad_end) - start
    return np.minimum(start + kernel, size) - np.maximum(start, 0)


def _avg_pool_reference(x, *, kernel, strides, pads, ceil_mode, count_include_pad):
    geometry = _pool_geometry(x.shape, kernel, strides, pads, (), ceil_mode)
    kernel, strides, pb, pe, _, out = geometry
    total = _pool_windows(x, 0, geometry).sum(axis=tuple(range(-len(kernel), 0)))
    # The divisor is separable: the product of one count per spatial axis.
    divisor = np.ones((), x.dtype)
    for args in zip(x.shape[2:], kernel, strides, pb, pe, out):
        divisor = np.multiply.outer(divisor, _avg_divisor(*args, count_include_pad))
    return (total / divisor).astype(x.dtype)


define("avg_pool", arity=1, infer=_pool_infer(FLOAT_TYPES), reference=_avg_pool_reference,
       attrs={"kernel": Attr("ints"), "strides": Attr("ints", ()), "pads": Attr("ints", ()),
              "ceil_mode": Attr("bool", False), "count_include_pad": Attr("bool", False)},
       traits=("pure",), summary="N-d average pooling over x [N,C,*S] (ONNX AveragePool)",
       family="pool", category="contraction")

# -- resize ----------------------------------------------------------------------------

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                    "align_corners", "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize_infer(types, attrs):
    x = types[0]
    require_dtype(x, FLOAT_TYPES)
    sizes, scales = attrs["sizes"], attrs["scales"]
    require_len(sizes, x.rank, "sizes")
    if min(sizes, default=1) < 1:
        raise ShapeError(f"sizes must be >= 1, got {list(sizes)}")
    if scales:
        require_len(scales, x.rank, "scales")
        if min(scales) <= 0:
            raise ShapeError(f"scales must be > 0, got {list(scales)}")
    return x.with_shape(sizes)


def _source_coords(n_in, n_out, scale, mode):
    """ONNX's x_original for each output index x along one axis (float64)."""
    x = np.arange(n_out, dtype=np.float64)

    def unscale(v):  # v / scale; exact in rational form when the scale is sizes/in
        return v / scale if scale else v * n_in / n_out

    if mode == "half_pixel":
        return unscale(x + 0.5) - 0.5
    if mode == "half_pixel_symmetric":
        # Centre the (integer) output on the input when scale * in is fractional.
        adjustment = n_out / (scale * n_in) if scale else 1.0
        return n_in / 2 * (1 - adjustment) + unscale(x + 0.5) - 0.5
    if mode == "pytorch_half_pixel":
        return unscale(x + 0.5) - 0.5 if n_out > 1 else np.zeros(1)
    if mode == "align_corners":
        return x * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(1)
    assert mode == "asymmetric", mode
    return unscale(x)


def _nearest_index(src, mode):
    if mode == "round_prefer_floor":
        return np.ceil(src - 0.5)
    if mode == "round_prefer_ceil":
        return np.floor(src + 0.5)
    return np.floor(src) if mode == "floor" else np.ceil(src)


def _cubic_weights(t, a):
    """Keys' cubic convolution weights of the 4 taps at distances 1+t, t, 1-t, 2-t."""
    def near(d):  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return np.stack([far(1 + t), near(t), near(1 - t), far(2 - t)], axis=-1)


def _taps(src, n_in, attrs):
    """(input indices, weights), each [n_out, taps], interpolating at coordinates src."""
    mode = attrs["mode"]
    if mode == "nearest":
        return _nearest_index(src, attrs["nearest_mode"])[:, None].astype(np.int64), None
    # Left neighbour strictly below src, so that t is in (0, 1] as in ONNX's reference.
    base = np.ceil(src) - 1
    t = src - base
    if mode == "linear":
        offsets, weights = np.arange(2), np.stack([1 - t, t], axis=-1)
    else:
        offsets, weights = np.arange(-1, 3), _cubic_weights(t, attrs["cubic_coeff_a"])
    index = base[:, None].astype(np.int64) + offsets
    if attrs["exclude_outside"]:
        weights = np.where((index >= 0) & (index < n_in), weights, 0.0)
        weights /= weights.sum(axis=1, keepdims=True)
    return index, weights


def _resize_axis(x, axis, index, weights):
    """x resampled along `axis`: out[..., o, ...] = sum_j weights[o, j] x[..., index[o, j]]."""
    gathered = np.take(x, np.clip(index, 0, x.shape[axis] - 1), axis=axis)  # [.., o, j, ..]
    if weights is None:
        return np.squeeze(gathered, axis=axis + 1)
    shape = (*weights.shape, *(1,) * (x.ndim - axis - 1))
    return (gathered * weights.astype(x.dtype).reshape(shape)).sum(axis=axis + 1)


def _resize_reference(x, **attrs):
    sizes, scales = attrs["sizes"], attrs["scales"]
    for axis, (n_in, n_out) in enumerate(zip(x.shape, sizes)):
        scale = scales[axis] if scales else None
        if n_in == n_out and scale in (None, 1.0):
            continue  # every coordinate mode maps this axis onto itself
        src = _source_coords(n_in, n_out, scale, attrs["coordinate_transformation_mode"])
        x = _resize_axis(x, axis, *_taps(src, n_in, attrs))
    return x


define("resize", arity=1, infer=_resize_infer, reference=_resize_reference,
       attrs={"sizes": Attr("ints"), "scales": Attr("floats", ()),
              "mode": Attr("str", "nearest", ("nearest", "linear", "cubic")),
              "coordinate_transformation_mode": Attr("str", "half_pixel", COORDINATE_MODES),
              "nearest_mode": Attr("str", "round_prefer_floor", NEAREST_MODES),
              "cubic_coeff_a": Attr("float", -0.75), "exclude_outside": Attr("bool", False)},
       traits=("pure",), summary="ONNX Resize (opset 19) to `sizes`: nearest, linear or"
       " cubic interpolation per axis", family="pool")
