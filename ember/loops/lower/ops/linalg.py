"""Lowerings of `matmul`, `conv` and `conv_transpose`: for each output element, a sum of
products accumulated in a local scalar of the compute type (f32 for halves, the dtype
otherwise, so integer sums wrap like the reference), rounded once at the store. Matmul's
plain nest is the algorithm: the scheduling stage blocks it (ember/loops/schedules/gemm.py).

Windowed reads that can fall into the padding sit under an `If` on the input position, so
no kernel reads out of bounds; the checks are left out on axes that cannot leave the input.
`conv_transpose` is a gather (each output element sums the kernel taps whose input
position is integral and in range), not a scatter, so its output elements are independent.
The window arithmetic is ember/loops/windows.py. A conv's plain nest is the algorithm: the
scheduling stage makes it an implicit GEMM or a depthwise schedule (ember/loops/schedules/
conv.py, depthwise.py); a packed conv is still a scheduled nest from packed_conv.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ember.graph.ops.linalg import window_params
from ember.loops.ir import Binary, Cast, Const, Expr, If, Load, Stmt, Store, Var
from ember.loops.lower.core import LowerContext, lowering
from ember.loops.windows import all_of, window_checks, window_position

# -- shared helpers -----------------------------------------------------------------------


def compute_load(ctx: LowerContext, i: int, index: Sequence[Expr | int]) -> Expr:
    """Operand `i` at `index`, widened to its compute type (f32 for halves)."""
    load = ctx.load(i, index)
    dtype = ctx.inputs[i].dtype
    return load if dtype.compute is dtype else Cast(dtype.compute, load)


def guarded(cond: Expr | None, stmts: list[Stmt]) -> list[Stmt]:
    return stmts if cond is None else [If(cond, stmts)]


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
def plain_matmul(ctx: LowerContext) -> list[Stmt]:
    """For each output element: acc = 0; acc += a * b over k; store (the scheduling stage
    finds this shape, `match_gemm`, and blocks f32 matmuls; others keep the plain nest)."""
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


@lowering("packed_matmul")
def packed_matmul(ctx: LowerContext) -> list[Stmt]:
    """x [..., M, K] times a matrix packed in panels of L columns (ember/graph/passes/
    pack_matmuls.py): the plain nest reads B at column j as wp[j // L, k, j % L], and the
    matmul schedule, told the panel width, reads a tile's panel in place when its tile is
    L columns wide (it copies panels otherwise, as it does any B)."""
    x, wp = ctx.inputs
    lanes = wp.shape[2]
    acc = accumulator(ctx)
    zero = ctx.const(0, acc.dtype)

    def element(index: list[Var]) -> list[Stmt]:
        *rows, col = index

        def term(k: list[Var]):
            return Binary("mul", compute_load(ctx, 0, [*rows, k[0]]),
                          compute_load(ctx, 1, [col // lanes, k[0], col % lanes])), None

        return reduce_into(ctx, acc, lambda v: store_result(ctx, index, v), zero,
                           [x.shape[-1]], term)

    return ctx.nest(ctx.outputs[0].shape, element)


# -- conv ---------------------------------------------------------------------------------


def group_channel(out_channel: Expr, groups: int, per_group_out: int, per_group_in: int,
                  c: Expr) -> Expr:
    """Input channel `c` of the group that output channel `out_channel` belongs to."""
    return c if groups == 1 else (out_channel // per_group_out) * per_group_in + c


def _add_bias(ctx: LowerContext, value: Expr, index: Sequence[Expr]) -> Expr:
    """`value` plus the bias (operand 2) at `index`, when the op has one."""
    if len(ctx.inputs) < 3:
        return value
    return Binary("add", value, compute_load(ctx, 2, index))


@lowering("conv")
def conv(ctx: LowerContext):
    """The plain nest: per output element, a sum over (c, taps). The scheduling stage makes
    an f32 2-D one an implicit GEMM (ember/loops/schedules/conv.py) or, when each output
    channel reads one input channel, gives it the depthwise schedule (depthwise.py)."""
    return plain_conv(ctx)


@lowering("packed_conv")
def packed_conv(ctx: LowerContext) -> list[Stmt]:
    """A conv whose weights are packed in panels of L output channels (ember/graph/ops/
    linalg.py), read as w[m, c, kh, kw] = wp[m // L, (c * KH + kh) * KW + kw, m % L]: the
    plain conv nest, which the scheduling stage gives the packed conv's schedule
    (ember/loops/schedules/packed_conv.py: output channels in the lanes)."""
    lanes = ctx.inputs[1].shape[2]
    kh_n, kw_n = ctx.attrs["kernel_shape"]

    def weight(n: Expr, m: Expr, c: Expr, taps: list[Var]) -> Expr:
        return compute_load(ctx, 1, [m // lanes, (c * kh_n + taps[0]) * kw_n + taps[1],
                                     m % lanes])

    return plain_conv(ctx, weight, kernel=(kh_n, kw_n), pads=(), groups=1)


@lowering("grouped_conv")
def grouped_conv(ctx: LowerContext) -> list[Stmt]:
    """Image b of x [N*G, C/G, H, W] convolved with w[b % G] (ember/graph/ops/linalg.py):
    the plain conv nest, its filter and bias read at the image's group, which the
    scheduling stage makes an implicit GEMM per image as any conv's."""
    groups = ctx.inputs[1].shape[0]

    def weight(n: Expr, m: Expr, c: Expr, taps: list[Var]) -> Expr:
        return compute_load(ctx, 1, [n % groups, m, c, *taps])

    return plain_conv(ctx, weight, kernel=ctx.inputs[1].shape[3:], groups=1,
                      bias=lambda n, m: [n % groups, m])


def plain_conv(ctx: LowerContext,
               weight: Callable[[Expr, Expr, Expr, list[Var]], Expr] | None = None,
               kernel: Sequence[int] | None = None, pads: Sequence[int] | None = None,
               groups: int | None = None,
               bias: Callable[[Expr, Expr], list[Expr]] | None = None) -> list[Stmt]:
    """Per output element [n, m, *o], a sum over (c, taps) of x at the window times
    `weight(n, m, c, taps)` (default: w[m, c, *taps], with the op's kernel, pads and
    groups), plus the bias at `bias(n, m)` (default: [m])."""
    x, w = ctx.inputs[:2]
    out = ctx.outputs[0]
    nd = len(x.shape) - 2
    strides, pb, _, dilations = window_params(
        nd, ctx.attrs["strides"], ctx.attrs["pads"] if pads is None else pads,
        ctx.attrs["dilations"])
    groups = ctx.attrs["groups"] if groups is None else groups
    kernel = w.shape[2:] if kernel is None else tuple(kernel)
    cg = w.shape[1] if weight is None else x.shape[1]  # input channels per group
    mg = out.shape[1] // groups  # output channels per group
    if weight is None:
        def weight(n: Expr, m: Expr, c: Expr, taps: list[Var]) -> Expr:
            return compute_load(ctx, 1, [m, c, *taps])
    if bias is None:
        def bias(n: Expr, m: Expr) -> list[Expr]:
            return [m]
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
                           weight(n, m, c, taps))
            return value, all_of(conds)

        return reduce_into(ctx, acc,
                           lambda v: store_result(ctx, index, _add_bias(ctx, v, bias(n, m))),
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

        return reduce_into(ctx, acc, lambda v: store_result(ctx, index, _add_bias(ctx, v, [m])),
                           zero, [cg, *kernel], term)

    return ctx.nest(out.shape, element)
