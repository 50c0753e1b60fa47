"""The loop-IR verifier: buffers and variables are defined where used, dtypes agree,
index arities match buffer ranks, affine accesses stay in bounds where decidable (every
index whose range follows from constant loop bounds is checked), locals used in parallel
loops are written before they are read (they are private to each thread), and every
`vectorized` loop can run on lanes (ember/loops/analysis.py, `plan_vector`)."""

from __future__ import annotations

import operator

from ember.dtypes import DType
from ember.errors import VerificationError
from ember.graph.symbolic import definitely
from ember.loops.analysis import vector_plan_in
from ember.loops.ir import (
    BINARY_OPS,
    BUFFER_KINDS,
    COMPARISONS,
    CONCURRENT_KINDS,
    INDEX,
    STATUS_DTYPE,
    UNARY_OPS,
    Binary,
    Bitcast,
    Buffer,
    Call,
    Cast,
    Const,
    Expr,
    Fma,
    For,
    If,
    Kernel,
    Load,
    Prefetch,
    Program,
    ProgramIf,
    ProgramLoop,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    is_size,
    shared_code,
    walk_expr,
    walk_stmts,
)

Interval = tuple[int, int] | None  # inclusive [lo, hi], or None when unknown
GUARDED = "<guarded>"  # marks ranges inside an If, where bounds are not decidable here


def verify_kernel(kernel: Kernel) -> Kernel:
    _KernelVerifier(kernel).block(kernel.body, {})
    _PrivateLocals(kernel).check()
    _check_vectorized(kernel)
    _check_threads(kernel)
    return kernel


def _check_threads(kernel: Kernel) -> None:
    """A `threads` loop is a launch of GPU threads: a statement of the kernel's body, not
    nested in another."""
    top = {id(s) for s in kernel.body}
    for s in walk_stmts(kernel.body):
        if isinstance(s, For) and s.kind == "threads" and id(s) not in top:
            raise VerificationError(f"kernel @{kernel.name}: threads loop %{s.var.name} is"
                                    " nested (a launch of GPU threads is a top-level loop)")


def _check_vectorized(kernel: Kernel) -> None:
    """A `vectorized` loop must be one its body can run as on lanes (`plan_vector`): code
    generation renders the plan and never falls back to a serial loop."""
    for s in walk_stmts(kernel.body):
        if isinstance(s, For) and s.kind == "vectorized":
            plan = vector_plan_in(kernel, s)
            if isinstance(plan, str):
                raise VerificationError(f"kernel @{kernel.name}: vectorized loop"
                                        f" %{s.var.name} cannot run on lanes: {plan}")


def verify_program(program: Program) -> Program:
    names = [b.buffer.name for b in program.buffers]
    if len(set(names)) != len(names):
        raise VerificationError(f"program @{program.name}: a buffer name is used twice")
    buffers = {b.buffer.name: b for b in program.buffers}
    for b in program.buffers:
        if b.kind not in BUFFER_KINDS:
            raise VerificationError(f"buffer %{b.buffer.name} has unknown kind '{b.kind}'")
        if b.kind == "status" and (b.buffer.shape != () or b.buffer.dtype is not STATUS_DTYPE
                                   or len(program.of_kind("status")) > 1):
            raise VerificationError(f"status buffer %{b.buffer.name} must be the program's one"
                                    f" {STATUS_DTYPE}[] buffer")
        if b.kind == "constant":
            data = program.constants.get(b.buffer.name)
            if data is None or data.shape != b.buffer.shape or data.dtype != b.buffer.dtype.np:
                raise VerificationError(f"constant buffer %{b.buffer.name} has no matching data")
    kernels: dict[str, Kernel] = {}
    verified = set()
    for k in program.kernels:
        if k.name in kernels:
            raise VerificationError(f"kernel @{k.name} is defined twice")
        if shared_code(k) not in verified:
            verify_kernel(k)
            verified.add(shared_code(k))
        kernels[k.name] = k
    _verify_steps(program.steps, buffers, kernels)
    return program


def _verify_steps(steps, buffers, kernels) -> None:
    def scalar(name: str, dtype: DType, what: str) -> None:
        if name not in buffers:
            raise VerificationError(f"{what} uses unknown buffer %{name}")
        b = buffers[name].buffer
        if b.shape != () or b.dtype is not dtype:
            raise VerificationError(f"{what} needs a {dtype}[] buffer, %{name} is"
                                    f" {b.dtype}{list(b.shape)}")

    for step in steps:
        if isinstance(step, Call):
            kernel = kernels.get(step.kernel)
            if kernel is None:
                raise VerificationError(f"call of unknown kernel @{step.kernel}")
            if len(step.args) != len(kernel.params):
                raise VerificationError(f"call @{step.kernel} passes {len(step.args)} buffers,"
                                        f" the kernel takes {len(kernel.params)}")
            for arg, param in zip(step.args, kernel.params):
                if arg not in buffers:
                    raise VerificationError(f"call @{step.kernel} uses unknown buffer %{arg}")
                b = buffers[arg].buffer
                if (b.dtype, b.shape) != (param.dtype, param.shape):
                    raise VerificationError(
                        f"call @{step.kernel}: %{arg} is {b.dtype}{list(b.shape)} but parameter"
                        f" %{param.name} is {param.dtype}{list(param.shape)}")
        elif isinstance(step, ProgramIf):
            scalar(step.cond, DType.bool, "if")
            _verify_steps(step.then, buffers, kernels)
            _verify_steps(step.orelse, buffers, kernels)
        elif isinstance(step, ProgramLoop):
            scalar(step.trip_count, DType.i64, "loop trip count")
            scalar(step.cond, DType.bool, "loop condition")
            scalar(step.counter, DType.i64, "loop counter")
            _verify_steps(step.body, buffers, kernels)


class _KernelVerifier:
    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.buffers: dict[str, Buffer] = {}
        for b in (*kernel.params, *kernel.locals):
            if b.name in self.buffers:
                self.fail(f"buffer %{b.name} is declared twice")
            self.buffers[b.name] = b

    def fail(self, message: str):
        raise VerificationError(f"kernel @{self.kernel.name}: {message}")

    def block(self, stmts: list[Stmt], ranges: dict[str, Interval]) -> None:
        for s in stmts:
            if isinstance(s, For):
                if s.var.name in ranges or s.var.name in self.buffers:
                    self.fail(f"loop variable %{s.var.name} shadows another name")
                if s.step == 0:
                    self.fail(f"loop %{s.var.name} has step 0")
                for bound in (s.start, s.stop):
                    if self.expr(bound, ranges) is not INDEX:
                        self.fail(f"loop %{s.var.name} bounds must be i64")
                self.block(s.body, {**ranges, s.var.name: _loop_range(s, ranges)})
            elif isinstance(s, Store):
                buffer = self.access(s.buffer, s.index, ranges, "store to")
                dtype = self.expr(s.value, ranges)
                if dtype is not buffer.dtype:
                    self.fail(f"store of a {dtype} value into %{s.buffer}: {buffer.dtype}")
            elif isinstance(s, Prefetch):
                self.access(s.buffer, s.index, ranges, "prefetch of")
            elif isinstance(s, If):
                if self.expr(s.cond, ranges) is not DType.bool:
                    self.fail("an if condition must be bool")
                # The condition may be what keeps an access in bounds: no range checks inside.
                guarded = {**ranges, GUARDED: None}
                self.block(s.then, guarded)
                self.block(s.orelse, guarded)
            else:
                self.fail(f"unknown statement {type(s).__name__}")

    def access(self, name: str, index, ranges, what: str) -> Buffer:
        buffer = self.buffers.get(name)
        if buffer is None:
            self.fail(f"{what} unknown buffer %{name}")
        if len(index) != len(buffer.shape):
            self.fail(f"{what} %{name} uses {len(index)} indices, its rank is"
                      f" {len(buffer.shape)}")
        for axis, (e, dim) in enumerate(zip(index, buffer.shape)):
            if self.expr(e, ranges) is not INDEX:
                self.fail(f"{what} %{name}: index {axis} is not i64")
            span = None if GUARDED in ranges else interval(e, ranges)
            if span is not None and (span[0] < 0 or definitely(operator.ge, span[1], dim)):
                self.fail(f"{what} %{name} may go out of bounds: index {axis} ranges over"
                          f" [{span[0]}, {span[1]}], the dim is {dim}")
        return buffer

    def expr(self, e: Expr, ranges) -> DType:
        if isinstance(e, Const):
            return e.dtype
        if isinstance(e, Var):
            if is_size(e):  # a size argument: in scope in the whole kernel
                return INDEX
            if e.name not in ranges or e.name == GUARDED:
                self.fail(f"index variable %{e.name} is used outside its loop")
            return INDEX
        if isinstance(e, Load):
            buffer = self.access(e.buffer, e.index, ranges, "load of")
            if e.dtype is not buffer.dtype:
                self.fail(f"load of %{e.buffer} typed {e.dtype}, the buffer is {buffer.dtype}")
            return e.dtype
        if isinstance(e, Unary):
            if e.op not in UNARY_OPS:
                self.fail(f"unknown unary op '{e.op}'")
            self.expr(e.a, ranges)
            return e.dtype
        if isinstance(e, Binary):
            if e.op not in BINARY_OPS:
                self.fail(f"unknown binary op '{e.op}'")
            a, b = self.expr(e.a, ranges), self.expr(e.b, ranges)
            if a is not b:
                self.fail(f"{e.op} of {a} and {b}: operand dtypes differ")
            return DType.bool if e.op in COMPARISONS else a
        if isinstance(e, Select):
            # A select evaluates only the side it picks (the interpreter's rule; vector code
            # masks the loads): its sides may index out of bounds where not picked.
            cond_ranges, ranges = ranges, {**ranges, GUARDED: None}
            if self.expr(e.cond, cond_ranges) is not DType.bool:
                self.fail("select condition must be bool")
            a, b = self.expr(e.a, ranges), self.expr(e.b, ranges)
            if a is not b:
                self.fail(f"select of {a} and {b}: branch dtypes differ")
            return a
        if isinstance(e, Fma):
            dtypes = {self.expr(x, ranges) for x in (e.a, e.b, e.c)}
            if len(dtypes) != 1 or not e.a.dtype.is_float:
                self.fail(f"fma of {', '.join(str(x.dtype) for x in (e.a, e.b, e.c))}: the"
                          " operands must be floats of one dtype")
            return e.a.dtype
        if isinstance(e, Cast):
            self.expr(e.a, ranges)
            return e.dtype
        if isinstance(e, Bitcast):
            if self.expr(e.a, ranges).itemsize != e.dtype.itemsize:
                self.fail(f"bitcast of {e.a.dtype} to {e.dtype}: the widths differ")
            return e.dtype
        self.fail(f"unknown expression {type(e).__name__}")


def _loop_range(s: For, ranges) -> Interval:
    start, stop = interval(s.start, ranges), interval(s.stop, ranges)
    if start is None or stop is None or start[0] != start[1] or stop[0] != stop[1]:
        return None
    values = range(start[0], stop[0], s.step)
    if not values:
        return (0, -1)  # empty: nothing to check
    # (the ends by index: min() and max() of a range walk it, a second for 10^7 trips)
    return (min(values[0], values[-1]), max(values[0], values[-1]))


def interval(e: Expr, ranges) -> Interval:
    """The inclusive range of an integer expression, when it follows from loop bounds."""
    if isinstance(e, Const) and e.dtype.is_int:
        return (int(e.value), int(e.value))
    if isinstance(e, Var):
        span = ranges.get(e.name)
        return None if span is None or span[0] > span[1] else span
    if not isinstance(e, Binary):
        return None
    a, b = interval(e.a, ranges), interval(e.b, ranges)
    if a is None or b is None:
        return None
    if e.op == "add":
        return (a[0] + b[0], a[1] + b[1])
    if e.op == "sub":
        return (a[0] - b[1], a[1] - b[0])
    if e.op == "mul":
        products = [x * y for x in a for y in b]
        return (min(products), max(products))
    if e.op in ("max", "min"):
        fn = max if e.op == "max" else min
        return (fn(a[0], b[0]), fn(a[1], b[1]))
    if e.op == "floordiv" and b[0] == b[1] and b[0] > 0:
        return (a[0] // b[0], a[1] // b[0])
    if e.op == "mod" and b[0] == b[1] and b[0] > 0:
        return (0, b[0] - 1) if a[1] - a[0] >= b[0] or a[0] // b[0] != a[1] // b[0] else (
            a[0] % b[0], a[1] % b[0])
    return None


# -- locals in parallel loops ----------------------------------------------------------------

Unset = dict[str, str]  # local -> why it holds no value here (for the message)


class _PrivateLocals:
    """Each thread running a parallel (or threads) loop has its own copy of the kernel's locals, so
    no value reaches a parallel loop's body, or leaves it, through a local. The rule: in a
    parallel loop's body, an iteration writes a local before it reads it; after the loop, a
    local that the body wrote holds nothing until it is written again. The check is per
    buffer (a store to any element counts as writing the local) and flow-sensitive: a write
    under an `if` counts after it only if both branches write, a write in a nested loop only
    if the loop runs at least once for every value of the loops around it (its bounds'
    ranges follow from theirs: a blocked nest's tail, `min(197 - 32 * j, 32)` lanes)."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.locals = [b.name for b in kernel.locals]
        self.ranges: dict[str, tuple[int, int]] = {}  # the enclosing loops' variables

    def check(self) -> None:
        if self.locals and any(isinstance(s, For) and s.kind in CONCURRENT_KINDS
                               for s in self.kernel.walk()):
            self.block(self.kernel.body, {})

    def reads(self, e: Expr, unset: Unset) -> None:
        for sub in walk_expr(e):
            if isinstance(sub, Load) and sub.buffer in unset:
                raise VerificationError(f"kernel @{self.kernel.name}: local %{sub.buffer} is"
                                        f" read {unset[sub.buffer]} (locals are private to"
                                        " each thread of a parallel loop)")

    def block(self, stmts: list[Stmt], unset: Unset) -> Unset:
        """Check `stmts` starting with the locals `unset` holding no value; returns the
        locals that may hold none after them."""
        for s in stmts:
            if isinstance(s, Store):
                for e in (*s.index, s.value):
                    self.reads(e, unset)
                unset = {name: why for name, why in unset.items() if name != s.buffer}
            elif isinstance(s, Prefetch):
                for e in s.index:
                    self.reads(e, unset)
            elif isinstance(s, If):
                self.reads(s.cond, unset)
                unset = {**self.block(s.then, unset), **self.block(s.orelse, unset)}
            elif isinstance(s, For):
                self.reads(s.start, unset)
                self.reads(s.stop, unset)
                unset = self.loop(s, unset)
        return unset

    def loop(self, s: For, unset: Unset) -> Unset:
        start, stop = interval(s.start, self.ranges), interval(s.stop, self.ranges)
        outer = self.ranges
        if start is not None and stop is not None and s.step > 0:
            self.ranges = {**outer, s.var.name: (start[0], stop[1] - 1)}
        else:
            self.ranges = {k: v for k, v in outer.items() if k != s.var.name}
        try:
            return self._loop(s, unset, start is not None and stop is not None and
                              s.step > 0 and start[1] < stop[0])
        finally:
            self.ranges = outer

    def _loop(self, s: For, unset: Unset, runs: bool) -> Unset:
        """`loop`, `runs` telling whether the loop runs at least once for every value of
        the loops around it."""
        if s.kind in CONCURRENT_KINDS:
            fresh = f"in {s.kind} loop %{s.var.name} before the iteration writes it"
            self.block(s.body, {name: fresh for name in self.locals})
            gone = f"after {s.kind} loop %{s.var.name} before it is written again"
            written = {st.buffer for st in walk_stmts(s.body) if isinstance(st, Store)}
            return {**unset, **{name: gone for name in self.locals if name in written}}
        # A serial loop: the state at its head is the union over iterations. Writes only
        # remove locals and parallel loops only add them, so two walks reach the fixpoint.
        after_one = self.block(s.body, unset)
        head = {**after_one, **unset}
        if head.keys() != unset.keys():
            after_one = self.block(s.body, head)
        return after_one if runs else {**after_one, **unset}
