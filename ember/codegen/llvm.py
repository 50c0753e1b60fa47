"""Loop IR -> LLVM IR (llvmlite.ir), independent of the target.

A `Kernel` becomes `void @<name>(ptr %<param>, ..., i64 %<size>, ...)`: one pointer per
parameter, each to a row-major buffer whose element strides are `Buffer.strides` (computed
from the size arguments where its dims are sizes known at call time). Locals are allocas
in the entry block (LLVM promotes them), loop counters too; scoped alias metadata tells
LLVM that no parameter points into a local (`mark_local_accesses`). Scalar code comes from
the op tables in `ember.codegen.scalar`; this module emits the structure around it: loops,
ifs, loads, stores.
Parallel loops run on a thread team through libgomp (`ember.codegen.parallel`); unrolled
loops become copies of their body and vectorized loops LLVM vectors (`ember.codegen.vector`),
or serial loops where they cannot.

A `Program` becomes one module: its kernels plus

    void @<program>_entry(ptr inputs, ptr outputs, ptr constants, ptr arena)

where `inputs`, `outputs` and `constants` are arrays of buffer pointers in the order of the
program's buffers of that kind, and `arena` is one block holding every temp buffer at the
byte offset the memory plan gives it. The entry runs the program's steps in order. A
program of every size (`Program.sizes`, docs/loop-ir.md) has two more arguments, `sizes`
(the sizes' values, in order) and `offsets` (each temp's offset, packed per binding by the
runtime); each kernel takes the sizes it reads as i64 arguments after its buffers.

Every buffer pointer must be aligned to its element size (LLVM assumes the ABI alignment of
the element type); aligning to 64 bytes lets later vector code use aligned accesses.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Sequence

from llvmlite import ir

from ember.codegen import CodegenError, scalar
from ember.codegen.parallel import (
    OPENMP_SYMBOLS,
    emit_parallel_for,
    num_threads_symbol,
    thread_count,
)
from ember.codegen.scalar import (
    I32,
    I64,
    PTR,
    cast,
    constant,
    declare,
    from_storage,
    reserved_symbols,
    storage_type,
    to_storage,
)
from ember.codegen.vector import (
    emit_streaming,
    emit_unrolled,
    emit_vectorized,
    streaming_width,
)
from ember.dtypes import DType
from ember.graph.symbolic import DimLike, definitely, is_symbolic
from ember.loops.analysis import copies_onto_itself, flatten_dims
from ember.loops.ir import (
    INDEX,
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
    ProgramStep,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    dim_expr,
    operands,
    row_major_strides,
    size_var,
    walk_expr,
    walk_stmts,
)
from ember.loops.simplify import INT_FOLD
from ember.loops.text import kernel_structure
from ember.loops.verify import interval

VOID = ir.VoidType()
ENTRY_ARGS = ("inputs", "outputs", "constants", "arena")
# The entry of a program compiled for every size (`Program.sizes`) also takes the sizes, and
# the temps' offsets in the arena for them.
SIZED_ENTRY_ARGS = ("sizes", "offsets")
# Locals start on a cache line, as the arena's buffers do: a vector load that straddles two
# lines costs two (a packed B panel read one 64-byte vector per row, 16-byte aligned on the
# stack, ran at 0.87x torch.matmul on Sapphire Rapids; docs/benchmarks.md).
LOCAL_ALIGN = 64


def mark_local_accesses(fn: ir.Function, local_slots: Sequence[ir.AllocaInstr]) -> None:
    """Tell LLVM that `fn`'s accesses to its local buffers (`local_slots`) and those
    through pointers it was given never overlap, with scoped alias metadata (LLVM's
    `!alias.scope` and `!noalias`). LLVM proves it alone only while it can follow every use
    of the alloca: past 100 uses (its capture-tracking limit) a large kernel's local looks
    escaped, so its register tile is stored at every step and the operands reloaded (an
    attention kernel at 200 keys ran at 0.7x the speed it had at 192)."""
    if not local_slots:
        return
    module = fn.module
    domain = module.add_metadata(["ember.locals"])
    scopes = module.add_metadata([module.add_metadata(["ember.local buffers", domain])])
    slots = {id(slot) for slot in local_slots}
    for block in fn.blocks:
        for instr in block.instructions:
            pointer = _accessed_pointer(instr)
            if pointer is None:
                continue
            root = _underlying_object(pointer)
            if id(root) in slots:
                instr.set_metadata("alias.scope", scopes)
            elif isinstance(root, (ir.Argument, ir.LoadInstr, ir.GlobalValue)):
                # A buffer the kernel was given (an argument, or loaded from the tables or
                # the parallel body's data struct): no pointer to a local is ever stored.
                instr.set_metadata("noalias", scopes)


# The pointer (or vector of pointers) operand of LLVM's masked memory intrinsics.
_MASKED_POINTER = {"llvm.masked.load": 0, "llvm.masked.store": 1, "llvm.masked.gather": 0,
                   "llvm.masked.scatter": 1}


def _accessed_pointer(instr: ir.Instruction) -> ir.Value | None:
    """The pointer that `instr` loads or stores through, if it accesses memory."""
    if isinstance(instr, ir.LoadInstr):
        return instr.operands[0]
    if isinstance(instr, ir.StoreInstr):
        return instr.operands[1]
    if isinstance(instr, ir.CallInstr) and isinstance(instr.callee, ir.Function):
        family = ".".join(instr.callee.name.split(".")[:3])
        if family in _MASKED_POINTER:
            return instr.args[_MASKED_POINTER[family]]
    return None


def _underlying_object(pointer: ir.Value) -> ir.Value:
    """The value `pointer` is computed from by offsets and casts (an alloca, an argument,
    a loaded pointer)."""
    while isinstance(pointer, (ir.GEPInstr, ir.CastInstr)):
        pointer = pointer.operands[0]
    return pointer


def entry_name(program_name: str) -> str:
    """The symbol of a program's entry function."""
    return f"{program_name}_entry"


def load_scalar(b: ir.IRBuilder, ptr: ir.Value, t: DType) -> ir.Value:
    return from_storage(b, b.load(ptr, typ=storage_type(t)), t)


def store_scalar(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, t: DType) -> None:
    b.store(to_storage(b, value, t), ptr)


# -- kernels -----------------------------------------------------------------------------------

class KernelEmitter:
    """Emits one kernel's body into its function: a walk over statements and expressions,
    each kind of node handled by the method that the tables at the end of the class name."""

    def __init__(self, fn: ir.Function, kernel: Kernel, locals_: Sequence[Buffer] | None = None,
                 in_parallel: bool = False, sizes: Sequence[str] = ()):
        """`sizes`: the kernel's size arguments, after its buffers (`declare_kernel`)."""
        self.kernel = kernel
        # Allocas go to the entry block, which ends with a branch to the code once it is done.
        self.allocas = ir.IRBuilder(fn.append_basic_block("entry"))
        self.start = fn.append_basic_block("start")
        self.b = ir.IRBuilder(self.start)
        self.buffers: dict[str, tuple[ir.Value, Buffer]] = {}
        self.vars: dict[str, ir.Value] = {}  # loop variable -> the i64 slot holding its value
        if not in_parallel:  # an outlined body gets its parameters from its data struct
            self.buffers.update((p.name, (arg, p)) for arg, p in zip(fn.args, kernel.params))
            for arg, size in zip(fn.args[len(kernel.params):], sizes):
                slot = self.allocas.alloca(I64, name=size)
                self.allocas.store(arg, slot)
                self.vars[size_var(size).name] = slot
        self.local_slots: list[ir.AllocaInstr] = []
        for local in kernel.locals if locals_ is None else locals_:
            slot = self.allocas.alloca(ir.ArrayType(storage_type(local.dtype), local.numel),
                                       name=local.name)
            slot.align = LOCAL_ALIGN
            self.buffers[local.name] = (slot, local)
            self.local_slots.append(slot)
        self.local_names = {local.name for local in kernel.locals}
        self.shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
        self.ranges: dict[str, tuple[int, int]] = {}  # loop variable -> its values, if known
        self.in_parallel = in_parallel  # inside an outlined parallel body: loops run serially
        # Loads of the unrolled copy being emitted -> their vector, from a block that the
        # unrolled loop transposed in registers (vector.transposed_loads).
        self.transposed: dict[Load, ir.Value] = {}
        # The values of the statement being emitted, by expression and the block that
        # computed them: an expression that appears twice in it (sigmoid's exp(-|x|)) is
        # computed once. A statement's expressions read memory before it writes any.
        self.values: dict[tuple[Expr, ir.Block], ir.Value] = {}
        # Loop variable -> its value in the unrolled copy being emitted: index arithmetic
        # on it folds here, rather than as instructions for LLVM to fold in every copy.
        self.known: dict[str, int] = {}

    def nested(self, fn: ir.Function, private: Sequence[Buffer]) -> KernelEmitter:
        """An emitter for `fn`, the outlined body of a parallel loop of this kernel, with its
        own copies of the locals `private`; the caller binds parameters and variables."""
        emitter = KernelEmitter(fn, self.kernel, private, in_parallel=True)
        emitter.ranges = dict(self.ranges)
        return emitter

    def error(self, message: str) -> CodegenError:
        return CodegenError(f"kernel @{self.kernel.name}: {message}")

    def emit(self) -> None:
        self.stmts(self.kernel.body)
        self.finish()

    def finish(self) -> None:
        self.b.ret_void()
        self.allocas.branch(self.start)
        mark_local_accesses(self.b.function, self.local_slots)

    # -- statements
    def stmts(self, stmts: Sequence[Stmt]) -> None:
        for s in stmts:
            self.values.clear()
            self.STMT[type(s)](self, s)

    def store(self, s: Store) -> None:
        ptr, buf = self.element_ptr(s.buffer, s.index)
        if s.value.dtype is not buf.dtype:
            raise self.error(f"storing a {s.value.dtype} value into %{s.buffer}: {buf.dtype}")
        value = self.expr(s.value)
        if self._accumulates(s) and isinstance(value, ir.Instruction) and \
                value.opname in ("fadd", "fmul"):
            # A float sum or product accumulated in a scalar local may be reassociated, so
            # that LLVM vectorizes the reduction (several partial sums, combined at the end).
            # The order changes the rounding, by as much as NumPy's pairwise sums differ
            # from a sequential loop; the tests' tolerances allow it.
            value.flags.extend(f for f in ("reassoc", "contract") if f not in value.flags)
        store_scalar(self.b, value, ptr, buf.dtype)

    def prefetch(self, s: Prefetch) -> None:
        """`llvm.prefetch` for reading, into L2 and closer (x86: prefetcht1): the lines a
        schedule prefetches are read a while later, not next."""
        ptr, _ = self.element_ptr(s.buffer, s.index)
        args = [ptr, *(ir.Constant(I32, x) for x in (0, 2, 1))]  # read, L2, data cache
        self.b.call(declare(self.b, "llvm.prefetch.p0", ir.VoidType(), [a.type for a in args]),
                    args)

    def _accumulates(self, s: Store) -> bool:
        """Whether `s` is `%acc[] = op(%acc[], term)` on a scalar local."""
        value = s.value
        return (s.buffer in self.local_names and not s.index and isinstance(value, Binary)
                and value.op in ("add", "mul") and value.dtype.is_float
                and isinstance(value.a, Load) and value.a.buffer == s.buffer)

    def for_(self, s: For) -> None:
        if s.step == 0:
            raise self.error(f"loop %{s.var.name} has step 0")
        span, outer = _values(s, self.ranges), self.ranges.pop(s.var.name, None)
        if span is not None:
            self.ranges[s.var.name] = span
        try:
            self.loop_of_kind(s)
        finally:
            self.ranges.pop(s.var.name, None)
            if outer is not None:
                self.ranges[s.var.name] = outer

    def loop_of_kind(self, s: For) -> None:
        if s.kind == "parallel" and not self.in_parallel:
            emit_parallel_for(self, s)
            return
        if s.kind == "unrolled" and emit_unrolled(self, s):
            return
        if s.kind == "vectorized":
            emit_vectorized(self, s)
            return
        # Otherwise (or when unrolling cannot apply): a serial loop.
        self.loop(s, self.index(s.start), self.index(s.stop))  # bounds evaluated once

    def loop(self, s: For, start: ir.Value, stop: ir.Value) -> None:
        """`s`'s body run serially for its variable from `start` while it has not reached
        `stop` (i64 values), by its step; a large elementwise loop with streaming stores
        (`ember.codegen.vector.streaming_width`)."""
        width = streaming_width(self, s)
        if width and emit_streaming(self, s, width, start, stop):
            return
        self.serial_loop(s, start, stop)

    def serial_loop(self, s: For, start: ir.Value, stop: ir.Value) -> None:
        """`s`'s body run serially for its variable from `start` while it has not reached
        `stop`, by its step."""
        b = self.b
        counter = self.allocas.alloca(I64, name=s.var.name)
        b.store(start, counter)
        with self.binding(s.var.name, counter):
            emit_while(b, counter, lambda i: b.icmp_signed("<" if s.step > 0 else ">", i, stop),
                       lambda: self.stmts(s.body), s.step, s.var.name)

    @contextlib.contextmanager
    def binding(self, name: str, slot: ir.Value):
        """Loop variable `name` read from `slot` inside the block (an outer binding of the
        name comes back after it)."""
        outer = self.vars.get(name)
        self.vars[name] = slot
        try:
            yield
        finally:
            if outer is None:
                del self.vars[name]
            else:
                self.vars[name] = outer

    def if_(self, s: If) -> None:
        emit_if(self.b, self.condition(s.cond), s, self.stmts)

    STMT = {Store: store, For: for_, If: if_, Prefetch: prefetch}

    # -- expressions
    def expr(self, e: Expr) -> ir.Value:
        key = (e, self.b.block)
        value = self.values.get(key)
        if value is None:
            value = self.values[key] = self.EXPR[type(e)](self, e)
        return value

    def index(self, e: Expr) -> ir.Value:
        """An index expression as i64."""
        value = self.expr(e)
        if e.dtype is INDEX:
            return value
        if e.dtype.is_float:
            raise self.error(f"a {e.dtype} expression used as an index")
        return cast(self.b, value, e.dtype, INDEX)

    def condition(self, e: Expr) -> ir.Value:
        if e.dtype is not DType.bool:
            raise self.error(f"a condition must be bool, not {e.dtype}")
        return self.expr(e)

    def element_ptr(self, name: str, index: Sequence[Expr]) -> tuple[ir.Value, Buffer]:
        if name not in self.buffers:
            raise self.error(f"unknown buffer %{name}")
        base, buf = self.buffers[name]
        if len(index) != len(buf.shape):
            raise self.error(f"%{name} has rank {len(buf.shape)}, indexed with {len(index)}")
        b = self.b
        offset = None
        # Dimensions split by a flat position are addressed by that position: a weight
        # read at (k // 9, k // 3 % 3, k % 3) costs one multiply, not four divisions.
        index, shape = flatten_dims(index, buf.shape)
        for i, stride in zip(index, row_major_strides(shape)):
            term = self.index(i)
            if stride != 1:
                term = index_op(b, "mul", term, self.stride(stride))
            offset = term if offset is None else index_op(b, "add", offset, term)
        if name in self.local_names:  # llvmlite's alloca is a typed pointer to an array
            offset = ir.Constant(I64, 0) if offset is None else offset
            return b.gep(base, [ir.Constant(I64, 0), offset], inbounds=True), buf
        if offset is None:
            return base, buf
        return b.gep(base, [offset], inbounds=True, source_etype=storage_type(buf.dtype)), buf

    def stride(self, stride: DimLike) -> ir.Value:
        """An element stride as i64: a constant, or computed from the size arguments."""
        return self.index(dim_expr(stride)) if is_symbolic(stride) else \
            ir.Constant(I64, stride)

    def const(self, e: Const) -> ir.Value:
        return constant(e.value, e.dtype)

    def var(self, e: Var) -> ir.Value:
        if e.name in self.known:
            return ir.Constant(I64, self.known[e.name])
        if e.name not in self.vars:
            raise self.error(f"index variable %{e.name} is used outside its loop")
        return self.b.load(self.vars[e.name], typ=I64)

    def load(self, e: Load) -> ir.Value:
        ptr, buf = self.element_ptr(e.buffer, e.index)
        if e.dtype is not buf.dtype:
            raise self.error(f"loading %{e.buffer}: {buf.dtype} as {e.dtype}")
        return load_scalar(self.b, ptr, buf.dtype)

    def select(self, e: Select) -> ir.Value:
        """select(c, a, b) evaluates only the side it picks (the interpreter's rule, and what
        the verifier allows): when a load on either side may fall outside its buffer, the
        sides are branched around; when every load is in bounds by the loop ranges, both
        are computed for one `select` instruction."""
        loads = [x for side in (e.a, e.b) for x in walk_expr(side) if isinstance(x, Load)]
        if all(self.in_bounds(x) for x in loads) or e.cond.dtype is not DType.bool or \
                e.a.dtype is not e.b.dtype:
            return self.operation(e)  # (which reports the ill-typed)
        cond = self.expr(e.cond)
        b = self.b
        with b.if_else(cond) as (then, otherwise):
            with then:
                picked, picked_block = self.expr(e.a), b.block
            with otherwise:
                other, other_block = self.expr(e.b), b.block
        phi = b.phi(picked.type)
        phi.add_incoming(picked, picked_block)
        phi.add_incoming(other, other_block)
        return phi

    def in_bounds(self, e: Load) -> bool:
        """Whether every index of `e` lies in its buffer for all values of the loop
        variables (as far as their ranges are known here)."""
        if e.buffer not in self.buffers:
            return False
        shape = self.buffers[e.buffer][1].shape
        for i, dim in zip(e.index, shape):
            span = interval(i, self.ranges)
            if span is None or span[0] < 0 or not definitely(operator.lt, span[1], dim):
                return False
        return True

    def operation(self, e: Unary | Binary | Select | Fma | Cast | Bitcast) -> ir.Value:
        return self.expr_of(e, [self.expr(x) for x in operands(e)])

    def expr_of(self, e: Expr, xs: list[ir.Value]) -> ir.Value:
        """The code of `e`'s own operation on its operands' values `xs` (in the order of
        `operands(e)`), computed by the caller: scalars here, single lanes for vector code."""
        b = self.b
        if isinstance(e, Binary) and e.a.dtype is INDEX and \
                (folded := fold_index(e.op, *xs)) is not None:
            return folded
        if isinstance(e, Select) and isinstance(xs[0], ir.Constant):
            return xs[1] if xs[0].constant else xs[2]
        if isinstance(e, Unary):
            return self.op(scalar.unary, e.op, e.a.dtype, *xs)
        if isinstance(e, Binary):
            if e.a.dtype is not e.b.dtype:
                raise self.error(f"{e.op} of {e.a.dtype} and {e.b.dtype}")
            return self.op(scalar.binary, e.op, e.a.dtype, *xs)
        if isinstance(e, Select):
            if e.cond.dtype is not DType.bool:
                raise self.error(f"a condition must be bool, not {e.cond.dtype}")
            if e.a.dtype is not e.b.dtype:
                raise self.error(f"select between {e.a.dtype} and {e.b.dtype}")
            return b.select(*xs)
        if isinstance(e, Fma):
            if len({x.dtype for x in (e.a, e.b, e.c)}) != 1 or not e.a.dtype.is_float:
                raise self.error("fma needs float operands of one dtype")
            return scalar.call_intrinsic(b, "llvm.fmuladd", *xs)
        if isinstance(e, Cast):
            return cast(b, xs[0], e.a.dtype, e.dtype)
        if isinstance(e, Bitcast):
            # Through the storage form: the bits in memory, not the widened register value.
            raw = to_storage(b, xs[0], e.a.dtype)
            target = storage_type(e.dtype)
            if raw.type != target:
                raw = b.bitcast(raw, target)
            return from_storage(b, raw, e.dtype)
        raise self.error(f"unknown expression {type(e).__name__}")

    def op(self, emit, op: str, t: DType, *xs: ir.Value) -> ir.Value:
        try:
            return emit(self.b, op, t, *xs)
        except CodegenError as error:
            raise self.error(str(error)) from None

    EXPR = {Const: const, Var: var, Load: load, Unary: operation, Binary: operation,
            Select: select, Fma: operation, Cast: operation, Bitcast: operation}


def fold_index(op: str, a: ir.Value, b: ir.Value) -> ir.Value | None:
    """Index arithmetic `op(a, b)` (i64) as a value without an instruction, where it is
    one: on two constants, or an identity (x + 0, x * 1, x * 0); else None."""
    x, y = (v.constant if isinstance(v, ir.Constant) and type(v.constant) is int else None
            for v in (a, b))
    if x is not None and y is not None and op in INT_FOLD:
        value = INT_FOLD[op](x, y)
        return None if value is None else \
            constant(value, DType.bool if isinstance(value, bool) else INDEX)
    if (op in ("add", "sub") and y == 0) or (op in ("mul", "floordiv") and y == 1):
        return a
    if (op == "add" and x == 0) or (op == "mul" and x == 1):
        return b
    if op == "mul" and 0 in (x, y):
        return ir.Constant(I64, 0)
    return None


def index_op(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """`op(x, y)` on i64 indices ("add" or "mul"): folded where `fold_index` can."""
    folded = fold_index(op, x, y)
    if folded is not None:
        return folded
    return b.add(x, y) if op == "add" else b.mul(x, y)


def emit_while(b: ir.IRBuilder, counter: ir.Value, more: Callable[[ir.Value], ir.Value],
               body: Callable[[], None], step: int, name: str) -> None:
    """while more(*counter) { body(); *counter += step }, at the builder's position (the
    counter an i64 slot the caller set); shared by serial and streaming loops."""
    header = b.append_basic_block(f"{name}.header")
    block = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(header)
    b.position_at_end(header)
    b.cbranch(more(b.load(counter, typ=I64)), block, done)
    b.position_at_end(block)
    body()
    b.store(b.add(b.load(counter, typ=I64), ir.Constant(I64, step)), counter)
    b.branch(header)
    b.position_at_end(done)


def _values(s: For, ranges: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    """The range of `s`'s variable, from the ranges of its bounds (a hull: all it takes)."""
    start, stop = interval(s.start, ranges), interval(s.stop, ranges)
    if start is None or stop is None:
        return None
    return (start[0], stop[1] - 1) if s.step > 0 else (stop[0] + 1, start[1])


def emit_if(b: ir.IRBuilder, cond: ir.Value, s: If,
            stmts: Callable[[Sequence[Stmt]], None]) -> None:
    """`s`'s branches under `cond`, each emitted by `stmts` (no else block when it has none);
    shared by the scalar and the vector emitters."""
    if not s.orelse:
        with b.if_then(cond):
            stmts(s.then)
        return
    with b.if_else(cond) as (then, orelse):
        with then:
            stmts(s.then)
        with orelse:
            stmts(s.orelse)


def declare_kernel(module: ir.Module, kernel: Kernel, sizes: Sequence[str] = ()
                   ) -> ir.Function:
    """`void @name(ptr %buffer..., i64 %size...)`: a pointer per parameter, then `sizes`,
    those known only at call time that the kernel reads (`Kernel.sizes`)."""
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR] * len(kernel.params)
                                             + [I64] * len(sizes)), kernel.name)
    fn.attributes.add("nounwind")
    for arg, name in zip(fn.args, [p.name for p in kernel.params] + list(sizes)):
        arg.name = name
    return fn


def _check_names(names: list[str], module: str, entry: str | None = None) -> None:
    reserved = reserved_symbols() | {*OPENMP_SYMBOLS, num_threads_symbol(module)}
    seen: set[str] = set()
    for name in names:
        if name in reserved or name.startswith("llvm.") or name == entry:
            raise CodegenError(f"kernel name @{name} is reserved for a function or global"
                               " that generated code uses")
        if name in seen:
            raise CodegenError(f"two kernels are named @{name}")
        seen.add(name)


def _add_kernels(module: ir.Module, kernels: Sequence[Kernel],
                 structures: Sequence[str] | None = None, declared: Sequence[Kernel] = (),
                 every_size: bool = True
                 ) -> tuple[dict[str, ir.Function], dict[str, tuple[str, ...]]]:
    """Each kernel's function. Kernels that differ only in name and origin (a model's
    repeated blocks: ResNet-50's 55 kernels are 30 distinct ones) are emitted once; each
    copy is a call of the first, so LLVM optimizes and codegens each body once. `declared`
    kernels are only declared: another module defines them. Also each kernel's size
    arguments (none looked for unless `every_size`: a program of numbers has none)."""
    structures = structures or [kernel_structure(k) for k in kernels]
    sizes = {k.name: k.sizes if every_size else () for k in (*kernels, *declared)}
    functions = {k.name: declare_kernel(module, k, sizes[k.name])
                 for k in (*kernels, *declared)}
    first: dict[str, ir.Function] = {}
    for k, structure in zip(kernels, structures):
        body = first.setdefault(structure, functions[k.name])
        if body is functions[k.name]:
            KernelEmitter(body, k, sizes=sizes[k.name]).emit()
        else:
            body.attributes.add("noinline")  # one body, not one per copy
            b = ir.IRBuilder(functions[k.name].append_basic_block("entry"))
            b.call(body, functions[k.name].args)
            b.ret_void()
    return functions, sizes


def kernel_module(kernels: Sequence[Kernel], name: str = "kernels") -> ir.Module:
    """A module holding just `kernels` (for tests, the tuner and single-kernel benchmarks)."""
    _check_names([k.name for k in kernels], name)
    module = ir.Module(name=name)
    _add_kernels(module, kernels)
    return module


# -- programs ------------------------------------------------------------------------------------

class EntryEmitter:
    """Emits a program's entry function: buffer pointers first, then the steps in order.
    It returns 0, or as soon as a call sets the status word (a failed check), the word
    with the call's number among those that pass it (`Program.status_calls`) above it:
    `number << 8 | word`."""

    def __init__(self, module: ir.Module, program: Program, plan: dict[str, int],
                 functions: dict[str, ir.Function], kernel_sizes: dict[str, tuple[str, ...]]):
        """`kernel_sizes`: each kernel's size arguments (`_add_kernels`)."""
        self.program, self.functions, self.kernel_sizes = program, functions, kernel_sizes
        self.offsets = {} if program.sizes else plan  # (a plan of every size: per binding)
        symbols = program.sizes
        names = ENTRY_ARGS + SIZED_ENTRY_ARGS if symbols else ENTRY_ARGS
        fn = ir.Function(module, ir.FunctionType(I32, [PTR] * len(names)),
                         entry_name(program.name))
        fn.attributes.add("nounwind")
        for arg, arg_name in zip(fn.args, names):
            arg.name = arg_name
        tables = dict(zip(names, fn.args))
        self.b = b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.ptrs: dict[str, ir.Value] = {}
        for kind in ("input", "output", "constant"):
            for i, buf in enumerate(program.of_kind(kind)):
                slot = b.gep(tables[kind + "s"], [ir.Constant(I64, i)], inbounds=True,
                             source_etype=PTR)
                self.ptrs[buf.name] = b.load(slot, typ=PTR, name=buf.name)
        # Sizes known only at call time come in a table, in `Program.sizes` order; so do the
        # temps' offsets in the arena, which the runtime plans per binding of the sizes.
        self.sizes = {name: b.load(b.gep(tables["sizes"], [ir.Constant(I64, i)],
                                         inbounds=True, source_etype=I64), typ=I64, name=name)
                      for i, name in enumerate(symbols)}
        for i, buf in enumerate(program.of_kind("temp")):
            if symbols:
                offset = b.load(b.gep(tables["offsets"], [ir.Constant(I64, i)], inbounds=True,
                                      source_etype=I64), typ=I64)
            elif buf.name not in plan:
                raise self.error(f"the memory plan has no offset for temp %{buf.name}")
            else:
                offset = ir.Constant(I64, plan[buf.name])
            self.ptrs[buf.name] = b.gep(tables["arena"], [offset], inbounds=True,
                                        source_etype=scalar.I8, name=buf.name)
        self.status_calls = 0
        for buf in program.of_kind("status"):  # (one: the verifier checks)
            self.status = self.ptrs[buf.name] = b.alloca(I32, name=buf.name)
            b.store(ir.Constant(I32, 0), self.status)

    def error(self, message: str) -> CodegenError:
        return CodegenError(f"program @{self.program.name}: {message}")

    def emit(self) -> None:
        self.steps(self.program.steps)
        self.b.ret(ir.Constant(I32, 0))

    def steps(self, steps: Sequence[ProgramStep]) -> None:
        for s in steps:
            self.STEP[type(s)](self, s)

    def buffer(self, name: str) -> tuple[ir.Value, Buffer]:
        if name not in self.ptrs:
            raise self.error(f"unknown buffer %{name}")
        return self.ptrs[name], self.program.buffer(name).buffer

    def scalar(self, name: str) -> tuple[ir.Value, DType]:
        """Pointer and dtype of a one-element buffer (a condition, counter or trip count)."""
        ptr, buf = self.buffer(name)
        if buf.numel != 1:
            raise self.error(f"%{name} must hold one element, it has shape {list(buf.shape)}")
        return ptr, buf.dtype

    def flag(self, name: str) -> ir.Value:
        ptr, dtype = self.scalar(name)
        if dtype is not DType.bool:
            raise self.error(f"condition %{name} must be bool, not {dtype}")
        return load_scalar(self.b, ptr, dtype)

    def call(self, s: Call) -> None:
        fn = self.functions.get(s.kernel)
        if fn is None:
            raise self.error(f"call of unknown kernel @{s.kernel}")
        if copies_onto_itself(self.program, s, self.offsets):
            return  # (a reshape whose result the memory plan put in its input's place)
        params = self.program.kernel(s.kernel).params
        if len(s.args) != len(params):
            raise self.error(f"@{s.kernel} takes {len(params)} buffers, given {len(s.args)}")
        args = []
        for name, param in zip(s.args, params):
            ptr, buf = self.buffer(name)
            if buf.dtype is not param.dtype or buf.numel != param.numel:
                raise self.error(f"@{s.kernel} parameter %{param.name}:"
                                 f" {param.dtype}{list(param.shape)} given %{name}:"
                                 f" {buf.dtype}{list(buf.shape)}")
            args.append(ptr)
        self.b.call(fn, args + [self.sizes[name] for name in self.kernel_sizes[s.kernel]])
        if any(self.program.buffer(name).kind == "status" for name in s.args):
            b, number = self.b, self.status_calls
            self.status_calls += 1
            word = b.load(self.status, typ=I32)
            failed, passed = b.append_basic_block("failed"), b.append_basic_block("passed")
            b.cbranch(b.icmp_signed("!=", word, ir.Constant(I32, 0)), failed, passed)
            b.position_at_end(failed)
            b.ret(b.or_(word, ir.Constant(I32, number << 8)))
            b.position_at_end(passed)

    def if_(self, s: ProgramIf) -> None:
        with self.b.if_else(self.flag(s.cond)) as (then, orelse):
            with then:
                self.steps(s.then)
            with orelse:
                self.steps(s.orelse)

    def loop(self, s: ProgramLoop) -> None:
        b = self.b
        counter, counter_type = self.scalar(s.counter)
        trip, trip_type = self.scalar(s.trip_count)
        for name, t in ((s.counter, counter_type), (s.trip_count, trip_type)):
            if not t.is_int:
                raise self.error(f"loop %{name} must be an integer, not {t}")
        store_scalar(b, constant(0, counter_type), counter, counter_type)
        header = b.append_basic_block("loop.header")
        body = b.append_basic_block("loop.body")
        done = b.append_basic_block("loop.done")
        b.branch(header)
        b.position_at_end(header)
        count = cast(b, load_scalar(b, counter, counter_type), counter_type, INDEX)
        limit = cast(b, load_scalar(b, trip, trip_type), trip_type, INDEX)
        b.cbranch(b.and_(b.icmp_signed("<", count, limit), self.flag(s.cond)), body, done)
        b.position_at_end(body)
        self.steps(s.body)
        count = load_scalar(b, counter, counter_type)
        store_scalar(b, b.add(count, constant(1, counter_type)), counter, counter_type)
        b.branch(header)
        b.position_at_end(done)

    STEP = {Call: call, ProgramIf: if_, ProgramLoop: loop}


def program_module(program: Program, plan: dict[str, int]) -> ir.Module:
    """One module for `program`: its kernels and its entry function. `plan` maps each temp
    buffer to its byte offset in the arena."""
    return next(program_modules(program, plan, 1))


def program_modules(program: Program, plan: dict[str, int], shards: int) -> Iterator[ir.Module]:
    """`program` as up to `shards` modules that together define it, built one at a time so
    that LLVM can compile the first while Python builds the next (`cpu.compile_objects`).

    Identical kernels stay together (a copy calls its first). The groups are dealt to the
    shards by size, largest first, each to the lightest shard. The first module holds the
    entry, which declares the kernels that others define, and the thread-count global,
    which the others declare; every module is named after the program, so they agree on
    that global's name."""
    _check_names([k.name for k in program.kernels], program.name, entry_name(program.name))
    structures = [kernel_structure(k) for k in program.kernels]
    groups: dict[str, list[int]] = {}
    for i, structure in enumerate(structures):
        groups.setdefault(structure, []).append(i)
    loads = [0] * max(1, min(shards, len(groups)))
    members: list[list[int]] = [[] for _ in loads]
    for structure, indices in sorted(groups.items(), key=lambda g: -len(g[0])):
        lightest = loads.index(min(loads))
        loads[lightest] += len(structure)
        members[lightest] += indices
    every_size = bool(program.sizes)
    threaded = any(isinstance(s, For) and s.kind == "parallel"
                   for k in program.kernels for s in walk_stmts(k.body))
    for shard, indices in enumerate(members):
        indices.sort()
        module = ir.Module(name=program.name)
        mine = [program.kernels[i] for i in indices]
        defined = set(indices)
        others = [k for i, k in enumerate(program.kernels) if i not in defined] \
            if shard == 0 else []
        functions, sizes = _add_kernels(module, mine, [structures[i] for i in indices],
                                        others, every_size)
        if shard == 0:
            EntryEmitter(module, program, plan, functions, sizes).emit()
            if threaded:
                thread_count(module)
        else:
            count = module.globals.get(num_threads_symbol(program.name))
            if count is not None:
                count.initializer = None  # defined by the first module
        yield module
