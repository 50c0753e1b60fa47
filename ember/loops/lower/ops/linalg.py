"""Lowerings of `matmul`, `conv` and `conv_transpose`: for each output element, a sum of
products accumulated in a local scalar of the compute type (f32 for halves, the dtype
otherwise, so integer sums wrap like the reference), rounded once at the store. Matmul's
plain nest is then blocked by its schedule (ember/loops/schedules/gemm.py).

Windowed reads that can fall into the padding sit under an `If` on the input position, so
no kernel reads out of bounds; the checks are left out on axes that cannot leave the input.
`conv_transpose` is a gather (each output element sums the kernel taps whose input
position is integral and in range), not a scatter, so its output elements are independent.
The pooling lowerings (pool.py) share the window helpers here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ember.graph.ops.linalg import window_params
from ember.loops.ir import Binary, Cast, Const, Expr, If, Load, Stmt, Store, Var
from ember.loops.lower.core import LowerContext, lowering
from ember.loops.schedules.gemm import schedule_matmul

# -- shared helpers -----------------------------------------------------------------------


def compute_load(ctx: LowerContext, i: int, index: Sequence[Expr | int]) -> Expr:
    """Operand `i` at `index`, widened to its compute type (f32 for halves)."""
    load = ctx.load(i, index)
    dtype = ctx.inputs[i].dtype
    return load if dtype.compute is dtype else Cast(dtype.compute, load)


def all_of(conds: Sequence[Expr]) -> Expr | None:
    """The conjunction of `conds` (None when there are none)."""
    result = None
    for c in conds:
        result = c if result is None else Binary("and", result, c)
    return result


def guarded(cond: Expr | None, stmts: list[Stmt]) -> list[Stmt]:
    return stmts if cond is None else [If(cond, stmts)]


def window_position(out: Expr, tap: Expr, stride: int, pad_begin: int,
                    dilation: int) -> Expr:
    """The input position that window `out` reads at kernel tap `tap`."""
    return out * stride + tap * dilation - pad_begin


def position_checks(pos: Expr, size: int, low: int, high: int) -> list[Expr]:
    """Conditions for 0 <= pos < size, given that pos always lies in [low, high]."""
    conds = []
    if low < 0:
        conds.append(Binary("ge", pos, Const(0)))
    if high >= size:
        conds.append(Binary("lt", pos, Const(size)))
    return conds


def window_checks(positions: Sequence[Expr], sizes: Sequence[int], outs: Sequence[int],
                  kernel: Sequence[int], strides: Sequence[int], pads_begin: Sequence[int],
                  dilations: Sequence[int]) -> list[Expr]:
    """The in-bounds conditions of windowed reads, only on axes where one can fail."""
    conds = []
    for pos, size, out, k, s, pb, d in zip(positions, sizes, outs, kernel, strides,
                                           pads_begin, dilations):
        conds += position_checks(pos, size, -pb, (out - 1) * s + (k - 1) * d - pb)
    return conds


def reduce_into(ctx: LowerContext, acc: Load, out_store: Callable[[Expr], Stmt],
                init: Expr, ranges: Sequence[int],
                term: Callable[[list[Var]], tuple[Expr, Expr | None]],
                combine: str = "add") -> list[Stmt]:
    """acc = init; acc = combine(acc, value) over the loops `ranges` where the term's
    condition holds; then out_store(acc). `term(vars)` gives (value, condition or None)."""
    def body(index: list[Var]) -> list[Stmt]:
        value, cond = term(index)
        return guarded(cond, [Store(acc.buffer, (), Binary(combine, acc, value))])

    return [Store(acc.buffer, (), init), *ctx.nest(ranges, body), out_store(acc)]


def accumulator(ctx: LowerContext) -> Load:
    """A scalar local of the output's compute type, as a load of itself."""
    dtype = ctx.outputs[0].dtype.compute
    return Load(ctx.local(dtype).name, (), dtype)


def store_result(ctx: LowerContext, index: Sequence[Expr], value: Expr) -> Store:
    """Store `value` (in the compute type) at `index` of the output, rounded to its dtype."""
    dtype = ctx.outputs[0].dtype
    return Store(ctx.outputs[0].name, tuple(index),
                 value if value.dtype is dtype else Cast(dtype, value))


# -- matmul -------------------------------------------------------------------------------


def batch_index(shape: Sequence[int], batch: Sequence[Expr]) -> list[Expr]:
    """The index into batch dims `shape` of broadcast batch index `batch` (right-aligned;
    size-1 dims read 0)."""
    tail = list(batch)[len(batch) - len(shape):] if shape else []
    return [Const(0) if d == 1 else e for d, e in zip(shape, tail)]


@lowering("matmul")
def matmul(ctx: LowerContext):
    """The plain nest (the algorithm), blocked by the matmul schedule (a no-op for integer
    and f64 matmuls, which keep the plain nest)."""
    return schedule_matmul(ctx, plain_matmul(ctx))


def plain_matmul(ctx: LowerContext) -> list[Stmt]:
    """For each output element: acc = 0; acc += a * b over k; store (ember/loops/schedules/
    gemm.py matches this shape)."""
    a, b = ctx.inputs
    out = ctx.outputs[0]
    depth = a.shape[-1]
    nbatch = len(out.shape) - (len(a.shape) > 1) - (len(b.shape) > 1)
    acc = accumulator(ctx)
    zero = ctx.const(0, acc.dtype)

    def element(index: list[Var]) -> list[Stmt]:
        batch, rest = index[:nbatch], list(index[nbatch:])
        row = [rest.pop(0)] if len(a.shape) > 1 else []
        col = [rest.pop(0)] if len(b.shape) > 1 else []

        def term(k: list[Var]):
            a_index = [*batch_index(a.shape[:-2], batch), *row, k[0]]
            b_index = ([*batch_index(b.shape[:-2], batch), k[0], *col] if len(b.shape) > 1
                       else [k[0]])
            return Binary("mul", compute_load(ctx, 0, a_index),
                          compute_load(ctx, 1, b_index)), None

        return reduce_into(ctx, acc, lambda v: store_result(ctx, index, v), zero, [depth],
                           term)

    return ctx.nest(out.shape, element)


# -- conv ---------------------------------------------------------------------------------


def group_channel(out_channel: Expr, groups: int, per_group_out: int, per_group_in: int,
                  c: Expr) -> Expr:
    """Input channel `c` of the group that output channel `out_channel` belongs to."""
    return c if groups == 1 else (out_channel // per_group_out) * per_group_in + c


def _add_bias(ctx: LowerContext, value: Expr, channel: Expr) -> Expr:
    if len(ctx.inputs) < 3:
        return value
    return Binary("add", value, compute_load(ctx, 2, [channel]))


@lowering("conv")
def conv(ctx: LowerContext):
    x, w = ctx.inputs[:2]
    out = ctx.outputs[0]
    nd = len(x.shape) - 2
    strides, pb, _, dilations = window_params(nd, ctx.attrs["strides"], ctx.attrs["pads"],
                                              ctx.attrs["dilations"])
    groups = ctx.attrs["groups"]
    cg, mg = w.shape[1], w.shape[0] // groups  # channels per group in and out
    kernel = w.shape[2:]
    acc = accumulator(ctx)
    zero = ctx.const(0, acc.dtype)

    def element(index: list[Var]) -> list[Stmt]:
        n, m, o = index[0], index[1], index[2:]

        def term(r: list[Var]):
            c, taps = r[0], r[1:]
            positions = [window_position(*args) for args in zip(o, taps, strides, pb,
                                                                 dilations)]
            conds = window_checks(positions, x.shape[2:], out.shape[2:], kernel, strides,
                                  pb, dilations)
            channel = group_channel(m, groups, mg, cg, c)
            value = Binary("mul", compute_load(ctx, 0, [n, channel, *positions]),
                           compute_load(ctx, 1, [m, c, *taps]))
            return value, all_of(conds)

        return reduce_into(ctx, acc, lambda v: store_result(ctx, index, _add_bias(ctx, v, m)),
                           zero, [cg, *kernel], term)

    return ctx.nest(out.shape, element)


# -- conv_transpose -----------------------------------------------------------------------


def transpose_source(o: Expr, tap: Expr, stride: int, pad_begin: int, dilation: int,
                     size: int, out_size: int, k: int) -> tuple[Expr, list[Expr]]:
    """The input position feeding output `o` through kernel tap `tap`, and the conditions
    for it to exist: o + pad_begin - tap * dilation is a multiple of the stride whose
    quotient is in [0, size)."""
    offset = o + pad_begin - tap * dilation
    low, high = pad_begin - (k - 1) * dilation, out_size - 1 + pad_begin  # offset's range
    conds = []
    if low < 0:
        conds.append(Binary("ge", offset, Const(0)))
    if stride != 1:
        conds.append(Binary("eq", offset % stride, Const(0)))
    if high // stride >= size:
        conds.append(Binary("lt", offset, Const(size * stride)))
    return offset // stride, conds


@lowering("conv_transpose")
def conv_transpose(ctx: LowerContext):
    x, w = ctx.inputs[:2]
    out = ctx.outputs[0]
    nd = len(x.shape) - 2
    strides, pb, _, dilations = window_params(nd, ctx.attrs["strides"], ctx.attrs["pads"],
                                              ctx.attrs["dilations"])
    groups = ctx.attrs["groups"]
    cg, mg = x.shape[1] // groups, w.shape[1]  # channels per group in and out
    kernel = w.shape[2:]
    acc = accumulator(ctx)
    zero = ctx.const(0, acc.dtype)

    def element(index: list[Var]) -> list[Stmt]:
        n, m, o = index[0], index[1], index[2:]

        def term(r: list[Var]):
            c, taps = r[0], r[1:]
            conds, positions = [], []
            for args in zip(o, taps, strides, pb, dilations, x.shape[2:], out.shape[2:],
                            kernel):
                pos, more = transpose_source(*args)
                positions.append(pos)
                conds += more
            channel = group_channel(m, groups, mg, cg, c)
            value = Binary("mul", compute_load(ctx, 0, [n, channel, *positions]),
                           compute_load(ctx, 1, [channel, m if groups == 1 else m % mg,
                                                 *taps]))
            return value, all_of(conds)

        return reduce_into(ctx, acc, lambda v: store_result(ctx, index, _add_bias(ctx, v, m)),
                           zero, [cg, *kernel], term)

    return ctx.nest(out.shape, element)
