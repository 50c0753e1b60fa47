"""The implicit-GEMM schedule of a 2-D convolution: out[n] = W (M x K) times im2col(x[n])
(K x P), blocked by the matmul schedule (ember/loops/schedules/gemm.py). B is never stored:
the schedule's packing of B gathers it from x, so its panels are dense and the micro-kernel
is the matmul's. Without padding, a panel's lanes read row segments of x (masked, or
strided vector loads up to MAX_LOAD_STRIDE); at column stride 1, a panel inside one output
row is one vector load per k; else the lane's position is found by compares and clamped
with selects, since the lanes' vector code has neither division nor integer min/max.

Reads from the target: the f32 lanes and the conv's register tile (`conv_tile`: its
vector registers). Also the geometry (`Conv2d`) and the terms (`ConvTerms`) that the
depthwise and packed conv schedules take.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ember.dtypes import DType
from ember.loops.analysis import MAX_LOAD_STRIDE
from ember.loops.ir import Binary, Const, Expr, Select, Stmt, Store, Var, binary
from ember.loops.schedules.gemm import Gemm, GemmSchedule, apply_gemm, conv_tile, fit_schedule
from ember.loops.schedules.params import Parameters, chosen
from ember.loops.windows import all_of, window_position
from ember.target import Target

F32 = DType.f32
KC = 8192  # K = c * kh * kw summed in one pass up to this (ResNet's deepest is 4608)


@dataclass(frozen=True)
class Conv2d:
    """The geometry of a 2-D convolution of x [N, C, H, W] into out [N, M, OH, OW]."""

    images: int  # N
    channels_out: int  # M
    out_rows: int  # OH
    out_cols: int  # OW
    channels_in: int  # C (per group)
    in_rows: int  # H
    in_cols: int  # W
    kernel: tuple[int, int]  # (KH, KW)
    strides: tuple[int, ...]
    pads_begin: tuple[int, ...]
    dilations: tuple[int, ...]

    def split_k(self, k: Expr) -> tuple[Expr, Expr | int, Expr | int]:
        """(c, kh, kw) of k = (c * KH + kh) * KW + kw, W's row-major layout."""
        kh_n, kw_n = self.kernel
        taps = kh_n * kw_n
        return (k // taps, (k // kw_n) % kh_n, k % kw_n) if taps > 1 else (k, 0, 0)


@dataclass(frozen=True)
class ConvTerms:
    """What a direct conv schedule reads and stores, as the lowering defines them: `x` the
    input at [image, channel, row, column], `w` the filter at its own index, and
    `store(index, sum)` the output's store of a sum at [image, channel, row, column], with
    the bias and any fused epilogue."""

    x: Callable[[list[Expr]], Expr]
    w: Callable[[list[Expr]], Expr]
    store: Callable[[list[Expr], Expr], Stmt]


@dataclass(frozen=True)
class ConvAsGemm:
    """A conv as out[n, m, p] = sum_k a * b over its plain nest's variables n, m, p, k:
    `a` is W[m, k] read in place, `b` im2col(x)[n, k, p] (x at the window position, a
    select giving 0 in the padding when `padded`). `acc` is the plain sum's scalar and
    `store` the output's store of it (with the epilogue); `x(index)` reads x at [image,
    channel, row, column], for the packing's other forms of B."""

    conv: Conv2d
    n: Var
    m: Var
    p: Var
    k: Var
    a: Expr
    b: Expr
    padded: bool
    acc: str
    store: Store
    x: Callable[[list[Expr]], Expr]


def parameters(target: Target) -> Parameters:
    """The tunable parameters (GemmSchedule's names) and their defaults on `target`."""
    lanes = target.lanes(F32)
    mr, nr = conv_tile(target)
    default = GemmSchedule(kc=KC, mr=mr, nr=nr)
    return {"mr": (default.mr, (4, 6, 8)), "nr": (default.nr, (lanes, 2 * lanes)),
            "mc": (default.mc, (48, 96, 192)), "nc": (default.nc, (128, 256, 512)),
            "parallel": (default.parallel, (2, 4, 8))}


def schedule_conv_gemm(ctx, conv: ConvAsGemm) -> list[Stmt]:
    """The scheduled nest of `conv`; `ctx` (a LowerContext) makes its variables and locals
    and gives its parameters. A, the filter, is read in place: its index splits k into (c,
    kh, kw), which code generation addresses by k itself (flatten_index), so copying its blocks
    would only copy them (figures: docs/decisions.md)."""
    g = conv.conv
    n, k = conv.n, conv.k
    nb, oh_n, ow_n = g.images, g.out_rows, g.out_cols
    h, wd = g.in_rows, g.in_cols
    kh_n, kw_n = g.kernel
    taps = kh_n * kw_n
    strides, pb, dilations = g.strides, g.pads_begin, g.dilations
    schedule = dataclasses.replace(GemmSchedule(kc=KC),
                                   **chosen(ctx, "conv_gemm", parameters(ctx.target)))

    def b_panel(values: dict[str, Expr], col0: Expr, jj: Var) -> Expr:
        """B at column col0 + jj without a division on the lane (vector code has none):
        the lane's row is col0's plus how many row ends it passes (at most nr), counted by
        compares."""
        image, kk = values[n.name], values[k.name]
        cc, th, tw = g.split_k(kk)
        e = col0 % ow_n + jj
        wraps = [Select(binary("ge", e, t * ow_n), Const(1), Const(0))
                 for t in range(1, (ow_n + schedule.nr - 2) // ow_n + 1)]
        q = sum(wraps[1:], wraps[0]) if wraps else Const(0)
        row, col = col0 // ow_n + q, e - q * ow_n
        if not conv.padded:  # every tap of every output inside x (graph/passes/pad_convs.py)
            if (oh_n * ow_n) % schedule.nr:  # lanes past N: their rows are clamped
                row = Select(Binary("ge", row, Const(oh_n)), Const(oh_n - 1), row)
            at = [window_position(o, tap, s_, 0, d_)
                  for o, tap, s_, d_ in zip((row, col), (th, tw), strides, dilations)]
            return conv.x([image, cc, *at])
        at, inside = [], []
        for o, tap, size, s_, pb_, d_ in zip((row, col), (th, tw), (h, wd), strides, pb,
                                             dilations):
            pos = window_position(o, tap, s_, pb_, d_)
            inside += [Binary("ge", pos, Const(0)), Binary("lt", pos, Const(size))]
            # Clamped with selects (integer min/max have no vector code); rows past the
            # output (columns past N) are clamped too.
            at.append(Select(Binary("lt", pos, Const(0)), Const(0),
                             Select(Binary("ge", pos, Const(size)), Const(size - 1), pos)))
        return Select(all_of(inside), conv.x([image, cc, *at]), Const(0.0, F32))

    def b_segments(values: dict[str, Expr], col0: Expr, jj: Var) -> Expr:
        """B at column col0 + jj for a conv without padding: the panel's lanes lie in a few
        output rows (up to 4 for 7 columns a row), and the lanes of each row read a row
        segment of x (every column at stride 1, every second at stride 2: a strided load),
        one vector load masked to those lanes (a select around a load:
        ember/codegen/vector.py), so no lane reads outside x."""
        image, kk = values[n.name], values[k.name]
        cc, th, tw = g.split_k(kk)
        (sh, sw), (dh, dw) = strides, dilations
        c0, row0 = col0 % ow_n, col0 // ow_n
        value: Expr = Const(0.0, F32)
        for seg in reversed(range((ow_n + schedule.nr - 2) // ow_n + 1)):
            row = row0 + seg
            lanes = [binary("lt", jj, Const((seg + 1) * ow_n) - c0)]
            if seg:
                lanes.append(binary("ge", jj, Const(seg * ow_n) - c0))
            if (oh_n * ow_n) % schedule.nr:  # the last panel's rows past the output
                lanes.append(binary("lt", row, oh_n))
                row = binary("min", row, oh_n - 1)
            load = conv.x([image, cc, window_position(row, th, sh, 0, dh),
                           window_position(c0 - seg * ow_n + jj, tw, sw, 0, dw)])
            value = Select(all_of(lanes), load, value)
        return value

    def b_direct(col0: Expr):
        """At column stride 1, a panel inside one output row whose every tap reads inside
        the input row is a row segment of x: one vector load per k (the input row, the
        same for every lane, may still be padding: a uniform select)."""
        (sh, _), (ph, pw), (dh, dw) = strides, pb, dilations  # column stride 1
        c0, row = col0 % ow_n, col0 // ow_n
        cond = all_of([binary("le", c0 + schedule.nr, ow_n), binary("ge", c0 - pw, 0),
                       binary("le", c0 + (schedule.nr - 1) + (kw_n - 1) * dw - pw, wd - 1)])

        def value(values: dict[str, Expr], jj: Var) -> Expr:
            image, kk = values[n.name], values[k.name]
            cc, th, tw = g.split_k(kk)
            ih = window_position(row, th, sh, ph, dh)
            if not conv.padded:  # no padding: the panel's row is inside x
                return conv.x([image, cc, ih, c0 + tw * dw + jj])
            at = Select(Binary("lt", ih, Const(0)), Const(0),
                        Select(Binary("ge", ih, Const(h)), Const(h - 1), ih))
            load = conv.x([image, cc, at, c0 - pw + tw * dw + jj])
            inside = Binary("and", Binary("ge", ih, Const(0)), Binary("lt", ih, Const(h)))
            return Select(inside, load, Const(0.0, F32))

        return cond, value

    # A 1x1 conv with stride 1 and no padding reads B = x[n] as it lies (K x P, rows
    # contiguous): its panels are packed from vector loads, no gather needed.
    direct = taps == 1 and not conv.padded and all(s_ == 1 for s_ in strides)
    segments = not conv.padded and strides[1] <= MAX_LOAD_STRIDE
    gemm = Gemm(((n.name, nb),), conv.m.name, g.channels_out, conv.p.name, oh_n * ow_n,
                k.name, g.channels_in * taps, conv.a, conv.b, conv.acc, (conv.store,),
                None if direct else b_segments if segments else b_panel,
                b_direct if not direct and strides[1] == 1 and ow_n >= schedule.nr else None,
                b_rows_contiguous=direct)
    return apply_gemm(ctx, gemm, fit_schedule(gemm, schedule, ctx.target))

