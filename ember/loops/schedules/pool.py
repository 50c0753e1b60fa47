"""The schedule of a 2-D f32 max or average pool, applied to the plain nest that
`graph.max_pool` and `graph.avg_pool` lower to.

Before: per output element, a scalar reduced over the window's taps, a tap in the padding
(or past a ceil_mode window's end) skipped by an `if` (`match_pool` finds this shape and
reads the window's geometry from the taps' input positions):

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

import dataclasses
from dataclasses import dataclass

from ember.dtypes import DType
from ember.errors import ScheduleError
from ember.loops.analysis import affine_form
from ember.loops.ir import (
    Binary,
    Const,
    Expr,
    For,
    If,
    Kernel,
    Load,
    Select,
    Stmt,
    Store,
    Var,
    loads_in,
    map_expr,
    walk_expr,
    walk_stmts,
)
from ember.loops.schedules.gemm import element_result
from ember.loops.schedules.lanes import largest_divisor, vector_loop
from ember.loops.schedules.names import FreshNames
from ember.loops.schedules.params import Parameters
from ember.loops.simplify import simplify_kernel
from ember.loops.verify import verify_kernel
from ember.loops.windows import all_of, window_checks, window_position
from ember.target import Target

F32 = DType.f32
# lanes: output columns per vector (default: the target's f32 lanes); chains: output
# vectors computed at once.
PARAMETERS: Parameters = {"lanes": (16, (8, 16, 32)), "chains": (8, (1, 2, 4, 8))}
IDENTITY = {"max": Const(-float("inf"), F32), "add": Const(0.0, F32)}


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


@dataclass(frozen=True)
class PoolNest:
    """A plain pool nest: its loops over the output (n, c, oh, ow) and the taps (kh, kw),
    the accumulator %acc, what it combines (`value`, x read at the window position) and the
    stores of the total (`result`, reading %acc[]: a fused epilogue's scalars, then the
    output at the nest's index)."""

    pool: Pool2d
    combine: str
    output: tuple[str, str, str, str]
    taps: tuple[str, str]
    acc: str
    value: Expr
    result: tuple[Store, ...]


def _loop_extent(s: Stmt) -> int | None:
    """The trip count of a plain loop (from 0 by 1 to a constant), else None."""
    if isinstance(s, For) and s.start == Const(0) and s.step == 1 and \
            isinstance(s.stop, Const) and s.kind == "serial":
        return int(s.stop.value)
    return None


def match_pool(top: For, shapes: dict[str, tuple[int, ...]]) -> PoolNest | None:
    """The 2-D f32 pool that the nest `top` computes when it has the plain lowering's shape
    (see the module docstring), else None. The geometry is read from the taps' input
    positions, `oh * s + kh * d - p` (the same wherever x is read), and the input's size
    from the buffers read there; the nest's `if` must be exactly the window's bounds check
    (`window_checks`), so that the schedule's checks stand in for it."""
    loops, body = [], [top]
    while len(body) == 1 and _loop_extent(body[0]) is not None and len(loops) < 4:
        loops.append(body[0])
        body = body[0].body
    if len(loops) != 4 or len(body) < 3:
        return None
    init, reduce, *result = body
    taps = [reduce]
    while len(taps) < 2 and len(taps[-1].body) == 1 and _loop_extent(taps[-1].body[0]):
        taps.append(taps[-1].body[0])
    if not (isinstance(init, Store) and init.index == () and _loop_extent(reduce)
            and len(taps) == 2 and len(taps[1].body) == 1):
        return None
    acc, step, guard = init.buffer, taps[1].body[0], None
    if isinstance(step, If) and not step.orelse and len(step.then) == 1:
        guard, step = step.cond, step.then[0]
    combine = next((c for c, v in IDENTITY.items() if init.value == v), None)
    term = step.value if isinstance(step, Store) else None
    if not (combine and isinstance(step, Store) and step.buffer == acc and step.index == ()
            and isinstance(term, Binary) and term.op == combine
            and term.a == Load(acc, (), F32) and term.b.dtype is F32):
        return None
    value, index = term.b, tuple(loop.var for loop in loops)
    if not element_result(result, acc, index) or \
            any(isinstance(x, Load) and x.buffer == acc for x in walk_expr(value)):
        return None
    out = [loop.var.name for loop in loops]
    tap_names = [t.var.name for t in taps]
    extents = [int(loop.stop.value) for loop in (*loops, *taps)]
    geometry = _window_geometry(value, out[2:], tap_names, shapes)
    if geometry is None:
        return None
    strides, dilations, pads, in_sizes = geometry
    pool = Pool2d(*extents[:4], in_sizes, tuple(extents[4:]), strides, pads, dilations)
    positions = [window_position(Var(o), Var(t), s, p, d) for o, t, s, p, d in
                 zip(out[2:], tap_names, strides, pads, dilations)]
    checks = window_checks(positions, in_sizes, extents[2:4], pool.kernel, strides, pads,
                           dilations)
    if guard != all_of(checks):
        return None
    return PoolNest(pool, combine, tuple(out), tuple(tap_names), acc, value, tuple(result))


def _window_geometry(value: Expr, out: list[str], taps: list[str],
                     shapes: dict[str, tuple[int, ...]]):
    """(strides, dilations, pads_begin, input sizes) of the window reads in `value`: per
    axis, every index that mentions the axis' output or tap variable is the same
    position o * s + t * d - p (s, d >= 1), into a dimension of the same size; None when
    the reads are of any other shape (an output or tap variable used anywhere else too)."""
    loads = [x for x in walk_expr(value) if isinstance(x, Load)]
    axes = []
    for o, t in zip(out, taps):
        found = [(e, shapes[x.buffer][d]) for x in loads for d, e in enumerate(x.index)
                 if any(isinstance(v, Var) and v.name in (o, t) for v in walk_expr(e))]
        if not found or len(set(found)) != 1:
            return None
        position, size = found[0]
        form = affine_form(position, {o, t})
        if form is None or form.rest != Const(0) or set(form.coefficients) != {o, t} or \
                min(form.coefficients.values()) < 1 or form.constant > 0:
            return None
        axes.append((form.coefficients[o], form.coefficients[t], -form.constant, size,
                     position))
    positions = {a[4] for a in axes}
    names = {*out, *taps}
    rest = map_expr(value, lambda x: Const(0) if x in positions else None)
    if any(isinstance(x, Var) and x.name in names for x in walk_expr(rest)):
        return None
    return tuple(tuple(a[i] for a in axes) for i in range(4))


def pool_nests(kernel: Kernel) -> list[tuple[str, PoolNest]]:
    """The top-level nests of `kernel` that are plain 2-D f32 pools with work in them, each
    with its outermost loop's name: what the `pool` step schedules."""
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    found = []
    for top in kernel.body:
        nest = match_pool(top, shapes) if isinstance(top, For) else None
        if nest is not None and all(dataclasses.astuple(nest.pool)[:4]):
            found.append((top.var.name, nest))
    return found


def default_parameters(target: Target) -> dict[str, int]:
    """The pool step's parameters on `target`: one vector register of columns, 8 rows."""
    return {"lanes": target.lanes(F32), "chains": PARAMETERS["chains"][0]}


def pool(kernel: Kernel, loop: str, lanes: int, chains: int) -> Kernel:
    """The schedule primitive: the plain pool nest of `loop` (a top-level loop of `kernel`)
    as vectors of `lanes` output columns, up to `chains` rows at once."""
    nest = dict(pool_nests(kernel)).get(loop)
    if nest is None:
        raise ScheduleError(f"kernel @{kernel.name}: %{loop} is not the outermost loop of a"
                            " plain 2-D f32 pool nest")
    if min(lanes, chains) < 1:
        raise ScheduleError(f"kernel @{kernel.name}: pool %{loop}: lanes and chains must be"
                            " positive")
    at = next(i for i, s in enumerate(kernel.body) if isinstance(s, For) and
              s.var.name == loop)
    rest = [*kernel.body[:at], *kernel.body[at + 1:]]
    used = {x.buffer for x in loads_in(rest)} | {
        s.buffer for s in walk_stmts(rest) if isinstance(s, Store)}
    # The plain nest's accumulator goes with it (unless another nest uses it too).
    kept = dataclasses.replace(kernel, body=rest, locals=[
        b for b in kernel.locals if b.name != nest.acc or b.name in used])
    names = FreshNames(kept)
    body = _pool_rows(names, nest, lanes, chains)
    scheduled = dataclasses.replace(kept, body=[*rest[:at], *body, *rest[at:]],
                                    locals=[*kept.locals, *names.locals])
    return verify_kernel(simplify_kernel(scheduled))


def _pool_rows(names: FreshNames, nest: PoolNest, lanes: int, chains: int) -> list[Stmt]:
    """The scheduled nest of `nest` (the module docstring's After)."""
    g = nest.pool
    oh_n, ow_n = g.out_rows, g.out_cols
    nb, channels = g.images, g.channels
    kernel, strides, pb, dilations = g.kernel, g.strides, g.pads_begin, g.dilations
    identity = IDENTITY[nest.combine]
    lanes = min(lanes, ow_n)
    blocks = (ow_n + lanes - 1) // lanes
    down = largest_divisor(oh_n, chains)  # rows taken together
    acc = names.local(F32, (down, lanes))
    nc, oh, ow0, kh, kw, r = (names.var(v) for v in ("nc", "oh", "ow0", "kh", "kw", "r"))
    n, c = (nc // channels, nc % channels) if nb > 1 else (Const(0), nc)
    row = oh * down + r

    def at(jj: Var, e: Expr) -> Expr:
        """`e` (of the plain nest) at output column ow0 * L + jj of row `row`, at the
        taps (kh, kw), its accumulator the vector's."""
        values = dict(zip((*nest.output, *nest.taps), (n, c, row, ow0 * lanes + jj, kh, kw)))
        scalar = Load(nest.acc, (), F32)
        return map_expr(e, lambda x: Load(acc.name, (r, jj), F32) if x == scalar else
                        values.get(x.name) if isinstance(x, Var) else None)

    def each_row(body: list[Stmt]) -> For:
        return For(r, Const(0), Const(down), body, 1, "unrolled")

    def tap(jj: Var) -> list[Stmt]:
        # Lanes past OW (in the last block) take windows past the input's end: the
        # checks on columns cover them.
        col = ow0 * lanes + jj
        positions = [window_position(o, t, s_, p, d) for o, t, s_, p, d in
                     zip((row, col), (kh, kw), strides, pb, dilations)]
        conds = window_checks(positions, g.in_sizes, (oh_n, blocks * lanes), kernel,
                              strides, pb, dilations)
        value = at(jj, nest.value)
        if conds:
            value = Select(all_of(conds), value, identity)
        current = Load(acc.name, (r, jj), F32)
        return [Store(acc.name, (r, jj), Binary(nest.combine, current, value))]

    def result(jj: Var) -> list[Stmt]:
        return [Store(s.buffer, tuple(at(jj, i) for i in s.index), at(jj, s.value))
                for s in nest.result]

    stop = Binary("min", Const(lanes), Const(ow_n) - ow0 * lanes) if ow_n % lanes \
        else Const(lanes)
    body = [each_row([vector_loop(names, lanes, lambda jj: [Store(acc.name, (r, jj),
                                                                    identity)])]),
            For(kh, Const(0), Const(kernel[0]),
                [For(kw, Const(0), Const(kernel[1]),
                     [each_row([vector_loop(names, lanes, tap)])], 1, "unrolled")],
                1, "unrolled"),
            each_row([vector_loop(names, stop, result)])]
    return [For(nc, Const(0), Const(nb * channels),
                [For(oh, Const(0), Const(oh_n // down),
                     [For(ow0, Const(0), Const(blocks), body)])])]
