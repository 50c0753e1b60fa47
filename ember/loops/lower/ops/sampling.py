"""Lowerings of the sampling ops, whose reads depend on data: `grid_sample` and
`roi_align`. As in the references, coordinates, weights and sums are f64, rounded once at
the store. Every data-dependent index is clamped into its axis before it is read, so
malformed grids, rois or batch indices (NaN, huge, out of range) cannot read outside x;
where the reference would raise on a bad batch index, the kernel clamps it.
"""

from __future__ import annotations

import itertools

from ember.dtypes import DType
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
)
from ember.loops.lower.core import LowerContext, lowering
from ember.loops.lower.ops.linalg import compute_load
from ember.loops.windows import all_of

F64 = DType.f64


def f64(value: float) -> Const:
    return Const(float(value), F64)


class Lets:
    """Intermediate values of a kernel body, each stored once in its own slot of a local
    buffer and read back, so that expressions that use a value several times stay small."""

    def __init__(self, ctx: LowerContext, dtype: DType = F64):
        self.ctx, self.dtype = ctx, dtype
        self.position = len(ctx.locals)
        self.name = ctx.local(dtype, (1,)).name
        self.count = 0

    def __call__(self, stmts: list[Stmt], value: Expr) -> Load:
        slot = (Const(self.count),)
        self.count += 1
        self.ctx.locals[self.position] = Buffer(self.name, self.dtype, (self.count,))
        stmts.append(Store(self.name, slot, value))
        return Load(self.name, slot, self.dtype)


def clamp_f64_index(index: Expr, size: int) -> Expr:
    """An f64 position as an index in [0, size): clamped before the cast (so that the
    cast is in range) and after it (so that NaN cannot escape)."""
    inside = Binary("min", Binary("max", index, f64(0)), f64(size - 1))
    return Binary("min", Binary("max", Cast(INDEX, inside), Const(0)), Const(size - 1))


def between(x: Expr, lo: Expr, hi: Expr) -> Expr:
    return Binary("and", Binary("ge", x, lo), Binary("le", x, hi))


# -- grid_sample ----------------------------------------------------------------------------


def reflect(lets: Lets, stmts: list[Stmt], x: Expr, lo: float, hi: float) -> Expr:
    """x reflected by the borders [lo, hi] until it falls inside (ONNX GridSample)."""
    span = hi - lo
    if span <= 0:
        return f64(lo)
    below, above = Binary("lt", x, f64(lo)), Binary("gt", x, f64(hi))
    dx = lets(stmts, Select(below, Binary("sub", f64(lo), x),
                            Select(above, Binary("sub", x, f64(hi)), f64(0))))
    n = lets(stmts, Unary("trunc", Binary("div", dx, f64(span))))
    r = lets(stmts, Binary("sub", dx, Binary("mul", n, f64(span))))
    even = Binary("eq", Binary("mod", n, f64(2)), f64(0))
    up, down = Binary("add", f64(lo), r), Binary("sub", f64(hi), r)
    return Select(below, Select(even, up, down), Select(above, Select(even, down, up), x))


def grid_position(ctx: LowerContext, lets: Lets, stmts: list[Stmt], g: Expr, size: int
                  ) -> Expr:
    """The input position (f64) that grid value `g` names along an axis of `size`, after
    rounding (nearest) and the padding mode's border handling."""
    attrs = ctx.attrs
    one = ctx.const(1, g.dtype)
    if attrs["align_corners"]:  # (g + 1) / 2 * (size - 1), in the grid's precision
        pos = Binary("mul", Binary("div", Binary("add", g, one), ctx.const(2, g.dtype)),
                     ctx.const(size - 1, g.dtype))
        lo, hi = 0.0, size - 1.0
    else:  # ((g + 1) * size - 1) / 2
        pos = Binary("div", Binary("sub", Binary("mul", Binary("add", g, one),
                                                 ctx.const(size, g.dtype)), one),
                     ctx.const(2, g.dtype))
        lo, hi = -0.5, size - 0.5
    pos = lets(stmts, Cast(F64, pos))
    if attrs["mode"] == "nearest":
        pos = lets(stmts, Unary("round", pos))
    outside = Binary("or", Binary("lt", pos, f64(lo)), Binary("gt", pos, f64(hi)))
    if attrs["padding_mode"] == "border":
        clipped = Binary("min", Binary("max", pos, f64(0)), f64(size - 1))
        pos = lets(stmts, Select(outside, clipped, pos))
    elif attrs["padding_mode"] == "reflection":
        pos = lets(stmts, Select(outside, reflect(lets, stmts, pos, lo, hi), pos))
    return pos


def grid_taps(ctx: LowerContext, lets: Lets, stmts: list[Stmt], pos: Expr, size: int
              ) -> list[tuple[Expr, Expr, Expr | None]]:
    """(index to read, f64 weight, reads-a-pixel condition or None) of each tap at `pos`."""
    attrs = ctx.attrs
    if attrs["mode"] == "nearest":
        taps = [(Unary("trunc", pos), f64(1))]
    else:
        base = lets(stmts, Unary("floor", pos))
        t = lets(stmts, Binary("sub", pos, base))
        if attrs["mode"] == "linear":
            weights, first = [Binary("sub", f64(1), t), t], 0
        else:
            weights, first = cubic_weights(t), -1
        taps = [(Binary("add", base, f64(first + k)), w) for k, w in enumerate(weights)]
    lo, hi = (0.0, size - 1.0) if attrs["align_corners"] else (-0.5, size - 0.5)
    result = []
    for index, weight in taps:
        valid = None
        if attrs["padding_mode"] == "zeros":
            valid = Binary("and", Binary("ge", index, f64(0)), Binary("lt", index, f64(size)))
        elif attrs["padding_mode"] == "reflection":
            index = Unary("trunc", reflect(lets, stmts, lets(stmts, index), lo, hi))
        result.append((clamp_f64_index(index, size), weight, valid))
    return result


def cubic_weights(t: Expr) -> list[Expr]:
    """Keys cubic weights (a = -0.75) of the taps at -1, 0, 1, 2 from floor(x)."""
    a = -0.75

    def near(d: Expr) -> Expr:  # ((a + 2) d - (a + 3)) d d + 1
        inner = Binary("sub", Binary("mul", f64(a + 2), d), f64(a + 3))
        return Binary("add", Binary("mul", Binary("mul", inner, d), d), f64(1))

    def far(d: Expr) -> Expr:  # ((a d - 5a) d + 8a) d - 4a
        inner = Binary("sub", Binary("mul", f64(a), d), f64(5 * a))
        inner = Binary("add", Binary("mul", inner, d), f64(8 * a))
        return Binary("sub", Binary("mul", inner, d), f64(4 * a))

    return [far(Binary("add", t, f64(1))), near(t), near(Binary("sub", f64(1), t)),
            far(Binary("sub", f64(2), t))]


@lowering("grid_sample")
def grid_sample(ctx: LowerContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    dims = x.shape[2:]
    r = len(dims)
    lets = Lets(ctx)
    acc = Load(ctx.local(F64).name, (), F64)
    n, c = ctx.var(), ctx.var()
    o = [ctx.var() for _ in out.shape[2:]]

    # Per output position: each spatial axis' tap tables (index, weight, valid).
    prologue: list[Stmt] = []
    tables = []
    for axis, size in enumerate(dims):
        g = compute_load(ctx, 1, [n, *o, r - 1 - axis])  # the last spatial axis comes first
        pos = grid_position(ctx, lets, prologue, g, size)
        taps = grid_taps(ctx, lets, prologue, pos, size)
        index = ctx.local(INDEX, (len(taps),))
        weight = ctx.local(F64, (len(taps),))
        valid = ctx.local(DType.bool, (len(taps),)) if taps[0][2] is not None else None
        for j, (i, w, v) in enumerate(taps):
            prologue += [Store(index.name, (Const(j),), i), Store(weight.name, (Const(j),), w)]
            if valid is not None:
                prologue.append(Store(valid.name, (Const(j),), v))
        tables.append((index, weight, valid))

    # Sum the taps, the first axis outermost, as the reference's itertools.product does.
    js = [ctx.var("j") for _ in dims]
    read = [Load(t[0].name, (j,), INDEX) for t, j in zip(tables, js)]
    weight = Load(tables[0][1].name, (js[0],), F64)
    for t, j in zip(tables[1:], js[1:]):
        weight = Binary("mul", weight, Load(t[1].name, (j,), F64))
    term = Binary("mul", Cast(F64, ctx.load(0, [n, c, *read])), weight)
    conds = all_of([Load(t[2].name, (j,), DType.bool) for t, j in zip(tables, js)
                    if t[2] is not None])
    if conds is not None:
        term = Select(conds, term, f64(0))
    body: list[Stmt] = [Store(acc.buffer, (), Binary("add", acc, term))]
    for t, j in reversed(list(zip(tables, js))):
        body = [For(j, Const(0), Const(t[0].shape[0]), body)]
    per_channel = [Store(acc.buffer, (), f64(0)), *body,
                   Store("y0", (n, c, *o), Cast(out.dtype, acc))]
    stmts = [*prologue, For(c, Const(0), Const(x.shape[1]), per_channel)]
    for v, extent in reversed(list(zip([n, *o], [out.shape[0], *out.shape[2:]]))):
        stmts = [For(v, Const(0), Const(extent), stmts)]
    return stmts


# -- roi_align ------------------------------------------------------------------------------


def roi_samples(lets: Lets, ints: Lets, bools: Lets, stmts: list[Stmt], start: Expr,
                step: Expr, bin_: Var, sample: Var, grid: Expr, length: int):
    """One sample position along an axis of a roi, as the reference's _roi_axis computes
    it: (low index, high index, weight of low, weight of high, inside)."""
    pos = lets(stmts, Binary("add", Binary("add", start, Binary("mul", Cast(F64, bin_), step)),
                             Binary("div", Binary("mul", Binary("add", Cast(F64, sample),
                                                                f64(0.5)), step),
                                    Cast(F64, grid))))
    inside = bools(stmts, between(pos, f64(-1), f64(length)))
    pos = lets(stmts, Binary("max", pos, f64(0)))
    at_end = bools(stmts, Binary("ge", Unary("floor", pos), f64(length - 1)))
    last = Const(length - 1)
    low = ints(stmts, Select(at_end, last, clamp_f64_index(Unary("floor", pos), length)))
    high = ints(stmts, Select(at_end, last, low + 1))
    frac = lets(stmts, Select(at_end, f64(0), Binary("sub", pos, Cast(F64, low))))
    return low, high, Binary("sub", f64(1), frac), frac, inside


def roi_grid_size(ctx: LowerContext, ints: Lets, stmts: list[Stmt], size: Expr, bins: int
                  ) -> Expr:
    """Samples per bin along an axis: sampling_ratio, or ceil(roi size / bins)."""
    if ctx.attrs["sampling_ratio"]:
        return Const(ctx.attrs["sampling_ratio"])
    limit = float(1 << 30)  # keeps the cast in range (and NaN out of the loop bounds)
    ratio = Unary("ceil", Binary("div", size, f64(bins)))
    bounded = Binary("min", Binary("max", ratio, f64(-limit)), f64(limit))
    return ints(stmts, Cast(INDEX, bounded))


@lowering("roi_align")
def roi_align(ctx: LowerContext):
    x, rois, batch_indices = ctx.inputs
    out = ctx.outputs[0]
    a = ctx.attrs
    n, _, height, width = x.shape
    lets, ints, bools = Lets(ctx), Lets(ctx, INDEX), Lets(ctx, DType.bool)
    acc = Load(ctx.local(F64).name, (), F64)
    k, c, ph, pw, iy, ix = (ctx.var() for _ in range(6))

    # Per roi: its corners, size, sampling grid and image.
    roi: list[Stmt] = []
    offset = 0.5 if a["half_pixel"] else 0.0
    x0, y0, x1, y1 = (lets(roi, Binary("sub", Binary("mul", Cast(F64, ctx.load(1, [k, j])),
                                                     f64(a["spatial_scale"])), f64(offset)))
                      for j in range(4))
    roi_w, roi_h = Binary("sub", x1, x0), Binary("sub", y1, y0)
    if not a["half_pixel"]:  # malformed rois become 1x1
        roi_w, roi_h = Binary("max", roi_w, f64(1)), Binary("max", roi_h, f64(1))
    roi_w, roi_h = lets(roi, roi_w), lets(roi, roi_h)
    grid_h = roi_grid_size(ctx, ints, roi, roi_h, a["output_height"])
    grid_w = roi_grid_size(ctx, ints, roi, roi_w, a["output_width"])
    step_h = lets(roi, Binary("div", roi_h, f64(a["output_height"])))
    step_w = lets(roi, Binary("div", roi_w, f64(a["output_width"])))
    batch = ctx.load(2, [k])
    batch = batch if batch.dtype is INDEX else Cast(INDEX, batch)
    batch = Select(Binary("lt", batch, Const(0)), batch + n, batch)  # negative: from the end
    batch = ints(roi, Binary("min", Binary("max", batch, Const(0)), Const(n - 1)))
    count = ints(roi, grid_h * grid_w)

    # Per sample: the four weighted corners, summed (avg) or maxed (max).
    y_stmts: list[Stmt] = []
    ylo, yhi, wyl, wyh, yin = roi_samples(lets, ints, bools, y_stmts, y0, step_h, ph, iy,
                                          grid_h, height)
    x_stmts: list[Stmt] = []
    xlo, xhi, wxl, wxh, xin = roi_samples(lets, ints, bools, x_stmts, x0, step_w, pw, ix,
                                          grid_w, width)
    inside = Binary("and", yin, xin)
    corners = [Binary("mul", Select(inside, Binary("mul", wy, wx), f64(0)),
                      Cast(F64, ctx.load(0, [batch, c, row, col])))
               for (row, wy), (col, wx) in itertools.product(((ylo, wyl), (yhi, wyh)),
                                                             ((xlo, wxl), (xhi, wxh)))]
    combine = "add" if a["mode"] == "avg" else "max"
    value = f64(0) if combine == "add" else corners[0]
    for corner in corners[1:] if combine == "max" else corners:
        value = Binary(combine, value, corner)
    x_stmts.append(Store(acc.buffer, (), Binary(combine, acc, value)))
    samples = [For(iy, Const(0), grid_h, [*y_stmts, For(ix, Const(0), grid_w, x_stmts)])]

    if combine == "add":
        init = f64(0)
        result = Binary("div", acc, Cast(F64, Binary("max", count, Const(1))))
    else:
        init = f64(float("-inf"))
        result = Select(Binary("ne", count, Const(0)), acc, f64(0))
    per_bin = [Store(acc.buffer, (), init), *samples,
               Store("y0", (k, c, ph, pw), Cast(out.dtype, result))]
    loops = [For(pw, Const(0), Const(out.shape[3]), per_bin)]
    loops = [For(ph, Const(0), Const(out.shape[2]), loops)]
    loops = [For(c, Const(0), Const(out.shape[1]), loops)]
    return [For(k, Const(0), Const(out.shape[0]), [*roi, *loops])]
