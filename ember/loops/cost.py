"""Static costs of a loop-IR kernel, for explain's roofline: floating-point operations and
the bytes its parameters span.

`flops(kernel)` counts, for every store, the float arithmetic of its value (a fused
multiply-add counts two; loads, index arithmetic and integer ops count nothing), times the
trip counts of the loops around it (bounds and conditions that follow from outer loops are
evaluated at each of their values; a `min(c, e)` stop that does not counts as c, other
unknown bounds once; an unknown `if` as its costlier branch). It is an estimate of the
work done, padding of blocked schedules included, not of the instructions run.
"""

from __future__ import annotations

from collections.abc import Callable

from ember.dtypes import DType
from ember.graph.symbolic import SIZE_HINT
from ember.loops.ir import (
    Binary,
    Const,
    Expr,
    Fma,
    For,
    If,
    Kernel,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    is_size,
    walk_expr,
    walk_stmts,
)
from ember.loops.simplify import INT_FOLD

# Ops that are not arithmetic: comparisons, selections, bit logic.
_FREE = {"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "not", "isnan", "isinf",
         "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "shl", "shr", "abs", "neg"}


def trip_count(s: For) -> int:
    """How many iterations `s` runs: exact for constant bounds, the block for a `min(c, e)`
    stop (a blocked loop's tail), 1 when unknown."""
    stop = s.stop
    if isinstance(stop, Binary) and stop.op == "min":  # a blocked loop's tail: the block
        stop = stop.a if isinstance(stop.a, Const) else stop.b
    if isinstance(s.start, Const) and isinstance(stop, Const):
        return len(range(s.start.value, stop.value, s.step))
    start, stop = evaluate(s.start, {}), evaluate(stop, {})  # sizes known at call time
    return 1 if start is None or stop is None else len(range(start, stop, s.step))


def _expr_flops(value) -> int:
    count = 0
    for e in walk_expr(value):
        if isinstance(e, Fma):
            count += 2
        elif isinstance(e, (Binary, Unary)) and e.op not in _FREE and e.dtype.is_float:
            count += 1
    return count


def weighted(stmts: list[Stmt], cost: Callable[[Stmt], int],
             budget: int | None = None) -> int:
    """The sum of `cost` over the statements that are not loops or ifs, each times the trip
    counts of the loops around it. Bounds and conditions that depend on outer loops are
    evaluated at each of their values (a blocked nest's tails count what they run), within
    `budget` iterations (default ENUMERATION_BUDGET); past it, a loop's iterations count
    as its first, but for its last (a blocked loop's tail). Where a bound reads memory, a
    loop counts `trip_count` iterations and an `if` its costlier branch."""
    return _Weigher(cost, ENUMERATION_BUDGET if budget is None else budget).block(stmts, {})


ENUMERATION_BUDGET = 1 << 9  # loop iterations visited one by one, per estimate


class _Weigher:
    """`weighted`, memoized: a block's weight depends only on the values of the variables
    that its bounds and conditions read (a blocked nest's tiles mostly weigh the same)."""

    def __init__(self, cost: Callable[[Stmt], int], budget: int):
        self.cost = cost
        self.budget = budget
        self.reads_of: dict[int, tuple[str, ...]] = {}  # id(block) -> its control's variables
        self.memo: dict[tuple, int] = {}
        self.costs: dict[int, int] = {}

    def block(self, stmts: list[Stmt], env: dict[str, int]) -> int:
        key = (id(stmts), tuple(env.get(v) for v in self.reads(stmts)))
        if key not in self.memo:
            self.memo[key] = self.compute(stmts, env)
        return self.memo[key]

    def compute(self, stmts: list[Stmt], env: dict[str, int]) -> int:
        total = 0
        for s in stmts:
            if isinstance(s, For):
                total += self.loop(s, env)
            elif isinstance(s, If):
                cond = evaluate(s.cond, env)
                if cond is None:
                    total += max(self.block(s.then, env), self.block(s.orelse, env))
                else:
                    total += self.block(s.then if cond else s.orelse, env)
            else:
                if id(s) not in self.costs:
                    self.costs[id(s)] = self.cost(s)
                total += self.costs[id(s)]
        return total

    def loop(self, s: For, env: dict[str, int]) -> int:
        start, stop = evaluate(s.start, env), evaluate(s.stop, env)
        if start is None or stop is None:
            return trip_count(s) * self.block(s.body, env)
        values = range(start, stop, s.step)
        if s.var.name not in self.reads(s.body) or not values:
            return len(values) * self.block(s.body, env)
        if len(values) <= self.budget:
            self.budget -= len(values)
            return sum(self.block(s.body, {**env, s.var.name: v}) for v in values)
        # Past the budget, the iterations are taken to weigh as the first does, but for the
        # last: a blocked loop's tail (counting each as a full block overstated a 128-row
        # GEMM's work by a third, and `explain` showed it above its roofline).
        first = self.block(s.body, {**env, s.var.name: values[0]})
        return first * (len(values) - 1) + self.block(s.body, {**env, s.var.name: values[-1]})

    def reads(self, stmts: list[Stmt]) -> tuple[str, ...]:
        """The variables that bounds and conditions in `stmts` read, sorted."""
        if id(stmts) not in self.reads_of:
            names: set[str] = set()
            for inner in walk_stmts(stmts):
                exprs = [inner.start, inner.stop] if isinstance(inner, For) else \
                    [inner.cond] if isinstance(inner, If) else []
                names |= {x.name for e in exprs for x in walk_expr(e) if isinstance(x, Var)}
            self.reads_of[id(stmts)] = tuple(sorted(names))
        return self.reads_of[id(stmts)]


_EVALUATE = {**INT_FOLD, "and": lambda a, b: a and b, "or": lambda a, b: a or b}


def evaluate(e: Expr, env: dict[str, int]) -> int | bool | None:
    """An integer or bool expression's value from constants and the loop variables in
    `env` (a size known only at call time weighs as SIZE_HINT), or None when it needs
    anything else (memory, other variables, floats)."""
    if isinstance(e, Const):
        return e.value if e.dtype.is_int or e.dtype is DType.bool else None
    if isinstance(e, Var):
        return SIZE_HINT if is_size(e) else env.get(e.name)
    if isinstance(e, Binary) and e.op in _EVALUATE:
        a = evaluate(e.a, env)
        b = evaluate(e.b, env) if a is not None else None
        return None if b is None else _EVALUATE[e.op](a, b)
    if isinstance(e, Select):
        cond = evaluate(e.cond, env)
        return None if cond is None else evaluate(e.a if cond else e.b, env)
    return None


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
