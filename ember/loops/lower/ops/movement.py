"""Lowerings of data-movement ops that are pure index maps: reshape, broadcast, transpose,
slice, concat and iota."""

from __future__ import annotations

from ember.loops.ir import Cast, Const, Store
from ember.loops.lower.core import LowerContext, lowering


def flat_index(index, shape):
    """The row-major offset of `index` in `shape`."""
    flat = Const(0)
    for e, d in zip(index, shape):
        flat = flat * d + e
    return flat


def unflatten(flat, shape):
    """The index of row-major offset `flat` in `shape`."""
    index, stride = [], 1
    for d in reversed(shape):
        index.append((flat // stride) % d if d != 1 else Const(0))
        stride *= d
    return list(reversed(index))


@lowering("reshape")
def reshape(ctx: LowerContext):
    out_shape, in_shape = ctx.outputs[0].shape, ctx.inputs[0].shape
    return ctx.store_each(lambda i: ctx.load(0, unflatten(flat_index(i, out_shape), in_shape)))


@lowering("broadcast")
def broadcast(ctx: LowerContext):
    return ctx.store_each(lambda i: ctx.load_broadcast(0, i))


@lowering("transpose")
def transpose(ctx: LowerContext):
    perm = ctx.attrs["perm"]

    def value(i):
        source = [None] * len(perm)
        for out_axis, in_axis in enumerate(perm):
            source[in_axis] = i[out_axis]
        return ctx.load(0, source)

    return ctx.store_each(value)


@lowering("slice")
def slice_(ctx: LowerContext):
    a = ctx.attrs
    return ctx.store_each(lambda i: ctx.load(0, [Const(s) + e * st for e, s, st in
                                                 zip(i, a["starts"], a["steps"])]))


@lowering("concat")
def concat(ctx: LowerContext):
    # One nest per operand writing its slab: no out-of-bounds reads behind a select.
    axis = ctx.attrs["axis"] % len(ctx.outputs[0].shape)
    stmts, offset = [], 0
    for k, buffer in enumerate(ctx.inputs):
        def body(i, k=k, offset=offset):
            target = list(i)
            target[axis] = i[axis] + offset
            return [Store("y0", tuple(target), ctx.load(k, i))]

        stmts += ctx.nest(buffer.shape, body)
        offset += buffer.shape[axis]
    return stmts


@lowering("size")
def size(ctx: LowerContext):
    return ctx.store_each(lambda i: Const(int(ctx.attrs["value"]), ctx.outputs[0].dtype))


@lowering("iota")
def iota(ctx: LowerContext):
    axis = ctx.attrs["axis"] % max(len(ctx.outputs[0].shape), 1)
    return ctx.store_each(lambda i: Cast(ctx.outputs[0].dtype, i[axis]))
