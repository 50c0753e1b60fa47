"""Lowerings of padding and data-dependent indexing: pad, gather, gather_elements,
gather_nd, scatter_elements, scatter_nd and one_hot.

Index operands follow the reference: negative indices count from the end. An index
outside [-dim, dim) makes the reference raise (IndexError); the generated code cannot
raise, so it clamps such indices into the axis and never reads or writes out of bounds.
Likewise a gather from an empty axis (which the reference rejects whenever it has
indices to look up) stores zeros, and a scatter into one leaves the copy of data as is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ember.dtypes import DType
from ember.loops.ir import (
    INDEX,
    INDEX_OUT_OF_RANGE,
    Binary,
    Cast,
    Const,
    Expr,
    For,
    If,
    Select,
    Stmt,
    Store,
    as_expr,
    binary,
    const,
)
from ember.loops.lower.core import LowerContext, lowering
from ember.loops.lower.ops.reduce import assign, logical, narrow, read, widen

# -- shared helpers --------------------------------------------------------------------------


def checked_index(raw: Expr, dim: int) -> Expr:
    """A data-dependent index into an axis of size `dim` (>= 1), as i64: negative values
    count from the end; values still outside the axis are clamped into it."""
    raw = Cast(INDEX, raw) if raw.dtype is not INDEX else raw
    wrapped = Select(Binary("lt", raw, Const(0)), raw + dim, raw)
    return binary("min", binary("max", wrapped, Const(0)), as_expr(dim - 1))


def zeros(ctx: LowerContext):
    """Fill output 0 with zeros (the result where the reference would raise)."""
    return ctx.store_each(lambda i: const(0, ctx.outputs[0].dtype))


# -- pad -------------------------------------------------------------------------------------


def _pad_source(p: Expr, dim: int, mode: str, lo: int, hi: int) -> Expr:
    """The input index that output position `p` (already shifted by the begin pad `lo`)
    reads in reflect, edge or wrap mode; inference guarantees dim >= 1 where there is
    padding, and dim > max(lo, hi) for reflect."""
    if mode == "wrap":
        return p % dim  # floor mod: also for pads wider than the axis
    if mode == "edge":
        p = binary("max", p, Const(0)) if lo else p
        return binary("min", p, as_expr(dim - 1)) if hi else p
    # reflect, one reflection: -p before the axis, 2 (dim - 1) - p after it.
    if hi:
        p = Select(Binary("ge", p, as_expr(dim)), as_expr(2 * (dim - 1)) - p, p)
    if lo:
        p = Select(Binary("lt", p, Const(0)), Const(0) - p, p)
    return p


def _pad_value(value: float, dtype: DType) -> Const:
    """The constant fill as the reference converts it: np.array(value).astype(dtype)."""
    with np.errstate(all="ignore"):
        v = np.asarray(value).astype(dtype.np)
    return const(bool(v) if dtype.is_bool else int(v) if dtype.is_int else float(v), dtype)


@lowering("pad")
def pad(ctx: LowerContext):
    x = ctx.inputs[0]
    rank, mode = len(x.shape), ctx.attrs["mode"]
    begins, ends = ctx.attrs["pads"][:rank], ctx.attrs["pads"][rank:]
    if mode == "constant" and rank and x.shape[-1]:
        return _constant_pad_rows(ctx, begins, ends)

    def body(i):
        shifted = [e - lo for e, lo in zip(i, begins)]
        if mode != "constant":
            source = [_pad_source(p, d, mode, lo, hi) if lo or hi else p
                      for p, d, lo, hi in zip(shifted, x.shape, begins, ends)]
            return [assign(ctx.outputs[0], ctx.load(0, source), i)]
        inside = _inside(shifted, x.shape, begins, ends)
        fill = assign(ctx.outputs[0], _pad_value(ctx.attrs["value"], x.dtype), i)
        copy = assign(ctx.outputs[0], ctx.load(0, shifted), i)
        return [If(logical("and", *inside), [copy], [fill])] if inside else [copy]

    return ctx.nest(ctx.outputs[0].shape, body)


def _inside(shifted: Sequence[Expr], shape: Sequence[int], begins: Sequence[int],
            ends: Sequence[int]) -> list[Expr]:
    """The tests that input position `shifted` (output index minus the begin pads) is in
    `shape`, on the axes `shifted` covers that have padding."""
    return [*(Binary("ge", p, Const(0)) for p, lo in zip(shifted, begins) if lo),
            *(Binary("lt", p, Const(d)) for p, d, hi in zip(shifted, shape, ends) if hi)]


def _constant_pad_rows(ctx: LowerContext, begins, ends) -> list:
    """Constant padding row by row (a row: the last axis): a row of the border is filled;
    any other row is its fill before, the input row copied, and its fill after. Every inner
    loop is a plain contiguous one, which vectorizes; the decision per element that the
    general nest makes would keep it scalar (a conv's padded input: 58x58 per channel)."""
    x, out = ctx.inputs[0], ctx.outputs[0]
    fill = _pad_value(ctx.attrs["value"], x.dtype)
    lo, width, hi = begins[-1], x.shape[-1], ends[-1]

    def row(i):
        shifted = [e - b for e, b in zip(i, begins)]
        inside = _inside(shifted, x.shape, begins, ends)

        def span(start: int, count: int, value) -> list:
            if not count:
                return []
            j = ctx.var()
            return [For(j, Const(0), Const(count),
                        [assign(out, value(j), [*i, j + start] if start else [*i, j])])]

        copy = [*span(0, lo, lambda j: fill),
                *span(lo, width, lambda j: ctx.load(0, [*shifted, j])),
                *span(lo + width, hi, lambda j: fill)]
        if not inside:
            return copy
        return [If(logical("and", *inside), copy, span(0, lo + width + hi, lambda j: fill))]

    return ctx.nest(out.shape[:-1], row)


# -- checks ------------------------------------------------------------------------------------


@lowering("check_index")
def check_index(ctx: LowerContext):
    """y = indices; the status word says INDEX_OUT_OF_RANGE where one is outside [-dim, dim)
    of the axis it addresses (ember/graph/ops/checks.py)."""
    indices = ctx.inputs[0]
    dims, nd = ctx.attrs["dims"], ctx.attrs["nd"]
    y = ctx.outputs[0].name

    def checked(index: list[Expr], dim) -> list[Stmt]:
        raw = ctx.load(0, index)
        wide = Cast(INDEX, raw) if raw.dtype is not INDEX else raw
        outside = logical("or", Binary("lt", wide, binary("sub", Const(0), as_expr(dim))),
                          Binary("ge", wide, as_expr(dim)))
        return [ctx.fail_if(outside, INDEX_OUT_OF_RANGE), Store(y, tuple(index), raw)]

    if not nd:
        return ctx.nest(indices.shape, lambda i: checked(i, dims[0]))
    return ctx.nest(indices.shape[:-1], lambda i: [
        s for j, dim in enumerate(dims) for s in checked([*i, Const(j)], dim)])


# -- gather, gather_elements, gather_nd -------------------------------------------------------


@lowering("gather")
def gather(ctx: LowerContext):
    # y[a..., j..., b...] = x[a..., indices[j...], b...]
    data, indices = ctx.inputs
    axis = ctx.attrs["axis"] % len(data.shape)
    q, dim = len(indices.shape), data.shape[axis]
    if dim == 0:
        return zeros(ctx)

    def value(i):
        at = checked_index(ctx.load(1, i[axis:axis + q]), dim)
        return ctx.load(0, [*i[:axis], at, *i[axis + q:]])

    return ctx.store_each(value)


@lowering("gather_elements")
def gather_elements(ctx: LowerContext):
    # y[i] = x[i with indices[i] along axis]; indices are no larger than x off the axis.
    data = ctx.inputs[0]
    axis = ctx.attrs["axis"] % len(data.shape)
    dim = data.shape[axis]
    if dim == 0:
        return zeros(ctx)

    def value(i):
        source = list(i)
        source[axis] = checked_index(ctx.load(1, i), dim)
        return ctx.load(0, source)

    return ctx.store_each(value)


def _nd_tuple(ctx: LowerContext, position, dims) -> list[Expr]:
    """The checked index tuple indices[position..., :] into axes of sizes `dims`."""
    return [checked_index(ctx.load(1, [*position, Const(j)]), d) for j, d in enumerate(dims)]


@lowering("gather_nd")
def gather_nd(ctx: LowerContext):
    # y[p..., r...] = x[p[:b]..., *indices[p..., :], r...] (p: indices' dims but the last)
    data, indices = ctx.inputs
    b, q, k = ctx.attrs["batch_dims"], len(indices.shape) - 1, indices.shape[-1]
    dims = data.shape[b:b + k]
    if 0 in dims:
        return zeros(ctx)

    def value(i):
        return ctx.load(0, [*i[:b], *_nd_tuple(ctx, i[:q], dims), *i[q:]])

    return ctx.store_each(value)


# -- scatter_elements, scatter_nd ------------------------------------------------------------


def _scatter(ctx: LowerContext, positions, target, empty: bool):
    """y = a copy of data; then, for each index p over `positions` in row-major order,
    y[target(p)] = updates[p], or combined with it by the reduction (repeats apply in
    order, so with no reduction the last update wins, as in the reference). Halves that
    add or multiply accumulate in an f32 copy, so each element rounds once."""
    data, y = ctx.inputs[0], ctx.outputs[0]
    reduction = ctx.attrs["reduction"]
    staged = reduction in ("add", "mul") and data.dtype.compute is not data.dtype
    out = ctx.local(DType.f32, data.shape) if staged else y

    def copy_in(i):
        return [assign(out, Cast(out.dtype, ctx.load(0, i)) if staged else ctx.load(0, i), i)]

    def update(p):
        at, new = target(p), ctx.load(2, p)
        if reduction != "none":
            new = narrow(Binary(reduction, widen(read(out, at)), widen(new)), out.dtype)
        return [assign(out, new, at)]

    def copy_out(i):
        return [assign(y, Cast(y.dtype, read(out, i)), i)]

    # (y in data's memory holds data already: the updates are all there is to write)
    stmts = [] if ctx.in_place and not staged else ctx.nest(data.shape, copy_in)
    if not empty:
        stmts += ctx.nest(positions, update)
    return stmts + ctx.nest(data.shape, copy_out) if staged else stmts


@lowering("scatter_elements")
def scatter_elements(ctx: LowerContext):
    # y[p with indices[p] along axis] (op)= updates[p]
    data, indices = ctx.inputs[0], ctx.inputs[1]
    axis = ctx.attrs["axis"] % len(data.shape)
    dim = data.shape[axis]

    def target(p):
        at = list(p)
        at[axis] = checked_index(ctx.load(1, p), dim)
        return at

    return _scatter(ctx, indices.shape, target, empty=dim == 0)


@lowering("scatter_nd")
def scatter_nd(ctx: LowerContext):
    # y[*indices[p..., :], r...] (op)= updates[p..., r...]
    data, indices, updates = ctx.inputs
    q, k = len(indices.shape) - 1, indices.shape[-1]
    dims = data.shape[:k]

    def target(p):
        return [*_nd_tuple(ctx, p[:q], dims), *p[q:]]

    return _scatter(ctx, updates.shape, target, empty=0 in dims)


# -- one_hot ---------------------------------------------------------------------------------


@lowering("one_hot")
def one_hot(ctx: LowerContext):
    # y[a..., d, b...] = values[1] if indices[a..., b...] (wrapped once) == d else values[0]
    depth = ctx.attrs["depth"]
    axis = ctx.attrs["axis"] % len(ctx.outputs[0].shape)
    off, on = ctx.load(1, [Const(0)]), ctx.load(1, [Const(1)])

    def value(i):
        raw = ctx.load(0, [*i[:axis], *i[axis + 1:]])
        raw = Cast(INDEX, raw) if raw.dtype is not INDEX else raw
        hot = Select(Binary("lt", raw, Const(0)), raw + depth, raw)  # others match nothing
        return Select(Binary("eq", hot, i[axis]), on, off)

    return ctx.store_each(value)
