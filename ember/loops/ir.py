"""Level 2, the loop IR: buffers, loop nests, loads, stores and scalar expressions.

A `Kernel` is a function over buffers (its parameters, plus local scratch buffers) whose
body is a list of statements: `For` loops with a kind (serial, parallel, vectorized,
unrolled, threads), `Store`s of scalar expressions into buffers, and `If`s. Expressions are
immutable and hashable: constants, index variables, loads, unary and binary operations,
`select`, `fma` and casts. Index arithmetic is i64.

A `Program` strings kernels together: its buffers are the inputs, outputs, constants and
temporaries of a compiled graph, and its steps call kernels on them (with structured `if`
and `loop` steps for graph control flow).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ember.dtypes import DType
from ember.graph.symbolic import Dim, DimLike, dim_max, dim_min, floor_div, modulo, symbol

INDEX = DType.i64

# -- expressions ---------------------------------------------------------------------------

# Unary ops and the dtypes they produce ("same" = the operand's). lgamma and erfc are the
# graph special ops of those names: computed in f64, then rounded.
UNARY_OPS = {
    "neg", "abs", "not", "bitwise_not", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "erf", "erfc", "lgamma", "floor", "ceil", "round", "trunc", "sign", "isnan",
    "isinf",
}
PREDICATE_UNARY = {"isnan", "isinf"}
BINARY_OPS = {
    "add", "sub", "mul", "div", "floordiv", "mod", "fmod", "pow", "max", "min",
    "and", "or", "xor", "bitwise_and", "bitwise_or", "bitwise_xor", "shl", "shr",
    "eq", "ne", "lt", "le", "gt", "ge",
}
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}


class Expr:
    """A scalar expression. Subclasses are frozen dataclasses, so equal trees are equal."""

    __slots__ = ()
    dtype: DType

    def __add__(self, other: ExprLike) -> Expr:
        return binary("add", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return binary("add", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return binary("sub", self, other)

    def __mul__(self, other: ExprLike) -> Expr:
        return binary("mul", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return binary("mul", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return binary("floordiv", self, other)

    def __mod__(self, other: ExprLike) -> Expr:
        return binary("mod", self, other)


ExprLike = Expr | int  # (or a graph Dim: a size expression)


@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: int | float | bool
    dtype: DType = INDEX

    def __post_init__(self):
        if isinstance(self.value, Dim):  # a lowering that needs a number got a call-time size
            int(self.value)  # raises SymbolicShapeError


@dataclass(frozen=True, slots=True)
class Var(Expr):
    """A loop or index variable (i64)."""

    name: str

    @property
    def dtype(self) -> DType:
        return INDEX


@dataclass(frozen=True, slots=True)
class Load(Expr):
    buffer: str
    index: tuple[Expr, ...]
    dtype: DType


@dataclass(frozen=True, slots=True)
class Unary(Expr):
    op: str
    a: Expr

    @property
    def dtype(self) -> DType:
        return DType.bool if self.op in PREDICATE_UNARY else self.a.dtype


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> DType:
        return DType.bool if self.op in COMPARISONS else self.a.dtype


@dataclass(frozen=True, slots=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> DType:
        return self.a.dtype


@dataclass(frozen=True, slots=True)
class Fma(Expr):
    """a * b + c on floats, rounded once or twice: whichever the target does faster (LLVM's
    `llvm.fmuladd`). Contraction schedules use it for their multiply-accumulate."""

    a: Expr
    b: Expr
    c: Expr

    @property
    def dtype(self) -> DType:
        return self.a.dtype


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    dtype: DType
    a: Expr


@dataclass(frozen=True, slots=True)
class Bitcast(Expr):
    """The bits of `a` read as `dtype`, a type of the same width (to bool: bits != 0)."""

    dtype: DType
    a: Expr


# A size known at call time (a symbolic dim of the graph, `?b`) is a variable of the kernels
# that read it, named with the dim's `?` (loop variables never are): code generation makes
# it an argument of the kernel, and the runtime binds it from each call's shapes.
SIZE_PREFIX = "?"


def size_var(symbol: str) -> Var:
    """The variable holding the size `symbol` at run time."""
    return Var(SIZE_PREFIX + symbol)


def is_size(v: Var) -> bool:
    return v.name.startswith(SIZE_PREFIX)


def dim_expr(d: DimLike) -> Expr:
    """A graph dim (int or Dim) as an i64 expression of the size variables."""
    if not isinstance(d, Dim):
        return Const(int(d), INDEX)
    total: Expr | None = None
    for monomial, coefficient in d.terms:
        term: Expr = Const(coefficient, INDEX)
        for atom in monomial:
            term = binary("mul", term, _atom_expr(atom))
        total = term if total is None else binary("add", total, term)
    return total if total is not None else Const(0, INDEX)


_ATOM_OPS = {"div": "floordiv", "mod": "mod", "min": "min", "max": "max"}


def _atom_expr(atom) -> Expr:
    if isinstance(atom, str):
        return size_var(atom)
    op, a, b = atom
    return binary(_ATOM_OPS[op], dim_expr(a), dim_expr(b))


_DIM_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


def expr_dim(e: Expr) -> DimLike | None:
    """An i64 expression of constants and size variables as a graph dim (the inverse of
    `dim_expr`), or None when it reads anything else (loop variables, memory)."""
    if isinstance(e, Const) and e.dtype is INDEX:
        return int(e.value)
    if isinstance(e, Var):
        return symbol(e.name[len(SIZE_PREFIX):]) if is_size(e) else None
    if not isinstance(e, Binary) or e.dtype is not INDEX:
        return None
    a, b = expr_dim(e.a), expr_dim(e.b)
    if a is None or b is None:
        return None
    ops = {**_DIM_OPS, "floordiv": floor_div, "mod": modulo, "min": dim_min, "max": dim_max}
    return ops[e.op](a, b) if e.op in ops else None


def sizes_in_shape(shape: Sequence[DimLike]) -> frozenset[str]:
    """The size symbols that a shape reads."""
    names: set[str] = set()
    for d in shape:
        if isinstance(d, Dim):
            names |= d.symbols
    return frozenset(names)


def as_expr(x: ExprLike) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, Dim):
        return dim_expr(x)
    if isinstance(x, (bool, np.bool_)):
        return Const(bool(x), DType.bool)
    if isinstance(x, (int, np.integer)):
        return Const(int(x), INDEX)
    raise TypeError(f"cannot use {x!r} as a loop IR expression")


def binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    from ember.loops.simplify import simplify_binary

    return simplify_binary(op, as_expr(a), as_expr(b))


def const(value: int | float | bool, dtype: DType) -> Const:
    """A constant of `dtype`, its value normalized to the Python type that holds it."""
    if dtype is DType.bool:
        return Const(bool(value), dtype)
    if dtype.is_int:
        return Const(int(value), dtype)
    return Const(float(value), dtype)


# -- statements ----------------------------------------------------------------------------

LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled", "threads")
# Loops whose iterations run at once, each with its own copy of the kernel's locals: a CPU
# thread team's share (`parallel`), or one GPU thread per iteration (`threads`, a top-level
# loop of a kernel scheduled for the GPU; elsewhere it runs as a serial loop).
CONCURRENT_KINDS = ("parallel", "threads")


class Stmt:
    __slots__ = ()


@dataclass(slots=True)
class For(Stmt):
    var: Var
    start: Expr
    stop: Expr
    body: list[Stmt]
    step: int = 1
    kind: str = "serial"


@dataclass(slots=True)
class Store(Stmt):
    buffer: str
    index: tuple[Expr, ...]
    value: Expr


@dataclass(slots=True)
class Prefetch(Stmt):
    """A hint to bring the cache line that holds buffer[index] closer before it is read (a
    packed weight panel that the next tiles of a matmul read from memory): no effect on
    any value. LLVM's `llvm.prefetch` on the CPU; nothing where there is none. The index
    must be in bounds, as a load's."""

    buffer: str
    index: tuple[Expr, ...]


@dataclass(slots=True)
class If(Stmt):
    cond: Expr
    then: list[Stmt]
    orelse: list[Stmt] = field(default_factory=list)


# -- kernels and programs -------------------------------------------------------------------

def row_major_strides(shape: Sequence[DimLike]) -> tuple[DimLike, ...]:
    """Element strides of a row-major array of `shape` (dims of sizes known at call time
    give strides that are expressions of them)."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


@dataclass(frozen=True, slots=True)
class Buffer:
    """A row-major tensor in memory: a kernel parameter, a local, or a program buffer. Its
    dims are numbers, or sizes known at call time (graph `Dim`s) in a program compiled for
    every size; then so are its strides, numel and nbytes."""

    name: str
    dtype: DType
    shape: tuple[DimLike, ...]

    @property
    def strides(self) -> tuple[DimLike, ...]:
        """Element strides of the row-major layout."""
        return row_major_strides(self.shape)

    @property
    def numel(self) -> DimLike:
        if any(isinstance(d, Dim) for d in self.shape):
            return math.prod(self.shape)
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> DimLike:
        return self.numel * self.dtype.itemsize

    @property
    def sizes(self) -> frozenset[str]:
        """The size symbols its shape reads."""
        return sizes_in_shape(self.shape)


@dataclass(slots=True)
class Kernel:
    name: str
    params: list[Buffer]
    body: list[Stmt]
    locals: list[Buffer] = field(default_factory=list)
    origin: str = ""  # the graph op(s) this kernel computes, for explain and messages

    def buffer(self, name: str) -> Buffer:
        for b in (*self.params, *self.locals):
            if b.name == name:
                return b
        raise KeyError(name)

    def walk(self) -> Iterator[Stmt]:
        yield from walk_stmts(self.body)

    @property
    def sizes(self) -> tuple[str, ...]:
        """The size symbols the kernel reads (its buffers' shapes and its expressions), in
        order: the size arguments that follow its buffers."""
        names = set().union(*(b.sizes for b in (*self.params, *self.locals)))
        for s in self.walk():
            for e in stmt_exprs(s):
                names |= {x.name[len(SIZE_PREFIX):] for x in walk_expr(e)
                          if isinstance(x, Var) and is_size(x)}
        return tuple(sorted(names))


def shared_code(kernel: Kernel) -> tuple[int, int, int]:
    """Equal for the copies of one kernel that share its lists (`schedule_program` gives a
    repeated block's kernels one scheduled body): what is checked or measured once for
    all of them. The copies live in the program, so their ids name no other."""
    return id(kernel.params), id(kernel.body), id(kernel.locals)


def walk_stmts(stmts: Sequence[Stmt]) -> Iterator[Stmt]:
    for s in stmts:
        yield s
        if isinstance(s, For):
            yield from walk_stmts(s.body)
        elif isinstance(s, If):
            yield from walk_stmts(s.then)
            yield from walk_stmts(s.orelse)


def operands(e: Expr) -> list[Expr]:
    """The operands of an operation, in order (none for constants, variables and loads: a
    load's index is not an operand)."""
    if isinstance(e, (Unary, Cast, Bitcast)):
        return [e.a]
    if isinstance(e, Binary):
        return [e.a, e.b]
    if isinstance(e, Select):
        return [e.cond, e.a, e.b]
    if isinstance(e, Fma):
        return [e.a, e.b, e.c]
    return []


def map_expr(e: Expr, fn: Callable[[Expr], Expr | None],
             whole: Callable[[Expr], Expr | None] | None = None) -> Expr:
    """`e` rebuilt bottom-up with each node x replaced by fn(x) where that is not None;
    first, top-down, a node that whole(x) maps (when given, and not None) is replaced by
    that, its subtree unvisited."""
    if whole is not None and (new := whole(e)) is not None:
        return new
    if isinstance(e, Load):
        e = Load(e.buffer, tuple(map_expr(i, fn, whole) for i in e.index), e.dtype)
    elif isinstance(e, (Unary, Binary)):
        e = type(e)(e.op, *(map_expr(x, fn, whole) for x in operands(e)))
    elif isinstance(e, (Cast, Bitcast)):
        e = type(e)(e.dtype, map_expr(e.a, fn, whole))
    elif isinstance(e, (Select, Fma)):
        e = type(e)(*(map_expr(x, fn, whole) for x in operands(e)))
    new = fn(e)
    return e if new is None else new


def substitute(e: Expr, values: Mapping[str, Expr]) -> Expr:
    """`e` with the variables named in `values` replaced by their expressions."""
    return map_expr(e, lambda x: values.get(x.name) if isinstance(x, Var) else None)


def walk_expr(e: Expr) -> Iterator[Expr]:
    """`e` and its subexpressions, parents first (a load's index included)."""
    yield e
    for x in e.index if isinstance(e, Load) else operands(e):
        yield from walk_expr(x)


def stmt_exprs(s: Stmt) -> list[Expr]:
    """The expressions a statement evaluates itself (not those of its body): a loop's
    bounds, a store's index and value, an if's condition."""
    if isinstance(s, For):
        return [s.start, s.stop]
    if isinstance(s, Store):
        return [*s.index, s.value]
    if isinstance(s, Prefetch):
        return list(s.index)
    return [s.cond] if isinstance(s, If) else []


def loads_in(stmts: Sequence[Stmt]) -> Iterator[Load]:
    """Every load that `stmts` evaluate, in their bodies too."""
    for s in walk_stmts(stmts):
        for e in stmt_exprs(s):
            yield from (x for x in walk_expr(e) if isinstance(x, Load))


# -- programs: kernels called in order on planned buffers -------------------------------------

BUFFER_KINDS = ("input", "output", "constant", "temp", "status")

# The status word (a program's `status` buffer, i32[]): 0, or the check that failed, written
# by a check's kernel. The entry returns after the call that sets it (ember/codegen/llvm.py).
STATUS_DTYPE = DType.i32
INDEX_OUT_OF_RANGE, ZERO_DIVISOR = 1, 2
CHECK_FAILURES = {INDEX_OUT_OF_RANGE: "an index is out of the range of the axis it addresses",
                  ZERO_DIVISOR: "an integer division by zero"}


def failure_message(program: str, checks: Sequence[str], status: int) -> str:
    """What a nonzero status says: the check of call number `status >> 8` (its origin in
    `checks`) failed with code `status & 255`."""
    number, code = status >> 8, status & 0xFF
    where = checks[number] if number < len(checks) else f"check {number}"
    return f"{program}: {where}: {CHECK_FAILURES.get(code, 'a check failed')}"


@dataclass(frozen=True, slots=True)
class ProgramBuffer:
    buffer: Buffer
    kind: str  # input, output, constant or temp


@dataclass(slots=True)
class Call:
    """Run `kernel` with the named program buffers as its parameters, in order."""

    kernel: str
    args: list[str]


@dataclass(slots=True)
class ProgramIf:
    """Run `then` or `orelse` by the bool[] program buffer `cond`."""

    cond: str
    then: list[ProgramStep]
    orelse: list[ProgramStep]


@dataclass(slots=True)
class ProgramLoop:
    """Repeat `body` while counter < trip count (an i64[] buffer) and the bool[] buffer
    `cond` holds; `counter` (an i64[] buffer) holds the iteration number during the body,
    which ends by updating `cond` and the carried buffers."""

    trip_count: str
    cond: str
    counter: str
    body: list[ProgramStep]


ProgramStep = Call | ProgramIf | ProgramLoop


@dataclass(slots=True)
class Program:
    name: str
    buffers: list[ProgramBuffer]
    kernels: list[Kernel]
    steps: list[ProgramStep]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    size_bounds: dict[str, int] = field(default_factory=dict)  # the graph's, for its sizes
    # Output buffer -> the input whose memory it is given (the graph's `aliases`): the
    # caller passes the input's memory, or a copy of it, as the output's.
    aliases: dict[str, str] = field(default_factory=dict)

    def buffer(self, name: str) -> ProgramBuffer:
        for b in self.buffers:
            if b.buffer.name == name:
                return b
        raise KeyError(name)

    def kernel(self, name: str) -> Kernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)

    def of_kind(self, kind: str) -> list[Buffer]:
        return [b.buffer for b in self.buffers if b.kind == kind]

    def status_calls(self) -> list[Call]:
        """The calls that pass the status buffer, in the order the entry numbers them (the
        steps depth first: then before else)."""
        status = {b.name for b in self.of_kind("status")}
        found: list[Call] = []

        def visit(steps: Sequence[ProgramStep]) -> None:
            for s in steps:
                if isinstance(s, Call):
                    if status.intersection(s.args):
                        found.append(s)
                elif isinstance(s, ProgramIf):
                    visit(s.then)
                    visit(s.orelse)
                else:
                    visit(s.body)

        visit(self.steps)
        return found

    @property
    def sizes(self) -> tuple[str, ...]:
        """The size symbols of the program's buffers and kernels, in order: the entry's
        size arguments. Empty for a program compiled for one shape (whose buffers, inputs
        included, are all numbers: then no kernel reads a size)."""
        names = set().union(*(b.buffer.sizes for b in self.buffers))
        if not names:
            return ()
        return tuple(sorted(names.union(*(k.sizes for k in self.kernels))))
