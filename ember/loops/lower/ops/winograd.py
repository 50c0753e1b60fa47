"""Lowerings of Winograd's F(2x2, 3x3) transforms (ember/graph/ops/winograd.py): the
arithmetic of one tile, its 16 points kept in scalar locals (lane-private once the tile
loop runs on lanes), in a plain nest over the tiles:

    winograd_input:   for c, n, row i < 4, th { for tw {
                        %r[j] = (B^T d)[i][j], from two rows of x's tile (stride-2 loads)
                        V[4 * i + j, c, (n * TH + th) * TW + tw] = (%r B)[j] } }
    winograd_output:  for n, m, th { for tw {
                        %p[a] = M[a, m, (n * TH + th) * TW + tw]        (contiguous loads)
                        %s = %p A;  y[n, m, 2 * th + r, 2 * tw + c] = (A^T %s)[r][c] } }

The scheduling stage puts each row of tiles (the innermost loop, `tw`) on vector lanes, so
that each input element is loaded once and the additions run on vectors
(`ember/loops/schedule.py`, `vectorize_inner_loops`). The input transform is computed one
row of the 4x4 transform at a time, each writing 4 of a tile's 16 points: writing all 16
at once wrote 16 streams whose distance, often a multiple of 4 KiB, puts them all in one
L1 set (docs/decisions.md). The output's four stores per tile are stride-2 scatters; a
tile of its last row or column, when the output's size is odd, stores only the elements
inside the output, in loops of their own. A fused epilogue (bias, activation, residual)
applies at each of those stores.
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.errors import UnsupportedOpError
from ember.graph.ops.winograd import output_tiles
from ember.loops.ir import Const, Expr, For, Load, Stmt, Store
from ember.loops.lower.core import LowerContext, lowering
from ember.loops.lower.ops.linalg import store_result

F32 = DType.f32


def _f32_only(ctx: LowerContext) -> None:
    if any(b.dtype is not F32 for b in (*ctx.inputs, *ctx.outputs)):
        raise UnsupportedOpError(f"{ctx.op.where()}: Winograd transforms are implemented for"
                                 f" f32 only, got {ctx.inputs[0].dtype}")


def _input_rows(d: list[Expr]) -> list[Expr]:
    """B^T applied to 4 values along one axis of the tile."""
    return [d[0] - d[2], d[1] + d[2], d[2] - d[1], d[1] - d[3]]


def _output_rows(p: list[Expr]) -> list[Expr]:
    """A^T applied to 4 values along one axis of the tile."""
    return [p[0] + p[1] + p[2], p[1] - p[2] - p[3]]


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
    """Row i of the 4x4 transform of each channel's tiles: 4 of a tile's 16 points."""
    _f32_only(ctx)
    (x,), (out,) = ctx.inputs, ctx.outputs
    nb, channels, h, w = x.shape
    th_n, tw_n = (h - 2) // 2, (w - 2) // 2
    n, c, a, col = ctx.var("n"), ctx.var("c"), ctx.var("a"), ctx.var("col")

    def tile(i: int, th: Expr, tw: Expr) -> list[Stmt]:
        def d(row: int, column: int) -> Expr:
            return ctx.load(0, [n, c, th * 2 + row, tw * 2 + column])

        # Row i of B^T d, which reads two rows of the tile.
        load_r, r = _lane_values(ctx, [_input_rows([d(row, j) for row in range(4)])[i]
                                       for j in range(4)])
        t = (n * th_n + th) * tw_n + tw
        row = _input_rows(r)
        return [*load_r, *[Store(out.name, (Const(4 * i + j), c, t), row[j])
                           for j in range(4)]]

    # Columns past the tiles (the pitch) are zero: the matmul reads them.
    pitch = out.shape[2]
    past = [For(a, Const(0), Const(16), [For(col, Const(nb * th_n * tw_n), Const(pitch), [
        Store(out.name, (a, c, col), Const(0.0, F32))])])] if pitch > nb * th_n * tw_n else []
    def row_pass(i: int) -> For:
        th, tw = ctx.var("th"), ctx.var("tw")
        return For(th, Const(0), Const(th_n), [For(tw, Const(0), Const(tw_n), tile(i, th, tw))])

    return [For(c, Const(0), Const(channels),
                [For(n, Const(0), Const(nb), [row_pass(i) for i in range(4)]), *past])]


@lowering("winograd_output")
def winograd_output(ctx: LowerContext) -> list[Stmt]:
    """Per tile, its 16 points (of the products' first N * TH * TW columns; the rest of the
    pitch is not read) into lane-private locals, `p A` into 8 more, then `A^T` down the
    two columns and one store per output element, each with the fused epilogue."""
    _f32_only(ctx)
    out = ctx.outputs[0]
    nb, channels, oh_n, ow_n = out.shape
    th_n, tw_n = output_tiles((oh_n, ow_n))
    n, m = ctx.var("n"), ctx.var("m")

    def tile(th: Expr, tw: Expr, rows: int, cols: int) -> list[Stmt]:
        t = (n * th_n + th) * tw_n + tw
        load_p, p = _lane_values(ctx, [ctx.load(0, [a, m, t]) for a in range(16)])
        # p A: across each row of the 4x4 points, then A^T down the two columns.
        across = [_output_rows(p[4 * i:4 * i + 4]) for i in range(4)]
        load_s, s = _lane_values(ctx, [across[i][j] for i in range(4) for j in range(2)])
        stores = []
        for j in range(cols):
            down = _output_rows([s[2 * i + j] for i in range(4)])
            stores += [store_result(ctx, [n, m, th * 2 + r, tw * 2 + j], down[r])
                       for r in range(rows)]
        return [*load_p, *load_s, *stores]

    def tiles(th: Expr, rows: int) -> list[Stmt]:
        """A row of tiles: the whole ones, then (odd width) the last one's first column."""
        def across(first: int, count: int, cols: int) -> For:
            tw = ctx.var("tw")
            return For(tw, Const(first), Const(first + count), tile(th, tw, rows, cols))

        return [across(0, ow_n // 2, 2)] + ([across(ow_n // 2, 1, 1)] if ow_n % 2 else [])

    th = ctx.var("th")
    body: list[Stmt] = [For(th, Const(0), Const(oh_n // 2), tiles(th, 2))]
    if oh_n % 2:  # the last row of tiles: its first row alone
        body += tiles(Const(oh_n // 2), 1)
    return [For(n, Const(0), Const(nb), [For(m, Const(0), Const(channels), body)])]
