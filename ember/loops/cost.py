"""Static costs of a loop-IR kernel, for explain's roofline: floating-point operations and
the bytes its parameters span.

`flops(kernel)` counts, for every store, the float arithmetic of its value (a fused
multiply-add counts two; loads, index arithmetic and integer ops count nothing), times the
trip counts of the loops around it (a `min(c, e)` stop counts as c, other non-constant
bounds count once; an `if` as its costlier branch). It is an estimate of the work done,
padding of blocked schedules included, not of the instructions run.
"""

from __future__ import annotations

from collections.abc import Callable

from ember.loops.ir import Binary, Const, Fma, For, If, Kernel, Stmt, Store, Unary, walk_expr

# Ops that are not arithmetic: comparisons, selections, bit logic.
_FREE = {"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "not", "isnan", "isinf",
         "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "shl", "shr", "abs", "neg"}


def trip_count(s: For) -> int:
    """How many iterations `s` runs: exact for constant bounds, the block for a `min(c, e)`
    stop (a blocked loop's tail), 1 when unknown."""
    stop = s.stop
    if isinstance(stop, Binary) and stop.op == "min" and isinstance(stop.a, Const):
        stop = stop.a  # a blocked loop's tail: at most the block
    if isinstance(s.start, Const) and isinstance(stop, Const):
        return len(range(s.start.value, stop.value, s.step))
    return 1


def _expr_flops(value) -> int:
    count = 0
    for e in walk_expr(value):
        if isinstance(e, Fma):
            count += 2
        elif isinstance(e, (Binary, Unary)) and e.op not in _FREE and e.dtype.is_float:
            count += 1
    return count


def weighted(stmts: list[Stmt], cost: Callable[[Stmt], int]) -> int:
    """The sum of `cost` over the statements that are not loops or ifs, each times the trip
    counts of the loops around it (an `if` counts as its costlier branch)."""
    total = 0
    for s in stmts:
        if isinstance(s, For):
            total += trip_count(s) * weighted(s.body, cost)
        elif isinstance(s, If):
            total += max(weighted(s.then, cost), weighted(s.orelse, cost))
        else:
            total += cost(s)
    return total


def schedule_summary(kernel: Kernel) -> str:
    """The kernel's schedule in brief: its loop kinds other than serial, outermost first, with
    their trip counts, e.g. "parallel 384, unrolled 6, vectorized 16" ("serial" if none)."""
    seen: dict[str, int] = {}

    def walk(stmts: list[Stmt]) -> None:
        for s in stmts:
            if isinstance(s, For):
                if s.kind != "serial" and s.kind not in seen:
                    seen[s.kind] = trip_count(s)
                walk(s.body)
            elif isinstance(s, If):
                walk(s.then)
                walk(s.orelse)

    walk(kernel.body)
    return ", ".join(f"{kind} {trips}" for kind, trips in seen.items()) or "serial"


def flops(kernel: Kernel) -> int:
    return weighted(kernel.body, lambda s: _expr_flops(s.value) if isinstance(s, Store) else 0)


def param_bytes(kernel: Kernel) -> int:
    return sum(p.nbytes for p in kernel.params)
