"""Linear algebra ops: `matmul`, and N-d `conv` / `conv_transpose` with ONNX semantics.

The window helpers here (per-axis parameters, output sizes, strided window views) are
shared with the pooling ops. References compute as one batched matrix product per op
(im2col for conv, col2im for conv_transpose) so that real models run in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ember.dtypes import FLOAT_TYPES, NUMERIC_TYPES
from ember.errors import ShapeError
from ember.graph.ir import TensorType
from ember.graph.ops.common import broadcast_shapes, require_dtype, same_dtype
from ember.graph.ops.registry import Attr, define

# -- matmul ----------------------------------------------------------------------------


def _matmul_infer(types, attrs):
    a, b = types
    dtype = same_dtype(types)
    require_dtype(a, NUMERIC_TYPES)
    if a.rank == 0 or b.rank == 0:
        raise ShapeError(f"operands must have rank >= 1, got {a} and {b}")
    # 1-D operands act as a row (left) or column (right) whose added dim is dropped.
    a_shape = (1, *a.shape) if a.rank == 1 else a.shape
    b_shape = (*b.shape, 1) if b.rank == 1 else b.shape
    if a_shape[-1] != b_shape[-2]:
        raise ShapeError(f"contracted dims differ: {a} has {a_shape[-1]}, {b} has"
                         f" {b_shape[-2]}")
    batch = broadcast_shapes(a_shape[:-2], b_shape[:-2])
    rows = (a_shape[-2],) if a.rank > 1 else ()
    cols = (b_shape[-1],) if b.rank > 1 else ()
    return TensorType(dtype, (*batch, *rows, *cols))


define("matmul", arity=2, infer=_matmul_infer, reference=np.matmul, traits=("pure",),
       summary="matrix product with NumPy semantics (batch dims broadcast)", family="linalg",
       category="contraction")

# -- window geometry, shared with pool.py ------------------------------------------------


def per_axis(values: Sequence[int], nd: int, default: int, what: str,
             minimum: int = 1) -> tuple[int, ...]:
    """`values` checked to have `nd` entries, each >= minimum; `default`s when empty."""
    if not values:
        return (default,) * nd
    if len(values) != nd:
        raise ShapeError(f"{what} must have {nd} entries, got {list(values)}")
    if min(values) < minimum:
        raise ShapeError(f"{what} must be >= {minimum}, got {list(values)}")
    return tuple(values)


def window_params(nd: int, strides: Sequence[int], pads: Sequence[int],
                  dilations: Sequence[int] = ()):
    """(strides, pads_begin, pads_end, dilations) for `nd` spatial axes, checked."""
    strides = per_axis(strides, nd, 1, "strides")
    dilations = per_axis(dilations, nd, 1, "dilations")
    pads = per_axis(pads, 2 * nd, 0, "pads", minimum=0)
    return strides, pads[:nd], pads[nd:], dilations


def window_count(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
                 dilation: int, ceil_mode: bool = False, axis: int = 0) -> int:
    """How many windows fit along one spatial axis (ONNX/PyTorch output size)."""
    extent = dilation * (kernel - 1) + 1
    span = size + pad_begin + pad_end - extent
    # With ceil_mode a window may hang over the end, even one longer than the padded input
    # (PyTorch's rule, which ONNX follows: a 2-wide window over 1 element gives 1 output).
    count = (-(-span // stride) if ceil_mode else span // stride) + 1
    # ... as long as it starts in the input or the left pad.
    if ceil_mode and (count - 1) * stride >= size + pad_begin:
        count -= 1
    if count < 1 or span < 0 and not ceil_mode:
        raise ShapeError(f"window extent {extent} is larger than the padded input"
                         f" {size + pad_begin + pad_end} on spatial axis {axis}")
    return count


def windows(x: np.ndarray, out: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
            dilations: Sequence[int]) -> np.ndarray:
    """A read-only view [N, C, *out, *kernel] of the windows of an already padded x."""
    spatial = x.strides[2:]
    return as_strided(x, (*x.shape[:2], *out, *kernel),
                      (*x.strides[:2], *(t * s for t, s in zip(spatial, strides)),
                       *(t * d for t, d in zip(spatial, dilations))), writeable=False)


def _channel_check(x: TensorType, w: TensorType, bias: TensorType | None, groups: int,
                   in_channels: int, out_channels: int) -> None:
    """The checks conv and conv_transpose share: dtypes, channel counts, groups, bias."""
    same_dtype([x, w] + ([bias] if bias else []))
    require_dtype(x, FLOAT_TYPES)
    if groups < 1:
        raise ShapeError(f"groups must be >= 1, got {groups}")
    if x.shape[1] != in_channels:
        raise ShapeError(f"x has {x.shape[1]} channels, but the weight {w} with {groups}"
                         f" group(s) expects {in_channels}")
    for what, count in (("input", in_channels), ("output", out_channels)):
        if count % groups:
            raise ShapeError(f"{count} {what} channels do not split into {groups} groups")
    if bias is not None and bias.shape != (out_channels,):
        raise ShapeError(f"bias must have shape [{out_channels}], got {bias}")


def _conv_ranks(types) -> None:
    x, w = types[:2]
    if x.rank < 3:
        raise ShapeError(f"x must be [N, C, *spatial] with at least one spatial axis, got {x}")
    if w.rank != x.rank:
        raise ShapeError(f"weight rank must match x rank {x.rank}, got {w}")
    if min(w.shape[2:]) < 1:
        raise ShapeError(f"the kernel must not be empty, got weight {w}")


# -- conv ------------------------------------------------------------------------------

WINDOW_ATTRS = {"strides": Attr("ints", ()), "pads": Attr("ints", ()),
                "dilations": Attr("ints", ())}


def _conv_infer(types, attrs):
    _conv_ranks(types)
    x, w, bias = (*types, None)[:3]
    groups = attrs["groups"]
    _channel_check(x, w, bias, groups, w.shape[1] * groups, w.shape[0])
    nd = x.rank - 2
    strides, pb, pe, dilations = window_params(nd, attrs["strides"], attrs["pads"],
                                               attrs["dilations"])
    out = [window_count(*args, axis=i) for i, args in
           enumerate(zip(x.shape[2:], w.shape[2:], strides, pb, pe, dilations))]
    return TensorType(x.dtype, (x.shape[0], w.shape[0], *out))


def _conv_reference(x, w, bias=None, *, strides, pads, dilations, groups):
    nd = x.ndim - 2
    strides, pb, pe, dilations = window_params(nd, strides, pads, dilations)
    kernel = w.shape[2:]
    out = [window_count(*args) for args in
           zip(x.shape[2:], kernel, strides, pb, pe, dilations)]
    n, c, m, g = x.shape[0], x.shape[1], w.shape[0], groups
    padded = np.pad(x, [(0, 0), (0, 0), *zip(pb, pe)])
    view = windows(padded, out, kernel, strides, dilations)
    # im2col: [g, N*out, C/g*kernel] (a copy), times the weights as [g, C/g*kernel, M/g].
    view = view.reshape(n, g, c // g, *out, *kernel)
    perm = (1, 0, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd))
    cols = view.transpose(perm).reshape(g, n * math.prod(out), -1)
    # f32 sums in f64, rounded once: BLAS sums output channels in an order of its own
    # (an edge kernel for the last ones), so channels of equal weights could round apart
    # (light_squeezenet's logits tie in exact arithmetic; AVX2 OpenBLAS split off 40).
    wide = np.float64 if x.dtype == np.float32 else x.dtype
    y = (cols.astype(wide) @ w.reshape(g, m // g, -1).transpose(0, 2, 1).astype(wide)
         ).astype(x.dtype)
    y = y.reshape(g, n, math.prod(out), m // g).transpose(1, 0, 3, 2).reshape(n, m, *out)
    if bias is not None:
        y = y + bias.reshape(m, *(1,) * nd)
    return np.ascontiguousarray(y)


define("conv", arity=(2, 3), infer=_conv_infer, reference=_conv_reference,
       attrs={**WINDOW_ATTRS, "groups": Attr("int", 1)}, traits=("pure",),
       summary="N-d convolution (ONNX Conv): x [N,C,*S], w [M,C/groups,*K], bias [M]",
       family="linalg", category="contraction")

# -- packed_matmul -----------------------------------------------------------------------


def pack_matmul_weights(w: np.ndarray, lanes: int) -> np.ndarray:
    """w [K, N] as panels of `lanes` columns, [ceil(N / lanes), K, lanes], zero past N."""
    k, n = w.shape
    whole, rest = divmod(n, lanes)
    packed = np.zeros((whole + (rest > 0), k, lanes), w.dtype)
    if w.T.flags.c_contiguous:  # a view of a Linear's weight [N, K]: read its rows in blocks
        packed[:whole] = w.T[:whole * lanes].reshape(whole, lanes, k).transpose(0, 2, 1)
    else:
        packed[:whole] = w[:, :whole * lanes].reshape(k, whole, lanes).transpose(1, 0, 2)
    if rest:
        packed[whole, :, :rest] = w[:, whole * lanes:]
    return packed


def unpack_matmul_weights(wp: np.ndarray, n: int) -> np.ndarray:
    """The [K, N] matrix of panels `wp` (pack_matmul_weights)."""
    panels, k, lanes = wp.shape
    return wp.transpose(1, 0, 2).reshape(k, panels * lanes)[:, :n]


def _packed_matmul_infer(types, attrs):
    x, wp = types
    same_dtype(types)
    require_dtype(x, FLOAT_TYPES)
    n = attrs["n"]
    if x.rank < 2 or wp.rank != 3:
        raise ShapeError(f"x must have rank >= 2 and the packed weights be [ceil(N/L), K, L],"
                         f" got {x} and {wp}")
    if wp.shape[1] != x.shape[-1] or not 0 < n <= wp.shape[0] * wp.shape[2] \
            or n <= (wp.shape[0] - 1) * wp.shape[2]:
        raise ShapeError(f"packed weights {wp} do not hold a [{x.shape[-1]}, {n}] matrix")
    return TensorType(x.dtype, (*x.shape[:-1], n))


define("packed_matmul", arity=2, infer=_packed_matmul_infer,
       reference=lambda x, wp, *, n: np.matmul(x, unpack_matmul_weights(wp, n)),
       attrs={"n": Attr("int")}, traits=("pure",),
       summary="matmul by a constant matrix packed in panels of columns: x [..., M, K],"
               " wp [ceil(N/L), K, L] -> [..., M, N]", family="linalg",
       category="contraction")

# -- packed_conv -------------------------------------------------------------------------
#
# A 2-D conv with one group and no padding whose weights were packed at compile time
# (ember/graph/passes/pack_convs.py) for a kernel that puts output channels in the vector
# lanes: wp[q, k, l] = w[q * L + l, k] with k = (c, kh, kw) flattened, L the panel width.


def unpack_conv_weights(wp: np.ndarray, kernel_shape: Sequence[int]) -> np.ndarray:
    """The [M, C, KH, KW] weights that `wp` [M / L, C * KH * KW, L] packs."""
    panels, depth, lanes = wp.shape
    kh, kw = kernel_shape
    return wp.transpose(0, 2, 1).reshape(panels * lanes, depth // (kh * kw), kh, kw)


def pack_conv_weights(w: np.ndarray, lanes: int) -> np.ndarray:
    """w [M, C, KH, KW] as panels of `lanes` output channels: [M / lanes, C * KH * KW,
    lanes] (M a multiple of `lanes`)."""
    m = w.shape[0]
    return np.ascontiguousarray(w.reshape(m // lanes, lanes, -1).transpose(0, 2, 1))


def _packed_conv_infer(types, attrs):
    x, wp, bias = (*types, None)[:3]
    same_dtype(types)
    require_dtype(x, FLOAT_TYPES)
    kernel = per_axis(attrs["kernel_shape"], 2, 1, "kernel_shape")
    if x.rank != 4 or wp.rank != 3:
        raise ShapeError(f"x must be [N, C, H, W] and the packed weights [M/L, C*KH*KW, L],"
                         f" got {x} and {wp}")
    if wp.shape[1] != x.shape[1] * kernel[0] * kernel[1]:
        raise ShapeError(f"packed weights {wp} do not hold {x.shape[1]} channels of"
                         f" {kernel[0]}x{kernel[1]} taps")
    m = wp.shape[0] * wp.shape[2]
    if bias is not None and bias.shape != (m,):
        raise ShapeError(f"bias must have shape [{m}], got {bias}")
    strides, _, _, dilations = window_params(2, attrs["strides"], (), attrs["dilations"])
    out = [window_count(size, k, s, 0, 0, d, axis=i) for i, (size, k, s, d) in
           enumerate(zip(x.shape[2:], kernel, strides, dilations))]
    return TensorType(x.dtype, (x.shape[0], m, *out))


def _packed_conv_reference(x, wp, bias=None, *, kernel_shape, strides, dilations):
    w = unpack_conv_weights(wp, kernel_shape)
    return _conv_reference(x, w, bias, strides=strides, pads=(), dilations=dilations,
                           groups=1)


define("packed_conv", arity=(2, 3), infer=_packed_conv_infer,
       reference=_packed_conv_reference,
       attrs={"kernel_shape": Attr("ints", ()), "strides": Attr("ints", ()),
              "dilations": Attr("ints", ())}, traits=("pure",),
       summary="2-D conv, one group, no padding, weights packed in panels of output"
               " channels: x [N,C,H,W], wp [M/L,C*KH*KW,L], bias [M]", family="linalg",
       category="contraction")

# -- grouped_conv ------------------------------------------------------------------------
#
# A 2-D conv of G groups, each group of channels an image of its own
# (ember/graph/passes/group_convs.py): x [N*G, C/G, H, W] is a conv's x [N, C, H, W] as it
# lies in memory, w [G, M/G, C/G, KH, KW] its weights per group, bias [G, M/G]; image b is
# convolved with w[b % G], and the output [N*G, M/G, OH, OW] is the conv's [N, M, OH, OW].


def _grouped_conv_infer(types, attrs):
    x, w, bias = (*types, None)[:3]
    same_dtype(types)
    require_dtype(x, FLOAT_TYPES)
    if x.rank != 4 or w.rank != 5:
        raise ShapeError(f"x must be [N*G, C/G, H, W] and w [G, M/G, C/G, KH, KW], got {x}"
                         f" and {w}")
    groups, per_group = w.shape[:2]
    if x.shape[1] != w.shape[2] or isinstance(x.shape[0], int) and x.shape[0] % groups:
        raise ShapeError(f"x {x} is not images of {groups} groups of {w.shape[2]} channels")
    if bias is not None and bias.shape != (groups, per_group):
        raise ShapeError(f"bias must have shape [{groups}, {per_group}], got {bias}")
    strides, pb, pe, dilations = window_params(2, attrs["strides"], attrs["pads"],
                                               attrs["dilations"])
    out = [window_count(*args, axis=i) for i, args in
           enumerate(zip(x.shape[2:], w.shape[3:], strides, pb, pe, dilations))]
    return TensorType(x.dtype, (x.shape[0], per_group, *out))


def _grouped_conv_reference(x, w, bias=None, *, strides, pads, dilations):
    groups, per_group, channels = w.shape[:3]
    images = x.shape[0] // groups
    y = _conv_reference(x.reshape(images, groups * channels, *x.shape[2:]),
                        w.reshape(groups * per_group, *w.shape[2:]),
                        None if bias is None else bias.reshape(-1), strides=strides,
                        pads=pads, dilations=dilations, groups=groups)
    return y.reshape(images * groups, per_group, *y.shape[2:])


define("grouped_conv", arity=(2, 3), infer=_grouped_conv_infer,
       reference=_grouped_conv_reference, attrs=dict(WINDOW_ATTRS), traits=("pure",),
       summary="2-D conv of G groups as images: x [N*G,C/G,H,W], w [G,M/G,C/G,KH,KW],"
               " bias [G,M/G]; image b by w[b % G]", family="linalg", category="contraction")

# -- conv_transpose ----------------------------------------------------------------------


def _transpose_geometry(in_spatial, kernel, attrs):
    """(strides, pads_begin, dilations, output spatial sizes) of a conv_transpose."""
    nd = len(in_spatial)
    strides, pb, pe, dilations = window_params(nd, attrs["strides"], attrs["pads"],
                                               attrs["dilations"])
    extra = per_axis(attrs["output_padding"], nd, 0, "output_padding", minimum=0)
    out = []
    for i in range(nd):
        if extra[i] >= max(strides[i], dilations[i]):
            raise ShapeError(f"output_padding {list(extra)} must be smaller than the stride"
                             f" or the dilation on each axis")
        size = ((in_spatial[i] - 1) * strides[i] - pb[i] - pe[i]
                + dilations[i] * (kernel[i] - 1) + extra[i] + 1)
        if size < 1:
            raise ShapeError(f"output size {size} on spatial axis {i} is not positive")
        out.append(size)
    return strides, pb, dilations, out


def _conv_transpose_infer(types, attrs):
    _conv_ranks(types)
    x, w, bias = (*types, None)[:3]
    groups = attrs["groups"]
    _channel_check(x, w, bias, groups, w.shape[0], w.shape[1] * groups)
    out = _transpose_geometry(x.shape[2:], w.shape[2:], attrs)[3]
    return TensorType(x.dtype, (x.shape[0], w.shape[1] * groups, *out))


def _conv_transpose_reference(x, w, bias=None, **attrs):
    nd = x.ndim - 2
    in_spatial, kernel = x.shape[2:], w.shape[2:]
    strides, pb, dilations, out = _transpose_geometry(in_spatial, kernel, attrs)
    n, c, g, mg = x.shape[0], x.shape[1], attrs["groups"], w.shape[1]
    # cols [N, M, *in, *kernel]: what every input pixel adds at every kernel offset.
    rows = x.reshape(n, g, c // g, -1).transpose(1, 0, 3, 2).reshape(g, -1, c // g)
    cols = rows @ w.reshape(g, c // g, -1)  # [g, N*in, M/g*kernel]
    cols = cols.reshape(g, n, *in_spatial, mg, *kernel)
    perm = (1, 0, 2 + nd, *range(2, 2 + nd), *range(3 + nd, 3 + 2 * nd))
    cols = cols.transpose(perm).reshape(n, g * mg, *in_spatial, *kernel)
    # col2im: scatter-add each kernel offset into a buffer covering every touched pixel
    # and the output window, then crop the begin pads.
    touched = [(i - 1) * s + d * (k - 1) + 1
               for i, s, d, k in zip(in_spatial, strides, dilations, kernel)]
    buf = np.zeros((n, g * mg, *(max(t, p + o) for t, p, o in zip(touched, pb, out))),
                   dtype=cols.dtype)
    for offset in np.ndindex(*kernel):
        where = tuple(slice(k * d, k * d + (i - 1) * s + 1, s) for k, d, i, s
                      in zip(offset, dilations, in_spatial, strides))
        buf[(..., *where)] += cols[(..., *offset)]
    y = buf[(..., *(slice(p, p + o) for p, o in zip(pb, out)))]
    if bias is not None:
        y = y + bias.reshape(-1, *(1,) * nd)
    return np.ascontiguousarray(y)


define("conv_transpose", arity=(2, 3), infer=_conv_transpose_infer,
       reference=_conv_transpose_reference,
       attrs={**WINDOW_ATTRS, "groups": Attr("int", 1), "output_padding": Attr("ints", ())},
       traits=("pure",),
       summary="N-d transposed convolution (ONNX ConvTranspose, explicit pads):"
               " w [C,M/groups,*K]", family="linalg", category="contraction")

# -- attention -----------------------------------------------------------------------------


def _attention_infer(types, attrs):
    q, kt, v = types[:3]
    same_dtype(types)
    require_dtype(q, FLOAT_TYPES)
    if not q.rank == kt.rank == v.rank >= 3:
        raise ShapeError(f"q, kt and v must have one rank, at least 3 ([*batch, rows, dim]),"
                         f" got {q}, {kt}, {v}")
    *batch, rows, dim = q.shape
    keys = kt.shape[-1]
    if kt.shape[:-1] != (*batch, dim) or v.shape[:-1] != (*batch, keys):
        raise ShapeError(f"attention needs q [*B, L, D], kt [*B, D, S] and v [*B, S, E], got"
                         f" {q}, {kt} and {v}")
    if len(types) == 4:
        mask = types[3]
        if mask.rank != q.rank or mask.shape[-2:] != (rows, keys) or \
                any(m not in (1, b) for m, b in zip(mask.shape[:-2], batch)):
            raise ShapeError(f"the mask must be [*B or 1s, {rows}, {keys}] for batch dims"
                             f" {list(batch)}, got {mask}")
    return q.with_shape((*batch, rows, v.shape[-1]))


def _attention_reference(q, kt, v, mask=None, *, scale, empty_rows_zero):
    scores = np.matmul(q, kt)
    if scale != 1:
        scores = scores * np.asarray(scale, scores.dtype)
    if mask is not None:
        scores = scores + mask
    top = scores.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - top)
        weights = weights / weights.sum(axis=-1, keepdims=True)
    if empty_rows_zero:
        weights = np.where(np.isneginf(scores).all(axis=-1, keepdims=True), 0, weights)
    return np.matmul(weights, v).astype(q.dtype)


define("attention", arity=(3, 4), infer=_attention_infer, reference=_attention_reference,
       attrs={"scale": Attr("float", 1.0), "empty_rows_zero": Attr("bool", False)},
       traits=("pure",), family="linalg",
       summary="softmax(q @ kt * scale + mask) @ v over the last axis (scaled dot-product"
               " attention), on batch dims that q, kt, v share and the mask has or is 1 in;"
               " rows whose scores are all -inf give 0 with empty_rows_zero, else NaN")
