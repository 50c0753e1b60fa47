"""Lowerings of data-movement ops that are pure index maps: reshape, broadcast, transpose,
slice, concat and iota."""

from __future__ import annotations

from ember.graph.symbolic import is_symbolic
from ember.loops.ir import INDEX, Cast, Const, Store, as_expr
from ember.loops.lower.core import LowerContext, lowering


def flat_index(index, shape):
    """The row-major offset of `index` in `shape`."""
    flat = Const(0)
    for e, d in zip(index, shape):
        flat = flat * d + e
    return flat


def unflatten(flat, shape, wrap_first: bool = True):
    """The index of row-major offset `flat` in `shape` (`wrap_first`: the first dim's too
    taken modulo its size, which an offset inside the shape never needs)."""
    index, stride = [], 1
    for k, d in enumerate(reversed(shape)):
        first = k == len(shape) - 1
        index.append(Const(0) if d == 1 else flat // stride if first and not wrap_first
                     else (flat // stride) % d)
        stride *= d
    return list(reversed(index))


def reshape_index(index, out_shape, in_shape):
    """The index into `in_shape` of element `index` of its reshape to `out_shape`. With
    sizes known at call time, trailing dims the two shapes share map one to one (a batch
    regrouped, [?b*?s, E] as [?b, ?s, E]): only the dims before them go through the flat
    offset, whose divisions by sizes no range can remove later."""
    if not any(is_symbolic(d) for d in (*out_shape, *in_shape)):
        return unflatten(flat_index(index, out_shape), in_shape)
    shared = 0
    while shared < min(len(out_shape), len(in_shape)) and \
            out_shape[len(out_shape) - 1 - shared] == in_shape[len(in_shape) - 1 - shared]:
        shared += 1
    head_out, head_in = len(out_shape) - shared, len(in_shape) - shared
    head = unflatten(flat_index(index[:head_out], out_shape[:head_out]), in_shape[:head_in],
                     wrap_first=False)
    return [*head, *index[head_out:]]


@lowering("reshape")
def reshape(ctx: LowerContext):
    out_shape, in_shape = ctx.outputs[0].shape, ctx.inputs[0].shape
    return ctx.store_each(lambda i: ctx.load(0, reshape_index(i, out_shape, in_shape)))


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
    value, dtype = ctx.attrs["value"], ctx.outputs[0].dtype
    if isinstance(value, int):
        return ctx.store_each(lambda i: Const(value, dtype))
    # A size known at call time: computed from the kernel's size arguments.
    return ctx.store_each(lambda i: Cast(dtype, as_expr(value)) if dtype is not INDEX
                          else as_expr(value))


@lowering("iota")
def iota(ctx: LowerContext):
    axis = ctx.attrs["axis"] % max(len(ctx.outputs[0].shape), 1)
    return ctx.store_each(lambda i: Cast(ctx.outputs[0].dtype, i[axis]))
