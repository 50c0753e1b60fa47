"""Converters of ONNX shape and data-movement ops: Reshape, Flatten, Squeeze, Unsqueeze,
Transpose, Concat, Split, Slice, Pad, CenterCropPad, Expand, Tile, Shape, Size,
DepthToSpace and SpaceToDepth. (Gather, scatter, scans and friends: ops/tensor_index.py.)

Ember's shapes are static, so the inputs that decide a shape (Reshape's `shape`, Slice's
`starts`, ...) must be constants, and Shape and Size fold to constants.
"""

from __future__ import annotations

import math

import numpy as np

from ember.errors import ShapeError
from ember.frontends.onnx.context import ConvertContext, converter
from ember.graph.ir import Value
from ember.graph.ops.common import broadcast_shapes, normalize_axis
from ember.graph.symbolic import Dim, is_static_shape

# -- helpers -----------------------------------------------------------------------------

def const_ints(ctx: ConvertContext, index: int, what: str | None = None) -> list[int]:
    """The known value of input `index` as a list of Python ints (a scalar gives one)."""
    return [v if isinstance(v, Dim) else int(v)  # (a size of a symbolic import)
            for v in np.asarray(ctx.const(index, what)).reshape(-1)]


def axis_arg(ctx: ConvertContext, axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [-rank, rank) as a non-negative index, or an error naming the node."""
    try:
        return normalize_axis(axis, rank, what)
    except ShapeError as e:
        raise ctx.error(str(e)) from None


def axes_arg(ctx: ConvertContext, axes, rank: int) -> list[int]:
    """Normalized `axes`, which must not repeat."""
    out = [axis_arg(ctx, a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ctx.error(f"axes {list(axes)} repeat an axis")
    return out


def attr_or_input(ctx: ConvertContext, name: str, index: int, input_since: int):
    """A list of ints given as attribute `name` before opset `input_since` and as input
    `index` from then on; None when absent."""
    if ctx.opset < input_since:
        return ctx.attr(name)
    return const_ints(ctx, index, f"'{name}'") if ctx.input(index) is not None else None


def slice_axes(b, x: Value, ranges: dict[int, tuple[int, int, int]]) -> Value:
    """x sliced on the given axes by (start, end, step) in Python range semantics."""
    full = [tuple(ranges.get(a, (0, d, 1))) for a, d in enumerate(x.shape)]
    if all(r == (0, d, 1) for r, d in zip(full, x.shape)):
        return x
    starts, ends, steps = zip(*full)
    return b.slice(x, starts=starts, ends=ends, steps=steps)


def reshape(b, x: Value, shape) -> Value:
    shape = tuple(d if isinstance(d, Dim) else int(d) for d in shape)
    return x if shape == x.shape else b.reshape(x, shape=shape)


# -- reshaping ---------------------------------------------------------------------------

@converter("Reshape")
def reshape_(ctx: ConvertContext):
    x = ctx.require(0)
    target = attr_or_input(ctx, "shape", 1, input_since=5)
    if target is None:
        raise ctx.error("the target shape is required")
    allowzero = ctx.attr("allowzero", 0)
    if not allowzero:  # 0 copies the input's dim at that position
        if any(d == 0 and i >= x.type.rank for i, d in enumerate(target)):
            raise ctx.error(f"shape {target} copies a dim (0) that {x.type} lacks")
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    unknown = [i for i, d in enumerate(target) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in target):
        raise ctx.error(f"shape {target} must hold non-negative dims and at most one -1")
    if unknown:
        known = math.prod(d for d in target if d != -1)
        if known == 0 or x.type.numel % known:
            raise ctx.error(f"cannot reshape {x.type} to {target}")
        target[unknown[0]] = x.type.numel // known
    return reshape(ctx.b, x, target)


@converter("Flatten")
def flatten(ctx: ConvertContext):
    x = ctx.require(0)
    axis = ctx.attr("axis", 1)
    axis = axis + x.type.rank if axis < 0 else axis
    if not 0 <= axis <= x.type.rank:
        raise ctx.error(f"axis {ctx.attr('axis')} is out of range for {x.type}")
    return reshape(ctx.b, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


@converter("Squeeze")
def squeeze(ctx: ConvertContext):
    x = ctx.require(0)
    axes = attr_or_input(ctx, "axes", 1, input_since=13)
    if axes is None:  # every dim of size 1
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = axes_arg(ctx, axes, x.type.rank)
    if any(x.shape[a] != 1 for a in axes):
        raise ctx.error(f"cannot squeeze axes {axes} of {x.type}: their size is not 1")
    return reshape(ctx.b, x, [d for i, d in enumerate(x.shape) if i not in axes])


@converter("Unsqueeze")
def unsqueeze(ctx: ConvertContext):
    x = ctx.require(0)
    axes = attr_or_input(ctx, "axes", 1, input_since=13)
    if axes is None:
        raise ctx.error("axes are required")
    rank = x.type.rank + len(axes)
    axes = axes_arg(ctx, axes, rank)  # they index the result
    dims = iter(x.shape)
    return reshape(ctx.b, x, [1 if i in axes else next(dims) for i in range(rank)])


@converter("Transpose")
def transpose(ctx: ConvertContext):
    x = ctx.require(0)
    perm = ctx.attr("perm", list(reversed(range(x.type.rank))))
    perm = [p + x.type.rank if p < 0 else p for p in perm]
    return x if perm == list(range(x.type.rank)) else ctx.b.transpose(x, perm=perm)


@converter("Expand", since=8)
def expand(ctx: ConvertContext):
    x = ctx.require(0)
    try:  # both ways: a 1 in `shape` keeps x's dim
        shape = broadcast_shapes(x.shape, const_ints(ctx, 1, "the target shape"))
    except ShapeError as e:
        raise ctx.error(str(e)) from None
    return x if shape == x.shape else ctx.b.broadcast(x, shape=shape)


@converter("Tile")
def tile(ctx: ConvertContext):
    x = ctx.require(0)
    if ctx.opset < 6:  # inputs `tiles` and `axis`: one axis repeated
        repeats = [1] * x.type.rank
        repeats[axis_arg(ctx, const_ints(ctx, 2)[0], x.type.rank)] = const_ints(ctx, 1)[0]
    else:
        repeats = const_ints(ctx, 1, "the repeats")
    if len(repeats) != x.type.rank:
        raise ctx.error(f"repeats {repeats} must have one entry per dim of {x.type}")
    return x if all(r == 1 for r in repeats) else ctx.b.tile(x, repeats=repeats)


def _nchw(ctx: ConvertContext, x: Value) -> tuple[int, ...]:
    if x.type.rank != 4:
        raise ctx.error(f"input must have rank 4, got {x.type}")
    return x.shape


def _space_depth(ctx: ConvertContext, x: Value, shape, perm, out_shape) -> Value:
    """DepthToSpace and SpaceToDepth: split dims, permute, merge."""
    return reshape(ctx.b, ctx.b.transpose(reshape(ctx.b, x, shape), perm=perm), out_shape)


@converter("DepthToSpace")
def depth_to_space(ctx: ConvertContext):
    x = ctx.require(0)
    bs, mode = ctx.attr("blocksize"), ctx.attr("mode", "DCR")
    n, c, h, w = _nchw(ctx, x)
    if not bs or c % (bs * bs):
        raise ctx.error(f"channels of {x.type} must divide by blocksize**2 ({bs}**2)")
    out = (n, c // (bs * bs), h * bs, w * bs)
    if mode == "DCR":  # depth split as (row, column, channel)
        return _space_depth(ctx, x, (n, bs, bs, c // bs ** 2, h, w), (0, 3, 4, 1, 5, 2), out)
    if mode == "CRD":  # depth split as (channel, row, column)
        return _space_depth(ctx, x, (n, c // bs ** 2, bs, bs, h, w), (0, 1, 4, 2, 5, 3), out)
    raise ctx.unsupported(f"mode '{mode}'")


@converter("SpaceToDepth")
def space_to_depth(ctx: ConvertContext):
    x = ctx.require(0)
    bs, mode = ctx.attr("blocksize"), ctx.attr("mode", "DCR")
    n, c, h, w = _nchw(ctx, x)
    if not bs or h % bs or w % bs:
        raise ctx.error(f"height and width of {x.type} must divide by blocksize {bs}")
    perm = {"DCR": (0, 3, 5, 1, 2, 4), "CRD": (0, 1, 3, 5, 2, 4)}.get(mode)
    if perm is None:
        raise ctx.unsupported(f"mode '{mode}'")
    return _space_depth(ctx, x, (n, c, h // bs, bs, w // bs, bs), perm,
                        (n, c * bs * bs, h // bs, w // bs))


# -- shape and size: constants ------------------------------------------------------------

@converter("Shape")
def shape(ctx: ConvertContext):
    x = ctx.require(0)
    # start and end (opset 15) clamp like Python slice bounds
    dims = x.shape[ctx.attr("start", 0):ctx.attr("end", x.type.rank)]
    if is_static_shape(dims):
        return ctx.constant(np.array(dims, np.int64))
    # Sizes known at call time: an i64 vector of `size` ops (numbers where they are).
    parts = [ctx.b.reshape(ctx.b.size(value=d) if isinstance(d, Dim) else
                           ctx.constant(np.array(d, np.int64)), shape=(1,)) for d in dims]
    return ctx.b.concat(*parts, axis=0) if len(parts) > 1 else parts[0]


@converter("Size")
def size(ctx: ConvertContext):
    numel = ctx.require(0).type.numel
    return ctx.b.size(value=numel) if isinstance(numel, Dim) else \
        ctx.constant(np.array(numel, np.int64))


# -- concat, split, slice ------------------------------------------------------------------

@converter("Concat")
def concat(ctx: ConvertContext):
    xs = [v for v in ctx.inputs if v is not None]
    if not xs:
        raise ctx.error("Concat needs at least one input")
    axis = ctx.attr("axis", 1 if ctx.opset < 4 else None)
    if axis is None:
        raise ctx.error("attribute 'axis' is required")
    axis = axis_arg(ctx, axis, xs[0].type.rank)
    return xs[0] if len(xs) == 1 else ctx.b.concat(*xs, axis=axis)


def _split_sizes(ctx: ConvertContext, dim: int) -> list[int]:
    if ctx.opset >= 13 or (ctx.opset < 2 and ctx.input(1) is not None):
        split = const_ints(ctx, 1, "the split sizes") if ctx.input(1) is not None else None
    else:
        split = ctx.attr("split")
    if split is not None:
        if sum(split) != dim or any(s < 0 for s in split):
            raise ctx.error(f"split sizes {split} must be non-negative and add up to {dim}")
        return split
    if ctx.has_attr("num_outputs"):  # opset 18: chunks of ceil(dim / n), the last smaller
        n = ctx.attr("num_outputs")
        chunk = -(-dim // n)
        return [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
    n = ctx.num_outputs
    if dim % n:
        raise ctx.error(f"cannot split a dim of size {dim} into {n} equal parts")
    return [dim // n] * n


@converter("Split")
def split(ctx: ConvertContext):
    x = ctx.require(0)
    axis = axis_arg(ctx, ctx.attr("axis", 0), x.type.rank)
    sizes = _split_sizes(ctx, x.shape[axis])
    if len(sizes) != ctx.num_outputs:
        raise ctx.error(f"{len(sizes)} split sizes for {ctx.num_outputs} outputs")
    starts = np.cumsum([0] + sizes)
    return [slice_axes(ctx.b, x, {axis: (int(s), int(s + n), 1)})
            for s, n in zip(starts, sizes)]


@converter("Slice")
def slice_(ctx: ConvertContext):
    x = ctx.require(0)
    starts, ends, axes, steps = (attr_or_input(ctx, name, i + 1, input_since=10)
                                 for i, name in enumerate(("starts", "ends", "axes", "steps")))
    if starts is None or ends is None:
        raise ctx.error("starts and ends are required")
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error("starts, ends, axes and steps must have one length")
    if 0 in steps:
        raise ctx.error("steps must not be 0")
    axes = axes_arg(ctx, axes, x.type.rank)
    # Python's slice.indices clamps exactly as ONNX specifies (negative steps included)
    # and gives the bounds in range semantics, which is what graph.slice takes.
    ranges = {a: slice(s, e, st).indices(x.shape[a])
              for a, s, e, st in zip(axes, starts, ends, steps)}
    return slice_axes(ctx.b, x, ranges)


# -- pad, center_crop_pad ------------------------------------------------------------------

def pad(ctx: ConvertContext, x: Value, begins, ends, mode: str = "constant",
        value: Value | float = 0.0) -> Value:
    """x padded per axis by begins[i] and ends[i]; negative amounts crop instead (first)."""
    ranges = {a: (-min(lo, 0), d + min(hi, 0), 1)
              for a, (d, lo, hi) in enumerate(zip(x.shape, begins, ends)) if min(lo, hi) < 0}
    x = slice_axes(ctx.b, x, ranges)
    pads = [max(p, 0) for p in list(begins) + list(ends)]
    if not any(pads):
        return x
    if mode != "constant":
        return ctx.b.pad(x, pads=pads, mode=mode)
    if isinstance(value, float):
        return ctx.b.pad(x, pads=pads, value=value)
    # A value the float attribute cannot hold exactly (or not known until run time):
    # pad with zeros and select the value where a padded mask is false.
    inside = ctx.b.pad(ctx.b.broadcast(ctx.constant(np.array(True)), shape=x.shape),
                       pads=pads)
    return ctx.b.where(inside, ctx.b.pad(x, pads=pads), reshape(ctx.b, value, ()))


def _pad_value(ctx: ConvertContext, x: Value) -> Value | float:
    """The constant_value input (opset 11+) as a float when that is exact, else a Value."""
    value = ctx.input(2)
    if value is None:
        return 0.0
    if value.type.numel != 1:
        raise ctx.error(f"constant_value must hold one element, got {value.type}")
    # A graph input is read at run time rather than specialized on (the mask path below).
    known = ctx.maybe_const(2) if value.producer is not None else None
    if known is not None:
        v = np.asarray(known).reshape(())
        if np.asarray(float(v)).astype(x.dtype.np) == v or np.isnan(float(v)):
            return float(v)
    return value if value.dtype == x.dtype else ctx.b.cast(value, to=x.dtype)


@converter("Pad")
def pad_(ctx: ConvertContext):
    x = ctx.require(0)
    mode = ctx.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.unsupported(f"mode '{mode}'")
    if ctx.opset < 11:
        pads = ctx.attr("paddings" if ctx.opset < 2 else "pads")
        value = ctx.attr("value", 0.0)
        axes = None
    else:
        pads = const_ints(ctx, 1, "the pads")
        value = _pad_value(ctx, x)
        axes = attr_or_input(ctx, "axes", 3, input_since=18)
    axes = axes_arg(ctx, range(x.type.rank) if axes is None else axes, x.type.rank)
    if pads is None or len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {pads} must have two entries per axis padded")
    begins, ends = [0] * x.type.rank, [0] * x.type.rank
    for i, a in enumerate(axes):
        begins[a], ends[a] = pads[i], pads[len(axes) + i]
    return pad(ctx, x, begins, ends, mode, value)


@converter("CenterCropPad", since=18)
def center_crop_pad(ctx: ConvertContext):
    x = ctx.require(0)
    target = const_ints(ctx, 1, "the shape")
    axes = axes_arg(ctx, ctx.attr("axes", list(range(x.type.rank))), x.type.rank)
    if len(target) != len(axes):
        raise ctx.error(f"shape {target} must have one entry per axis {axes}")
    # The crop window starts rounded down; the odd pixel of padding goes to the end.
    begins, ends = [0] * x.type.rank, [0] * x.type.rank
    for a, size in zip(axes, target):
        grow = size - x.shape[a]
        begins[a] = grow // 2 if grow >= 0 else -((-grow) // 2)
        ends[a] = grow - begins[a]
    return pad(ctx, x, begins, ends)
