"""The schedule of a conv whose weights are packed in panels of L output channels
(`packed_conv`, ember/graph/passes/pack_convs.py), with the output channels in the vector
lanes: a tile is R output positions by one panel, R * L / lanes register-held accumulators
(the GEMM micro-kernel's shape: positions are its rows, the panel its vectors across); per
(c, kh, kw) it loads one row of the panel and broadcasts R input elements:

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

Where a panel is deeper than half of L1 holds (C * KH * KW rows of L floats), the sum runs
in passes of a block of input channels: a task is a panel (or a group of its tiles), and
per pass each tile resumes from its partial sums in a per-task workspace, sums the block
(read from L1 by every tile, not from L2) and saves them, the last pass writing back
(`pass_channels`; the GEMM's passes over k, ember/loops/schedules/gemm.py).

The write-back puts positions in the lanes: per output channel, the tile's positions are
one contiguous store, read from the sums by a gather; the sum reads every operand
contiguously or as a broadcast. An epilogue that reads nothing by position (a bias, an
activation) runs in the copy to the sums instead, on whole vectors of channels; the tiles
of a panel prefetch the next panel's rows for each c (`next_panel_prefetches`). On a
small plane (7x7) the implicit GEMM's panels of output positions would leave lanes idle;
here none are when M is a multiple of L.

The step `packed_conv <outer loop> <R> <channels> <groups>` applies this to the plain nest
that `graph.packed_conv` lowers to (a window nest with no padding whose filter is read from
panels, wp[m // L, k, m % L]: ember/loops/schedules/window_nest.py); the plain nest's reads
and stores are instantiated at the tile's variables.

Reads from the target: the registers and FMA units, through the GEMM's register tile
(`panel_lanes`, `default_parameters`), L1's size and the cores (`pass_channels`). L is the
panel width the graph pass chose.
The measurements behind these choices: docs/decisions.md.
"""

from __future__ import annotations

import functools
import math

from ember.dtypes import DType
from ember.errors import ScheduleError
from ember.loops.ir import (
    Binary,
    Const,
    Expr,
    Fma,
    For,
    If,
    Kernel,
    Load,
    Stmt,
    Store,
    Var,
    as_expr,
    binary,
    map_expr,
    walk_expr,
)
from ember.loops.schedules.gemm import MIN_PARALLEL_FMAS, hint, next_panel_prefetches
from ember.loops.schedules.lanes import serial_unless_vectorizable, vector_loop
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
from ember.target import Target

F32 = DType.f32
# rows: output positions per tile (the default derives from the target's registers and the
# plane: `default_parameters`).
PARAMETERS: Parameters = {"rows": (6, (4, 5, 6, 7, 8))}
MAX_ROWS = 8  # output positions per tile at most: each is a stream of broadcasts
# Taps unrolled at most: a 3x3 filter's 9 unroll whole, a patch embedding's 16x16 unrolls a
# row of 16 (its 32x32, CLIP's, unrolled whole, was 1024 copies of the tile's FMAs: a
# minute of LLVM for one kernel).
MAX_UNROLLED_TAPS = 16


def panel_lanes(target: Target, channels: int) -> int | None:
    """The panel width (output channels a tile holds) for a packed conv of `channels`
    output channels on `target`: the widest power of two of f32 vectors, at most the GEMM
    micro-kernel's vectors across (`tile_vectors`), that divides the channels; None when
    not one vector divides them. 16 with AVX2 (2 vectors of 8 by 6 positions: 12
    accumulators of 16 registers; a panel of 8 by 7, as before, was latency-bound: 7
    accumulators for two FMA units, ResNet-50's late 1x1 convs at 37-58% of the peak)."""
    from ember.loops.schedules.gemm import tile_vectors

    lanes, most = target.lanes(F32), tile_vectors(target)
    widest = None
    vectors = 1
    while vectors <= most:
        if channels % (vectors * lanes) == 0:
            widest = vectors * lanes
        vectors *= 2
    return widest


def packed_conv_rows(positions: int, most: int) -> int:
    """Output positions per tile for a plane of `positions`, a tile of at most `most`:
    `most`, unless a tile or two fewer leaves fewer positions past the plane where `most`
    leaves over 5% of it (7x7 planes take 7 of 8)."""
    most = max(1, min(most, positions))

    def past(rows: int) -> int:
        return -(-positions // rows) * rows - positions

    if past(most) <= 0.05 * positions:
        return most
    return min(range(most, max(1, most - 2) - 1, -1), key=past)


def panel_width(nest: WindowNest, shapes: dict[str, tuple[int, ...]]) -> int | None:
    """L when the nest's filter term reads wp[m // L, k, m % L] (wp[0, k, m] when M fits
    one panel), else None."""
    terms = product_terms(nest)
    w = terms[1] if terms else None
    m = Var(nest.output[1])
    if not (isinstance(w, Load) and len(w.index) == 3 and w.buffer in shapes):
        return None
    panel, _, lane = w.index
    lanes = shapes[w.buffer][2]
    if panel == Const(0) and lane == m and shapes[w.buffer][0] == 1 or \
            panel == Binary("floordiv", m, Const(lanes)) and lane == Binary("mod", m,
                                                                            Const(lanes)):
        return lanes
    return None


def nests(kernel: Kernel, windows: Windows | None = None) -> list[tuple[str, WindowNest]]:
    """The top-level nests of `kernel` that are plain f32 2-D convs with no padding whose
    filter is read from panels of output channels, each with its outermost loop's name:
    what the `packed_conv` step schedules. `windows`: the kernel's window nests by
    depth, when the caller has found them."""
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    found = []
    for loop, nest in (windows or functools.partial(window_nests, kernel))(3):
        terms = product_terms(nest)
        if nest.combine == "add" and nest.init == Const(0.0, F32) and terms and \
                not any(nest.pads_begin) and not mentions(terms[0], {nest.output[1]}) and \
                panel_width(nest, shapes) and nest.extents[1] % panel_width(nest, shapes) == 0:
            found.append((loop, nest))
    return found


def default_parameters(nest: WindowNest, target: Target) -> dict[str, int]:
    """The rows of the tile on `target`: as many as the GEMM's register tile of the
    panel's vectors holds (`register_tile`), at most MAX_ROWS, fitted to the plane."""
    from ember.loops.schedules.gemm import register_tile

    vectors = max(1, _panel_lanes_of(nest) // target.lanes(F32))
    most = min(MAX_ROWS, register_tile(target, vectors)[0])
    return {"rows": packed_conv_rows(nest.extents[2] * nest.extents[3], most)}


def _panel_lanes_of(nest: WindowNest) -> int:
    """L of the nest's filter read wp[m // L, k, m % L] (or wp[0, k, m]: one panel)."""
    panel = product_terms(nest)[1].index[0]
    return int(panel.b.value) if isinstance(panel, Binary) else nest.extents[1]


def step_arguments(nest: WindowNest, values: dict[str, int], target: Target) -> tuple:
    """The `packed_conv` step's arguments for `values` on `target`: the rows, and the input
    channels a pass sums and the groups of a panel's tiles (`pass_channels`)."""
    return (values["rows"], *pass_channels(nest, values["rows"], target))


def pass_channels(nest: WindowNest, rows: int, target: Target) -> tuple[int, int]:
    """(channels, groups): the input channels a pass sums, so that its block of the panel
    (channels x taps x L) stays in half of L1, where every tile of the panel reads it
    instead of from L2 (0: one pass, the panel is that small already); and the groups a
    panel's tiles are split into, so that the tasks are a multiple of the cores.
    Alone on one thread (Sapphire Rapids, docs/benchmarks.md, stop 48): ResNet-50's 3x3
    512->512 at 7x7 (a panel of 1.2 MB) 1.75 -> 1.56 ms, 2048->512 at 7x7 0.83 -> 0.70 ms;
    ResNet-50 and RegNet as a whole 6% faster."""
    lanes = _panel_lanes_of(nest)
    taps = nest.kernel[0] * nest.kernel[1]
    c_in = nest.reduction_extents[0]
    channels = max(1, target.l1d_bytes // 2 // (4 * taps * lanes))
    if channels >= c_in:
        return 0, 1
    panels = hint(nest.extents[0]) * (nest.extents[1] // lanes)
    tiles = -(-nest.extents[2] * nest.extents[3] // min(rows, nest.extents[2] * nest.extents[3]))
    # Groups enough that the tasks are a multiple of the cores: PoolFormer's 1280->320 at
    # 14x14 (5 panels) ran 1.35x faster on two threads than on one with 5 tasks.
    return channels, max(1, min(tiles, target.cores // math.gcd(panels, target.cores)))


def packed_conv(kernel: Kernel, loop: str, rows: int, channels: int, groups: int) -> Kernel:
    """The schedule primitive: the plain packed conv nest of `loop` (a top-level loop of
    `kernel`) in tiles of `rows` output positions by one panel of output channels; with
    `channels`, summed in passes of that many input channels, a panel's tiles in `groups`
    tasks (`pass_channels`)."""
    nest = step_nest(kernel, loop, nests, "packed_conv", "plain packed conv nest", rows=rows,
                     groups=groups)
    if channels < 0:
        raise ScheduleError(f"kernel @{kernel.name}: packed_conv %{loop}: channels must be 0"
                            " (one pass) or positive")
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    lanes = panel_width(nest, shapes)
    scheduled = replace_nest(kernel, loop, nest.acc, lambda names: _packed_tiles(
        names, nest, nest.extents[1] // lanes, lanes, rows, channels, groups))
    # (A fused epilogue without vector code, sin say, runs its lanes' loop serially.)
    return verify_kernel(serial_unless_vectorizable(scheduled, simplified=True))


def _packed_tiles(names: FreshNames, nest: WindowNest, panels: int, lanes: int, rows: int,
                  channels: int, groups: int) -> list[Stmt]:
    """The scheduled nest of `nest` (the module docstring's), its filter in `panels`
    panels of `lanes` output channels, tiles of `rows` positions; in passes of `channels`
    input channels (0: one), a panel's tiles in `groups` tasks."""
    x_term, w_term = product_terms(nest)
    n_var, m_var, oh_var, ow_var = nest.output
    c_var, kh_var, kw_var = nest.reduction
    (sh, sw), (dh, dw) = nest.strides, nest.dilations
    kh_n, kw_n = nest.kernel
    nb, m_out, oh_n, ow_n = nest.extents
    c_in = nest.reduction_extents[0]
    positions = oh_n * ow_n
    rows = min(rows, positions)
    tiles = -(-positions // rows)
    passes = -(-c_in // channels) if 0 < channels < c_in else 1
    acc = names.local(F32, (rows, lanes))
    t, c, kh, kw, r = (names.var(v) for v in ("task", "c", "kh", "kw", "r"))
    if passes == 1:  # a task a tile
        n = Const(0) if nb == 1 else t // (panels * tiles)  # (nb: maybe known at call time)
        q, tile, tasks = (t // tiles) % panels, t % tiles, nb * panels * tiles
    else:  # a task a group of a panel's tiles, each tile in turn a pass
        groups = max(1, min(groups, tiles))
        per_group = -(-tiles // groups)
        groups = -(-tiles // per_group)
        n = Const(0) if nb == 1 else t // (panels * groups)
        q, tasks = (t // groups) % panels, nb * panels * groups
        tt, cb = names.var("tile"), names.var("pass")
        tile = (t % groups) * per_group + tt
    p0 = tile * rows
    p = p0 + r
    if positions % rows:  # the last tile's rows past the plane read its last position
        p = binary("min", p, positions - 1)
    oh, ow = p // ow_n, p % ow_n

    def each_row(body: list[Stmt]) -> For:
        return For(r, Const(0), Const(rows), body, 1, "unrolled")

    def tap(jj: Var) -> list[Stmt]:
        x = nest.at(x_term, {n_var: n, c_var: c}, positions=(oh * sh + kh * dh,
                                                              ow * sw + kw * dw))
        w = nest.at(w_term, {m_var: q * lanes + jj, c_var: c, kh_var: kh, kw_var: kw})
        value = Fma(x, w, Load(acc.name, (r, jj), F32))
        return [Store(acc.name, (r, jj), value)]

    # The write-back puts the tile's positions in the lanes, one output channel at a time:
    # a tile's positions are consecutive in the plane, so each channel's are one contiguous
    # (masked) store, and a fused epilogue reads its other operands (a residual) the same
    # way. The sums are read across their rows, a gather, from a copy of the accumulators:
    # a gather from the accumulators themselves would keep LLVM from holding them in
    # registers through the sum (it ran much slower that way).
    # An epilogue that reads nothing by position (a bias and a GELU) runs in the copy
    # instead, on whole vectors of channels: in the write-back its math would run once per
    # channel on a vector of `rows` lanes (a conv with a GELU took 1.8x the time of one
    # without).
    sums = names.local(F32, (rows, lanes))
    by_channel = _channel_epilogue(nest)

    def summed(jj: Var) -> Expr:
        total = Load(acc.name, (r, jj), F32)
        if by_channel is None:
            return total
        return nest.at(by_channel.value, {n_var: n, m_var: q * lanes + jj}, total)

    copy = vector_loop(names, lanes, lambda jj: [Store(sums.name, (r, jj), summed(jj))])
    jj, pr = names.var("jj"), names.var("r")
    m = q * lanes + jj
    p_out = p0 + pr
    written = binary("min", Const(rows), Const(positions) - p0) if positions % rows \
        else Const(rows)
    at_out = {n_var: n, m_var: m, oh_var: p_out // ow_n, ow_var: p_out % ow_n}
    total = Load(sums.name, (pr, jj), F32)
    stores = nest.result_at(at_out, total) if by_channel is None else \
        [Store(by_channel.buffer, tuple(nest.at(i, at_out) for i in by_channel.index), total)]
    write_back = For(jj, Const(0), Const(lanes),
                     [For(pr, Const(0), written, stores, 1, "vectorized")])
    zero = vector_loop(names, lanes, lambda jj: [Store(acc.name, (r, jj), Const(0.0, F32))])
    taps = For(kh, Const(0), Const(kh_n),
               [For(kw, Const(0), Const(kw_n), [each_row([vector_loop(names, lanes, tap)])], 1,
                    "unrolled" if kw_n <= MAX_UNROLLED_TAPS else "serial")], 1,
               "unrolled" if kh_n * kw_n <= MAX_UNROLLED_TAPS else "serial")
    # Per input channel, the lines of the next panel's rows for it, spread over the
    # panel's tiles: a small plane has few tiles (7 on a 7x7 plane) to share the first
    # one's wait on memory for its panel.
    taps_n = kh_n * kw_n
    ahead = [] if panels == 1 else next_panel_prefetches(
        w_term.buffer, binary("min", q + 1, panels - 1), c * taps_n, taps_n, lanes,
        tile if passes == 1 else tt, tiles if passes == 1 else per_group)
    if passes == 1:
        body = [each_row([zero]), For(c, Const(0), Const(c_in), [*ahead, taps]),
                each_row([copy]), write_back]
    else:
        # The tiles' partial sums between passes, per task (as the GEMM's workspace).
        sums_ws = names.local(F32, (per_group, rows, lanes))
        resume = vector_loop(names, lanes, lambda jj: [
            Store(acc.name, (r, jj), Load(sums_ws.name, (tt, r, jj), F32))])
        save = vector_loop(names, lanes, lambda jj: [
            Store(sums_ws.name, (tt, r, jj), Load(acc.name, (r, jj), F32))])
        first = cb * channels
        summed_channels = For(c, first, binary("min", first + channels, Const(c_in)),
                              [*ahead, taps])
        per_tile = [each_row([resume]), summed_channels,
                    If(binary("eq", cb, Const(passes - 1)), [each_row([copy]), write_back],
                       [each_row([save])])]
        if groups * per_group > tiles:  # the last group has fewer tiles
            per_tile = [If(binary("lt", tile, Const(tiles)), per_tile, [])]
        # (Zeroed at the task's start, not read on a first pass only: the verifier checks
        # that a thread's locals are written before they are read, whatever the branch.)
        clear = For(tt, Const(0), Const(per_group), [each_row([vector_loop(
            names, lanes, lambda jj: [Store(sums_ws.name, (tt, r, jj), Const(0.0, F32))])])])
        body = [clear, For(cb, Const(0), Const(passes),
                           [For(tt, Const(0), Const(per_group), per_tile)])]
    # Tasks write disjoint tiles, which the default schedule cannot see through t's
    # division into (n, q, p0): the loop is made parallel here, as the GEMM's is.
    work = hint(nb) * m_out * positions * c_in * kh_n * kw_n
    kind = "parallel" if work >= MIN_PARALLEL_FMAS else "serial"
    return [For(t, Const(0), as_expr(tasks), body, 1, kind)]


def _channel_epilogue(nest: WindowNest) -> Store | None:
    """The nest's one store of its result, its scalar temporaries substituted into it,
    when that reads nothing else by output position (a bias, an activation): an epilogue
    that can run where the tile holds channels in its lanes. None otherwise (a residual
    add reads its operand by position; several outputs)."""
    temporaries: dict[Load, Expr] = {}
    *steps, last = nest.result
    for s in steps:
        if s.index:
            return None
        temporaries[Load(s.buffer, (), s.value.dtype)] = \
            map_expr(s.value, lambda x: temporaries.get(x) if isinstance(x, Load) else None)
    value = map_expr(last.value, lambda x: temporaries.get(x) if isinstance(x, Load) else None)
    if value.dtype is not F32 or mentions(value, set(nest.output[2:])) or \
            any(isinstance(x, Load) and x.buffer == last.buffer for x in walk_expr(value)):
        return None
    return Store(last.buffer, last.index, value)

