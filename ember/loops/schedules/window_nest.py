"""The plain nest of a 2-D windowed reduction (a pool's, a conv's), found in a kernel and
instantiated at a schedule's loops: what the pool and depthwise conv steps start from.

    for %n { for %m { for %oh { for %ow {               (from 0 by 1 to constants)
      %acc[] = init
      for [%c] { for %kh { for %kw {                     (c: a conv's input channels)
        [if inside] { %acc[] = combine(%acc[], term) } } } }
      (the stores of the total: a fused epilogue's scalars, then out[n, m, oh, ow])
    } } } }

The window's geometry is read from the term's reads: per spatial axis, every index that
mentions the output variable is the same input position oh * s + kh * d - p (s, d >= 1)
into a dimension of the same size, and the output variable appears nowhere else (so a
schedule that runs lanes past the output's end reads only windows, which its checks
guard). The `if` must be exactly the window's bounds check (`window_checks`), so that a
schedule's checks stand in for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ember.dtypes import DType
from ember.errors import ScheduleError
from ember.graph.symbolic import DimLike
from ember.loops.analysis import affine_form, mentions
from ember.loops.ir import (
    INDEX,
    Binary,
    Const,
    Expr,
    For,
    If,
    Kernel,
    Load,
    Stmt,
    Store,
    Var,
    binary,
    expr_dim,
    loads_in,
    map_expr,
    walk_expr,
    walk_stmts,
)
from ember.loops.schedules.gemm import element_result
from ember.loops.schedules.names import FreshNames
from ember.loops.windows import all_of, window_checks, window_position

F32 = DType.f32


@dataclass(frozen=True)
class WindowNest:
    """A plain windowed reduction nest (the module docstring's shape), f32 throughout."""

    output: tuple[str, str, str, str]  # n, m, oh, ow
    extents: tuple[DimLike, int, int, int]  # N (maybe a size known at call time), M, OH, OW
    reduction: tuple[str, ...]  # [c,] kh, kw
    reduction_extents: tuple[int, ...]
    acc: str
    init: Const
    combine: str
    term: Expr
    result: tuple[Store, ...]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads_begin: tuple[int, int]
    in_sizes: tuple[int, int]  # the windowed dimensions' sizes (H, W)
    positions: tuple[Expr, Expr]  # the input positions read, in the nest's variables

    @property
    def kernel(self) -> tuple[int, int]:
        return self.reduction_extents[-2], self.reduction_extents[-1]

    def at(self, e: Expr, values: dict[str, Expr], acc: Expr | None = None,
           positions: tuple[Expr, Expr] | None = None) -> Expr:
        """`e` (one of the nest's expressions) with its variables replaced by `values`,
        the accumulator's load by `acc` and, when given, the window's input positions by
        `positions` (x read at other positions); index arithmetic re-simplified."""
        if positions is not None:
            marks = {p: Var(f"%position{i}") for i, p in enumerate(self.positions)}
            e = map_expr(e, lambda x: marks.get(x))
            values = {**values, **{m.name: p for m, p in zip(marks.values(), positions)}}
        scalar = Load(self.acc, (), F32)

        def node(x: Expr) -> Expr | None:
            if isinstance(x, Var):
                return values.get(x.name)
            if acc is not None and x == scalar:
                return acc
            if isinstance(x, Binary) and x.a.dtype is INDEX:
                return binary(x.op, x.a, x.b)
            return None

        return map_expr(e, node)

    def result_at(self, values: dict[str, Expr], acc: Expr) -> list[Stmt]:
        """The stores of the total at `values`, the total read from `acc`."""
        return [Store(s.buffer, tuple(self.at(i, values) for i in s.index),
                      self.at(s.value, values, acc)) for s in self.result]


def product_terms(nest: WindowNest) -> tuple[Expr, Expr] | None:
    """(x's term, w's term) of a conv nest, whose term is the window's read of x times a
    filter read: w's with no output position in it, x's with no tap outside its positions
    (so that it can be read at any position: `WindowNest.at`); else None."""
    term = nest.term
    if not (isinstance(term, Binary) and term.op == "mul"):
        return None
    x, w = term.a, term.b
    spatial, taps = set(nest.output[2:]), set(nest.reduction[-2:])
    marked = nest.at(x, {}, positions=(Const(0), Const(0)))
    if mentions(w, spatial) or mentions(marked, taps | spatial):
        return None
    return x, w


def _extent(s: Stmt) -> int | None:
    """The trip count of a plain loop (from 0 by 1 to a constant), else None."""
    if isinstance(s, For) and s.start == Const(0) and s.step == 1 and \
            isinstance(s.stop, Const) and s.kind == "serial":
        return int(s.stop.value)
    return None


def _batch_extent(s: Stmt) -> DimLike | None:
    """The trip count of a plain loop to a constant or to a size known at call time (the
    images of a batch, which a schedule may leave to run time)."""
    if isinstance(s, For) and s.start == Const(0) and s.step == 1 and s.kind == "serial":
        return expr_dim(s.stop)
    return None


def match_window(top: For, shapes: dict[str, tuple[int, ...]], reduction_depth: int
                 ) -> WindowNest | None:
    """The windowed reduction that the nest `top` computes, with `reduction_depth` loops
    around its term (the last two the taps), when it has the module docstring's shape."""
    loops, body = [], [top]
    while len(body) == 1 and len(loops) < 4 and (_extent(body[0]) is not None or (
            not loops and _batch_extent(body[0]) is not None)):
        loops.append(body[0])
        body = body[0].body
    if len(loops) != 4 or len(body) < 3:
        return None
    init, reduce, *result = body
    if not _extent(reduce):
        return None
    reduction = [reduce]
    while len(reduction) < reduction_depth and len(reduction[-1].body) == 1 and \
            _extent(reduction[-1].body[0]):
        reduction.append(reduction[-1].body[0])
    if not (isinstance(init, Store) and init.index == () and isinstance(init.value, Const)
            and init.value.dtype is F32 and _extent(reduce)
            and len(reduction) == reduction_depth and len(reduction[-1].body) == 1):
        return None
    acc, step, guard = init.buffer, reduction[-1].body[0], None
    if isinstance(step, If) and not step.orelse and len(step.then) == 1:
        guard, step = step.cond, step.then[0]
    term = step.value if isinstance(step, Store) else None
    if not (isinstance(step, Store) and step.buffer == acc and step.index == ()
            and isinstance(term, Binary) and term.a == Load(acc, (), F32)
            and term.b.dtype is F32):
        return None
    index = tuple(loop.var for loop in loops)
    if not element_result(result, acc, index) or \
            any(isinstance(x, Load) and x.buffer == acc for x in walk_expr(term.b)):
        return None
    out = [loop.var.name for loop in loops]
    reduced = [loop.var.name for loop in reduction]
    geometry = _geometry(term.b, out[2:], reduced[-2:], shapes)
    if geometry is None:
        return None
    strides, dilations, pads, sizes, positions = geometry
    extents = (_batch_extent(loops[0]), *(int(loop.stop.value) for loop in loops[1:]))
    reduction_extents = tuple(int(loop.stop.value) for loop in reduction)
    checks = window_checks([window_position(Var(o), Var(t), s, p, d) for o, t, s, p, d in
                            zip(out[2:], reduced[-2:], strides, pads, dilations)],
                           sizes, extents[2:], reduction_extents[-2:], strides, pads,
                           dilations)
    if guard != all_of(checks):
        return None
    return WindowNest(tuple(out), extents, tuple(reduced), reduction_extents, acc,
                      init.value, term.op, term.b, tuple(result), strides, dilations, pads,
                      sizes, positions)


def _geometry(term: Expr, out: list[str], taps: list[str],
              shapes: dict[str, tuple[int, ...]]):
    """(strides, dilations, pads_begin, sizes, positions) of the window reads in `term`
    (see the module docstring), or None."""
    loads = [x for x in walk_expr(term) if isinstance(x, Load)]
    axes = []
    for o, t in zip(out, taps):
        found = {(e, shapes[x.buffer][d]) for x in loads for d, e in enumerate(x.index)
                 if any(isinstance(v, Var) and v.name == o for v in walk_expr(e))}
        if len(found) != 1:
            return None
        (position, size), = found
        form = affine_form(position, {o, t})
        if form is None or form.rest != Const(0) or set(form.coefficients) != {o, t} or \
                min(form.coefficients.values()) < 1 or form.constant > 0:
            return None
        axes.append((form.coefficients[o], form.coefficients[t], -form.constant, size,
                     position))
    positions = {a[4] for a in axes}
    rest = map_expr(term, lambda x: Const(0) if x in positions else None)
    if any(isinstance(x, Var) and x.name in out for x in walk_expr(rest)):
        return None
    return tuple(tuple(a[i] for a in axes) for i in range(5))


Windows = Callable[[int], list[tuple[str, WindowNest]]]  # depth -> a kernel's window nests


def window_nests(kernel: Kernel, reduction_depth: int, loop: str | None = None
                 ) -> list[tuple[str, WindowNest]]:
    """The top-level nests of `kernel` (the one of `loop`, when given) that are windowed
    reductions with work in them, each with its outermost loop's name."""
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    found = []
    for top in kernel.body:
        if not isinstance(top, For) or loop is not None and top.var.name != loop:
            continue
        nest = match_window(top, shapes, reduction_depth)
        if nest is not None and all(nest.extents):
            found.append((top.var.name, nest))
    return found


def step_nest(kernel: Kernel, loop: str, nests: Callable[[Kernel, Windows], list],
              step: str, what: str, **sizes: int) -> Any:
    """The nest of `loop` if the step's finder `nests` takes it (a WindowNest, or what
    the finder finds: attention's), its `sizes` checked positive; a ScheduleError naming
    the step when it does not or one is not."""
    nest = dict(nests(kernel, lambda depth: window_nests(kernel, depth, loop))).get(loop)
    if nest is None:
        raise ScheduleError(f"kernel @{kernel.name}: %{loop} is not the outermost loop of a"
                            f" {what}")
    bad = [name for name, value in sizes.items() if value < 1]
    if bad:
        raise ScheduleError(f"kernel @{kernel.name}: {step} %{loop}: {', '.join(bad)} must be"
                            " positive")
    return nest


def replace_nest(kernel: Kernel, loop: str, acc: str | Collection[str], build) -> Kernel:
    """`kernel` with its top-level nest `loop` replaced by build(names) (a FreshNames of
    the kernel without that nest, whose locals are added; the nest's accumulator `acc`, or
    its locals, go with it unless the rest of the kernel uses them)."""
    acc = {acc} if isinstance(acc, str) else set(acc)
    at = next(i for i, s in enumerate(kernel.body) if isinstance(s, For) and
              s.var.name == loop)
    rest = [*kernel.body[:at], *kernel.body[at + 1:]]
    used = {x.buffer for x in loads_in(rest)} | {
        s.buffer for s in walk_stmts(rest) if isinstance(s, Store)}
    kept = dataclasses.replace(kernel, body=rest, locals=[
        b for b in kernel.locals if b.name not in acc or b.name in used])
    names = FreshNames(kept)
    body = build(names)
    return dataclasses.replace(kept, body=[*rest[:at], *body, *rest[at:]],
                               locals=[*kept.locals, *names.locals])
