"""Lowerings of `max_pool`, `avg_pool` and `resize`.

Pools reduce each output element's window into a local scalar, reading only the taps
inside the input (an `If` guards axes where a tap can fall into the padding or past the
end of a ceil_mode window): for max_pool the padding never wins, for avg_pool it adds 0
and the divisor follows the reference's count_include_pad rule. This plain nest is the
algorithm: the scheduling stage gives a 2-D f32 one the pool schedule
(ember/loops/schedules/pool.py: vectors of output columns).

`resize` computes, per resized axis, the source indices and weights of an output index
in the loop body (in f64, as the reference does), in tables local to the kernel filled
inside that axis' loop; linear and cubic modes then sum the taps one axis at a time, in
the reference's order (first resized axis innermost).
"""

from __future__ import annotations

import numpy as np

from ember.dtypes import DType
from ember.graph.ops.linalg import per_axis, window_params
from ember.loops.ir import (
    INDEX,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    Load,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    as_expr,
)
from ember.loops.lower.core import LowerContext, lowering
from ember.loops.lower.ops.linalg import accumulator, compute_load, reduce_into, store_result
from ember.loops.windows import all_of, window_checks, window_position

# -- max_pool / avg_pool ------------------------------------------------------------------


def pool_geometry(ctx: LowerContext, dilations=()):
    """(kernel, strides, pads_begin, pads_end, dilations, output spatial sizes)."""
    x = ctx.inputs[0]
    nd = len(x.shape) - 2
    kernel = per_axis(ctx.attrs["kernel"], nd, 1, "kernel")
    strides, pb, pe, dilations = window_params(nd, ctx.attrs["strides"], ctx.attrs["pads"],
                                               dilations)
    return kernel, strides, pb, pe, dilations, ctx.outputs[0].shape[2:]


def pool(ctx: LowerContext, geometry, init: Expr, combine: str, finish) -> list[Stmt]:
    """Reduce each window of x with `combine` from `init`; store finish(acc, out index)."""
    x = ctx.inputs[0]
    kernel, strides, pb, _, dilations, out = geometry
    acc = accumulator(ctx)

    def element(index: list[Var]) -> list[Stmt]:
        n, c, o = index[0], index[1], index[2:]

        def term(taps: list[Var]):
            positions = [window_position(*args) for args in zip(o, taps, strides, pb,
                                                                 dilations)]
            conds = window_checks(positions, x.shape[2:], out, kernel, strides, pb,
                                  dilations)
            return compute_load(ctx, 0, [n, c, *positions]), all_of(conds)

        return reduce_into(ctx, acc, lambda v: store_result(ctx, index, finish(v, o)), init,
                           kernel, term, combine)

    return ctx.nest(ctx.outputs[0].shape, element)


@lowering("max_pool")
def max_pool(ctx: LowerContext):
    dtype = ctx.inputs[0].dtype.compute
    lowest = -np.inf if dtype.is_float else np.iinfo(dtype.np).min
    geometry = pool_geometry(ctx, ctx.attrs["dilations"])
    return pool(ctx, geometry, ctx.const(lowest, dtype), "max", lambda v, o: v)


def avg_count(o: Expr, size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
              include_pad: bool) -> Expr:
    """How many elements window `o` averages along one axis (as in the reference:
    explicit padding counts with count_include_pad, a ceil_mode overhang never does)."""
    start = o * stride - pad_begin
    if include_pad:
        return Binary("min", start + kernel, as_expr(size + pad_end)) - start
    return Binary("min", start + kernel, as_expr(size)) - Binary("max", start, Const(0))


@lowering("avg_pool")
def avg_pool(ctx: LowerContext):
    dtype = ctx.outputs[0].dtype.compute
    geometry = pool_geometry(ctx)
    kernel, strides, pb, pe, _, _ = geometry
    sizes = ctx.inputs[0].shape[2:]
    include_pad = ctx.attrs["count_include_pad"]

    def count(o: list[Expr]) -> Expr:
        total = Const(1)
        for args in zip(o, sizes, kernel, strides, pb, pe):
            total = total * avg_count(*args, include_pad)
        return total

    return pool(ctx, geometry, ctx.const(0, dtype), "add",
                lambda total, o: Binary("div", total, Cast(dtype, count(o))))


# -- resize -------------------------------------------------------------------------------

F64 = DType.f64


def f64(value: float) -> Const:
    return Const(float(value), F64)


def source_coord(o: Expr, n_in: int, n_out: int, scale: float | None, mode: str) -> Expr:
    """ONNX's x_original of output index `o` along one axis, in f64 (the reference's
    arithmetic, operation by operation)."""
    x = Cast(F64, o)

    def unscale(v: Expr) -> Expr:
        if scale:
            return Binary("div", v, f64(scale))
        return Binary("div", Binary("mul", v, f64(n_in)), f64(n_out))

    def half_pixel() -> Expr:
        return Binary("sub", unscale(Binary("add", x, f64(0.5))), f64(0.5))

    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and n_out > 1):
        return half_pixel()
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in) if scale else 1.0
        shift = f64(n_in / 2 * (1 - adjustment))
        return Binary("sub", Binary("add", shift, unscale(Binary("add", x, f64(0.5)))),
                      f64(0.5))
    if mode == "align_corners" and n_out > 1:
        return Binary("div", Binary("mul", x, f64(n_in - 1)), f64(n_out - 1))
    if mode == "asymmetric":
        return unscale(x)
    return f64(0.0)  # pytorch_half_pixel and align_corners with one output


def clamp_index(i: Expr, n: int) -> Expr:
    return Binary("min", Binary("max", i, Const(0)), as_expr(n - 1))


def nearest_index(src: Expr, mode: str) -> Expr:
    """The input index (unclamped, i64) that nearest mode `mode` picks for `src`."""
    if mode == "round_prefer_floor":
        rounded = Unary("ceil", Binary("sub", src, f64(0.5)))
    elif mode == "round_prefer_ceil":
        rounded = Unary("floor", Binary("add", src, f64(0.5)))
    else:
        rounded = Unary(mode, src)
    return Cast(INDEX, rounded)


def cubic_weights(t: Expr, a: float) -> list[Expr]:
    """Keys' cubic convolution weights of the taps at distances 1+t, t, 1-t, 2-t."""
    def near(d: Expr) -> Expr:  # ((a + 2) d - (a + 3)) d d + 1
        inner = Binary("sub", Binary("mul", f64(a + 2), d), f64(a + 3))
        return Binary("add", Binary("mul", Binary("mul", inner, d), d), f64(1))

    def far(d: Expr) -> Expr:  # ((a d - 5a) d + 8a) d - 4a
        inner = Binary("sub", Binary("mul", f64(a), d), f64(5 * a))
        inner = Binary("add", Binary("mul", inner, d), f64(8 * a))
        return Binary("sub", Binary("mul", inner, d), f64(4 * a))

    return [far(Binary("add", f64(1), t)), near(t), near(Binary("sub", f64(1), t)),
            far(Binary("sub", f64(2), t))]


def tap_tables(ctx: LowerContext, src: Expr, n_in: int) -> tuple[Buffer, Buffer,
                                                                  list[Stmt]]:
    """Tables (clamped input indices, weights in the compute type) of the linear or cubic
    taps at coordinate `src`, and the statements that fill them. Intermediate values go
    through f64 locals, computed as the reference computes them."""
    attrs = ctx.attrs
    coord = ctx.local(F64, (2,))  # src, and the left neighbour strictly below it
    src_at, base = Load(coord.name, (Const(0),), F64), Load(coord.name, (Const(1),), F64)
    stmts: list[Stmt] = [Store(coord.name, (Const(0),), src),
                         Store(coord.name, (Const(1),),
                               Binary("sub", Unary("ceil", src_at), f64(1)))]
    t = Binary("sub", src_at, base)  # in (0, 1], as in ONNX's reference
    if attrs["mode"] == "linear":
        offsets, weights = range(2), [Binary("sub", f64(1), t), t]
    else:
        offsets, weights = range(-1, 3), cubic_weights(t, attrs["cubic_coeff_a"])
    index = [Cast(INDEX, base) + k for k in offsets]
    n = len(index)
    raw = ctx.local(F64, (n,))
    raw_at = [Load(raw.name, (Const(j),), F64) for j in range(n)]
    stmts += [Store(raw.name, (Const(j),), w) for j, w in enumerate(weights)]
    if attrs["exclude_outside"]:  # zero the taps outside, and renormalize
        stmts += [Store(raw.name, (Const(j),), Select(all_of([Binary("ge", i, Const(0)),
                                                              Binary("lt", i, Const(n_in))]),
                                                      w, f64(0)))
                  for j, (i, w) in enumerate(zip(index, raw_at))]
        total = raw_at[0]
        for w in raw_at[1:]:
            total = Binary("add", total, w)
        raw_at = [Binary("div", w, total) for w in raw_at]
    dtype = ctx.outputs[0].dtype.compute
    idx_table, w_table = ctx.local(INDEX, (n,)), ctx.local(dtype, (n,))
    stmts += [Store(idx_table.name, (Const(j),), clamp_index(i, n_in))
              for j, i in enumerate(index)]
    stmts += [Store(w_table.name, (Const(j),), Cast(dtype, w)) for j, w in enumerate(raw_at)]
    return idx_table, w_table, stmts


def resized_axes(ctx: LowerContext) -> list[tuple[int, float | None]]:
    """(axis, scale or None) of the axes resize changes; the rest map onto themselves."""
    x, scales = ctx.inputs[0], ctx.attrs["scales"]
    axes = []
    for axis, (n_in, n_out) in enumerate(zip(x.shape, ctx.outputs[0].shape)):
        scale = scales[axis] if scales else None
        if not (n_in == n_out and scale in (None, 1.0)):
            axes.append((axis, scale))
    return axes


@lowering("resize")
def resize(ctx: LowerContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    attrs = ctx.attrs
    mode = attrs["coordinate_transformation_mode"]
    axes = resized_axes(ctx)
    index = [ctx.var() for _ in out.shape]

    def src(axis: int, scale) -> Expr:
        return source_coord(index[axis], x.shape[axis], out.shape[axis], scale, mode)

    if attrs["mode"] == "nearest":
        source = list(index)
        for axis, scale in axes:
            source[axis] = clamp_index(nearest_index(src(axis, scale),
                                                     attrs["nearest_mode"]), x.shape[axis])
        return wrap_loops(index, out.shape, {}, [Store("y0", tuple(index),
                                                       ctx.load(0, source))])

    # Per resized axis: tables of its taps, filled at the top of its loop.
    tables, prologues = {}, {}
    for axis, scale in axes:
        idx_table, w_table, prologues[axis] = tap_tables(ctx, src(axis, scale), x.shape[axis])
        tables[axis] = (idx_table, w_table)
    body = interpolate(ctx, index, axes, tables)
    return wrap_loops(index, out.shape, prologues, body)


def wrap_loops(index: list[Var], shape, prologues: dict[int, list[Stmt]],
               body: list[Stmt]) -> list[Stmt]:
    """Loops over `shape` around `body`, with prologues[d] at the top of loop d's body."""
    for d in reversed(range(len(shape))):
        body = [For(index[d], Const(0), as_expr(shape[d]), [*prologues.get(d, []), *body])]
    return body


def interpolate(ctx: LowerContext, index: list[Var], axes, tables) -> list[Stmt]:
    """The weighted sum of the taps at output `index`, one accumulator per resized axis:
    the first resized axis sums innermost, as the reference resizes it first."""
    dtype = ctx.outputs[0].dtype.compute
    source: list[Expr] = list(index)
    accs = [Load(ctx.local(dtype).name, (), dtype) for _ in axes]
    taps = [ctx.var("j") for _ in axes]
    for (axis, _), j in zip(axes, taps):
        source[axis] = Load(tables[axis][0].name, (j,), INDEX)
    value: Expr = compute_load(ctx, 0, source)
    stmts: list[Stmt] = []
    for (axis, _), j, acc in zip(axes, taps, accs):
        idx_table, w_table = tables[axis]
        weighted = Binary("mul", Load(w_table.name, (j,), dtype), value)
        loop = For(j, Const(0), Const(idx_table.shape[0]),
                   [*stmts, Store(acc.buffer, (), Binary("add", acc, weighted))])
        stmts = [Store(acc.buffer, (), ctx.const(0, dtype)), loop]
        value = acc
    return [*stmts, store_result(ctx, index, value)]
