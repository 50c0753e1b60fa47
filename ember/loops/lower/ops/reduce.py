"""Lowerings of reductions and scans: reduce_sum/prod/max/min, argmax/argmin, cumsum,
cumprod and topk.

Each output element accumulates in a local scalar of the compute type (f32 for f16/bf16,
the dtype otherwise), so halves round once, at the store, like the reference; integer
sums and products wrap in the dtype. max and min are the loop IR's (NaN wins).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ember.dtypes import DType
from ember.graph.ops.common import normalize_axes
from ember.loops.ir import (
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    If,
    Load,
    Stmt,
    Store,
    Unary,
    Var,
    as_expr,
    binary,
    const,
)
from ember.loops.lower.core import LowerContext, lowering

# -- shared helpers --------------------------------------------------------------------------


def widen(e: Expr) -> Expr:
    """`e` in its compute type: f16/bf16 values become f32."""
    return Cast(DType.f32, e) if e.dtype.compute is not e.dtype else e


def narrow(e: Expr, dtype: DType) -> Expr:
    """`e` (in the compute type of `dtype`) as a `dtype` value to store."""
    return Cast(dtype, e) if e.dtype is not dtype else e


def read(buffer: Buffer, index: Sequence[Expr] = ()) -> Load:
    """A load of a kernel buffer (an output or a local) by name."""
    return Load(buffer.name, tuple(index), buffer.dtype)


def assign(buffer: Buffer, value: Expr, index: Sequence[Expr] = ()) -> Store:
    return Store(buffer.name, tuple(index), value)


def logical(op: str, *terms: Expr) -> Expr:
    """`terms` joined by the bool op `op` ("and" or "or")."""
    result = terms[0]
    for t in terms[1:]:
        result = Binary(op, result, t)
    return result


def extreme(dtype: DType, highest: bool) -> Const:
    """The identity of min (`highest`) or max (not `highest`) in `dtype`."""
    if dtype.is_float:
        return Const(float("inf") if highest else float("-inf"), dtype)
    info = np.iinfo(dtype.np)
    return Const(int(info.max if highest else info.min), dtype)


def compose(rank: int, parts: dict[int, Expr]) -> list[Expr]:
    """An index of `rank` dims from {axis: expr}."""
    return [parts[a] for a in range(rank)]


# -- reduce_sum, reduce_prod, reduce_max, reduce_min -----------------------------------------

COMBINE = {"reduce_sum": "add", "reduce_prod": "mul", "reduce_max": "max", "reduce_min": "min"}


def identity(op: str, dtype: DType) -> Const:
    if op in ("add", "mul"):
        return const(0 if op == "add" else 1, dtype)  # +0.0: NumPy's sums start from it too
    return extreme(dtype, highest=op == "min")


# Float sums of more elements than CASCADE_MIN add blocks of at most CASCADE_BLOCK of them
# in the compute type, and the blocks' sums in f64: one f32 accumulator over 50M floats was
# off by 5e-7 relative (eager, which sums in a cascade: 1.5e-8, as the blocks are now), and
# a mean over 10^9 broadcast ones gave 0.97 (it stalls at 2^24). Shorter sums (rows, whose
# schedules match their nest) keep one accumulator.
CASCADE_MIN = 1 << 16
CASCADE_BLOCK = 1 << 10


def accumulate(ctx: LowerContext, op: str, compute: DType, extents: Sequence,
               term: Callable[[list[Expr]], Expr]) -> tuple[list[Stmt], Expr]:
    """Statements combining term(index) by `op` over every index of `extents`, and the
    result (of type `compute`) once they have run: one accumulator, or for a long float
    sum blocks added in f64 (CASCADE_MIN)."""
    if op != "add" or not compute.is_float or not all(isinstance(e, int) for e in extents) \
            or math.prod(extents) <= CASCADE_MIN:
        acc = ctx.local(compute)

        def step(index: list[Var]) -> list[Stmt]:
            return [assign(acc, Binary(op, read(acc), term(index)))]

        return [assign(acc, identity(op, compute)), *ctx.nest(extents, step)], read(acc)
    part, total = ctx.local(compute), ctx.local(DType.f64)

    def block(loops: list[Stmt]) -> list[Stmt]:
        """part = the block's sum (`loops` add into it); total += part, in f64."""
        return [assign(part, identity(op, compute)), *loops,
                assign(total, Binary(op, read(total), Cast(DType.f64, read(part))))]

    def add(index: list[Expr]) -> list[Stmt]:
        return [assign(part, Binary(op, read(part), term(index)))]

    trailing = 0  # the trailing extents that make one block
    while trailing < len(extents) and \
            math.prod(extents[len(extents) - trailing - 1:]) <= CASCADE_BLOCK:
        trailing += 1
    if trailing:
        lead, inner = list(extents[:-trailing]), list(extents[-trailing:])
        body = ctx.nest(lead, lambda index: block(ctx.nest(inner, lambda i: add([*index, *i]))))
    else:  # the last extent alone is longer than a block: chunks of it
        n = extents[-1]

        def chunk(index: list[Var]) -> list[Stmt]:
            *lead_index, c = index
            j, start = ctx.var(), c * CASCADE_BLOCK
            return block([For(j, Const(0), binary("min", CASCADE_BLOCK, as_expr(n) - start),
                              add([*lead_index, start + j]))])

        body = ctx.nest([*extents[:-1], -(-n // CASCADE_BLOCK)], chunk)
    result = read(total) if compute is DType.f64 else Cast(compute, read(total))
    return [assign(total, Const(0.0, DType.f64)), *body], result


@lowering(*COMBINE)
def reduction(ctx: LowerContext):
    x, y = ctx.inputs[0], ctx.outputs[0]
    rank, op = len(x.shape), COMBINE[ctx.op.name]
    axes = normalize_axes(ctx.attrs["axes"], rank)
    kept = [a for a in range(rank) if a not in axes]
    reduced = [x.shape[a] for a in axes]

    def outer(kept_index):
        where = dict(zip(kept, kept_index))

        def term(reduced_index):
            return widen(ctx.load(0, compose(rank, {**where, **dict(zip(axes, reduced_index))})))

        stmts, value = accumulate(ctx, op, x.dtype.compute, reduced, term)
        out = [where.get(a, Const(0)) for a in range(rank)
               if a in where or ctx.attrs["keepdims"]]
        return [*stmts, assign(y, narrow(value, y.dtype), out)]

    return ctx.nest([x.shape[a] for a in kept], outer)


# -- argmax, argmin --------------------------------------------------------------------------


def _better(v: Expr, best: Expr, op: str, last: bool) -> Expr:
    """Whether `v`, met after `best`, replaces it: strictly better (or equal, when the last
    index wins); NaN beats every number, and a later NaN replaces a NaN only when `last`."""
    cmp = op if not last else {"gt": "ge", "lt": "le"}[op]
    cond = Binary(cmp, v, best)
    if not v.dtype.is_float:
        return cond
    nan_v = Unary("isnan", v)
    if last:
        return logical("or", cond, nan_v)
    return logical("or", cond, logical("and", nan_v, Unary("not", Unary("isnan", best))))


@lowering("argmax", "argmin")
def arg_extreme(ctx: LowerContext):
    x, y = ctx.inputs[0], ctx.outputs[0]
    rank = len(x.shape)
    axis = ctx.attrs["axis"] % rank
    n = x.shape[axis]  # >= 1: inference rejects an empty axis
    op = "gt" if ctx.op.name == "argmax" else "lt"
    others = [a for a in range(rank) if a != axis]

    def outer(index):
        where = dict(zip(others, index))
        best, at = ctx.local(x.dtype.compute), ctx.local(DType.i64)
        j = ctx.var("j")
        v = widen(ctx.load(0, compose(rank, {**where, axis: j})))
        update = If(_better(v, read(best), op, ctx.attrs["select_last_index"]),
                    [assign(best, v), assign(at, j)])
        out = [where.get(a, Const(0)) for a in range(rank)
               if a != axis or ctx.attrs["keepdims"]]
        return [assign(best, widen(ctx.load(0, compose(rank, {**where, axis: Const(0)})))),
                assign(at, Const(0)),
                For(j, Const(1), as_expr(n), [update]),
                assign(y, read(at), out)]

    return ctx.nest([x.shape[a] for a in others], outer)


# -- cumsum, cumprod -------------------------------------------------------------------------


@lowering("cumsum", "cumprod")
def cumulative(ctx: LowerContext):
    x, y = ctx.inputs[0], ctx.outputs[0]
    rank = len(x.shape)
    axis = ctx.attrs["axis"] % rank
    n = x.shape[axis]
    op = "add" if ctx.op.name == "cumsum" else "mul"
    init = identity(op, x.dtype.compute)
    if op == "add" and init.dtype.is_float and not ctx.attrs["exclusive"]:
        init = Const(-0.0, init.dtype)  # -0.0 + x is x for every x, so y[0] is x[0] exactly
    others = [a for a in range(rank) if a != axis]

    def outer(index):
        where = dict(zip(others, index))
        acc = ctx.local(x.dtype.compute)
        j = ctx.var("j")
        at = compose(rank, {**where, axis: as_expr(n - 1) - j if ctx.attrs["reverse"] else j})
        step = assign(acc, Binary(op, read(acc), widen(ctx.load(0, at))))
        out = assign(y, narrow(read(acc), y.dtype), at)
        body = [out, step] if ctx.attrs["exclusive"] else [step, out]
        return [assign(acc, init), For(j, Const(0), as_expr(n), body)]

    return ctx.nest([x.shape[a] for a in others], outer)


# -- topk ------------------------------------------------------------------------------------


def _precedes(a: Expr, ia: Expr, b: Expr, ib: Expr, largest: bool) -> Expr:
    """Whether element (value a, index ia) comes before (b, ib) in topk's order: by value,
    descending when `largest` (ascending otherwise), NaN counting as the largest value;
    equal values (and NaNs among themselves) by index, lower first."""
    ahead = Binary("gt" if largest else "lt", a, b)
    tie = Binary("eq", a, b)
    if a.dtype.is_float:
        nan_a, nan_b = Unary("isnan", a), Unary("isnan", b)
        first, second = (nan_a, nan_b) if largest else (nan_b, nan_a)
        ahead = logical("or", ahead, logical("and", first, Unary("not", second)))
        tie = logical("or", tie, logical("and", nan_a, nan_b))
    return logical("or", ahead, logical("and", tie, Binary("lt", ia, ib)))


@lowering("topk")
def topk(ctx: LowerContext):
    # Output slot s holds the first element in topk's order that comes after the one in
    # slot s - 1: one pass over the axis per slot, O(k n), no scratch beyond scalars.
    # Always sorted, like the reference.
    x, values, indices = ctx.inputs[0], ctx.outputs[0], ctx.outputs[1]
    rank = len(x.shape)
    axis = ctx.attrs["axis"] % rank
    n, k, largest = x.shape[axis], ctx.attrs["k"], ctx.attrs["largest"]
    others = [a for a in range(rank) if a != axis]
    ct = x.dtype.compute

    def outer(index):
        where = dict(zip(others, index))
        prev, prev_at = ctx.local(ct), ctx.local(DType.i64)  # the last pick; index -1: none
        best, best_at = ctx.local(ct), ctx.local(DType.i64)  # this slot's pick; -1: none yet
        current = ctx.local(ct)  # the element at j
        s, j = ctx.var("s"), ctx.var("j")
        v = read(current)
        eligible = logical("or", Binary("lt", read(prev_at), Const(0)),
                           _precedes(read(prev), read(prev_at), v, j, largest))
        better = logical("or", Binary("lt", read(best_at), Const(0)),
                         _precedes(v, j, read(best), read(best_at), largest))
        scan = For(j, Const(0), as_expr(n), [
            assign(current, widen(ctx.load(0, compose(rank, {**where, axis: j})))),
            If(logical("and", eligible, better), [assign(best, v), assign(best_at, j)])])
        out = compose(rank, {**where, axis: s})
        slot = For(s, Const(0), Const(k), [
            assign(best_at, Const(-1)), assign(best, const(0, ct)),
            scan,
            assign(values, narrow(read(best), values.dtype), out),
            assign(indices, read(best_at), out),
            assign(prev, read(best)), assign(prev_at, read(best_at))])
        return [assign(prev_at, Const(-1)), assign(prev, const(0, ct)),
                slot]

    return ctx.nest([x.shape[a] for a in others], outer)
