"""The schedule of a 2-D f32 max or average pool, applied to the plain nest that
`graph.max_pool` and `graph.avg_pool` lower to.

Before: per output element, a scalar reduced over the window's taps, a tap in the padding
(or past a ceil_mode window's end) skipped by an `if` (ember/loops/schedules/window_nest.py
finds this shape and reads the window's geometry from the taps' input positions):

    for %n { for %c { for %oh { for %ow {
      %acc[] = identity
      for %kh { for %kw { if inside { %acc[] = combine(%acc[], x[n, c, ih, iw]) } } }
      y[n, c, oh, ow] = finish(%acc[])
    } } } }

After (the step `pool <outer loop> lanes chains`): vectors of L output columns, R rows at
once. Each vector combines its unrolled taps; a tap outside the input is a select around
the load, so those lanes read nothing and give the combine's identity, and at stride s the
lanes read every s-th input column (a strided load):

    for %nc { for %oh = 0 to OH / R { for %ow0 = 0 to ceil(OW / L) {
      (r < R unrolled, row = oh * R + r)
      %acc[r, jj] = identity;  for %kh, %kw unrolled { (r) { for %jj = 0 to L vectorized {
        %acc[r, jj] = combine(%acc[r, jj], select(inside,
                              x[n, c, ih(row, kh), (ow0 * L + jj) * s + kw - pl], identity))
      } } }
      y[n, c, row, ow0 * L + jj] = finish(%acc[r, jj])  (the lanes before OW) } } }

The plain nest's read and its store are instantiated at the new loops (their variables
substituted), so a fused producer's or epilogue's arithmetic comes along. The rows taken
together are chains of their own: a NaN-propagating max is several instructions a tap,
which would wait on each other in one chain. These vectors do not depend on LLVM's loop
vectorizer.

Reads from the target: the f32 lanes, the default L (one vector register); L and the
rows at once (R) are parameters. The measurements behind these choices: docs/decisions.md.
"""

from __future__ import annotations

import functools

from ember.dtypes import DType
from ember.loops.ir import (
    Binary,
    Const,
    Expr,
    For,
    Kernel,
    Load,
    Select,
    Stmt,
    Store,
    Var,
    as_expr,
)
from ember.loops.schedules.lanes import largest_divisor, serial_unless_vectorizable, vector_loop
from ember.loops.schedules.names import FreshNames
from ember.loops.schedules.params import Parameters
from ember.loops.schedules.window_nest import (
    WindowNest,
    Windows,
    replace_nest,
    step_nest,
    window_nests,
)
from ember.loops.verify import verify_kernel
from ember.loops.windows import all_of, window_checks, window_position
from ember.target import Target

F32 = DType.f32
# lanes: output columns per vector (default: the target's f32 lanes); chains: output
# vectors computed at once.
PARAMETERS: Parameters = {"lanes": (16, (8, 16, 32)), "chains": (8, (1, 2, 4, 8))}
IDENTITY = {"max": Const(-float("inf"), F32), "add": Const(0.0, F32)}


def nests(kernel: Kernel, windows: Windows | None = None) -> list[tuple[str, WindowNest]]:
    """The top-level nests of `kernel` that are plain 2-D f32 max or average pools (a
    window nest over the taps, from the combine's identity), each with its outermost loop's
    name: what the `pool` step schedules. `windows`: the kernel's window nests by
    depth, when the caller has found them."""
    return [(loop, nest) for loop, nest in (windows or functools.partial(window_nests, kernel))(2)
            if IDENTITY.get(nest.combine) == nest.init]


def default_parameters(nest: WindowNest, target: Target) -> dict[str, int]:
    """The pool step's parameters on `target`: one vector register of columns, 8 rows."""
    return {"lanes": target.lanes(F32), "chains": PARAMETERS["chains"][0]}


def pool(kernel: Kernel, loop: str, lanes: int, chains: int) -> Kernel:
    """The schedule primitive: the plain pool nest of `loop` (a top-level loop of `kernel`)
    as vectors of `lanes` output columns, up to `chains` rows at once."""
    nest = step_nest(kernel, loop, nests, "pool", "plain 2-D f32 pool nest",
                     lanes=lanes, chains=chains)
    scheduled = replace_nest(kernel, loop, nest.acc,
                             lambda names: _pool_rows(names, nest, lanes, chains))
    # (A fused epilogue without vector code, sin say, runs its lanes' loop serially.)
    return verify_kernel(serial_unless_vectorizable(scheduled, simplified=True))


def _pool_rows(names: FreshNames, nest: WindowNest, lanes: int, chains: int) -> list[Stmt]:
    """The scheduled nest of `nest` (the module docstring's After)."""
    nb, channels, oh_n, ow_n = nest.extents
    kernel, strides, pb, dilations = nest.kernel, nest.strides, nest.pads_begin, nest.dilations
    identity = IDENTITY[nest.combine]
    lanes = min(lanes, ow_n)
    blocks = (ow_n + lanes - 1) // lanes
    down = largest_divisor(oh_n, chains)  # rows taken together
    acc = names.local(F32, (down, lanes))
    nc, oh, ow0, kh, kw, r = (names.var(v) for v in ("nc", "oh", "ow0", "kh", "kw", "r"))
    n, c = (Const(0), nc) if nb == 1 else (nc // channels, nc % channels)  # nb: maybe a size
    row = oh * down + r

    def values(jj: Var) -> dict[str, Expr]:
        """The plain nest's variables at output column ow0 * L + jj of row `row`."""
        return dict(zip((*nest.output, *nest.reduction), (n, c, row, ow0 * lanes + jj, kh,
                                                          kw)))

    def each_row(body: list[Stmt]) -> For:
        return For(r, Const(0), Const(down), body, 1, "unrolled")

    def tap(jj: Var) -> list[Stmt]:
        # Lanes past OW (in the last block) take windows past the input's end: the
        # checks on columns cover them.
        col = ow0 * lanes + jj
        positions = [window_position(o, t, s_, p, d) for o, t, s_, p, d in
                     zip((row, col), (kh, kw), strides, pb, dilations)]
        conds = window_checks(positions, nest.in_sizes, (oh_n, blocks * lanes), kernel,
                              strides, pb, dilations)
        value = nest.at(nest.term, values(jj))
        if conds:
            value = Select(all_of(conds), value, identity)
        current = Load(acc.name, (r, jj), F32)
        return [Store(acc.name, (r, jj), Binary(nest.combine, current, value))]

    def result(jj: Var) -> list[Stmt]:
        return nest.result_at(values(jj), Load(acc.name, (r, jj), F32))

    stop = Binary("min", Const(lanes), Const(ow_n) - ow0 * lanes) if ow_n % lanes \
        else Const(lanes)
    body = [each_row([vector_loop(names, lanes, lambda jj: [Store(acc.name, (r, jj),
                                                                    identity)])]),
            For(kh, Const(0), Const(kernel[0]),
                [For(kw, Const(0), Const(kernel[1]),
                     [each_row([vector_loop(names, lanes, tap)])], 1, "unrolled")],
                1, "unrolled"),
            each_row([vector_loop(names, stop, result)])]
    return [For(nc, Const(0), as_expr(nb * channels),
                [For(oh, Const(0), Const(oh_n // down),
                     [For(ow0, Const(0), Const(blocks), body)])])]
