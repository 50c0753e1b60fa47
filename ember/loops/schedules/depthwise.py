"""The schedule of an f32 2-D depthwise convolution (one input channel per output channel):
per (image, channel), a zero-padded copy of the channel in a local plane, its columns dealt
into `stride` phases, so that every tap reads in bounds with no test and consecutive
outputs read consecutive plane elements; then groups of R rows by U blocks of L output
columns sum the taps in register-held accumulators, one a vector:

    for %nc = 0 to N * C {                            (parallel, by the default schedule)
      %pad = 0;  %pad[ih + pt, (pl + iw) % s, (pl + iw) // s] = x[n, c, ih, iw]
      for %oh = 0 to OH / R { for %ow0 = 0 to ceil(OW / L) / U {
        (r < R, u < U unrolled; row = oh * R + r, col0 = (ow0 * U + u) * L)
        for %jj = 0 to L vectorized { %acc[r * U + u, %jj] = 0.0 }
        for %kh unrolled { for %kw unrolled { (r, u) { for %jj = 0 to L vectorized {
          %acc[r * U + u, %jj] = fma(%pad[row * sh + kh * dh, (kw * dw) % s,
                                          col0 + jj + (kw * dw) // s],
                                     w[c, 0, kh, kw], %acc[r * U + u, %jj]) } } } }
        for %jj = 0 to min(L, OW - col0) vectorized { out[n, c, row, col0 + jj] = %acc[...] }
      } }
    }

Each tap is one vector load. At stride s > 1 the copy fills each phase with strided loads
(every s-th input column); past MAX_LOAD_STRIDE it deals a row in one serial loop that
stores s phases from s consecutive input columns, for LLVM's vectorizer. The lanes past
the row's end read the plane's zero columns and are not stored. A plane too large for a
thread's stack gets no schedule (the kernel keeps its plain nest).

The step `depthwise_conv <outer loop> lanes chains` applies this to the plain conv nest that
`graph.conv` lowers to when each output channel reads one input channel (a window nest over
(c, kh, kw) with c of one trip, summing x times w: ember/loops/schedules/window_nest.py);
the plain nest's read of x (at the plane's positions), of w and its stores are instantiated
at the new loops, so a fused producer, the bias and an epilogue come along.

Reads from the target: the f32 lanes, the default L (one vector register); L and the
vectors summed at once (R * U) are parameters.
The measurements behind these choices: docs/decisions.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ember.dtypes import DType
from ember.errors import ScheduleError
from ember.loops.analysis import MAX_LOAD_STRIDE
from ember.loops.ir import (
    Const,
    Expr,
    Fma,
    For,
    Kernel,
    Load,
    Stmt,
    Store,
    Var,
    as_expr,
    binary,
)
from ember.loops.schedules.lanes import (
    lane_chunks,
    largest_divisor,
    serial_unless_vectorizable,
    vector_loop,
)
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
# lanes: output columns per vector (default: the target's f32 lanes); chains: output
# vectors summed at once, each its own chain of FMAs.
PARAMETERS: Parameters = {"lanes": (16, (8, 16, 32)), "chains": (8, (1, 2, 4, 8, 12))}
MAX_DEPTHWISE_PLANE = 1 << 16  # floats (256 KiB) of padded plane, on each thread's stack


def nests(kernel: Kernel, windows: Windows | None = None) -> list[tuple[str, WindowNest]]:
    """The top-level nests of `kernel` that are plain f32 2-D convs with one input channel
    per output channel (x read at a channel that follows the output's), each with its
    outermost loop's name: what the `depthwise_conv` step schedules. `windows`: the
    kernel's window nests by depth, when the caller has found them."""
    return [(loop, nest) for loop, nest in (windows or functools.partial(window_nests, kernel))(3)
            if nest.combine == "add" and nest.init == Const(0.0, F32)
            and nest.reduction_extents[0] == 1 and (terms := product_terms(nest))
            and mentions(terms[0], {nest.output[1]})]


def plane_fits(nest: WindowNest, values: dict[str, int]) -> bool:
    """Whether the padded plane at `values`' lanes fits MAX_DEPTHWISE_PLANE (a thread's
    stack budget); a conv whose plane does not keeps its plain nest."""
    return _plane(nest, values["lanes"])[0] <= MAX_DEPTHWISE_PLANE


def default_parameters(nest: WindowNest, target: Target) -> dict[str, int]:
    """About 8 vector registers of accumulators: a row of at most MAX_ROW_VECTORS vectors
    is one block (its columns the lanes, several registers wide; rows of blocks of one
    register measured 1.3-1.9x slower at widths 14 and 28 on AVX2), down as many rows as
    make 8 vectors; a wider row is blocks of one register, 8 at once."""
    lanes = target.lanes(F32)
    row_vectors = -(-nest.extents[3] // lanes)
    if row_vectors <= MAX_ROW_VECTORS:
        return {"lanes": row_vectors * lanes, "chains": max(1, CHAIN_VECTORS // row_vectors)}
    return {"lanes": lanes, "chains": CHAIN_VECTORS}


MAX_ROW_VECTORS = 4  # the widest output row summed as one block of lanes
CHAIN_VECTORS = PARAMETERS["chains"][0]  # the accumulators' vector registers


def depthwise_conv(kernel: Kernel, loop: str, lanes: int, chains: int) -> Kernel:
    """The schedule primitive: the plain depthwise conv nest of `loop` (a top-level loop of
    `kernel`) through a padded plane, `lanes` output columns a vector, up to `chains`
    vectors at once."""
    nest = step_nest(kernel, loop, nests, "depthwise_conv",
                     "plain depthwise conv nest", lanes=lanes, chains=chains)
    if not plane_fits(nest, {"lanes": lanes}):
        raise ScheduleError(f"kernel @{kernel.name}: depthwise_conv %{loop}: the padded"
                            f" plane is larger than {MAX_DEPTHWISE_PLANE} floats")
    scheduled = replace_nest(kernel, loop, nest.acc,
                             lambda names: _depthwise_rows(names, nest, lanes, chains))
    # (A fused epilogue without vector code, sin say, runs its lanes' loop serially.)
    return verify_kernel(serial_unless_vectorizable(scheduled, simplified=True))


def _plane(nest: WindowNest, lanes: int) -> tuple[int, int, int]:
    """(floats, rows, columns per phase) of the padded plane at `lanes` columns a vector:
    what the taps of every (padded) output position read. At column stride s its columns
    are dealt into s phases (column c at phase c % s, position c // s), so that the
    columns a tap reads for consecutive outputs lie next to each other: one vector load
    per tap at any stride."""
    (sh, sw), (dh, dw) = nest.strides, nest.dilations
    oh_n, ow_n = nest.extents[2:]
    kh_n, kw_n = nest.kernel
    lanes = min(lanes, ow_n)
    blocks = (ow_n + lanes - 1) // lanes
    rows = (oh_n - 1) * sh + (kh_n - 1) * dh + 1
    cols = (blocks * lanes - 1) * sw + (kw_n - 1) * dw + 1
    per_phase = (cols + sw - 1) // sw
    return rows * sw * per_phase, rows, per_phase


def _depthwise_rows(names: FreshNames, nest: WindowNest, lanes: int, chains: int
                    ) -> list[Stmt]:
    """The scheduled nest of `nest` (the module docstring's)."""
    x_term, w_term = product_terms(nest)
    n_var, m_var, oh_var, ow_var = nest.output
    c_var, kh_var, kw_var = nest.reduction

    def x_at(image: Expr, channel: Expr, ih: Expr, iw: Expr) -> Expr:
        return nest.at(x_term, {n_var: image, m_var: channel, c_var: Const(0)},
                       positions=(ih, iw))

    (sh, sw), (pt, pl), (dh, dw) = nest.strides, nest.pads_begin, nest.dilations
    nb, channels, oh_n, ow_n = nest.extents
    kh_n, kw_n = nest.kernel
    h, wd = nest.in_sizes
    _, rows, per_phase = _plane(nest, lanes)
    lanes = min(lanes, ow_n)
    blocks = (ow_n + lanes - 1) // lanes
    row_size = sw * per_phase
    # The plane rounded up to whole vectors, so that zeroing it is loops of constant
    # trips: a write the verifier sees (locals are private to each parallel iteration).
    plane = (rows * row_size + lanes - 1) // lanes * lanes
    # Several output vectors summed together, each its own chain of FMAs: one vector's
    # taps wait on each other, several vectors' interleave, and vertical neighbours share
    # the loads of their common rows. A group is `down` rows times `across` blocks of a
    # row, up to `chains` vectors.
    down = largest_divisor(oh_n, chains)
    across = largest_divisor(blocks, chains // down)
    pad, acc = names.local(F32, (plane,)), names.local(F32, (down * across, lanes))
    nc, oh, ow0, kh, kw, r, u = (names.var(v) for v in ("nc", "oh", "ow0", "kh", "kw", "r", "u"))
    n, c = (Const(0), nc) if nb == 1 else (nc // channels, nc % channels)  # nb: maybe a size
    col0 = (ow0 * across + u) * lanes
    row = oh * down + r
    chain = r * across + u

    def chunks(total: int, body: Callable[[Expr], list[Stmt]]) -> list[Stmt]:
        return lane_chunks(names, total, lanes, body)

    zero = chunks(plane, lambda i: [Store(pad.name, (i,), Const(0.0, F32))])
    # Input rows that land in the plane, and per phase the positions whose input column
    # iw = q * s + phase - pl is in the row (the rest stay zero: the padding).
    first_row, last_row = max(0, -pt), min(h, rows - pt)
    ih = names.var("ih")
    copies: list[Stmt] = []

    def deal(phase: int, i: Expr) -> Store:
        return Store(pad.name, (((ih + pt) * sw + phase) * per_phase + i,),
                     x_at(n, c, ih, i * sw + phase - pl))

    spans = {}  # phase -> the positions whose input column is in the row
    for phase in range(sw):
        low = max(0, -(-(pl - phase) // sw))
        high = min(per_phase - 1, (wd - 1 + pl - phase) // sw)
        if high >= low:
            spans[phase] = (low, high)
    if sw <= MAX_LOAD_STRIDE:
        # Per phase, vectors of its positions: at stride s > 1 each reads every s-th input
        # column, a strided load (faster than LLVM's vectorization of the loop below).
        for phase, (low, high) in spans.items():
            copies += chunks(high - low + 1, lambda i, phase=phase, low=low: [
                deal(phase, low + i)])
    elif spans:
        # Every phase in one serial loop over the positions they share: the loads of an
        # iteration are consecutive input columns, which LLVM's vectorizer reads as wide
        # loads and deals with shuffles (a gather per phase measured slower).
        common = (max(lo for lo, _ in spans.values()), min(hi for _, hi in spans.values()))
        if common[1] >= common[0]:
            i = names.var("i")
            copies.append(For(i, Const(common[0]), Const(common[1] + 1),
                              [deal(phase, i) for phase in spans]))
            rest = {phase: [(low, common[0] - 1), (common[1] + 1, high)]
                    for phase, (low, high) in spans.items()}
        else:
            rest = {phase: [span] for phase, span in spans.items()}
        for phase, ranges in rest.items():
            for lo, hi in ranges:
                if hi >= lo:
                    j = names.var("i")
                    copies.append(For(j, Const(lo), Const(hi + 1), [deal(phase, j)]))
    copy = [For(ih, Const(first_row), Const(last_row), copies)]

    def tap(jj: Var) -> list[Stmt]:
        # Padded column (col0 + jj) * s + kw * d: phase (kw * d) % s, position
        # col0 + jj + (kw * d) // s.
        shift = kw * dw
        at = (row * sh + kh * dh) * row_size + binary("mod", shift, sw) * per_phase + \
            col0 + jj + binary("floordiv", shift, sw)
        w = nest.at(w_term, {n_var: n, m_var: c, c_var: Const(0), kh_var: kh, kw_var: kw})
        value = Fma(Load(pad.name, (at,), F32), w,
                    Load(acc.name, (chain, jj), F32))
        return [Store(acc.name, (chain, jj), value)]

    def each_block(body: list[Stmt]) -> For:
        return For(r, Const(0), Const(down), [For(u, Const(0), Const(across), body, 1,
                                                  "unrolled")], 1, "unrolled")

    # Every lane runs but the store's: constant trips keep the accumulator in registers,
    # and it is written before it is read in each iteration, which makes the outer loops
    # parallel (locals are private to each thread).
    full = Const(lanes)
    stop = binary("min", full, binary("sub", ow_n, col0)) if ow_n % lanes else full
    body = [each_block([vector_loop(names, full, lambda jj: [Store(acc.name, (chain, jj),
                                                            Const(0.0, F32))])]),
            For(kh, Const(0), Const(kh_n),
                [For(kw, Const(0), Const(kw_n), [each_block([vector_loop(names, full, tap)])], 1,
                     "unrolled")], 1, "unrolled"),
            each_block([vector_loop(names, stop, lambda jj: nest.result_at(
                {n_var: n, m_var: c, oh_var: row, ow_var: col0 + jj},
                Load(acc.name, (chain, jj), F32)))])]
    return [For(nc, Const(0), as_expr(nb * channels),
                [*zero, *copy, For(oh, Const(0), Const(oh_n // down),
                                   [For(ow0, Const(0), Const(blocks // across), body)])])]
