"""Converters of core ATen linear algebra and neural-net ops: matrix products,
convolutions, pooling, normalizations, upsampling and attention.

Where an ATen op returns statistics or indices next to its result (native_layer_norm's
mean and rstd, max_pool's indices), those are computed only when the graph reads them.
"""

from __future__ import annotations

import math

import numpy as np

from ember.dtypes import DType
from ember.frontends.torch.aten_tensor import filled, reshape, slice_axis, transpose, used_results
from ember.frontends.torch.context import ConvertContext, aten, overload_name
from ember.graph.ir import Value


def _per_dim(ctx: ConvertContext, values, nd: int, what: str) -> list[int]:
    """An int or list of ints as one entry per spatial dim (PyTorch repeats a single one)."""
    values = [values] if isinstance(values, int) else list(values)
    if len(values) == 1:
        values *= nd
    if len(values) != nd:
        raise ctx.unsupported(f"{what} {values} for {nd} spatial dims")
    return values


def _scaled(ctx: ConvertContext, x: Value, factor) -> Value:
    return x if factor == 1 else ctx.b.mul(x, ctx.constant(factor, x.dtype))


# -- matrix products ------------------------------------------------------------------------
@aten("mm.default", "bmm.default", "matmul.default", "mv.default", "dot.default")
def matmul(ctx: ConvertContext, a, b):
    return ctx.b.matmul(a, b)


@aten("addmm.default", "baddbmm.default", "addmv.default")
def addmm(ctx: ConvertContext, bias, a, b, beta=1, alpha=1):
    product = _scaled(ctx, ctx.b.matmul(a, b), alpha)
    if beta == 0:  # PyTorch ignores the bias then, NaNs included
        return product
    return ctx.b.add(product, _scaled(ctx, ctx.as_value(bias, product.dtype), beta))


# -- convolution ----------------------------------------------------------------------------
@aten("convolution.default", "_convolution.default")
def convolution(ctx: ConvertContext, x, weight, bias, stride, padding, dilation, transposed,
                output_padding, groups, *_):
    nd = x.type.rank - 2
    attrs = {"strides": _per_dim(ctx, stride, nd, "stride"),
             "pads": _per_dim(ctx, padding, nd, "padding") * 2,
             "dilations": _per_dim(ctx, dilation, nd, "dilation"), "groups": groups}
    operands = [x, weight] + ([bias] if bias is not None else [])
    if transposed:
        return ctx.b.conv_transpose(
            *operands, **attrs, output_padding=_per_dim(ctx, output_padding, nd,
                                                        "output_padding"))
    if any(output_padding):
        raise ctx.unsupported("output_padding on a convolution that is not transposed")
    return ctx.b.conv(*operands, **attrs)


# -- pooling --------------------------------------------------------------------------------
def _batched(ctx: ConvertContext, x: Value, nd: int, pool) -> Value:
    """pool(x) on [N, C, *spatial], also for an unbatched [C, *spatial] x."""
    if x.type.rank == nd + 2:
        return pool(x)
    y = pool(reshape(ctx, x, (1,) + x.shape))
    return reshape(ctx, y, y.shape[1:])


def _window(ctx, nd: int, kernel, stride, padding) -> dict:
    kernel = _per_dim(ctx, kernel, nd, "kernel_size")
    return {"kernel": kernel,
            "strides": _per_dim(ctx, stride, nd, "stride") if stride else kernel,
            "pads": _per_dim(ctx, padding, nd, "padding") * 2}


_MAX_POOLS = {f"max_pool{n}d{suffix}.default": n for n in (1, 2, 3)
              for suffix in ("", "_with_indices")}


def _pool_with_indices(ctx: ConvertContext, x: Value, windows: list[np.ndarray]):
    """(max, flat index of the max) over windows given per spatial dim as [O_d, K_d]
    arrays of input coordinates (-1: outside the input), on [N, C, *spatial] x.

    The windows' elements are gathered into [N, C, O, K] from x flattened to [N, C, S]
    with one lowest-value element appended, where the outside taps point; each row lists
    its inside taps first, so that argmax's first-of-equals is ATen's first tap."""
    nd, b = len(windows), ctx.b
    sizes = x.shape[2:]
    flat, inside = np.zeros((), np.int64), np.ones((), bool)
    for d, coords in enumerate(windows):  # broadcast to [O_1..O_n, K_1..K_n]
        shape = [1] * (2 * nd)
        shape[d], shape[nd + d] = coords.shape
        coords = coords.reshape(shape)
        flat = flat * sizes[d] + np.maximum(coords, 0)
        inside = inside & (coords >= 0)
    outs = tuple(c.shape[0] for c in windows)
    inside = np.broadcast_to(inside, flat.shape).reshape(math.prod(outs), -1)
    flat = flat.reshape(inside.shape)
    order = np.argsort(~inside, axis=1, kind="stable")
    flat = np.take_along_axis(np.where(inside, flat, math.prod(sizes)), order, axis=1)
    lowest = -math.inf if x.dtype.is_float else float(np.iinfo(x.dtype.np).min)
    n, c = x.shape[:2]
    padded = b.pad(reshape(ctx, x, (n, c, math.prod(sizes))), pads=[0, 0, 0, 0, 0, 1],
                   value=lowest)
    taps = b.gather(padded, b.constant(flat), axis=2)  # [N, C, O, K]
    values = b.reduce_max(taps, axes=(3,))
    which = b.argmax(taps, axis=3, keepdims=True)
    table = b.broadcast(b.constant(flat), shape=(n, c) + flat.shape)
    indices = b.gather_elements(table, which, axis=3)
    return reshape(ctx, values, (n, c) + outs), reshape(ctx, indices, (n, c) + outs)


def _batched_pair(ctx: ConvertContext, x: Value, nd: int, pool):
    """pool(x) -> (values, indices) on [N, C, *spatial], also for an unbatched x."""
    if x.type.rank == nd + 2:
        return pool(x)
    values, indices = pool(reshape(ctx, x, (1,) + x.shape))
    return reshape(ctx, values, values.shape[1:]), reshape(ctx, indices, indices.shape[1:])


def _max_pool_windows(n: int, out: int, kernel: int, stride: int, pad: int,
                      dilation: int) -> np.ndarray:
    coords = (np.arange(out)[:, None] * stride - pad + np.arange(kernel)[None, :] * dilation)
    return np.where((coords >= 0) & (coords < n), coords, -1)


def _adaptive_windows(n: int, out: int) -> np.ndarray:
    """PyTorch's adaptive windows [floor(i*n/o), ceil((i+1)*n/o)), padded with -1."""
    starts = [i * n // out for i in range(out)]
    ends = [-(-(i + 1) * n // out) for i in range(out)]
    width = max((e - s for s, e in zip(starts, ends)), default=0)
    coords = np.array(starts)[:, None] + np.arange(width)[None, :]
    return np.where(coords < np.array(ends)[:, None], coords, -1).reshape(out, width)


@aten(*_MAX_POOLS)
def max_pool(ctx: ConvertContext, x, kernel_size, stride=(), padding=0, dilation=1,
             ceil_mode=False):
    name = overload_name(ctx.node.target)
    nd = _MAX_POOLS[name]
    attrs = _window(ctx, nd, kernel_size, stride, padding)
    if "indices" in name and 1 in used_results(ctx):
        dilations = _per_dim(ctx, dilation, nd, "dilation")
        outs = ctx.result_type(0).shape[-nd:]
        windows = [_max_pool_windows(*args) for args in zip(
            x.shape[-nd:], outs, attrs["kernel"], attrs["strides"], attrs["pads"][:nd],
            dilations)]
        return _batched_pair(ctx, x, nd, lambda v: _pool_with_indices(ctx, v, windows))
    y = _batched(ctx, x, nd, lambda v: ctx.b.max_pool(
        v, **attrs, dilations=_per_dim(ctx, dilation, nd, "dilation"), ceil_mode=ceil_mode))
    return (y, None) if "indices" in name else y


_AVG_POOLS = {f"avg_pool{n}d.default": n for n in (1, 2, 3)}


@aten(*_AVG_POOLS)
def avg_pool(ctx: ConvertContext, x, kernel_size, stride=(), padding=0, ceil_mode=False,
             count_include_pad=True, divisor_override=None):
    nd = _AVG_POOLS[overload_name(ctx.node.target)]
    attrs = _window(ctx, nd, kernel_size, stride, padding)
    include = count_include_pad or divisor_override is not None
    y = _batched(ctx, x, nd, lambda v: ctx.b.avg_pool(
        v, **attrs, ceil_mode=ceil_mode, count_include_pad=include))
    if divisor_override is None:
        return y
    # Every window averaged over the whole kernel (padding included) when none overhangs
    # the end: then the sum is that average times the kernel size.
    spatial = x.shape[x.type.rank - nd:]
    full = all((o - 1) * s + k <= n + 2 * p for o, s, k, n, p in zip(
        y.shape[y.type.rank - nd:], attrs["strides"], attrs["kernel"], spatial,
        attrs["pads"]))
    if not full:
        raise ctx.unsupported("divisor_override with ceil_mode windows past the end")
    return _scaled(ctx, y, math.prod(attrs["kernel"]) / divisor_override)


_ADAPTIVE = {f"_adaptive_avg_pool{n}d.default": ("avg", n) for n in (1, 2, 3)} | {
    f"adaptive_max_pool{n}d.default": ("max", n) for n in (1, 2, 3)}


@aten(*_ADAPTIVE)
def adaptive_pool(ctx: ConvertContext, x, output_size):
    kind, nd = _ADAPTIVE[overload_name(ctx.node.target)]
    sizes = x.shape[x.type.rank - nd:]
    out = ctx.result_type(0 if kind == "max" else None).shape[x.type.rank - nd:]
    if kind == "max" and 1 in used_results(ctx):
        windows = [_adaptive_windows(n, o) for n, o in zip(sizes, out)]
        return _batched_pair(ctx, x, nd, lambda v: _pool_with_indices(ctx, v, windows))
    if all(n % o == 0 for n, o in zip(sizes, out)):  # equal windows: a plain pool
        kernel = [n // o for n, o in zip(sizes, out)]
        pool = getattr(ctx.b, f"{kind}_pool")
        y = _batched(ctx, x, nd, lambda v: pool(v, kernel=kernel, strides=kernel))
    else:  # PyTorch's windows [floor(i*n/o), ceil((i+1)*n/o)), one axis at a time
        reduce = ctx.b.reduce_mean if kind == "avg" else ctx.b.reduce_max
        y = x
        for axis, n, o in zip(range(x.type.rank - nd, x.type.rank), sizes, out):
            parts = [reduce(slice_axis(ctx, y, axis, i * n // o, -(-(i + 1) * n // o)),
                            axes=(axis,), keepdims=True) for i in range(o)]
            y = parts[0] if len(parts) == 1 else ctx.b.concat(*parts, axis=axis)
    return (y, None) if kind == "max" else y


# -- normalization --------------------------------------------------------------------------
def _stats(ctx: ConvertContext, x: Value, axes, eps: float, want: set[int],
           first: int = 1) -> list[Value | None]:
    """[mean, rstd] over `axes` as results `first` and `first + 1` (those in `want`)."""
    if not want & {first, first + 1}:
        return [None, None]
    xf = x if x.dtype in (DType.f32, DType.f64) else ctx.b.cast(x, to=DType.f32)
    mean = ctx.b.reduce_mean(xf, axes=tuple(axes), keepdims=True)
    d = ctx.b.sub(xf, mean)
    var = ctx.b.reduce_mean(ctx.b.mul(d, d), axes=tuple(axes), keepdims=True)
    rstd = ctx.b.rsqrt(ctx.b.add(var, ctx.constant(eps, xf.dtype)))
    results = []
    for i, value in ((first, mean), (first + 1, rstd)):
        t = ctx.result_type(i)
        value = reshape(ctx, value, t.shape)
        results.append(value if value.dtype is t.dtype else ctx.b.cast(value, to=t.dtype))
    return results


def _param(ctx: ConvertContext, p: Value | None, fill: float, shape, dtype: DType) -> Value:
    return filled(ctx, fill, shape, dtype) if p is None else ctx.as_value(p, dtype)


def _normalized(ctx: ConvertContext, x: Value, axes, eps: float) -> Value:
    """(x - mean) * rsqrt(var + eps) over `axes`, in f32 for halves: what the IR's
    normalization ops compute, spelled out for an eps they refuse (a negative one, which
    PyTorch accepts and which gives NaN where var + eps < 0)."""
    xf = x if x.dtype in (DType.f32, DType.f64) else ctx.b.cast(x, to=DType.f32)
    d = ctx.b.sub(xf, ctx.b.reduce_mean(xf, axes=tuple(axes), keepdims=True))
    var = ctx.b.reduce_mean(ctx.b.mul(d, d), axes=tuple(axes), keepdims=True)
    return ctx.b.mul(d, ctx.b.rsqrt(ctx.b.add(var, ctx.constant(eps, xf.dtype))))


def _affine(ctx: ConvertContext, y: Value, weight, bias, shape, dtype: DType) -> Value:
    """y * weight + bias (each optional, reshaped to broadcast as `shape`), as `dtype`."""
    for p, op in ((weight, ctx.b.mul), (bias, ctx.b.add)):
        if p is not None:
            y = op(y, reshape(ctx, ctx.as_value(p, y.dtype), shape))
    return y if y.dtype is dtype else ctx.b.cast(y, to=dtype)


@aten("native_layer_norm.default")
def native_layer_norm(ctx: ConvertContext, x, normalized_shape, weight, bias, eps):
    axis = x.type.rank - len(normalized_shape)
    if eps < 0:
        y = _normalized(ctx, x, range(axis, x.type.rank), eps)
        y = _affine(ctx, y, weight, bias, x.shape[axis:], x.dtype)
        return (y, *_stats(ctx, x, range(axis, x.type.rank), eps, used_results(ctx)))
    params = [] if weight is None and bias is None else [_param(ctx, weight, 1, (), x.dtype)]
    if bias is not None:
        params.append(ctx.as_value(bias, x.dtype))
    y = ctx.b.layer_norm(x, *params, axis=axis, epsilon=eps)
    return (y, *_stats(ctx, x, range(axis, x.type.rank), eps, used_results(ctx)))


@aten("native_group_norm.default")
def native_group_norm(ctx: ConvertContext, x, weight, bias, n, c, hxw, group, eps):
    if eps < 0:
        grouped = reshape(ctx, x, (n, group, x.type.numel // max(n * group, 1)))
        y = reshape(ctx, _normalized(ctx, grouped, (2,), eps), x.shape)
        y = _affine(ctx, y, weight, bias, (c,) + (1,) * (x.type.rank - 2), x.dtype)
        return (y, *_stats(ctx, grouped, (2,), eps, used_results(ctx)))
    scale, shift = (_param(ctx, p, f, (c,), x.dtype) for p, f in ((weight, 1), (bias, 0)))
    y = ctx.b.group_norm(x, scale, shift, num_groups=group, epsilon=eps)
    grouped = reshape(ctx, x, (n, group, x.type.numel // max(n * group, 1)))
    return (y, *_stats(ctx, grouped, (2,), eps, used_results(ctx)))


@aten("_native_batch_norm_legit_no_training.default")
def batch_norm(ctx: ConvertContext, x, weight, bias, running_mean, running_var, momentum, eps):
    c = x.shape[1]
    scale, shift = (_param(ctx, p, f, (c,), x.dtype) for p, f in ((weight, 1), (bias, 0)))
    y = ctx.b.batch_norm(x, scale, shift, ctx.as_value(running_mean, x.dtype),
                         ctx.as_value(running_var, x.dtype), epsilon=eps)
    # The saved statistics are empty tensors in inference.
    empty = [filled(ctx, 0, ctx.result_type(i).shape, ctx.result_type(i).dtype)
             if i in used_results(ctx) else None for i in (1, 2)]
    return (y, *empty)


@aten("_native_batch_norm_legit.default", "native_batch_norm.default")
def batch_norm_legit(ctx: ConvertContext, x, weight, bias, running_mean, running_var,
                     training, momentum, eps):
    if not training:
        return batch_norm(ctx, x, weight, bias, running_mean, running_var, momentum, eps)
    if running_mean is not None or running_var is not None:
        raise ctx.unsupported("batch norm in training mode updates its running statistics")
    return batch_norm_batch_stats(ctx, x, weight, bias, training, momentum, eps)


@aten("_native_batch_norm_legit.no_stats")
def batch_norm_batch_stats(ctx: ConvertContext, x, weight, bias, training, momentum, eps):
    """Normalized by the statistics of the batch itself (how InstanceNorm reaches here)."""
    if not training:
        raise ctx.unsupported("batch norm without running statistics outside training mode")
    c, rank = x.shape[1], x.type.rank
    axes = (0, *range(2, rank))
    xf = x if x.dtype in (DType.f32, DType.f64) else ctx.b.cast(x, to=DType.f32)
    d = ctx.b.sub(xf, ctx.b.reduce_mean(xf, axes=axes, keepdims=True))
    var = ctx.b.reduce_mean(ctx.b.mul(d, d), axes=axes, keepdims=True)
    y = ctx.b.mul(d, ctx.b.rsqrt(ctx.b.add(var, ctx.constant(eps, xf.dtype))))
    per_channel = (c,) + (1,) * (rank - 2)
    if weight is not None:
        y = ctx.b.mul(y, reshape(ctx, ctx.as_value(weight, xf.dtype), per_channel))
    if bias is not None:
        y = ctx.b.add(y, reshape(ctx, ctx.as_value(bias, xf.dtype), per_channel))
    y = y if y.dtype is x.dtype else ctx.b.cast(y, to=x.dtype)
    return (y, *_stats(ctx, x, axes, eps, used_results(ctx)))


# -- upsampling -----------------------------------------------------------------------------
_UPSAMPLE = {}
for _n, _mode in ((1, "nearest"), (2, "nearest"), (3, "nearest"), (1, "linear"),
                  (2, "bilinear"), (3, "trilinear"), (2, "bicubic")):
    for _overload in ("vec", "default"):
        _UPSAMPLE[f"upsample_{_mode}{_n}d.{_overload}"] = (_mode, _n)
        if _mode == "nearest":
            _UPSAMPLE[f"_upsample_nearest_exact{_n}d.{_overload}"] = ("nearest_exact", _n)


@aten(*_UPSAMPLE)
def upsample(ctx: ConvertContext, x, output_size, *args):
    """.vec: (output_size, [align_corners,] scale_factors); .default: (output_size,
    [align_corners,] *per-dim scales)."""
    name = overload_name(ctx.node.target)
    mode, nd = _UPSAMPLE[name]
    align_corners = False
    if not mode.startswith("nearest"):
        align_corners, args = bool(args[0]), args[1:]
    if name.endswith(".vec"):
        args = args[0] if args and args[0] is not None else []
    args = list(args) + [None] * (nd - len(args))  # FX leaves out trailing defaults
    sizes = ctx.result_type().shape
    scales = []
    if not align_corners and any(s is not None and s > 0 for s in args):
        # PyTorch maps with 1/scale when a scale is given, else with in/out.
        scales = [1.0, 1.0] + [float(s) if s is not None and s > 0 else o / i for s, i, o in
                               zip(args, x.shape[2:], sizes[2:])]
    if mode.startswith("nearest"):
        attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                 "nearest_mode": "floor"} if mode == "nearest" else {
            "mode": "nearest", "coordinate_transformation_mode": "half_pixel",
            "nearest_mode": "round_prefer_ceil"}
    else:
        # half_pixel with the source clamped at 0 (which linear taps do at the border),
        # and PyTorch's bicubic is Keys' with a = -0.75 and border-clamped taps.
        attrs = {"mode": "cubic" if mode == "bicubic" else "linear", "cubic_coeff_a": -0.75,
                 "coordinate_transformation_mode":
                     "align_corners" if align_corners else "half_pixel"}
    return ctx.b.resize(x, sizes=sizes, scales=scales, **attrs)


# -- attention and shuffles -----------------------------------------------------------------
@aten("_scaled_dot_product_flash_attention_for_cpu.default")
def sdpa_flash_cpu(ctx: ConvertContext, q, k, v, dropout_p=0.0, is_causal=False, *,
                   attn_mask=None, scale=None):
    if dropout_p:
        raise ctx.unsupported("attention dropout")
    if 1 in used_results(ctx):
        raise ctx.unsupported("the logsumexp result of attention is not supported")
    mask = [] if attn_mask is None else [ctx.as_value(attn_mask, q.dtype)
                                         if attn_mask.dtype is not DType.bool else attn_mask]
    y = ctx.b.sdpa(q, k, v, *mask, scale=math.nan if scale is None else scale,
                   is_causal=bool(is_causal))
    return y, None


@aten("pixel_shuffle.default", "pixel_unshuffle.default")
def pixel_shuffle(ctx: ConvertContext, x, factor):
    *batch, c, h, w = x.shape
    n, r = len(batch), factor
    if overload_name(ctx.node.target).startswith("pixel_shuffle"):
        y = reshape(ctx, x, (*batch, c // (r * r), r, r, h, w))
        perm = (*range(n), n, n + 3, n + 1, n + 4, n + 2)  # [*, C, H, r, W, r]
    else:
        y = reshape(ctx, x, (*batch, c, h // r, r, w // r, r))
        perm = (*range(n), n, n + 2, n + 4, n + 1, n + 3)  # [*, C, r, r, H, W]
    return reshape(ctx, transpose(ctx, y, perm), ctx.result_type().shape)


# -- batch norm with running statistics (functional: the updated statistics are results) --
def _updated_stats(ctx: ConvertContext, x: Value, running_mean, running_var, momentum):
    """ATen's running statistics after a training step: (1 - m) * old + m * new, the new
    variance unbiased (n / (n - 1))."""
    b, c = ctx.b, x.shape[1]
    axes = (0, *range(2, x.type.rank))
    count = x.type.numel // max(c, 1)
    xf = x if x.dtype in (DType.f32, DType.f64) else b.cast(x, to=DType.f32)
    mean = b.reduce_mean(xf, axes=axes)
    d = b.sub(xf, b.reduce_mean(xf, axes=axes, keepdims=True))
    var = b.div(b.reduce_sum(b.mul(d, d), axes=axes), ctx.constant(max(count - 1, 0), xf.dtype))
    out = []
    for old, new in ((running_mean, mean), (running_var, var)):
        old = ctx.as_value(old, new.dtype)
        step = b.add(b.mul(old, 1 - momentum), b.mul(new, momentum))
        out.append(ctx.as_value(step, running_mean.dtype))
    return out


@aten("_native_batch_norm_legit_functional.default")
def batch_norm_functional(ctx: ConvertContext, x, weight, bias, running_mean, running_var,
                          training, momentum, eps):
    if not training:  # the running statistics normalize and come back unchanged
        y, *stats = batch_norm(ctx, x, weight, bias, running_mean, running_var, momentum, eps)
        return (y, *stats, running_mean, running_var)
    y, *stats = batch_norm_batch_stats(ctx, x, weight, bias, training, momentum, eps)
    return (y, *stats, *_updated_stats(ctx, x, running_mean, running_var, momentum))


@aten("_batch_norm_with_update_functional.default")
def batch_norm_with_update(ctx: ConvertContext, x, weight, bias, running_mean, running_var,
                           momentum, eps):
    y, mean, rstd = batch_norm_batch_stats(ctx, x, weight, bias, True, momentum, eps)
    reserve = ctx.result_type(3)  # a buffer for the backward, empty on CPU
    return (y, mean, rstd, filled(ctx, 0, reserve.shape, reserve.dtype),
            *_updated_stats(ctx, x, running_mean, running_var, momentum))
