"""The implicit-GEMM schedule of a 2-D convolution: out[n] = W (M x K) times im2col(x[n])
(K x P), blocked by the matmul schedule (ember/loops/schedules/gemm.py). The step
`conv_gemm <outer loop> mr nr kc mc nc pack_a parallel` applies it to the plain conv nest
that `graph.conv` lowers to (a window nest over (c, kh, kw) summing x times w, x read at
the reduced channel: ember/loops/schedules/window_nest.py), as k = (c, kh, kw) and
p = (oh, ow); the plain nest's reads of x and w and its stores are instantiated at the
GEMM's variables, so a fused producer, the bias and an epilogue come along. B is never stored:
the schedule's packing of B gathers it from x, so its panels are dense and the micro-kernel
is the matmul's. Without padding, a panel's lanes read row segments of x (masked, or
strided vector loads up to MAX_LOAD_STRIDE); at column stride 1, a panel inside one output
row is one vector load per k; else the lane's position is found by compares and clamped
with selects, since the lanes' vector code has neither division nor integer min/max.

Reads from the target: the f32 lanes and the conv's register tile (`conv_tile`: its
vector registers).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from ember.dtypes import DType
from ember.loops.analysis import MAX_LOAD_STRIDE
from ember.loops.ir import Binary, Const, Expr, Kernel, Load, Select, Stmt, Var, binary
from ember.loops.schedules.gemm import (
    Gemm,
    GemmSchedule,
    apply_gemm,
    conv_tile,
    fit_schedule,
    gemm_step,
)
from ember.loops.schedules.lanes import serial_unless_vectorizable
from ember.loops.schedules.names import FreshNames
from ember.loops.schedules.params import Parameters
from ember.loops.schedules.window_nest import (
    WindowNest,
    Windows,
    mentions,
    product_terms,
    replace_nest,
    step_nest,
    window_nests,
)
from ember.loops.verify import verify_kernel
from ember.loops.windows import all_of, position_checks, window_position
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
class ConvAsGemm:
    """A conv as out[n, m, p] = sum_k a * b over its plain nest's variables n, m, p, k:
    `a` is W[m, k] read in place, `b` im2col(x)[n, k, p] (x at the window position, a
    select giving 0 in the padding when `padded`). `acc` is the plain sum's scalar and
    `result` the stores of it (a fused epilogue's, then the output's); `x(index)` reads x
    at [image, channel, row, column], for the packing's other forms of B."""

    conv: Conv2d
    n: Var
    m: Var
    p: Var
    k: Var
    a: Expr
    b: Expr
    padded: bool
    acc: str
    result: tuple[Stmt, ...]
    x: Callable[[list[Expr]], Expr]


def parameters(target: Target) -> Parameters:
    """The tunable parameters (GemmSchedule's names) and their defaults on `target`."""
    lanes = target.lanes(F32)
    mr, nr = conv_tile(target)
    default = GemmSchedule(kc=KC, mr=mr, nr=nr)
    return {"mr": (default.mr, (4, 6, 8)), "nr": (default.nr, (lanes, 2 * lanes)),
            "mc": (default.mc, (48, 96, 192)), "nc": (default.nc, (128, 256, 512)),
            "parallel": (default.parallel, (2, 4, 8))}


def nests(kernel: Kernel, windows: Windows | None = None) -> list[tuple[str, WindowNest]]:
    """The top-level nests of `kernel` that are plain f32 2-D convs whose input channel is
    the reduced one (x's read does not follow the output channel), each with its outermost
    loop's name: what the `conv_gemm` step schedules. The filter may follow the image (a
    `grouped_conv`'s, read at the image's group): A is then each image's own. `windows`:
    the kernel's window nests by depth, when the caller has found them."""
    found = []
    for loop, nest in (windows or functools.partial(window_nests, kernel))(3):
        terms = product_terms(nest) if nest.combine == "add" and \
            nest.init == Const(0.0, F32) else None
        if terms and not mentions(terms[0], {nest.output[1]}):
            found.append((loop, nest))
    return found


def default_parameters(nest: WindowNest, target: Target) -> dict[str, int]:
    """The tile and blocks of `parameters(target)` (the step fits them to the conv)."""
    return {name: value for name, (value, _) in parameters(target).items()}


def step_arguments(nest: WindowNest, values: dict[str, int], target: Target) -> tuple:
    """The `conv_gemm` step's arguments for `values`: the GemmSchedule they make, fitted
    to the conv's GEMM and the target's stack budgets (`fit_schedule`)."""
    schedule = dataclasses.replace(GemmSchedule(kc=KC), **values)
    fitted = fit_schedule(_conv_as_gemm(FreshNames(Kernel("k", [], [])), nest, schedule)[1],
                          schedule, target)
    return gemm_step("", fitted)[1][1:]


def conv_gemm(kernel: Kernel, loop: str, mr: int, nr: int, kc: int, mc: int, nc: int,
              pack_a: int, parallel: int) -> Kernel:
    """The schedule primitive: the plain conv nest of `loop` (a top-level loop of `kernel`)
    as an implicit GEMM blocked by this GemmSchedule."""
    nest = step_nest(kernel, loop, nests, "conv_gemm",
                     "plain conv nest that is an implicit GEMM", mr=mr, nr=nr, kc=kc, mc=mc,
                     nc=nc, parallel=parallel)
    schedule = GemmSchedule(mr, nr, kc, mc, nc, bool(pack_a), parallel)

    def build(names: FreshNames) -> list[Stmt]:
        return apply_gemm(names, _conv_as_gemm(names, nest, schedule)[1], schedule)

    scheduled = replace_nest(kernel, loop, nest.acc, build)
    # A padded conv's packing has divisions that vary by lane: those loops run serially.
    return verify_kernel(serial_unless_vectorizable(scheduled, simplified=True))


def _conv_as_gemm(names: FreshNames, nest: WindowNest, schedule: GemmSchedule
                  ) -> tuple[ConvAsGemm, Gemm]:
    """The conv nest `nest` as out[n, m, p] = sum_k W[m, k] * col[n, k, p] in fresh
    variables, and its Gemm for `schedule`. B reads x at the window position, clamped into
    the input on axes where a tap can leave it, with zeros there (a select)."""
    nb, m_n, oh_n, ow_n = nest.extents
    x_term, w_term = product_terms(nest)
    n_var, m_var, oh_var, ow_var = nest.output
    c_var, kh_var, kw_var = nest.reduction
    geometry = Conv2d(nb, m_n, oh_n, ow_n, nest.reduction_extents[0], *nest.in_sizes,
                      nest.kernel, nest.strides, nest.pads_begin, nest.dilations)
    n, m, p, k = names.var("n"), names.var("m"), names.var("p"), names.var("k")
    acc = names.local(F32)
    c, kh, kw = geometry.split_k(k)
    oh, ow = p // ow_n, p % ow_n
    a = nest.at(w_term, {n_var: n, m_var: m, c_var: c,
                         kh_var: Const(kh) if isinstance(kh, int) else kh,
                         kw_var: Const(kw) if isinstance(kw, int) else kw})
    position, conds = [], []
    for o, tap, size, o_n, k_n, s_, pb_, d_ in zip(
            (oh, ow), (kh, kw), nest.in_sizes, (oh_n, ow_n), nest.kernel, nest.strides,
            nest.pads_begin, nest.dilations):
        pos = window_position(o, tap, s_, pb_, d_)
        checks = position_checks(pos, size, -pb_, (o_n - 1) * s_ + (k_n - 1) * d_ - pb_)
        if checks:  # read at the clamped position; the select gives 0 where it was outside
            conds += checks
            pos = binary("min", binary("max", pos, 0), size - 1)
        position.append(pos)

    def x(index: list[Expr]) -> Expr:
        image, channel, row, col = index
        return nest.at(x_term, {n_var: image, c_var: channel}, positions=(row, col))

    b = x([n, c, *position])
    if conds:
        b = Select(all_of(conds), b, Const(0.0, F32))
    result = tuple(nest.result_at({n_var: n, m_var: m, oh_var: oh, ow_var: ow},
                                  Load(acc.name, (), F32)))
    conv = ConvAsGemm(geometry, n, m, p, k, a, b, bool(conds), acc.name, result, x)
    return conv, _gemm(conv, schedule)


def _gemm(conv: ConvAsGemm, schedule: GemmSchedule) -> Gemm:
    """The Gemm of `conv` for `schedule` (its tile's width shapes B's packing). A, the
    filter, is read in place: its index splits k into (c, kh, kw), which code generation
    addresses by k itself (flatten_index), so copying its blocks would only copy them
    (figures: docs/decisions.md)."""
    g = conv.conv
    n, k = conv.n, conv.k
    nb, oh_n, ow_n = g.images, g.out_rows, g.out_cols
    h, wd = g.in_rows, g.in_cols
    kh_n, kw_n = g.kernel
    taps = kh_n * kw_n
    strides, pb, dilations = g.strides, g.pads_begin, g.dilations

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
    return Gemm(((n.name, nb),), conv.m.name, g.channels_out, conv.p.name, oh_n * ow_n,
                k.name, g.channels_in * taps, conv.a, conv.b, conv.acc, conv.result,
                None if direct else b_segments if segments else b_panel,
                b_direct if not direct and strides[1] == 1 and ow_n >= schedule.nr else None,
                b_rows_contiguous=direct)

