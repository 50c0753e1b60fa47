"""The schedules of Winograd's F(2x2, 3x3) transforms (ember/loops/lower/ops/winograd.py
gives the arithmetic of one tile): both walk the tiles of a row of tiles on vector lanes,
up to LANES at a time, each lane a tile whose points live in lane-private locals, so that
each input element is loaded once and the additions run on vectors:

    winograd_input:   for c, n, pass i < 4, th { for tw vectorized { row i of a tile } }
    winograd_output:  for n, m, th { for tw vectorized { a tile } }

The input transform runs in four passes, one per row of the 4x4 transform, each writing 4
of a tile's 16 points: writing all 16 at once wrote 16 streams whose distance, often a
multiple of 4 KiB, puts them all in one L1 set. The output's last row and column of tiles,
when its size is odd, have loops of their own that store only what is inside the output.

Reads no target fact: LANES is a constant.
The measurements behind these choices: docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Callable

from ember.loops.ir import Const, Expr, For, Stmt, Var
from ember.loops.schedules.lanes import lane_chunks

LANES = 16  # tiles per vector (one AVX-512 register of f32, two AVX2 ones)


def schedule_winograd_input(ctx, images: int, channels: int, tiles: tuple[int, int], n: Var,
                            c: Var, tile: Callable[[int, Expr, Expr], list[Stmt]],
                            after: list[Stmt]) -> list[Stmt]:
    """The scheduled nest over images `n` and channels `c` of `tiles` (rows, columns of
    tiles), tile(i, th, tw) computing row i of tile (th, tw)'s transform; `after` ends each
    channel. `ctx` (a LowerContext) makes the variables."""
    th_n, tw_n = tiles

    def row_pass(i: int) -> For:
        th = ctx.var("th")
        return For(th, Const(0), Const(th_n), lane_chunks(ctx, tw_n, LANES,
                                                         lambda tw: tile(i, th, tw)))

    return [For(c, Const(0), Const(channels),
                [For(n, Const(0), Const(images), [row_pass(i) for i in range(4)]), *after])]


def schedule_winograd_output(ctx, images: int, channels: int, out_size: tuple[int, int],
                             n: Var, m: Var,
                             tile: Callable[[Expr, Expr, int, int], list[Stmt]]) -> list[Stmt]:
    """The scheduled nest over images `n` and channels `m` of an output of `out_size`,
    tile(th, tw, rows, cols) storing the first rows x cols elements of tile (th, tw).
    `ctx` (a LowerContext) makes the variables."""
    oh_n, ow_n = out_size

    def row_of_tiles(th: Expr, rows: int) -> list[Stmt]:
        # Whole tiles, then (odd width) the last tile's first column alone.
        stmts = lane_chunks(ctx, ow_n // 2, LANES, lambda tw: tile(th, tw, rows, 2))
        if ow_n % 2:
            stmts += lane_chunks(ctx, 1, LANES, lambda tw: tile(th, tw + ow_n // 2, rows, 1))
        return stmts

    th = ctx.var("th")
    body: list[Stmt] = [For(th, Const(0), Const(oh_n // 2), row_of_tiles(th, 2))]
    if oh_n % 2:  # the last row of tiles: its first row alone
        body += row_of_tiles(Const(oh_n // 2), 1)
    return [For(n, Const(0), Const(images), [For(m, Const(0), Const(channels), body)])]
