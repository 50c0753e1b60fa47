"""Lowerings of Winograd's F(mxm, 3x3) transforms (ember/graph/ops/winograd.py): the
arithmetic of one tile, its (m + 2)^2 points kept in scalar locals (lane-private once the
tile loop runs on lanes), in a plain nest over the tiles; each row of a transform's matrix
is a sum of its nonzero coefficients' terms (a coefficient of +-1 an addition):

    winograd_input:   for c, n, pass (rows of B^T that read the same rows of the tile),
                      th { for tw {
                        %d = those rows of x's tile                   (stride-m loads)
                        for each row i of the pass:
                          %r[j] = (B^T d)[i][j]
                          V[(m + 2) i + j, c, (n * TH + th) * TW + tw] = (%r B)[j] } }
    winograd_output:  for n, m, th { for tw {
                        %p[a] = M[a, m, (n * TH + th) * TW + tw]        (contiguous loads)
                        %s = %p A;  y[n, m, m * th + r, m * tw + c] = (A^T %s)[r][c] } }

The scheduling stage puts each row of tiles (the innermost loop, `tw`) on vector lanes, so
that each input element is loaded once and the additions run on vectors
(`ember/loops/schedule.py`, `vectorize_inner_loops`). The input transform is computed a
few rows of the transform at a time, those that read the same rows of the tile (F(2x2):
rows {0}, {1, 2}, {3}; F(4x4): {0}, {1, 2, 3, 4}, {5}), which a pass loads once: writing all
the points at once wrote (m + 2)^2 streams whose distance, often a multiple of 4 KiB, put
them all in one L1 set (docs/decisions.md), and F(4x4) a row a pass loaded rows 1-4 of its
tiles four times (ResNet-18's input transforms: 2.35 -> 1.88 ms in all). The output's m^2
stores per tile are stride-m scatters; a tile of its last row or column, when the output's
size is not a whole number of tiles, stores only the elements inside the output, in loops
of their own. A fused epilogue (bias, activation, residual) applies at each of those
stores.
"""

from __future__ import annotations

import numpy as np

from ember.dtypes import DType
from ember.errors import UnsupportedOpError
from ember.graph.ops.winograd import output_tiles, transform
from ember.loops.ir import Const, Expr, For, Load, Stmt, Store
from ember.loops.lower.core import LowerContext, lowering
from ember.loops.lower.ops.linalg import store_result

F32 = DType.f32


def _f32_only(ctx: LowerContext) -> None:
    if any(b.dtype is not F32 for b in (*ctx.inputs, *ctx.outputs)):
        raise UnsupportedOpError(f"{ctx.op.where()}: Winograd transforms are implemented for"
                                 f" f32 only, got {ctx.inputs[0].dtype}")


def _combine(coefficients, values: list[Expr]) -> Expr:
    """The sum of coefficient times value over the nonzero coefficients, a positive one
    first: +-1 adds or subtracts, others multiply by their magnitude first."""
    terms = [(float(c), v) for c, v in zip(coefficients, values) if c != 0]
    terms.sort(key=lambda term: term[0] < 0)  # (stable: the matrix's order otherwise)
    total: Expr | None = None
    for c, value in terms:
        term = value if abs(c) == 1 else value * Const(abs(c), F32)
        if total is None:
            total = term if c > 0 else Const(0.0, F32) - term
        else:
            total = total + term if c > 0 else total - term
    if total is None:
        raise ValueError("a Winograd transform's row has no nonzero coefficient")
    return total


def _apply(matrix, values: list[Expr]) -> list[Expr]:
    """`matrix` (rows of coefficients) times the column of `values`."""
    return [_combine(row, values) for row in matrix]


def _lane_values(ctx: LowerContext, values: list[Expr]) -> tuple[list[Stmt], list[Expr]]:
    """Stores of `values` into lane-private scalar locals, and loads of them."""
    stores, loads = [], []
    for value in values:
        local = ctx.local(F32)
        stores.append(Store(local.name, (), value))
        loads.append(Load(local.name, (), F32))
    return stores, loads


@lowering("winograd_input")
def winograd_input(ctx: LowerContext) -> list[Stmt]:
    """Per pass over a channel's tiles, the rows of the transform that read the same rows
    of the tile: m + 2 points of a tile per row."""
    _f32_only(ctx)
    (x,), (out,) = ctx.inputs, ctx.outputs
    f = transform(ctx.op.attrs["tile"])
    nb, channels, h, w = x.shape
    th_n, tw_n = (h - 2) // f.tile, (w - 2) // f.tile
    n, c, a, col = ctx.var("n"), ctx.var("c"), ctx.var("a"), ctx.var("col")

    def tile(rows_of_t: list[int], th: Expr, tw: Expr) -> list[Stmt]:
        """Rows `rows_of_t` of the transform, which read the same rows of the tile: those
        rows loaded once, then each row of B^T d, then its points."""
        read = sorted({row for i in rows_of_t for row in range(f.side) if f.input_t[i][row]})
        load_d, loaded = _lane_values(ctx, [ctx.load(0, [n, c, th * f.tile + row,
                                                         tw * f.tile + j])
                                            for row in read for j in range(f.side)])
        t = (n * th_n + th) * tw_n + tw
        stmts = list(load_d)
        for i in rows_of_t:
            coefficients = [f.input_t[i][row] for row in read]
            load_r, r = _lane_values(ctx, [_combine(coefficients, loaded[j::f.side])
                                           for j in range(f.side)])
            stmts += [*load_r, *[Store(out.name, (Const(f.side * i + j), c, t), point)
                                 for j, point in enumerate(_apply(f.input_t, r))]]
        return stmts

    # Columns past the tiles (the pitch) are zero: the matmul reads them.
    pitch = out.shape[2]
    past = [For(a, Const(0), Const(f.points), [For(col, Const(nb * th_n * tw_n), Const(pitch), [
        Store(out.name, (a, c, col), Const(0.0, F32))])])] if pitch > nb * th_n * tw_n else []

    def row_pass(rows_of_t: list[int]) -> For:
        th, tw = ctx.var("th"), ctx.var("tw")
        return For(th, Const(0), Const(th_n), [For(tw, Const(0), Const(tw_n),
                                                   tile(rows_of_t, th, tw))])

    # One pass per set of tile rows that rows of B^T read (F(4x4)'s rows 1-4 all read rows
    # 1-4 of the tile: one pass loads them once for the four).
    passes: dict[tuple[int, ...], list[int]] = {}
    for i in range(f.side):
        passes.setdefault(tuple(np.flatnonzero(f.input_t[i])), []).append(i)
    return [For(c, Const(0), Const(channels),
                [For(n, Const(0), Const(nb), [row_pass(rows) for rows in passes.values()]),
                 *past])]


@lowering("winograd_output")
def winograd_output(ctx: LowerContext) -> list[Stmt]:
    """Per tile, its points (of the products' first N * TH * TW columns; the rest of the
    pitch is not read) into lane-private locals, `p A` into (m + 2) m more, then `A^T`
    down the m columns and one store per output element, each with the fused epilogue."""
    _f32_only(ctx)
    out = ctx.outputs[0]
    f = transform(ctx.op.attrs["tile"])
    m_t = f.tile
    nb, channels, oh_n, ow_n = out.shape
    th_n, tw_n = output_tiles((oh_n, ow_n), m_t)
    n, m = ctx.var("n"), ctx.var("m")

    def tile(th: Expr, tw: Expr, rows: int, cols: int) -> list[Stmt]:
        t = (n * th_n + th) * tw_n + tw
        load_p, p = _lane_values(ctx, [ctx.load(0, [a, m, t]) for a in range(f.points)])
        # p A: across each row of the points (the columns stored), then A^T down them.
        across = [_apply(f.output_t[:cols], p[f.side * i:f.side * (i + 1)])
                  for i in range(f.side)]
        load_s, s = _lane_values(ctx, [across[i][j] for i in range(f.side)
                                       for j in range(cols)])
        stores = []
        for j in range(cols):
            down = _apply(f.output_t[:rows], [s[cols * i + j] for i in range(f.side)])
            stores += [store_result(ctx, [n, m, th * m_t + r, tw * m_t + j], down[r])
                       for r in range(rows)]
        return [*load_p, *load_s, *stores]

    def tiles(th: Expr, rows: int) -> list[Stmt]:
        """A row of tiles: the whole ones, then the last one's columns inside the output."""
        def across(first: int, count: int, cols: int) -> For:
            tw = ctx.var("tw")
            return For(tw, Const(first), Const(first + count), tile(th, tw, rows, cols))

        whole = [across(0, ow_n // m_t, m_t)] if ow_n >= m_t else []
        return whole + ([across(ow_n // m_t, 1, ow_n % m_t)] if ow_n % m_t else [])

    th = ctx.var("th")
    body: list[Stmt] = [For(th, Const(0), Const(oh_n // m_t), tiles(th, m_t))] \
        if oh_n >= m_t else []
    if oh_n % m_t:  # the last row of tiles: its rows inside the output
        body += tiles(Const(oh_n // m_t), oh_n % m_t)
    return [For(n, Const(0), Const(nb), [For(m, Const(0), Const(channels), body)])]
