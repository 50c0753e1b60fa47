"""The schedule of a 2-D f32 max or average pool: vectors of L output columns, R rows at
once. Each vector combines its unrolled taps; a tap outside the input (padding, a
ceil_mode overhang) is a select around the load, so those lanes read nothing and give the
combine's identity, and at stride s the lanes read every s-th input column (a strided
load):

    for %nc { for %oh = 0 to OH / R { for %ow0 = 0 to ceil(OW / L) {
      (r < R unrolled, row = oh * R + r)
      %acc[r, jj] = identity;  for %kh, %kw unrolled { (r) { for %jj = 0 to L vectorized {
        %acc[r, jj] = combine(%acc[r, jj], select(inside,
                              x[n, c, ih(row, kh), (ow0 * L + jj) * s + kw - pl], identity))
      } } }
      y[n, c, row, ow0 * L + jj] = finish(%acc[r, jj])  (the lanes before OW) } } }

The rows taken together are chains of their own: a NaN-propagating max is several
instructions a tap, which would wait on each other in one chain. These vectors do not
depend on LLVM's loop vectorizer.

Reads from the target: the f32 lanes, the default L (one vector register); L and the
rows at once (R) are parameters.
The measurements behind these choices: docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ember.dtypes import DType
from ember.loops.ir import Binary, Const, Expr, For, Load, Select, Stmt, Store, Var
from ember.loops.schedules.lanes import largest_divisor, vector_loop
from ember.loops.schedules.params import Parameters, chosen
from ember.loops.windows import all_of, window_checks, window_position

F32 = DType.f32
# lanes: output columns per vector (default: the target's f32 lanes); chains: output
# vectors computed at once.
PARAMETERS: Parameters = {"lanes": (16, (8, 16, 32)), "chains": (8, (1, 2, 4, 8))}


@dataclass(frozen=True)
class Pool2d:
    """The windows of a 2-D pool of x [N, C, H, W] into y [N, C, OH, OW]."""

    images: int
    channels: int
    out_rows: int
    out_cols: int
    in_sizes: tuple[int, int]  # (H, W)
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads_begin: tuple[int, ...]
    dilations: tuple[int, ...]


def schedule_pool_rows(ctx, pool: Pool2d, combine: str, identity: Const,
                       x: Callable[[list[Expr]], Expr],
                       store: Callable[[list[Expr], Expr], Stmt]) -> list[Stmt]:
    """The scheduled nest of `pool`, which reduces its windows of x (x(index) reads x at
    [image, channel, row, column]) with `combine` from `identity`, and stores a window's
    total at [image, channel, row, column] by store(index, total); `ctx` (a
    LowerContext) makes its variables and locals and gives its parameters."""
    oh_n, ow_n = pool.out_rows, pool.out_cols
    nb, channels = pool.images, pool.channels
    kernel, strides, pb, dilations = pool.kernel, pool.strides, pool.pads_begin, pool.dilations
    parameters = chosen(ctx, "pool", PARAMETERS, lanes=ctx.target.lanes(F32))
    lanes = min(parameters["lanes"], ow_n)
    blocks = (ow_n + lanes - 1) // lanes
    down = largest_divisor(oh_n, parameters["chains"])  # rows taken together
    acc = ctx.local(F32, (down, lanes))
    nc, oh, ow0, kh, kw, r = (ctx.var(v) for v in ("nc", "oh", "ow0", "kh", "kw", "r"))
    n, c = (nc // channels, nc % channels) if nb > 1 else (Const(0), nc)
    row = oh * down + r

    def each_row(body: list[Stmt]) -> For:
        return For(r, Const(0), Const(down), body, 1, "unrolled")

    def tap(jj: Var) -> list[Stmt]:
        # Lanes past OW (in the last block) take windows past the input's end: the
        # checks on columns cover them.
        col = ow0 * lanes + jj
        positions = [window_position(o, t, s_, p, d) for o, t, s_, p, d in
                     zip((row, col), (kh, kw), strides, pb, dilations)]
        conds = window_checks(positions, pool.in_sizes, (oh_n, blocks * lanes), kernel,
                              strides, pb, dilations)
        value = x([n, c, *positions])
        if conds:
            value = Select(all_of(conds), value, identity)
        current = Load(acc.name, (r, jj), F32)
        return [Store(acc.name, (r, jj), Binary(combine, current, value))]

    def result(jj: Var) -> list[Stmt]:
        return [store([n, c, row, ow0 * lanes + jj], Load(acc.name, (r, jj), F32))]

    stop = Binary("min", Const(lanes), Const(ow_n) - ow0 * lanes) if ow_n % lanes \
        else Const(lanes)
    body = [each_row([vector_loop(ctx, lanes, lambda jj: [Store(acc.name, (r, jj),
                                                                  identity)])]),
            For(kh, Const(0), Const(kernel[0]),
                [For(kw, Const(0), Const(kernel[1]),
                     [each_row([vector_loop(ctx, lanes, tap)])], 1, "unrolled")],
                1, "unrolled"),
            each_row([vector_loop(ctx, stop, result)])]
    return [For(nc, Const(0), Const(nb * channels),
                [For(oh, Const(0), Const(oh_n // down),
                     [For(ow0, Const(0), Const(blocks), body)])])]
