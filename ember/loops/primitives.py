"""Schedule primitives: named rewrites of a kernel's loop nests that keep what it computes,
and `Schedule`, a list of them as data that prints, parses, serialises and replays.

A loop is named by its index variable (`i0`); a name that two loops share is refused as
ambiguous. Each primitive is a pure function from a kernel to a new, verified kernel, and
raises ScheduleError naming the loop and the reason when a rewrite is illegal
(`vectorize` raises VerificationError when the loop's body cannot run on lanes). New loops
get fresh names derived from the old (`split i0 8` makes `i0.o` and `i0.i`, `fuse i0 i1`
makes `i0_i1`) and are serial, except that split keeps a parallel loop's outer part
parallel and a vectorized or unrolled loop's inner part so. A schedule prints one step a
line, its arguments bare:

    split i0 8
    reorder i0.i i1
    vectorize i1
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from ember.errors import ParseError, ScheduleError, VerificationError
from ember.loops.analysis import (
    REDUCTION_IDENTITY,
    affine_form,
    independent,
    interchange_conflict,
    is_reduction,
    plan_vector,
    stored_buffers,
    vector_plan_in,
)
from ember.loops.ir import (
    INDEX,
    Binary,
    Buffer,
    Const,
    Expr,
    For,
    If,
    Kernel,
    Load,
    Prefetch,
    Select,
    Stmt,
    Store,
    Var,
    binary,
    expr_dim,
    loads_in,
    map_expr,
    operands,
    stmt_exprs,
    walk_expr,
    walk_stmts,
)
from ember.loops.schedules.attention import attention
from ember.loops.schedules.conv import conv_gemm
from ember.loops.schedules.depthwise import depthwise_conv
from ember.loops.schedules.gemm import gemm
from ember.loops.schedules.packed_conv import packed_conv
from ember.loops.schedules.pool import pool
from ember.loops.verify import verify_kernel

# Locals live on the stack (an alloca per kernel); a cache past L2's size also buys nothing.
MAX_CACHE_BYTES = 256 * 1024


# -- finding, renaming and rebuilding loops --------------------------------------------------------

def find_loop(kernel: Kernel, name: str) -> For:
    """The loop of `kernel` whose index variable is `name`."""
    loops = [s for s in kernel.walk() if isinstance(s, For) and s.var.name == name]
    if not loops:
        raise ScheduleError(f"kernel @{kernel.name} has no loop %{name}")
    if len(loops) > 1:
        raise ScheduleError(f"kernel @{kernel.name}: loop name %{name} is ambiguous"
                            f" ({len(loops)} loops use it)")
    return loops[0]


def _fresh(kernel: Kernel, base: str) -> str:
    """`base`, or `base` with a number appended, so that no variable or buffer has it."""
    taken = {b.name for b in (*kernel.params, *kernel.locals)}
    taken |= {s.var.name for s in kernel.walk() if isinstance(s, For)}
    name, n = base, 1
    while name in taken:
        name, n = f"{base}{n}", n + 1
    return name


def _splice(stmts: list[Stmt], replacements: dict[int, list[Stmt]]) -> list[Stmt]:
    """`stmts` rebuilt with each statement whose id is a key replaced by its list."""
    out: list[Stmt] = []
    for s in stmts:
        if id(s) in replacements:
            out.extend(replacements[id(s)])
        elif isinstance(s, For):
            out.append(replace(s, body=_splice(s.body, replacements)))
        elif isinstance(s, If):
            out.append(replace(s, then=_splice(s.then, replacements),
                               orelse=_splice(s.orelse, replacements)))
        else:
            out.append(s)
    return out


def _rewrite(kernel: Kernel, replacements: dict[int, list[Stmt]],
             new_locals: tuple[Buffer, ...] = ()) -> Kernel:
    """The kernel with statements replaced, verified (a failure is the primitive's refusal)."""
    result = replace(kernel, body=_splice(kernel.body, replacements),
                     locals=[*kernel.locals, *new_locals])
    try:
        return verify_kernel(result)
    except VerificationError as e:
        raise ScheduleError(f"the rewritten kernel does not verify: {e}") from e


def _map_exprs(stmts: list[Stmt], fn: Callable[[Expr], Expr]) -> list[Stmt]:
    """`stmts` with `fn` applied to every expression in them (loop bounds included)."""
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, For):
            out.append(replace(s, start=fn(s.start), stop=fn(s.stop), body=_map_exprs(s.body, fn)))
        elif isinstance(s, Store):
            out.append(Store(s.buffer, tuple(map(fn, s.index)), fn(s.value)))
        elif isinstance(s, Prefetch):
            out.append(Prefetch(s.buffer, tuple(map(fn, s.index))))
        elif isinstance(s, If):
            out.append(If(fn(s.cond), _map_exprs(s.then, fn), _map_exprs(s.orelse, fn)))
    return out


def _substitute(stmts: list[Stmt], values: dict[str, Expr]) -> list[Stmt]:
    """`stmts` with variables replaced, index arithmetic re-simplified around them."""
    def node(x: Expr) -> Expr | None:
        if isinstance(x, Var):
            return values.get(x.name)
        if isinstance(x, Binary) and x.a.dtype is INDEX:
            return binary(x.op, x.a, x.b)
        return None
    return _map_exprs(stmts, lambda e: map_expr(e, node))


def _uses(e: Expr, name: str) -> bool:
    return any(isinstance(x, Var) and x.name == name for x in walk_expr(e))


def _extent(s: For) -> range | None:
    if isinstance(s.start, Const) and isinstance(s.stop, Const):
        return range(int(s.start.value), int(s.stop.value), s.step)
    return None


def _constant_trip_bound(s: For) -> bool:
    """A constant start and a constant stop, or a `min(c, e)` stop (a split's tail)."""
    stop_bound = isinstance(s.stop, Const) or s.step == 1 and isinstance(s.stop, Binary) and \
        s.stop.op == "min" and any(isinstance(x, Const) for x in (s.stop.a, s.stop.b))
    return isinstance(s.start, Const) and stop_bound


def _check_bounds_stable(s: For, what: str) -> None:
    """Refuse to move the evaluation of `s`'s bounds when its body writes what they read."""
    read = {x.buffer for e in (s.start, s.stop) for x in walk_expr(e) if isinstance(x, Load)}
    clobbered = read & stored_buffers(s.body)
    if clobbered:
        raise ScheduleError(f"cannot {what}: the bounds of %{s.var.name} read"
                            f" %{sorted(clobbered)[0]}, which its body writes")


def _perfect_nest(kernel: Kernel, outer: str, inner: str, what: str) -> tuple[For, For]:
    a, b = find_loop(kernel, outer), find_loop(kernel, inner)
    if len(a.body) != 1 or a.body[0] is not b:
        raise ScheduleError(f"cannot {what}: loops %{outer} and %{inner} are not a perfect"
                            f" nest (the body of %{outer} is not exactly loop %{inner})")
    for bound in (b.start, b.stop):
        if _uses(bound, outer):
            raise ScheduleError(f"cannot {what}: the bounds of %{inner} depend on %{outer}")
    _check_bounds_stable(a, what)
    _check_bounds_stable(b, what)
    return a, b


def _position(block: list[Stmt], target: Stmt) -> int:
    return next(i for i, s in enumerate(block) if s is target)


def _affine_expr(coefficients: dict[str, int], constant: int) -> Expr:
    e: Expr = Const(constant)
    for v, c in reversed(coefficients.items()):  # the first variable ends up leftmost
        e = binary("add", binary("mul", Var(v), c), e)
    return e


# -- the primitives --------------------------------------------------------------------------------

def _split(kernel: Kernel, loop: str, factor: int) -> tuple[Kernel, str, str]:
    s = find_loop(kernel, loop)
    if factor < 1:
        raise ScheduleError(f"cannot split %{loop} by {factor}: the factor must be at least 1")
    if s.step != 1:
        raise ScheduleError(f"cannot split %{loop}: it has step {s.step}, split needs step 1")
    _check_bounds_stable(s, f"split %{loop}")
    outer = Var(_fresh(kernel, f"{loop}.o"))
    inner = Var(_fresh(kernel, f"{loop}.i"))
    trips = binary("sub", s.stop, s.start)
    # The last outer iteration runs a partial inner loop when `factor` does not divide the
    # trip count: min(factor, what is left) keeps the form that unroll/vectorize mask.
    tail = Binary("min", Const(factor), binary("sub", trips, binary("mul", outer, factor)))
    if isinstance(trips, Const):
        n = max(0, int(trips.value))
        outer_stop: Expr = Const(-(-n // factor))
        inner_stop = Const(factor) if n % factor == 0 else tail
    else:
        outer_stop = binary("floordiv", binary("add", trips, factor - 1), factor)
        inner_stop = tail
    index = binary("add", binary("add", binary("mul", outer, factor), inner), s.start)
    body = _substitute(s.body, {loop: index})
    # Chunks of independent iterations stay independent, and a block of lanes or copies
    # keeps its constant bound: the kinds that stay meaningful carry over.
    inner_loop = For(inner, Const(0), inner_stop, body,
                     kind=s.kind if s.kind in ("vectorized", "unrolled") else "serial")
    nest = For(outer, Const(0), outer_stop, [inner_loop],
               kind="parallel" if s.kind == "parallel" else "serial")
    return _rewrite(kernel, {id(s): [nest]}), outer.name, inner.name


def split(kernel: Kernel, loop: str, factor: int) -> Kernel:
    """Loop i becomes i.o { i.i } with i = i.o * factor + i.i (plus i's start); a trip count
    that `factor` does not divide gets a tail: i.i runs to min(factor, n - i.o * factor)."""
    return _split(kernel, loop, factor)[0]


def reorder(kernel: Kernel, outer: str, inner: str) -> Kernel:
    """Interchange the perfect nest `outer` { `inner` { body } }, each loop keeping its kind."""
    a, b = _perfect_nest(kernel, outer, inner, f"reorder %{outer} and %{inner}")
    why = interchange_conflict(a, b, {x.name for x in kernel.locals})
    if why:
        raise ScheduleError(f"cannot reorder %{outer} and %{inner}: {why}")
    return _rewrite(kernel, {id(a): [replace(b, body=[replace(a, body=b.body)])]})


def fuse(kernel: Kernel, outer: str, inner: str) -> Kernel:
    """The perfect nest `outer` { `inner` } with constant bounds becomes one loop over the
    product, outer = f // n and inner = f % n (n: inner's trip count). The outer loop may
    run from 0 by 1 to a size known at call time (a batch: then the product is too)."""
    a, b = _perfect_nest(kernel, outer, inner, f"fuse %{outer} and %{inner}")
    ra, rb = _extent(a), _extent(b)
    sized = ra is None and a.start == Const(0) and a.step == 1 and expr_dim(a.stop) is not None
    for s, r in ((a, ra), (b, rb)):
        if r is None and not (s is a and sized):
            raise ScheduleError(f"cannot fuse %{outer} and %{inner}: loop %{s.var.name} has no"
                                " constant bounds")
    fused = Var(_fresh(kernel, f"{outer}_{inner}"))
    n = max(1, len(rb))
    values = {outer: binary("add", binary("mul", binary("floordiv", fused, n), a.step), a.start),
              inner: binary("add", binary("mul", binary("mod", fused, n), b.step), b.start)}
    stop = binary("mul", a.stop, len(rb)) if sized else Const(len(ra) * len(rb))
    loop = For(fused, Const(0), stop, _substitute(b.body, values))
    return _rewrite(kernel, {id(a): [loop]})


def _set_kind(kernel: Kernel, s: For, kind: str) -> Kernel:
    return _rewrite(kernel, {id(s): [replace(s, kind=kind)]})


def vectorize(kernel: Kernel, loop: str) -> Kernel:
    """Mark an innermost loop with a constant trip count (or a split's `min(c, e)` tail)
    `vectorized`; raises VerificationError with the reason when its body cannot run on
    lanes (`plan_vector`, ember/loops/analysis.py)."""
    s = find_loop(kernel, loop)
    nested = next((t for t in walk_stmts(s.body) if isinstance(t, For)), None)
    if nested is not None:
        raise ScheduleError(f"cannot vectorize %{loop}: it is not innermost (loop"
                            f" %{nested.var.name} is inside it)")
    if s.step != 1 or not _constant_trip_bound(s):
        raise ScheduleError(f"cannot vectorize %{loop}: its trip count is not constant (it runs"
                            " from a constant start to a constant or min(c, e) stop, step 1)")
    plan = vector_plan_in(kernel, s)
    if isinstance(plan, str):
        raise VerificationError(f"kernel @{kernel.name}: cannot vectorize %{loop}: {plan}")
    return _set_kind(kernel, s, "vectorized")


def unroll(kernel: Kernel, loop: str) -> Kernel:
    """Mark a loop whose trip count has a constant bound `unrolled`."""
    s = find_loop(kernel, loop)
    if not _constant_trip_bound(s):
        raise ScheduleError(f"cannot unroll %{loop}: its trip count has no constant bound")
    return _set_kind(kernel, s, "unrolled")


def parallel(kernel: Kernel, loop: str) -> Kernel:
    """Mark a loop whose iterations are independent (`analysis.independent`) `parallel`."""
    s = find_loop(kernel, loop)
    why = independent(s, kernel)
    if why:
        raise ScheduleError(f"cannot parallelize %{loop}: {why}")
    return _set_kind(kernel, s, "parallel")


def threads(kernel: Kernel, loop: str) -> Kernel:
    """Mark a top-level loop whose iterations are independent `threads`: on the GPU, a
    launch of one thread per iteration."""
    s = find_loop(kernel, loop)
    if not any(t is s for t in kernel.body):
        raise ScheduleError(f"cannot run %{loop} on threads: it is not a top-level loop")
    why = independent(s, kernel)
    if why:
        raise ScheduleError(f"cannot run %{loop} on threads: {why}")
    return _set_kind(kernel, s, "threads")


def vectorize_blocks(kernel: Kernel, loop: str, width: int) -> Kernel:
    """Strip-mine the innermost serial loop %i (constant bounds, step 1, n iterations, at
    least `width`) into blocks of `width` lanes: `for %i.v = 0 to n / width { for %i.l = 0
    to width vectorized { .. } }`, then a vectorized tail `for %i.l = 0 to n % width` (the
    block loop only when there are several blocks, the tail only when there is a rest);
    `width` is one vector register of the body's widest type. A reduction into a local
    (`%acc[u] = op(%acc[u], x)`, %acc read nowhere else in the loop) runs on a local of
    `width` partial results started at the op's identity, one per lane, reduced across
    the lanes into %acc once after the loop (LLVM's vectorizer leaves float reductions
    serial: their order is the program's). Refused with the reason when the body cannot
    run on lanes."""
    s = find_loop(kernel, loop)
    nested = next((t for t in walk_stmts(s.body) if isinstance(t, For)), None)
    if nested is not None:
        raise ScheduleError(f"cannot vectorize %{loop} in blocks: it is not innermost (loop"
                            f" %{nested.var.name} is inside it)")
    if s.kind != "serial" or s.step != 1 or not (isinstance(s.start, Const) and
                                                  isinstance(s.stop, Const)):
        raise ScheduleError(f"cannot vectorize %{loop} in blocks: it must be a serial loop"
                            " with constant bounds and step 1")
    start, trips = int(s.start.value), int(s.stop.value) - int(s.start.value)
    if width < 1 or trips < width:
        raise ScheduleError(f"cannot vectorize %{loop} in blocks of {width}: it runs"
                            f" {trips} iterations")
    blocks, rest = divmod(trips, width)
    names = {t.var.name for t in kernel.walk() if isinstance(t, For)}
    block, lane = f"{loop}.v", f"{loop}.l"
    while block in names or lane in names:
        block, lane = block + "_", lane + "_"
    original = s
    s, partials, combine = _private_reductions(kernel, s, width, lane)
    main = _lanes(s, lane, Var(block) * width + start if blocks > 1 else Const(start), width)
    plan = plan_vector(main, {b.name for b in (*kernel.locals, *partials)},
                       {b.name: b.shape for b in (*kernel.params, *kernel.locals, *partials)})
    if isinstance(plan, str):
        raise ScheduleError(f"cannot vectorize %{loop} in blocks: {plan}")
    nest: list[Stmt] = [For(Var(block), Const(0), Const(blocks), [main])] \
        if blocks > 1 else [main]
    if rest:
        nest.append(_lanes(s, lane, Const(start + blocks * width), rest))
    starts = [For(Var(lane), Const(0), Const(width), [Store(
        b.name, (Var(lane),), Const(REDUCTION_IDENTITY[op, b.dtype], b.dtype))],
        kind="vectorized")
        for b, op in partials.items()]
    return _rewrite(kernel, {id(original): [*starts, *nest, *combine]}, tuple(partials))


def _private_reductions(kernel: Kernel, s: For, width: int, lane: str
                        ) -> tuple[For, dict[Buffer, str], list[Stmt]]:
    """Loop `s` with each reduction into a local (`%acc[u] = op(%acc[u], x)`, the local read
    nowhere else in it) accumulating into a new local of `width` lanes instead, at the
    loop's lane; the new locals with their ops; and the loops that reduce each into its
    %acc after the loop, across the lanes."""
    locals_ = {b.name: b for b in kernel.locals}
    name = s.var.name
    reading = [x.buffer for t in walk_stmts(s.body) for e in stmt_exprs(t)
               for x in walk_expr(e) if isinstance(x, Load)]
    partials: dict[Buffer, str] = {}
    combine: list[Stmt] = []
    body: list[Stmt] = []
    for t in s.body:
        if not (is_reduction(t, set(locals_), name) and reading.count(t.buffer) == 1
                and sum(isinstance(u, Store) and u.buffer == t.buffer
                        for u in walk_stmts(s.body)) == 1):
            body.append(t)
            continue
        op, acc = t.value.op, locals_[t.buffer]
        partial = Buffer(_fresh(replace(kernel, locals=[*kernel.locals, *partials]),
                                f"{acc.name}.lanes"), acc.dtype, (width,))
        partials[partial] = op
        mine = Load(partial.name, (Var(lane),), acc.dtype)
        # (Indexed by the lane itself, which `_lanes` leaves as it is.)
        body.append(Store(partial.name, (Var(lane),), Binary(op, mine, t.value.b)))
        combine.append(For(Var(lane), Const(0), Const(width), [Store(
            t.buffer, t.index, Binary(op, Load(t.buffer, t.index, acc.dtype), mine))],
            kind="vectorized"))
    return replace(s, body=body), partials, combine


def _lanes(loop: For, lane: str, first: Expr, count: int) -> For:
    """`loop`'s iterations first .. first + count - 1 as a vectorized loop over `lane`."""
    return For(Var(lane), Const(0), Const(count),
               _substitute(loop.body, {loop.var.name: Var(lane) + first}), kind="vectorized")


def tile(kernel: Kernel, loop_a: str, loop_b: str, factor_a: int, factor_b: int) -> Kernel:
    """Split the perfect nest a { b } into a.o { b.o { a.i { b.i } } }."""
    _perfect_nest(kernel, loop_a, loop_b, f"tile %{loop_a} and %{loop_b}")
    kernel, _, a_inner = _split(kernel, loop_a, factor_a)
    kernel, b_outer, _ = _split(kernel, loop_b, factor_b)
    try:
        return reorder(kernel, a_inner, b_outer)
    except ScheduleError as e:
        raise ScheduleError(f"cannot tile %{loop_a} and %{loop_b}: {e}") from e


def _guarded_loads(e: Expr, buffer: str, guarded: bool) -> Iterator[tuple[Load, bool]]:
    """The loads of `buffer` in `e`, each with whether a select may skip it."""
    if isinstance(e, Load):
        if e.buffer == buffer:
            yield e, guarded
        for i in e.index:
            yield from _guarded_loads(i, buffer, guarded)
    elif isinstance(e, Select):
        yield from _guarded_loads(e.cond, buffer, guarded)
        yield from _guarded_loads(e.a, buffer, True)
        yield from _guarded_loads(e.b, buffer, True)
    else:
        for x in operands(e):
            yield from _guarded_loads(x, buffer, guarded)


def _reads_in(stmts: list[Stmt], buffer: str, loops: tuple[For, ...],
              guarded: bool) -> Iterator[tuple[Load, tuple[For, ...], bool]]:
    """Each load of `buffer` in `stmts`, with the loops around it and whether it may not run."""
    for s in stmts:
        for e in stmt_exprs(s):
            for load, skipped in _guarded_loads(e, buffer, guarded):
                yield load, loops, skipped
        if isinstance(s, For):
            yield from _reads_in(s.body, buffer, (*loops, s), guarded)
        elif isinstance(s, If):
            yield from _reads_in(s.then + s.orelse, buffer, loops, True)


def cache_read(kernel: Kernel, buffer: str, at_loop: str) -> Kernel:
    """Copy the box of `buffer` that loop `at_loop` reads into a new local just before the
    loop, and read the local instead.

    Every load of the buffer in the loop must run on every iteration (no if or select around
    it) inside loops with constant, non-empty bounds, and index each axis by the same
    expression of outer variables plus an affine function of the loops in `at_loop` (so
    the box is in bounds wherever the loads were); the loop must not write the buffer."""
    s = find_loop(kernel, at_loop)
    try:
        source = kernel.buffer(buffer)
    except KeyError:
        raise ScheduleError(f"kernel @{kernel.name} has no buffer %{buffer}") from None
    where = f"cannot cache %{buffer} at %{at_loop}"
    written = stored_buffers(s.body)
    if buffer in written:
        raise ScheduleError(f"{where}: the loop writes it")
    reads = list(_reads_in(s.body, buffer, (s,), False))
    if not reads:
        raise ScheduleError(f"{where}: the loop does not read it")
    box: list[tuple[Expr, int, int]] = []  # per axis: the outer offset, lowest, highest
    for load, loops, skipped in reads:
        if skipped:
            raise ScheduleError(f"{where}: a load of it is conditional (under an if or a"
                                " select), so its box may reach out of bounds")
        ranges = {}
        for loop in loops:
            r = _extent(loop)
            if not r:
                raise ScheduleError(f"{where}: loop %{loop.var.name} has no constant,"
                                    " non-empty bounds")
            ranges[loop.var.name] = (r[0], r[-1])
        form = [affine_form(e, set(ranges)) for e in load.index]
        for axis, f in enumerate(form):
            if f is None:
                raise ScheduleError(f"{where}: index {axis} of %{buffer} is not affine in the"
                                    " loop's variables")
            if any(x.buffer in written for x in walk_expr(f[2]) if isinstance(x, Load)):
                raise ScheduleError(f"{where}: index {axis} reads a buffer the loop writes")
            low = f[1] + sum(min(c * ranges[v][0], c * ranges[v][1]) for v, c in f[0].items())
            high = f[1] + sum(max(c * ranges[v][0], c * ranges[v][1]) for v, c in f[0].items())
            if len(box) <= axis:
                box.append((f[2], low, high))
            elif box[axis][0] != f[2]:
                raise ScheduleError(f"{where}: its loads differ in a non-constant offset at"
                                    f" index {axis}")
            else:
                box[axis] = (f[2], min(low, box[axis][1]), max(high, box[axis][2]))
    extents = [high - low + 1 for _, low, high in box]
    kept = [axis for axis, n in enumerate(extents) if n > 1]  # the cache drops axes of 1
    cache = Buffer(_fresh(kernel, f"{buffer}.cache"), source.dtype,
                   tuple(extents[axis] for axis in kept))
    if cache.nbytes > MAX_CACHE_BYTES:
        raise ScheduleError(f"{where}: the box {extents} takes {cache.nbytes} bytes, more"
                            f" than {MAX_CACHE_BYTES}")
    copy_vars = {axis: Var(_fresh(kernel, f"{buffer}.c{axis}")) for axis in kept}
    origin = tuple(binary("add", binary("add", offset, low), copy_vars.get(axis, 0))
                   for axis, (offset, low, _) in enumerate(box))
    copy: list[Stmt] = [Store(cache.name, tuple(copy_vars.values()),
                              Load(buffer, origin, source.dtype))]
    for axis in reversed(kept):
        copy = [For(copy_vars[axis], Const(0), Const(extents[axis]), copy)]
    inside = {t.var.name for t in walk_stmts([s]) if isinstance(t, For)}

    def reread(x: Expr) -> Expr | None:
        if not (isinstance(x, Load) and x.buffer == buffer):
            return None
        forms = [affine_form(e, inside) for e in x.index]
        return Load(cache.name, tuple(_affine_expr(forms[axis][0], forms[axis][1] - box[axis][1])
                                      for axis in kept), x.dtype)

    body = _map_exprs(s.body, lambda e: map_expr(e, reread))
    return _rewrite(kernel, {id(s): [*copy, replace(s, body=body)]}, (cache,))


def _block_of(stmts: list[Stmt], target: Stmt) -> list[Stmt] | None:
    """The statement list that holds `target`."""
    if any(s is target for s in stmts):
        return stmts
    for s in stmts:
        for inner in ([s.body] if isinstance(s, For) else [s.then, s.orelse]
                      if isinstance(s, If) else []):
            found = _block_of(inner, target)
            if found is not None:
                return found
    return None


def compute_at(kernel: Kernel, producer: str, consumer: str) -> Kernel:
    """Move the body of loop `producer`, which writes locals, to the top of loop `consumer`,
    a later loop of the same block over the same index space, where iteration i computes
    just the slice i that the consumer's iteration i reads.

    The producer's stores to each local the consumer reads must index it by the producer's
    variable at one axis, and the consumer must read it only at its own variable on that
    axis; nothing between the two loops may touch the producer's locals, the consumer may
    not write them, and neither may write a buffer the producer reads."""
    p, c = find_loop(kernel, producer), find_loop(kernel, consumer)
    where = f"cannot compute %{producer} at %{consumer}"
    block = _block_of(kernel.body, p)
    if not any(s is c for s in block) or _position(block, c) < _position(block, p):
        raise ScheduleError(f"{where}: %{consumer} is not a later loop of the block that holds"
                            f" %{producer}")
    if (p.start, p.stop, p.step) != (c.start, c.stop, c.step):
        raise ScheduleError(f"{where}: they iterate different index spaces")
    if any(isinstance(x, Load) for e in (p.start, p.stop) for x in walk_expr(e)):
        raise ScheduleError(f"{where}: their bounds read memory")
    local_names = {b.name for b in kernel.locals}
    produced = stored_buffers(p.body)
    if not produced or not produced <= local_names:
        raise ScheduleError(f"{where}: the producer must write locals only (it writes"
                            f" {', '.join('%' + b for b in sorted(produced)) or 'nothing'})")
    inputs = {x.buffer for x in loads_in([p])}
    between = block[_position(block, p) + 1:_position(block, c)]
    touched = stored_buffers(between) | {x.buffer for x in loads_in(between)}
    if touched & produced:
        raise ScheduleError(f"{where}: %{sorted(touched & produced)[0]} is used between them")
    clobbered = (stored_buffers(between) | stored_buffers(c.body)) & inputs
    if clobbered:
        raise ScheduleError(f"{where}: %{sorted(clobbered)[0]}, which the producer reads, is"
                            " written after it")
    overwritten = stored_buffers(c.body) & produced
    if overwritten:
        raise ScheduleError(f"{where}: the consumer writes %{sorted(overwritten)[0]}")
    own = (Var(producer), Var(consumer))
    for name in sorted(produced):  # locals the consumer does not read are the producer's own
        stores = [s.index for s in walk_stmts(p.body) if isinstance(s, Store) and s.buffer == name]
        loads = [x.index for x in loads_in(c.body) if x.buffer == name]
        axes = [axis for axis in range(len(stores[0]))
                if all(i[axis] == own[0] for i in stores) and all(i[axis] == own[1] for i in loads)]
        if loads and not axes:
            raise ScheduleError(f"{where}: %{name} is not written at %{producer} and read at"
                                f" %{consumer} on one axis (the iterations must match 1:1)")
    moved = _substitute(p.body, {producer: own[1]})
    return _rewrite(kernel, {id(p): [], id(c): [replace(c, body=[*moved, *c.body])]})


# -- schedules as data -------------------------------------------------------------------------

# Each primitive with the kinds of its arguments (after the kernel): loop and buffer names,
# and integers.
PRIMITIVES: dict[str, tuple[Callable[..., Kernel], tuple[str, ...]]] = {
    "split": (split, ("loop", "int")),
    "reorder": (reorder, ("loop", "loop")),
    "fuse": (fuse, ("loop", "loop")),
    "vectorize": (vectorize, ("loop",)),
    "vectorize_blocks": (vectorize_blocks, ("loop", "int")),
    "unroll": (unroll, ("loop",)),
    "parallel": (parallel, ("loop",)),
    "threads": (threads, ("loop",)),
    "tile": (tile, ("loop", "loop", "int", "int")),
    "cache_read": (cache_read, ("buffer", "loop")),
    "compute_at": (compute_at, ("loop", "loop")),
    # A kernel class's composite step: the matmul nest of a loop blocked by a GemmSchedule
    # (mr nr kc mc nc pack_a parallel; ember/loops/schedules/gemm.py).
    "gemm": (gemm, ("loop", "int", "int", "int", "int", "int", "int", "int")),
    # A plain conv nest as an implicit GEMM blocked by a GemmSchedule (as gemm's;
    # ember/loops/schedules/conv.py).
    "conv_gemm": (conv_gemm, ("loop", "int", "int", "int", "int", "int", "int", "int")),
    # A plain conv nest whose filter is in panels of output channels, the channels in the
    # lanes (rows, input channels a pass, groups of a panel's tiles;
    # ember/loops/schedules/packed_conv.py).
    "packed_conv": (packed_conv, ("loop", "int", "int", "int")),
    # A plain 2-D pool nest as vectors of output columns (lanes chains;
    # ember/loops/schedules/pool.py).
    "pool": (pool, ("loop", "int", "int")),
    # A plain depthwise conv nest through a padded plane (lanes chains;
    # ember/loops/schedules/depthwise.py).
    "depthwise_conv": (depthwise_conv, ("loop", "int", "int")),
    # A plain attention nest as an online softmax over blocks of keys for groups of rows
    # (key_block row_group tile lanes; ember/loops/schedules/attention.py).
    "attention": (attention, ("loop", "int", "int", "int", "int")),
}
_NAME = re.compile(r"[A-Za-z0-9_.$]+")  # a %name of the loop-IR text, without the %


@dataclass(frozen=True)
class Step:
    """One primitive applied: its name and its arguments after the kernel."""

    name: str
    args: tuple = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))  # JSON gives lists
        why = _bad_step(self.name, self.args)
        if why:
            raise ScheduleError(f"bad schedule step '{self}': {why}")

    def __str__(self) -> str:
        return " ".join([self.name, *map(str, self.args)])

    def apply(self, kernel: Kernel) -> Kernel:
        return PRIMITIVES[self.name][0](kernel, *self.args)


def _bad_step(name: str, args: tuple) -> str | None:
    if name not in PRIMITIVES:
        return f"unknown primitive (known: {', '.join(PRIMITIVES)})"
    kinds = PRIMITIVES[name][1]
    if len(args) != len(kinds):
        return f"{name} takes {len(kinds)} arguments ({', '.join(kinds)}), not {len(args)}"
    for arg, kind in zip(args, kinds):
        ok = type(arg) is int if kind == "int" else isinstance(arg, str) and _NAME.fullmatch(arg)
        if not ok:
            return f"{arg!r} is not {'an integer' if kind == 'int' else f'a {kind} name'}"
    return None


@dataclass
class Schedule:
    """Primitives to apply in order. `str()` prints a step a line (`split i0 8`), `parse`
    reads that back, `to_json`/`from_json` store it, `apply` replays it on a kernel."""

    steps: list[Step] = field(default_factory=list)

    def then(self, name: str, *args: str | int) -> Schedule:
        """This schedule with one more step."""
        return Schedule([*self.steps, Step(name, args)])

    def __str__(self) -> str:
        return "".join(f"{step}\n" for step in self.steps)

    @classmethod
    def parse(cls, text: str, source_name: str = "<schedule>") -> Schedule:
        """The schedule of `text`: a step a line, `#` comments and blank lines skipped."""
        steps = []
        for number, line in enumerate(text.splitlines(), 1):
            words = list(re.finditer(r"\S+", line.split("#")[0]))
            if not words:
                continue
            name, args = words[0].group(), []
            kinds = PRIMITIVES.get(name, (None, ()))[1]
            for word, kind in zip(words[1:], kinds):
                if kind == "int" and not re.fullmatch(r"-?\d+", word.group()):
                    raise ParseError(f"{name} expects an integer, found '{word.group()}'",
                                     number, word.start() + 1, source_name)
                args.append(int(word.group()) if kind == "int" else word.group())
            args += [w.group() for w in words[1 + len(kinds):]]  # reported as extra
            why = _bad_step(name, tuple(args))
            if why:
                raise ParseError(why, number, words[0].start() + 1, source_name)
            steps.append(Step(name, tuple(args)))
        return cls(steps)

    def to_json(self) -> str:
        return json.dumps({"steps": [[step.name, *step.args] for step in self.steps]})

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        try:
            data = json.loads(text)
            return cls([Step(s[0], s[1:]) for s in data["steps"]])
        except (ValueError, KeyError, TypeError, IndexError, ScheduleError) as e:
            raise ScheduleError(f"malformed schedule JSON: {e}") from e

    def apply(self, kernel: Kernel) -> Kernel:
        """`kernel` with the steps applied in order; an error names the failing step."""
        for number, step in enumerate(self.steps, 1):
            try:
                kernel = step.apply(kernel)
            except (ScheduleError, VerificationError) as e:
                raise type(e)(f"step {number} ({step}): {e}") from e
        return kernel
