"""Loops on vector lanes, the piece every hand-written schedule here is made of: a
`vectorized` loop over a fresh lane variable, a range cut into such loops, and the divisor
that sizes a group of register-held vectors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ember.loops.analysis import vector_plan_in
from ember.loops.ir import Const, Expr, For, If, Kernel, Stmt, Var, binary, walk_stmts
from ember.loops.simplify import simplify_kernel


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


def serial_unless_vectorizable(kernel: Kernel, simplified: bool = False) -> Kernel:
    """`kernel` with each `vectorized` loop that cannot run on lanes once its indices are
    simplified (`plan_vector`) made serial, as code generation ran it when it decided:
    loops that lowerings mark for lanes whose bodies have no vector code (a bf16
    write-back, a one-column GEMM tile's store, a padded conv's lane-varying divisions).
    The verifier rejects any other such loop.
    `simplified`: return the kernel with its indices simplified too (a schedule step's
    result), which this finds anyway."""
    simple = simplify_kernel(kernel)  # what the schedule and code generation see
    if simplified:
        kernel = simple
    loops = zip(walk_stmts(kernel.body), walk_stmts(simple.body))
    serial = {id(s) for s, t in loops if isinstance(s, For) and s.kind == "vectorized"
              and isinstance(vector_plan_in(simple, t), str)}
    if not serial:
        return kernel

    def rebuild(stmts: list[Stmt]) -> list[Stmt]:
        out: list[Stmt] = []
        for s in stmts:
            if isinstance(s, For):
                s = replace(s, body=rebuild(s.body),
                            kind="serial" if id(s) in serial else s.kind)
            elif isinstance(s, If):
                s = replace(s, then=rebuild(s.then), orelse=rebuild(s.orelse))
            out.append(s)
        return out

    return replace(kernel, body=rebuild(kernel.body))
