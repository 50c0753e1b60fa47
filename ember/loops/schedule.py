"""Schedule primitives on the loop IR, and the default schedule that every compile applies.

A primitive rewrites a kernel's loop nest without changing what it computes. Here is
`parallelize`: it marks a loop `parallel` (the CPU backend runs its iterations on a thread
team) after checking that its iterations are independent; the others (split, reorder,
tile, cache_read, ...) are in `ember/loops/primitives.py`. Every compile first simplifies
each kernel's indices by its loops' ranges (`simplify_kernel`), then the default schedule
parallelizes, in each top-level nest of a kernel, the outermost loop that is legal and has
enough work to pay for a fork (a few microseconds); it looks past a loop it cannot
parallelize only when that loop has at most MAX_FORKS iterations (a fork per iteration);
then it vectorizes inner loops whose bodies have vector code (`vectorize_inner_loops`).
Before both, nests that transpose (the store contiguous along one loop, a load along
another) are tiled into square blocks (`block_transposes`).

Independence is `ember.loops.analysis.independent`.
"""

from __future__ import annotations

from dataclasses import replace

from ember.dtypes import DType
from ember.errors import VerificationError
from ember.loops.analysis import access_kind, independent, plan_vector
from ember.loops.cost import trip_count, weighted
from ember.loops.ir import (
    Const,
    Expr,
    For,
    If,
    Kernel,
    Load,
    Program,
    Stmt,
    Store,
    Var,
    loads_in,
    walk_expr,
    walk_stmts,
)
from ember.loops.primitives import _rewrite, _split, _substitute, reorder, unroll, vectorize
from ember.loops.simplify import simplify_kernel
from ember.loops.verify import verify_kernel
from ember.target import Target

# About the work of one fork on this class of machine: below it, a team costs more than it
# saves (a fork and join measured ~8 us on 2 threads; a simple iteration is ~1 ns).
MIN_PARALLEL_WORK = 1 << 15
MAX_FORKS = 8  # most iterations of a serial loop around a parallel one


def _constant_bounds(s: For) -> bool:
    return isinstance(s.start, Const) and isinstance(s.stop, Const)


def work(stmts: list[Stmt]) -> int:
    """About how many statement executions `stmts` cost (unknown trip counts count 1; a
    rough figure, for deciding whether a nest is worth a thread team)."""
    return weighted(stmts, lambda s: 1, budget=0)


def parallelize(kernel: Kernel, loop: For) -> Kernel:
    """`kernel` with `loop` (one of its loops) marked parallel; raises VerificationError
    when its iterations may depend on each other."""
    why = independent(loop, kernel)
    if why is not None:
        raise VerificationError(f"kernel @{kernel.name}: cannot parallelize %{loop.var.name}:"
                                f" {why}")

    def mark(stmts: list[Stmt]) -> list[Stmt]:
        out = []
        for s in stmts:
            if s is loop:
                out.append(replace(s, kind="parallel"))
            elif isinstance(s, For):
                out.append(replace(s, body=mark(s.body)))
            elif isinstance(s, If):
                out.append(replace(s, then=mark(s.then), orelse=mark(s.orelse)))
            else:
                out.append(s)
        return out

    scheduled = replace(kernel, body=mark(kernel.body))
    verify_kernel(scheduled)  # the private-locals rule
    return scheduled


def _candidates(s: For):
    """The loops of the perfect-ish nest headed by `s`, outermost first."""
    while True:
        yield s
        inner = [t for t in s.body if isinstance(t, For)]
        if len(s.body) != 1 or len(inner) != 1:
            return
        s = inner[0]


def default_schedule(kernel: Kernel, min_work: int = MIN_PARALLEL_WORK) -> Kernel:
    """Parallelize the outermost legal loop of each top-level nest with enough work (and
    at least two iterations)."""
    for position in range(len(kernel.body)):
        top = kernel.body[position]  # from the kernel as scheduled so far
        if not isinstance(top, For) or work([top]) < min_work:
            continue
        for loop in _candidates(top):
            if trip_count(loop) < 2 or not _constant_bounds(loop):
                continue
            try:
                kernel = parallelize(kernel, loop)
            except VerificationError:
                # A team per iteration of this loop would pay a fork each time: look
                # further in only past a loop of a few iterations.
                if trip_count(loop) > MAX_FORKS:
                    break
                continue
            break
    return kernel


def transpose_block(target: Target) -> int:
    """The side of a transposed block: one vector of f32, so that the block's loads and
    stores are whole vectors."""
    return target.lanes(DType.f32)


def block_transposes(kernel: Kernel, target: Target) -> Kernel:
    """Tile each transposing nest `for %a { for %b { y[.., %b] = f(x[.., %b, .., %a]) } }`
    (every store contiguous in %b, a load contiguous in %a instead) into square blocks,
    `for %a.o { for %b.o { for %a.i unrolled { for %b.i vectorized { .. } } } }`. Code
    generation transposes a full block in registers (ember/codegen/vector.py,
    `transposed_loads`): W vector loads along %a, W log2(W) shuffles, W vector stores along
    %b; the edge blocks gather. Untiled, the load walked down a column, a cache line per
    element, and rows whose pitch is a multiple of 1 KiB share a few L1 sets, so the lines
    were evicted before the next column came back to them (BERT's key heads, [128, 12, 64]
    -> [12, 64, 128] by 0.125: 106 -> 22 us a call on one thread, PyTorch's 43; the
    transposing kernels of BERT-base 2.25 -> 1.20 ms, of GPT-2 2.00 -> 0.90)."""
    side = transpose_block(target)
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    pairs = []
    for outer in walk_stmts(kernel.body):
        if not (isinstance(outer, For) and len(outer.body) == 1 and
                isinstance(outer.body[0], For)):
            continue
        inner = outer.body[0]
        if not all(isinstance(x, Store) for x in inner.body) or not all(
                _constant_bounds(x) and x.kind == "serial" and x.step == 1 and
                trip_count(x) >= side for x in (outer, inner)):
            continue
        a, b = outer.var.name, inner.var.name
        loads = list(loads_in(inner.body))
        if all(access_kind(s.index, b, shapes[s.buffer]) == "contiguous"
               for s in inner.body) and any(
                access_kind(x.index, b, shapes[x.buffer]) == "gather" and
                access_kind(x.index, a, shapes[x.buffer]) == "contiguous" for x in loads):
            pairs.append((a, b))
    for a, b in pairs:
        kernel, _, rows = _split(kernel, a, side)
        kernel, blocks, lanes = _split(kernel, b, side)
        kernel = vectorize(unroll(reorder(kernel, rows, blocks), rows), lanes)
    return kernel


def vectorize_inner_loops(kernel: Kernel, target: Target) -> Kernel:
    """Each innermost serial loop with constant bounds whose body ember.codegen.vector can
    run on lanes without gathers becomes a loop over blocks of one of `target`'s vector
    registers of its widest type (at least 4 lanes), each a vectorized loop, and a
    vectorized tail for the rest. Kernels that already have vectorized loops (a GEMM's)
    keep their schedule.

    LLVM's loop vectorizer would widen most of these loops too, but behind a run-time check
    that the output does not overlap the inputs: an output planned in place of its input
    (ember/runtime/memory_plan.py) fails it and runs serially. BERT's GELU in place took
    3 ms a layer that way instead of 0.3."""
    if any(isinstance(s, For) and s.kind == "vectorized" for s in walk_stmts(kernel.body)):
        return kernel
    locals_ = {b.name for b in kernel.locals}
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    names = {s.var.name for s in walk_stmts(kernel.body) if isinstance(s, For)}
    replacements: dict[int, list[Stmt]] = {}
    for loop in walk_stmts(kernel.body):
        if not isinstance(loop, For) or loop.kind != "serial" or loop.step != 1 or \
                not _constant_bounds(loop) or \
                any(isinstance(s, For) for s in walk_stmts(loop.body)):
            continue
        body_stmts = list(walk_stmts(loop.body))
        if not all(isinstance(s, Store) for s in body_stmts):
            continue
        loads = [x for s in body_stmts for x in walk_expr(s.value) if isinstance(x, Load)]
        widest = max(x.dtype.itemsize for x in [*loads, *(s.value for s in body_stmts)])
        width = max(4, target.vector_bytes // widest)
        trips = int(loop.stop.value) - int(loop.start.value)
        if trips < width or any(access_kind(x.index, loop.var.name, shapes[x.buffer]) ==
                                "gather" for x in loads):
            continue
        blocks, rest = divmod(trips, width)
        # Fresh names, against the kernel's and those picked so far in this pass (which
        # primitives._fresh, reading the kernel alone, would not see).
        block, lane = f"{loop.var.name}.v", f"{loop.var.name}.l"
        while block in names or lane in names:
            block, lane = block + "_", lane + "_"
        names |= {block, lane}
        start = int(loop.start.value)
        main = _lanes(loop, lane, Var(block) * width + start if blocks > 1 else Const(start),
                      width)
        # No reductions: LLVM's vectorizer keeps a reduction's partial sums in vectors
        # across the whole loop, where blocks of lanes would each end in a horizontal one.
        if isinstance(plan_vector(main, locals_, shapes), str):
            continue
        nest: list[Stmt] = [For(Var(block), Const(0), Const(blocks), [main])] \
            if blocks > 1 else [main]
        if rest:
            nest.append(_lanes(loop, lane, Const(start + blocks * width), rest))
        replacements[id(loop)] = nest
    if not replacements:
        return kernel
    return _rewrite(kernel, replacements)


def _lanes(loop: For, lane: str, first: Expr, count: int) -> For:
    """`loop`'s iterations first .. first + count - 1 as a vectorized loop over `lane`."""
    return For(Var(lane), Const(0), Const(count),
               _substitute(loop.body, {loop.var.name: Var(lane) + first}), kind="vectorized")


def schedule_kernel(kernel: Kernel, target: Target) -> Kernel:
    """`kernel` with its index arithmetic simplified by the loops' ranges (divisions that
    inlined reshapes leave) and the default schedule for `target` applied: transposes in
    blocks, parallel outer loops, vectorized inner ones."""
    blocked = block_transposes(simplify_kernel(kernel), target)
    return vectorize_inner_loops(default_schedule(blocked), target)


def schedule_program(program: Program, target: Target) -> Program:
    """`program` with each kernel scheduled by `schedule_kernel` for `target`."""
    program.kernels = [schedule_kernel(k, target) for k in program.kernels]
    return program
