"""Parallel loops through the OpenMP runtime (libgomp), as GCC's `#pragma omp parallel for
schedule(static)` compiles them.

A loop of kind `parallel` becomes a call

    GOMP_parallel(@<kernel>.parallel<n>, ptr %data, i32 load @<module>_num_threads, 0)

(or, when that count is 1, a direct call of the body: no fork and join), where
`@<kernel>.parallel<n>(ptr %data)` is the loop body outlined into an internal
function that every thread of the team runs: it splits the iteration range into one
contiguous chunk per thread (omp_get_thread_num / omp_get_num_threads) and runs its own
chunk serially. `%data` points to a struct, on the caller's stack, holding what the body
captures: the loop bounds, the pointers of the parameters it uses and the values of the
enclosing loop variables it reads. Locals that the body uses are allocated anew in the
outlined function: each thread has its own (the verifier checks that the body writes them
before reading them, so no value needs to flow in or out).

Only the outermost parallel loop of a nest runs on a team; parallel loops inside it are
emitted as serial loops (nested teams would oversubscribe the cores).

The thread count is not part of the code: `@<module>_num_threads` (i32, 0 = the OpenMP
default) is a global that the runtime sets after loading (`ember.codegen.cpu`), so the
code, and every cache key, is the same for any count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ember.codegen.scalar import I32, I64, PTR, declare
from ember.loops.ir import (
    Buffer,
    Const,
    For,
    If,
    Load,
    Prefetch,
    Stmt,
    Store,
    Var,
    size_var,
    walk_expr,
    walk_stmts,
)

if TYPE_CHECKING:
    from ember.codegen.llvm import KernelEmitter

# The libgomp entry points that parallel code calls.
OPENMP_SYMBOLS = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")
THREADS_SUFFIX = "_num_threads"


def num_threads_symbol(module_name: str) -> str:
    """The i32 global holding the team size for the parallel loops of module `module_name`
    (a program's name, for a program module)."""
    return module_name + THREADS_SUFFIX


def thread_count(module: ir.Module) -> ir.GlobalVariable:
    """The module's thread-count global, defined on first use. It is externally visible, so
    that the runtime can find and set it and LLVM cannot fold its initial value."""
    name = num_threads_symbol(module.name)
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    count = ir.GlobalVariable(module, I32, name)
    count.initializer = ir.Constant(I32, 0)  # 0: libgomp picks (OMP_NUM_THREADS or the cores)
    count.align = 4
    return count


# -- what the body captures ------------------------------------------------------------------

def _uses(stmts: list[Stmt]) -> tuple[set[str], set[str]]:
    """The buffers and the variables that `stmts` name."""
    exprs, buffers, variables = [], set(), set()
    for s in walk_stmts(stmts):
        if isinstance(s, For):
            exprs += [s.start, s.stop]
        elif isinstance(s, Store):
            buffers.add(s.buffer)
            exprs += [*s.index, s.value]
        elif isinstance(s, Prefetch):
            buffers.add(s.buffer)
            exprs += s.index
        elif isinstance(s, If):
            exprs.append(s.cond)
    for e in exprs:
        for sub in walk_expr(e):
            if isinstance(sub, Load):
                buffers.add(sub.buffer)
            elif isinstance(sub, Var):
                variables.add(sub.name)
    return buffers, variables


def _outlined_name(module: ir.Module, kernel: str) -> str:
    n = 0
    while f"{kernel}.parallel{n}" in module.globals:
        n += 1
    return f"{kernel}.parallel{n}"


# -- emission ------------------------------------------------------------------------------------

def emit_parallel_for(parent: KernelEmitter, s: For) -> None:
    """Emit `s` (a parallel loop, not inside another) at the parent's insertion point: the
    outlined body and the GOMP_parallel call that runs it on a team."""
    kernel = parent.kernel
    buffers, variables = _uses(s.body)
    params = [p for p in kernel.params if p.name in buffers]
    private = [b for b in kernel.locals if b.name in buffers]
    # Sizes known at call time are read by the body's bounds and by its buffers' strides.
    variables |= {size_var(n).name for b in (*params, *private) for n in b.sizes}
    captured = sorted(v for v in variables if v in parent.vars and v != s.var.name)

    # The data struct: start, stop, then parameter pointers, then enclosing loop variables.
    fields = [I64, I64] + [PTR] * len(params) + [I64] * len(captured)
    data_type = ir.LiteralStructType(fields)
    b = parent.b
    values = [parent.index(s.start), parent.index(s.stop)]  # evaluated once, as serial loops do
    values += [parent.buffers[p.name][0] for p in params]
    values += [b.load(parent.vars[v], typ=I64) for v in captured]
    data = parent.allocas.alloca(data_type, name=f"{s.var.name}.data")
    for i, value in enumerate(values):
        b.store(value, _field(b, data, data_type, i))

    module = b.module
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]),
                     _outlined_name(module, kernel.name))
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.args[0].name = "data"
    _emit_body(parent.nested(fn, private), s, fn.args[0], data_type, params, captured)

    gomp = declare(b, "GOMP_parallel", ir.VoidType(), [PTR, PTR, I32, I32])
    threads = b.load(thread_count(module), typ=I32, name="num_threads")
    # One thread runs the body itself: outside a team, omp_get_num_threads() is 1 and the
    # body takes the whole range, without the runtime's fork and join (4 us a loop).
    # So it does when bounds known only at call time leave a single iteration (a batch of 1).
    alone_test = b.icmp_signed("==", threads, ir.Constant(I32, 1))
    if not (isinstance(s.start, Const) and isinstance(s.stop, Const)):
        single = b.icmp_signed("<=", b.sub(values[1], values[0]), ir.Constant(I64, abs(s.step)))
        alone_test = b.or_(alone_test, single)
    with b.if_else(alone_test) as (alone, team):
        with alone:
            b.call(fn, [data])
        with team:
            b.call(gomp, [fn, data, threads, ir.Constant(I32, 0)])


def _field(b: ir.IRBuilder, data: ir.Value, data_type: ir.Type, i: int) -> ir.Value:
    """A pointer to field `i` of the data struct, from the caller's alloca (a typed pointer
    in llvmlite) or from the outlined function's argument (an opaque one)."""
    etype = data_type if data.type.is_opaque else None
    return b.gep(data, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True,
                 source_etype=etype)


def _emit_body(sub: KernelEmitter, s: For, data: ir.Value, data_type: ir.LiteralStructType,
               params: list[Buffer], captured: list[str]) -> None:
    """The outlined function: unpack the captures, find this thread's chunk, run it."""
    entry = sub.allocas
    loaded = [entry.load(_field(entry, data, data_type, i), typ=t)
              for i, t in enumerate(data_type.elements)]
    start, stop = loaded[0], loaded[1]
    for p, ptr in zip(params, loaded[2:]):
        ptr.name = p.name
        sub.buffers[p.name] = (ptr, p)
    for name, value in zip(captured, loaded[2 + len(params):]):
        slot = entry.alloca(I64, name=name)
        entry.store(value, slot)
        sub.vars[name] = slot

    first, last = _static_chunk(sub.b, start, stop, s.step)
    sub.loop(s, first, last)
    sub.finish()


def _static_chunk(b: ir.IRBuilder, start: ir.Value, stop: ir.Value,
                  step: int) -> tuple[ir.Value, ir.Value]:
    """This thread's part of the loop, as the values of the loop variable where it starts and
    where it stops: the iterations split into contiguous chunks whose sizes differ by at most
    one, the first `trip % threads` threads taking one more (OpenMP's schedule(static))."""
    one, zero = ir.Constant(I64, 1), ir.Constant(I64, 0)
    span = b.sub(stop, start) if step > 0 else b.sub(start, stop)
    # ceil(span / |step|) without overflow for spans near the i64 limit; 0 when empty.
    trip = b.add(b.sdiv(b.sub(span, one), ir.Constant(I64, abs(step))), one)
    trip = b.select(b.icmp_signed(">", span, zero), trip, zero, name="trip")
    thread = b.sext(b.call(declare(b, "omp_get_thread_num", I32, []), []), I64)
    threads = b.sext(b.call(declare(b, "omp_get_num_threads", I32, []), []), I64)
    chunk, extra = b.sdiv(trip, threads), b.srem(trip, threads)
    lo = b.add(b.mul(thread, chunk), b.select(b.icmp_signed("<", thread, extra), thread, extra))
    count = b.add(chunk, b.zext(b.icmp_signed("<", thread, extra), I64))
    hi = b.add(lo, count)
    stride = ir.Constant(I64, step)
    return b.add(start, b.mul(lo, stride)), b.add(start, b.mul(hi, stride))
