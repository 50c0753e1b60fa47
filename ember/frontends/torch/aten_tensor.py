"""Converters of core ATen shape ops: views, joins and splits, slices, padding, flips,
repeats, sorting and arange (indexing with tensors is in aten_index.py).

View-like ops become copies (the IR has value semantics); their shapes come from the
type PyTorch recorded, which settles -1 entries and squeezes.
"""

from __future__ import annotations

import operator

import numpy as np

from ember.dtypes import DType
from ember.frontends.torch.context import ConvertContext, aten, overload_name
from ember.graph.ir import Value

INDEX_DTYPES = (DType.i32, DType.i64)


# -- helpers shared with aten_index.py and aten_nn.py ----------------------------------------
def used_results(ctx: ConvertContext) -> set[int]:
    """The positions of a tuple result that reach the graph's outputs (traces keep dead
    reads, such as max_pool's indices squeezed and dropped)."""
    return {u.args[1] for u in ctx.node.users if u.target is operator.getitem and _live(u)}


def _live(node) -> bool:
    """Whether some chain of users of `node` reaches the output (a depth-first search)."""
    stack, seen = [node], {node}
    while stack:
        node = stack.pop()
        if node.op == "output":
            return True
        fresh = [u for u in node.users if u not in seen]
        seen.update(fresh)
        stack.extend(fresh)
    return False


def filled(ctx: ConvertContext, value: float, shape, dtype: DType) -> Value:
    """A tensor of `shape` holding `value` (a broadcast scalar, not a table constant)."""
    scalar = ctx.constant(value, dtype)
    return scalar if tuple(shape) == () else ctx.b.broadcast(scalar, shape=tuple(shape))


def reshape(ctx: ConvertContext, x: Value, shape) -> Value:
    return x if x.shape == tuple(shape) else ctx.b.reshape(x, shape=tuple(shape))


def transpose(ctx: ConvertContext, x: Value, perm) -> Value:
    perm = tuple(int(p) for p in perm)
    return x if perm == tuple(range(len(perm))) else ctx.b.transpose(x, perm=perm)


def slice_axis(ctx: ConvertContext, x: Value, axis: int, start: int, end: int,
               step: int = 1) -> Value:
    """x[start:end:step] along `axis` (range semantics, indices in bounds)."""
    if (start, end, step) == (0, x.shape[axis], 1):
        return x
    starts, ends, steps = [0] * x.type.rank, list(x.shape), [1] * x.type.rank
    starts[axis], ends[axis], steps[axis] = start, end, step
    return ctx.b.slice(x, starts=starts, ends=ends, steps=steps)


def index_value(ctx: ConvertContext, index: Value) -> Value:
    return index if index.dtype in INDEX_DTYPES else ctx.b.cast(index, to=DType.i64)


def clamped_range(dim: int, start: int | None, end: int | None) -> tuple[int, int]:
    """PyTorch's slice bounds: None means the edge, negatives wrap, then clamp to [0, dim]."""
    start, end = (0 if start is None else start), (dim if end is None else end)
    start, end = (start + dim if start < 0 else start), (end + dim if end < 0 else end)
    start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    return start, max(start, end)


# -- views ----------------------------------------------------------------------------------
@aten("view.default", "_unsafe_view.default", "reshape.default", "alias.default",
      "squeeze.default", "squeeze.dim", "squeeze.dims", "unsqueeze.default",
      "view_copy.default")
def view(ctx: ConvertContext, x, *shape_args):
    return reshape(ctx, x, ctx.result_type().shape)


@aten("view.dtype")
def view_dtype(ctx: ConvertContext, x, dtype):
    to = ctx.result_type().dtype
    if to.itemsize != x.dtype.itemsize:
        raise ctx.unsupported(f"viewing {x.dtype} as {to} changes the element width")
    return x if to is x.dtype else ctx.b.bitcast(x, to=to)


@aten("expand.default")
def expand(ctx: ConvertContext, x, size, implicit=False):
    shape = ctx.result_type().shape
    return x if x.shape == shape else ctx.b.broadcast(x, shape=shape)


@aten("permute.default", "permute_copy.default")
def permute(ctx: ConvertContext, x, dims):
    return transpose(ctx, x, [d % max(x.type.rank, 1) for d in dims])


@aten("transpose.int")
def transpose_int(ctx: ConvertContext, x, dim0, dim1):
    perm = list(range(x.type.rank))
    if perm:
        a, b = dim0 % len(perm), dim1 % len(perm)
        perm[a], perm[b] = perm[b], perm[a]
    return transpose(ctx, x, perm)


@aten("t.default")
def t(ctx: ConvertContext, x):
    return transpose(ctx, x, (1, 0)) if x.type.rank == 2 else x


# -- joins and splits -----------------------------------------------------------------------
@aten("cat.default")
def cat(ctx: ConvertContext, tensors, dim=0):
    out = ctx.result_type()
    # Empty operands add nothing; PyTorch also accepts legacy 1-D [0] ones of any rank.
    parts = [ctx.as_value(x, out.dtype) for x in tensors if x.type.numel]
    if not parts:
        return filled(ctx, 0, out.shape, out.dtype)
    axis = dim % out.rank
    return parts[0] if len(parts) == 1 else ctx.b.concat(*parts, axis=axis)


@aten("stack.default")
def stack(ctx: ConvertContext, tensors, dim=0):
    out = ctx.result_type()
    axis = dim % out.rank
    parts = [reshape(ctx, ctx.as_value(x, out.dtype), x.shape[:axis] + (1,) + x.shape[axis:])
             for x in tensors]
    return parts[0] if len(parts) == 1 else ctx.b.concat(*parts, axis=axis)


def _split(ctx: ConvertContext, x: Value, sizes, dim: int) -> list[Value]:
    axis, start, parts = dim % x.type.rank, 0, []
    for size in sizes:
        parts.append(slice_axis(ctx, x, axis, start, start + size))
        start += size
    return parts


@aten("split.Tensor")
def split(ctx: ConvertContext, x, split_size, dim=0):
    n = x.shape[dim % x.type.rank]
    sizes = [min(split_size, n - s) for s in range(0, n, split_size)] if split_size else []
    return _split(ctx, x, sizes or [n], dim)


@aten("split_with_sizes.default")
def split_with_sizes(ctx: ConvertContext, x, split_sizes, dim=0):
    return _split(ctx, x, split_sizes, dim)


@aten("unbind.int", "unbind_copy.int")
def unbind(ctx: ConvertContext, x, dim=0):
    axis = dim % x.type.rank
    shape = x.shape[:axis] + x.shape[axis + 1:]
    return [reshape(ctx, part, shape) for part in _split(ctx, x, [1] * x.shape[axis], axis)]


# -- slicing --------------------------------------------------------------------------------
@aten("slice.Tensor")
def slice_(ctx: ConvertContext, x, dim=0, start=None, end=None, step=1):
    axis = dim % x.type.rank
    return slice_axis(ctx, x, axis, *clamped_range(x.shape[axis], start, end), step)


@aten("narrow.default", "narrow_copy.default")
def narrow(ctx: ConvertContext, x, dim, start, length):
    axis = dim % x.type.rank
    start = start + x.shape[axis] if start < 0 else start
    return slice_axis(ctx, x, axis, start, start + length)


@aten("select.int")
def select(ctx: ConvertContext, x, dim, index):
    axis = dim % x.type.rank
    index = index + x.shape[axis] if index < 0 else index
    return reshape(ctx, slice_axis(ctx, x, axis, index, index + 1), ctx.result_type().shape)


# -- padding, flips, repeats ----------------------------------------------------------------
def _torch_pads(ctx: ConvertContext, x: Value, pad) -> tuple[list[int], list[int]]:
    """PyTorch's (last dim first) before/after pairs as per-dim begins and ends."""
    if len(pad) % 2 or len(pad) // 2 > x.type.rank:
        raise ctx.unsupported(f"padding {list(pad)} for a rank-{x.type.rank} tensor")
    begins, ends = [0] * x.type.rank, [0] * x.type.rank
    for i in range(len(pad) // 2):
        begins[-1 - i], ends[-1 - i] = pad[2 * i], pad[2 * i + 1]
    return begins, ends


def _pad(ctx, x: Value, begins, ends, mode: str = "constant", value: float = 0.0) -> Value:
    # Negative pads crop.
    if any(p < 0 for p in begins + ends):
        x = ctx.b.slice(x, starts=[max(-b, 0) for b in begins],
                        ends=[d + min(e, 0) for d, e in zip(x.shape, ends)],
                        steps=[1] * x.type.rank)
        begins, ends = [max(b, 0) for b in begins], [max(e, 0) for e in ends]
    if not any(begins + ends):
        return x
    return ctx.b.pad(x, pads=[*begins, *ends], mode=mode, value=float(value))


@aten("constant_pad_nd.default")
def constant_pad_nd(ctx: ConvertContext, x, pad, value=0):
    return _pad(ctx, x, *_torch_pads(ctx, x, pad), value=value)


_PAD_MODES = {f"{kind}_pad{n}d.default": mode for kind, mode in
              (("reflection", "reflect"), ("replication", "edge")) for n in (1, 2, 3)}


@aten(*_PAD_MODES)
def mode_pad(ctx: ConvertContext, x, padding):
    return _pad(ctx, x, *_torch_pads(ctx, x, padding),
                mode=_PAD_MODES[overload_name(ctx.node.target)])


@aten("flip.default")
def flip(ctx: ConvertContext, x, dims):
    axes = {d % x.type.rank for d in dims} if x.type.rank else set()
    if not axes:
        return x
    return ctx.b.slice(x, starts=[d - 1 if i in axes else 0 for i, d in enumerate(x.shape)],
                       ends=[-1 if i in axes else d for i, d in enumerate(x.shape)],
                       steps=[-1 if i in axes else 1 for i in range(x.type.rank)])


@aten("roll.default")
def roll(ctx: ConvertContext, x, shifts, dims=()):
    if not dims:  # roll the flattened tensor
        flat = roll(ctx, reshape(ctx, x, (x.type.numel,)), shifts, [0])
        return reshape(ctx, flat, x.shape)
    for shift, dim in zip(shifts, dims):
        axis = dim % x.type.rank
        n = x.shape[axis]
        shift = shift % n if n else 0
        if shift:
            x = ctx.b.concat(slice_axis(ctx, x, axis, n - shift, n),
                             slice_axis(ctx, x, axis, 0, n - shift), axis=axis)
    return x


@aten("repeat.default")
def repeat(ctx: ConvertContext, x, repeats):
    x = reshape(ctx, x, (1,) * (len(repeats) - x.type.rank) + x.shape)
    return x if all(r == 1 for r in repeats) else ctx.b.tile(x, repeats=list(repeats))


@aten("tril.default", "triu.default")
def tril_triu(ctx: ConvertContext, x, diagonal=0):
    shape = x.shape[-2:]
    offset = ctx.b.sub(ctx.b.iota(shape=shape, axis=1), ctx.b.iota(shape=shape, axis=0))
    bound = ctx.constant(diagonal, DType.i64)
    lower = ctx.node.target.__name__.startswith("tril")
    keep = ctx.b.le(offset, bound) if lower else ctx.b.ge(offset, bound)
    return ctx.b.where(keep, x, ctx.constant(0, x.dtype))


@aten("diagonal.default")
def diagonal(ctx: ConvertContext, x, offset=0, dim1=0, dim2=1):
    rank = x.type.rank
    a, b = dim1 % rank, dim2 % rank
    others = [d for d in range(rank) if d not in (a, b)]
    rows, cols = x.shape[a], x.shape[b]
    x = reshape(ctx, transpose(ctx, x, others + [a, b]),
                tuple(x.shape[d] for d in others) + (rows * cols,))
    length = ctx.result_type().shape[-1]
    i = np.arange(length, dtype=np.int64)
    flat = (i + max(-offset, 0)) * cols + i + max(offset, 0)
    return ctx.b.gather(x, ctx.b.constant(flat), axis=-1)


@aten("unfold.default")
def unfold(ctx: ConvertContext, x, dimension, size, step):
    if x.type.rank == 0:
        raise ctx.unsupported("unfolding a scalar")
    axis = dimension % x.type.rank
    count = (x.shape[axis] - size) // step + 1
    windows = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    y = ctx.b.gather(x, ctx.b.constant(windows.astype(np.int64)), axis=axis)
    perm = [d for d in range(y.type.rank) if d != axis + 1] + [axis + 1]
    return transpose(ctx, y, perm)  # the window dim goes last


# -- sorting --------------------------------------------------------------------------------
@aten("topk.default")
def topk(ctx: ConvertContext, x, k, dim=-1, largest=True, sorted=True):
    # Always sorted, which sorted=False allows.
    if x.type.rank == 0:  # a scalar is its own top 1 (or top 0), at index 0
        values, indices = topk(ctx, reshape(ctx, x, (1,)), k, 0, largest, sorted)
        shape = ctx.result_type(0).shape
        return reshape(ctx, values, shape), reshape(ctx, indices, shape)
    return ctx.b.topk(x, k=k, axis=dim, largest=largest, sorted=True)


@aten("sort.default")
def sort(ctx: ConvertContext, x, dim=-1, descending=False):
    if x.type.rank == 0:
        return x, ctx.constant(0, DType.i64)
    # A stable sort: topk keeps the lower index first among equal values either way.
    keys = ctx.b.cast(x, to=DType.u8) if x.dtype is DType.bool else x
    values, indices = ctx.b.topk(keys, k=x.shape[dim % x.type.rank], axis=dim,
                                 largest=bool(descending))
    return (ctx.b.cast(values, to=DType.bool) if x.dtype is DType.bool else values), indices


@aten("sort.stable")
def sort_stable(ctx: ConvertContext, x, *, stable=None, dim=-1, descending=False):
    return sort(ctx, x, dim, descending)


# -- arange ---------------------------------------------------------------------------------
@aten("arange.default", "arange.start", "arange.start_step")
def arange(ctx: ConvertContext, *args, **kwargs):
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
    out = ctx.result_type()
    # start + i * step, in f64 for floats like PyTorch's CPU kernel, then rounded.
    exact = out.dtype.is_int and isinstance(start, int) and isinstance(step, int)
    wide = DType.i64 if exact else DType.f64
    y = ctx.b.iota(shape=out.shape, dtype=wide)
    if step != 1:
        y = ctx.b.mul(y, ctx.constant(step, wide))
    if start != 0:
        y = ctx.b.add(y, ctx.constant(start, wide))
    return y if wide is out.dtype else ctx.b.cast(y, to=out.dtype)
