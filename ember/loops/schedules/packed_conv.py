"""The schedule of a conv whose weights are packed in panels of L output channels
(`packed_conv`, ember/graph/passes/pack_convs.py), with the output channels in the vector
lanes: a tile is R output positions by one panel, R * L / 16 register-held accumulators;
per (c, kh, kw) it loads one row of the panel and broadcasts R input elements:

    for %t = 0 to N * (M / L) * ceil(P / R) parallel {
      (n, q, p0) from t
      %acc[r, jj] = 0
      for %c = 0 to C { for %kh unrolled { for %kw unrolled { (r < R unrolled) {
        for %jj = 0 to L vectorized {
          %acc[r, jj] = fma(x[n, c, oh(p0 + r) * sh + kh * dh, ow(p0 + r) * sw + kw * dw],
                            wp[q, (c * KH + kh) * KW + kw, jj], %acc[r, jj])
      } } } } }
      %sums[r, jj] = %acc[r, jj]                       (r unrolled, jj vectorized)
      for %jj = 0 to L { for %r = 0 to min(R, P - p0) vectorized {
        out[n, q * L + jj, oh(p0 + r), ow(p0 + r)] = %sums[r, jj] (+ bias) } }
    }

The write-back puts positions in the lanes: per output channel, the tile's positions are
one contiguous store, read from the sums by a gather; the sum reads every operand
contiguously or as a broadcast. On a small plane (7x7) the implicit GEMM's panels of
output positions would leave lanes idle; here none are when M is a multiple of L.

Reads no target fact: L is the panel width the graph pass chose, R a constant.
The measurements behind these choices: docs/decisions.md.
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.loops.ir import Const, Fma, For, Load, Stmt, Store, Var, binary
from ember.loops.schedules.conv import Conv2d, ConvTerms
from ember.loops.schedules.gemm import MIN_PARALLEL_FMAS
from ember.loops.schedules.lanes import vector_loop

F32 = DType.f32
PACKED_CONV_ROWS = 7  # output positions per tile: 7 x 32 lanes is 14 accumulators


def packed_conv_rows(positions: int) -> int:
    """Output positions per tile for a plane of `positions`: a divisor of it near
    PACKED_CONV_ROWS when there is one (7x7 and 14x14 planes take 7), so that no tile
    computes positions past the plane."""
    for rows in (PACKED_CONV_ROWS, 8, 6):
        if positions % rows == 0:
            return rows
    return min(PACKED_CONV_ROWS, positions)


def schedule_packed_conv(ctx, conv: Conv2d, panels: int, lanes: int,
                         terms: ConvTerms) -> list[Stmt]:
    """The scheduled nest of `conv` (no padding) with its weights in `panels` panels of
    `lanes` output channels, read as terms.w([panel, k, lane]); `ctx` (a LowerContext)
    makes its variables and locals."""
    (sh, sw), (dh, dw) = conv.strides, conv.dilations
    kh_n, kw_n = conv.kernel
    nb, m_out, oh_n, ow_n = conv.images, conv.channels_out, conv.out_rows, conv.out_cols
    c_in = conv.channels_in
    positions = oh_n * ow_n
    rows = packed_conv_rows(positions)
    tiles = -(-positions // rows)
    acc = ctx.local(F32, (rows, lanes))
    t, c, kh, kw, r = (ctx.var(v) for v in ("task", "c", "kh", "kw", "r"))
    n = t // (panels * tiles) if nb > 1 else Const(0)
    q, p0 = (t // tiles) % panels, (t % tiles) * rows
    p = p0 + r
    if positions % rows:  # the last tile's rows past the plane read its last position
        p = binary("min", p, positions - 1)
    oh, ow = p // ow_n, p % ow_n

    def each_row(body: list[Stmt]) -> For:
        return For(r, Const(0), Const(rows), body, 1, "unrolled")

    def tap(jj: Var) -> list[Stmt]:
        k = (c * kh_n + kh) * kw_n + kw
        value = Fma(terms.x([n, c, oh * sh + kh * dh, ow * sw + kw * dw]),
                    terms.w([q, k, jj]), Load(acc.name, (r, jj), F32))
        return [Store(acc.name, (r, jj), value)]

    # The write-back puts the tile's positions in the lanes, one output channel at a time:
    # a tile's positions are consecutive in the plane, so each channel's are one contiguous
    # (masked) store, and a fused epilogue reads its other operands (a residual) the same
    # way. The sums are read across their rows, a gather, from a copy of the accumulators:
    # a gather from the accumulators themselves would keep LLVM from holding them in
    # registers through the sum (it ran much slower that way).
    sums = ctx.local(F32, (rows, lanes))
    copy = vector_loop(ctx, lanes, lambda jj: [Store(sums.name, (r, jj),
                                                     Load(acc.name, (r, jj), F32))])
    jj, pr = ctx.var("jj"), ctx.var("r")
    m = q * lanes + jj
    p_out = p0 + pr
    written = binary("min", Const(rows), Const(positions) - p0) if positions % rows \
        else Const(rows)
    store = terms.store([n, m, p_out // ow_n, p_out % ow_n], Load(sums.name, (pr, jj), F32))
    write_back = For(jj, Const(0), Const(lanes),
                     [For(pr, Const(0), written, [store], 1, "vectorized")])
    zero = vector_loop(ctx, lanes, lambda jj: [Store(acc.name, (r, jj), Const(0.0, F32))])
    taps = For(kh, Const(0), Const(kh_n),
               [For(kw, Const(0), Const(kw_n), [each_row([vector_loop(ctx, lanes, tap)])], 1,
                    "unrolled")], 1, "unrolled")
    body = [each_row([zero]), For(c, Const(0), Const(c_in), [taps]), each_row([copy]),
            write_back]
    # Tasks write disjoint tiles, which the default schedule cannot see through t's
    # division into (n, q, p0): the loop is made parallel here, as the GEMM's is.
    work = nb * m_out * positions * c_in * kh_n * kw_n
    kind = "parallel" if work >= MIN_PARALLEL_FMAS else "serial"
    return [For(t, Const(0), Const(nb * panels * tiles), body, 1, kind)]
