"""Loops on vector lanes, the piece every hand-written schedule here is made of: a
`vectorized` loop over a fresh lane variable, a range cut into such loops, and the divisor
that sizes a group of register-held vectors."""

from __future__ import annotations

from collections.abc import Callable

from ember.loops.ir import Const, Expr, For, Stmt, Var, binary


def vector_loop(ctx, count: Expr | int, body: Callable[[Var], list[Stmt]]) -> For:
    """A loop of kind `vectorized` over a fresh lane variable jj from 0 to `count`,
    around body(jj); `ctx` (a LowerContext) makes the variable."""
    jj = ctx.var("jj")
    return For(jj, Const(0), Const(count) if isinstance(count, int) else count, body(jj), 1,
               "vectorized")


def lane_chunks(ctx, total: int, lanes: int, body: Callable[[Expr], list[Stmt]]) -> list[Stmt]:
    """body(i) for i = 0 .. total - 1, in vectorized loops of up to `lanes` (the last one
    shorter when `lanes` does not divide `total`)."""
    if total <= 0:
        return []
    width = min(lanes, total)
    q = ctx.var("q")
    count = binary("min", Const(width), binary("sub", total, q * width)) \
        if total % width else Const(width)
    return [For(q, Const(0), Const(-(-total // width)),
                [vector_loop(ctx, count, lambda jj: body(q * width + jj))])]


def largest_divisor(n: int, most: int) -> int:
    """The largest divisor of `n` that is at most `most` (at least 1)."""
    return max(d for d in range(1, max(1, most) + 1) if n % d == 0)
