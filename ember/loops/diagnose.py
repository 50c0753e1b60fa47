"""Why a scheduled kernel may run far below its roofline: notes read off its loops, which
`ember explain` gives as the reasons of a kernel it flags as slow.

The notes look at the loops that do a kernel's work (the innermost loops that carry most
of its loads and stores, weighted by their trip counts) and say what keeps them from the
machine's vector units and cores: an inner loop left scalar and why (a body with no vector
code, an access across the layout, too few iterations, a reduction), lanes that gather or
stride through memory, vector loops whose count is known only at run time (masked lanes),
no loop run in parallel.
"""

from __future__ import annotations

from dataclasses import replace

from ember.loops.analysis import access_kind, load_stride, mentions, plan_vector
from ember.loops.cost import trip_count
from ember.loops.ir import (
    Binary,
    Const,
    For,
    If,
    Kernel,
    Load,
    Stmt,
    Store,
    binary,
    stmt_exprs,
    walk_expr,
    walk_stmts,
)
from ember.loops.text import format_expr

# The innermost loops looked at: the heaviest, until they carry this share of the work.
_COVERED_SHARE = 0.8
_MOST_LOOPS = 3
_LANES = 16  # a vector's lanes, for asking whether a loop's body could run on them


def slowness_notes(kernel: Kernel) -> list[str]:
    """Reasons `kernel` may run below its roofline, heaviest loop first ([] when none)."""
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    locals_ = {b.name for b in kernel.locals}
    weights: dict[int, tuple[For, int]] = {}
    _weigh(kernel.body, 1, None, weights)
    if not weights:
        return []
    total = sum(w for _, w in weights.values()) or 1
    notes: list[str] = []
    covered = 0
    innermost = [(loop, weight) for loop, weight in weights.values()
                 if not any(isinstance(s, For) for s in walk_stmts(loop.body))]
    for loop, weight in sorted(innermost, key=lambda lw: -lw[1])[:_MOST_LOOPS]:
        if covered >= _COVERED_SHARE * total:
            break
        covered += weight
        share = f"{100 * weight / total:.0f}% of its accesses"
        note = _vector_note(loop, locals_, shapes) if loop.kind == "vectorized" \
            else _scalar_note(loop, locals_, shapes)
        if note and note not in notes:
            notes.append(f"{note} ({share})")
    masked = [s for s in walk_stmts(kernel.body)
              if isinstance(s, For) and s.kind == "vectorized" and not isinstance(s.stop, Const)]
    if masked:
        first = masked[0]
        notes.append(f"{len(masked)} of its vectorized loops run a count known only at run"
                     f" time, on masked lanes (%{first.var.name} to {format_expr(first.stop)}):"
                     " a partial tile or row where the loops' ranges could not show it whole")
    if not any(isinstance(s, For) and s.kind == "parallel" for s in walk_stmts(kernel.body)):
        notes.append("one thread: none of its loops runs in parallel")
    return notes


def _weigh(stmts: list[Stmt], trips: int, loop: For | None,
           weights: dict[int, tuple[For, int]]) -> None:
    """Add to `weights` (by id of the innermost loop around them) the loads and stores of
    `stmts`, run `trips` times: each loop's trip count at most (one walk of the kernel;
    `cost.weighted` evaluates bounds exactly, at many times the cost)."""
    for s in stmts:
        if isinstance(s, For):
            _weigh(s.body, trips * max(1, trip_count(s)), s, weights)
        elif isinstance(s, If):
            _weigh(s.then, trips, loop, weights)
            _weigh(s.orelse, trips, loop, weights)
        elif loop is not None:
            accesses = int(isinstance(s, Store)) + sum(
                isinstance(x, Load) for e in stmt_exprs(s) for x in walk_expr(e))
            weights[id(loop)] = (loop, weights.get(id(loop), (loop, 0))[1] + trips * accesses)


def _loads(loop: For) -> list[Load]:
    return [x for s in walk_stmts(loop.body) for e in stmt_exprs(s) for x in walk_expr(e)
            if isinstance(x, Load)]


def _vector_note(loop: For, locals_: set[str], shapes: dict) -> str | None:
    """What a vectorized loop's lanes do that costs more than a vector load: gathers and
    strided loads of buffers in memory."""
    name = loop.var.name
    gathers, strided = [], []
    for x in _loads(loop):
        if x.buffer in locals_:
            continue
        kind = access_kind(x.index, name, shapes.get(x.buffer))
        if kind == "gather" and x.buffer not in gathers:
            gathers.append(x.buffer)
        elif kind == "strided" and x.buffer not in strided:
            strided.append((x.buffer, load_stride(x.index, name, shapes[x.buffer])))
    if gathers:
        return (f"its lanes over %{name} gather " + ", ".join(f"%{b}" for b in gathers)
                + " element by element (the index is not contiguous along the lanes)")
    if strided:
        return (f"its lanes over %{name} read " + ", ".join(f"%{b} with stride {c}"
                                                            for b, c in strided))
    return None


def _scalar_note(loop: For, locals_: set[str], shapes: dict) -> str:
    """Why an innermost loop runs one element at a time."""
    name = loop.var.name
    trips = trip_count(loop)
    head = f"scalar: its inner loop %{name} ({trips} iterations)"
    # Planned as a loop of a vector's lanes: whether lanes could run its body at all.
    lanes = replace(loop, kind="vectorized",
                    stop=binary("add", loop.start, Const(max(1, min(trips, _LANES)))))
    plan = plan_vector(lanes, locals_, shapes, reductions=True)
    if isinstance(plan, str):
        return f"{head} has no vector form: {plan}"
    across = [x for x in _loads(loop) if x.buffer not in locals_
              and access_kind(x.index, name, shapes.get(x.buffer)) == "gather"]
    divided = [x for x in across if any(
        isinstance(e, Binary) and e.op in ("floordiv", "mod") and mentions(e, {name})
        for i in x.index for e in walk_expr(i))]
    if divided:
        return (f"{head} reads %{divided[0].buffer} at an index that divides %{name} (a"
                " reshape inlined into the kernel whose divisions did not simplify away)")
    if across:
        return (f"{head} reads %{across[0].buffer} across its layout (the loop order is"
                " against the layout: a transpose or permute it could not block)")
    if trips < 4:
        return f"{head} is too short for vector lanes"
    if plan.reductions:
        return f"{head} reduces into " + ", ".join(f"%{b}" for b in sorted(plan.reductions)) \
            + ", left to LLVM's vectorizer"
    if any(isinstance(s, If) for s in walk_stmts(loop.body)):
        return f"{head} has an if in its body that no schedule step vectorized"
    return f"{head} could run on lanes, but its schedule does not vectorize it"
