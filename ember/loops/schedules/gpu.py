"""The GPU's default schedule: every top-level nest of a kernel is a launch.

A nest whose outer loops have independent iterations runs one GPU thread per iteration of
that band: the band's loops are fused into one loop (`fuse`, outermost first) and marked
`threads`; what is inside runs serially in each thread, with the kernel's locals private to
it (the rule of parallel loops). The other top-level statements, taken in runs between
those launches, run as one launch of a single thread. Which thread of which block an
iteration gets, and how many threads a block has, is code generation's business
(`ember/codegen/nvptx.py`); the schedule says only which iterations may run at once.

    for %i = 0 to 64 {                       for %i_j = 0 to 8192 threads {
      for %j = 0 to 128 {          ==>         %y[%i_j // 128, %i_j % 128] = ...
        %y[%i, %j] = ...                     }
"""

from __future__ import annotations

from ember.errors import ScheduleError
from ember.loops.analysis import independent, is_threads, launches
from ember.loops.ir import (
    Const,
    For,
    Kernel,
    Load,
    Stmt,
    Store,
    expr_dim,
    stmt_exprs,
    walk_expr,
    walk_stmts,
)
from ember.loops.primitives import Step


def gpu_steps(kernel: Kernel) -> tuple[Kernel, list[Step]]:
    """The default GPU schedule of `kernel`: the kernel it makes and its steps."""
    steps: list[Step] = []

    def apply(name: str, *args: str) -> None:
        nonlocal kernel
        step = Step(name, args)
        kernel = step.apply(kernel)
        steps.append(step)

    for position in range(len(kernel.body)):
        band = _band(kernel, kernel.body[position])
        if not band:
            continue
        before = kernel, len(steps)
        fused = band[0]
        for inner in band[1:]:
            try:
                apply("fuse", fused, inner)
            except ScheduleError:  # (bounds that depend on the outer loop)
                break
            fused = kernel.body[position].var.name  # (fuse's loop, of a fresh name)
        try:
            apply("threads", fused)
        except ScheduleError:  # a local carried from iteration to iteration (a sum)
            kernel = before[0]
            del steps[before[1]:]
    kernel, serial = _keep_carried_locals(kernel)
    return kernel, [st for st in steps if not (st.name == "threads" and st.args[0] in serial)]


def _band(kernel: Kernel, top: Stmt) -> list[str]:
    """The outer loops of the perfect nest headed by `top` that may run at once: from 0 by
    1 to a bound fixed for the launch, each with independent iterations."""
    band = []
    s = top
    while isinstance(s, For):
        fixed = expr_dim(s.stop) is not None
        if s.step != 1 or s.start != Const(0) or not fixed or independent(s, kernel):
            break
        band.append(s.var.name)
        inner = [t for t in s.body if isinstance(t, For)]
        if len(s.body) != 1 or len(inner) != 1:
            break
        s = inner[0]
    return band


def _uses(stmts: list[Stmt], name: str) -> bool:
    """Whether `stmts` read or write buffer `name`."""
    return any(isinstance(s, Store) and s.buffer == name or
               any(isinstance(x, Load) and x.buffer == name
                   for e in stmt_exprs(s) for x in walk_expr(e))
               for s in walk_stmts(stmts))


def _keep_carried_locals(kernel: Kernel) -> tuple[Kernel, set[str]]:
    """`kernel` with the threads loops serial again where a local carries a value from one
    single-thread launch to a later one past them (a launch's locals live in its threads'
    registers and die with it): those launches then merge into one. Also the names of the
    loops made serial (their `threads` steps are dropped from the schedule)."""
    serial: set[str] = set()
    while True:
        groups = launches(kernel)
        single = [i for i, g in enumerate(groups) if not is_threads(g[0])]
        span = None
        for local in kernel.locals:
            users = [i for i in single if _uses(groups[i], local.name)]
            if len(users) > 1:
                span = (users[0], users[-1])
                break
        if span is None:
            return kernel, serial
        between = {id(groups[i][0]) for i in range(span[0] + 1, span[1])
                   if is_threads(groups[i][0])}
        serial |= {s.var.name for s in kernel.body if id(s) in between}
        body = [For(s.var, s.start, s.stop, s.body, s.step, "serial") if id(s) in between
                else s for s in kernel.body]
        kernel = Kernel(kernel.name, kernel.params, body, kernel.locals, kernel.origin)
