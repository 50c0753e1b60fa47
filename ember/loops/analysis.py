"""Analyses of loop IR that scheduling, verification and code generation all read.

- **Affine form**: an index expression as coefficients of variables, a constant and a rest
  (`affine_terms`, `affine_form`, `coefficient`).
- **Accesses**: how the lanes of a vectorized loop see a load or store (`access_kind`:
  uniform, contiguous, strided or gather), with dimensions split by a flat position merged
  back (`flatten_index`).
- **Dependence**: whether a loop's iterations are independent (`independent`) and whether
  a nest can be interchanged (`interchange_conflict`).
- **Vector legality**: whether a `vectorized` loop can run its body once on lanes, and how
  (`plan_vector`). A schedule that marks a loop it rejects fails verification; code
  generation renders what the plan says.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ember.dtypes import DType
from ember.graph.ops.registry import get_opdef, has_op
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
    Program,
    Stmt,
    Store,
    Unary,
    Var,
    as_expr,
    binary,
    loads_in,
    operands,
    row_major_strides,
    stmt_exprs,
    walk_expr,
    walk_stmts,
)

# -- the affine form ---------------------------------------------------------------------------


def _int_const(e: Expr) -> int | None:
    if isinstance(e, Const) and e.dtype.is_int and not isinstance(e.value, bool):
        return int(e.value)
    return None


def affine_terms(e: Expr) -> list[tuple[int, Expr]]:
    """`e` as a sum of coefficient * term through add, sub and multiplication by a constant
    (a constant is the term Const(1); anything else is a term of its own)."""
    if isinstance(e, Binary) and e.dtype.is_int and e.op in ("add", "sub"):
        a, b = affine_terms(e.a), affine_terms(e.b)
        return a + ([(-c, t) for c, t in b] if e.op == "sub" else b)
    if isinstance(e, Binary) and e.dtype.is_int and e.op == "mul":
        for factor, other in ((e.b, e.a), (e.a, e.b)):
            c = _int_const(factor)
            if c is None:  # a constant not yet folded, as parsed text may hold
                terms = affine_terms(factor)
                c = sum(k for k, _ in terms) if all(t == Const(1) for _, t in terms) else None
            if c is not None:
                return [(c * k, t) for k, t in affine_terms(other)]
    c = _int_const(e)
    return [(c, Const(1))] if c is not None else [(1, e)]


def affine_sum(terms: list[tuple[int, Expr]]) -> Expr:
    """The expression of `affine_terms`' list."""
    total: Expr = Const(0)
    for c, t in terms:
        total = binary("add", total, t if c == 1 else binary("mul", t, c))
    return total


def _mentions(e: Expr, names: set[str]) -> bool:
    return any(isinstance(x, Var) and x.name in names for x in walk_expr(e))


class AffineForm(NamedTuple):
    """e = sum(coefficients[v] * v) + constant + rest, the rest free of the variables asked
    about (zero coefficients left out)."""

    coefficients: dict[str, int]
    constant: int
    rest: Expr


def _affine_parts(e: Expr, names: set[str]) -> tuple[dict[str, int], int, list] | None:
    coefficients: dict[str, int] = {}
    constant, rest = 0, []
    for c, term in affine_terms(e):
        if isinstance(term, Var) and term.name in names:
            coefficients[term.name] = coefficients.get(term.name, 0) + c
        elif term == Const(1):
            constant += c
        elif _mentions(term, names):
            return None
        else:
            rest.append((c, term))
    return {v: c for v, c in coefficients.items() if c}, constant, rest


def affine_form(e: Expr, names: set[str]) -> AffineForm | None:
    """`e` as an affine function of the variables `names`, or None when it is not one."""
    parts = _affine_parts(e, names)
    return None if parts is None else AffineForm(parts[0], parts[1], affine_sum(parts[2]))


def affine_map(e: Expr) -> dict[str | None, int] | None:
    """`e` as {variable: coefficient, None: constant} when it is affine in all its
    variables with nothing else in it (no loads, divisions), else None."""
    parts = _affine_parts(e, {x.name for x in walk_expr(e) if isinstance(x, Var)})
    if parts is None or parts[2]:
        return None
    return {**parts[0], None: parts[1]}


def coefficient(e: Expr, name: str) -> int | None:
    """The constant c with e = u + c * name (u free of `name`), or None when there is none."""
    parts = _affine_parts(e, {name})
    return None if parts is None else parts[0].get(name, 0)


# -- accesses ------------------------------------------------------------------------------------

def flatten_index(index: Sequence[Expr], shape: Sequence[int]) -> list[Expr]:
    """`index` with adjacent dimensions merged where the row-major address does not need
    them apart: [.., floordiv(e, D), mod(e, D)] with D the last one's extent is [.., e]
    (an output written by its flat position, as a convolution's (oh, ow)), and
    [.., mod(floordiv(e, D), X), mod(e, D)] is [.., mod(e, X * D)] (a weight read by a
    flat (c, kh, kw)); [.., add(r, floordiv(e, D)), mod(e, D)] is [.., add(mul(r, D), e)]
    (a block of columns from row r on). The merged index addresses the same element."""
    return flatten_dims(index, shape)[0]


def flatten_dims(index: Sequence[Expr], shape: Sequence[int]) -> tuple[list[Expr], list[int]]:
    """`flatten_index`, with the extents of the merged dimensions."""
    index, extents, _ = merged_dims(index, shape)
    return index, extents


def merged_dims(index: Sequence[Expr], shape: Sequence[int]) \
        -> tuple[list[Expr], list[int], list[int]]:
    """`flatten_dims`, with how many of `index`'s dimensions each merged one stands for."""
    dims = [(i, extent, 1) for i, extent in zip(index, shape)]
    merged = True
    while merged:
        merged = False
        for d in range(len(dims) - 1):
            (high, high_extent, high_count), (low, low_extent, low_count) = dims[d], dims[d + 1]
            if not (isinstance(low, Binary) and low.op == "mod" and low.b == as_expr(low_extent)):
                continue
            e = low.a
            if (rest := _beside_quotient(high, e, low.b)) is not None:
                one = e if rest is _NOTHING else Binary("add", Binary("mul", rest, low.b), e)
            elif isinstance(high, Binary) and high.op == "mod" and isinstance(high.b, Const) \
                    and high.a == Binary("floordiv", e, low.b):
                one = Binary("mod", e, as_expr(int(high.b.value) * low_extent))
            else:
                continue
            dims[d:d + 2] = [(one, high_extent * low_extent, high_count + low_count)]
            merged = True
            break
    return [i for i, _, _ in dims], [extent for _, extent, _ in dims], \
        [count for _, _, count in dims]


_NOTHING = Const(0)


def _beside_quotient(high: Expr, e: Expr, divisor: Expr) -> Expr | None:
    """What `high` adds to floordiv(e, divisor): _NOTHING when it is that quotient, `r`
    when it is add(r, quotient) in either order, at any depth of adds (a column block's
    start row plus the rows its lanes pass); None when the quotient is not a term of it."""
    if isinstance(high, Binary) and high.op == "floordiv" and high.a == e and high.b == divisor:
        return _NOTHING
    if isinstance(high, Binary) and high.op == "add":
        for term, other in ((high.a, high.b), (high.b, high.a)):
            rest = _beside_quotient(term, e, divisor)
            if rest is not None:
                return other if rest is _NOTHING else Binary("add", rest, other)
    return None


def linear_offset(buf: Buffer, index: Sequence[Expr]) -> dict[str | None, int] | None:
    """The element offset of `buf[index]` in its row-major layout, as an affine map (of the
    flat position where dimensions are split by one: `flatten_dims`)."""
    total: dict[str | None, int] = {}
    index, shape = flatten_dims(index, buf.shape)
    for i, stride in zip(index, row_major_strides(shape)):
        a = affine_map(i)
        if a is None:
            return None
        for v, c in a.items():
            total[v] = total.get(v, 0) + c * stride
    return {v: c for v, c in total.items() if c}


def identity_copy(kernel: Kernel) -> tuple[str, str] | None:
    """(out, in) when all `kernel` does is copy its input parameter into its output
    parameter, each element to the offset it comes from (a reshape's kernel), else None."""
    if len(kernel.params) != 2 or kernel.locals:
        return None
    stores = [s for s in walk_stmts(kernel.body) if isinstance(s, Store)]
    if not stores:
        return None
    a, b = kernel.params
    out, src = (a, b) if stores[0].buffer == a.name else (b, a)
    if src.dtype is not out.dtype:
        return None
    for store in stores:  # (a vectorized loop's blocks and its tail store alike)
        value = store.value
        if not (isinstance(value, Load) and value.buffer == src.name
                and store.buffer == out.name):
            return None
        offset = linear_offset(out, store.index)
        if offset is None or offset != linear_offset(src, value.index):
            return None
    return out.name, src.name


def copies_onto_itself(program: Program, call: Call, offsets: Mapping[str, int]) -> bool:
    """Whether `call` copies a temp into a temp at the same arena `offsets` (the memory plan
    put a reshape's result in its input's place): the data is already there, and code
    generation emits no call."""
    kernel = program.kernel(call.kernel)
    copy = identity_copy(kernel)
    if copy is None:
        return False
    at = dict(zip((p.name for p in kernel.params), call.args))
    out, src = at[copy[0]], at[copy[1]]
    return out in offsets and src in offsets and offsets[out] == offsets[src]


# A load whose lanes are this many elements apart or fewer reads the span they cover and
# picks its lanes with a shuffle; a gather costs about one load per lane.
MAX_LOAD_STRIDE = 4


def mentions(e: Expr, names: set[str]) -> bool:
    """Whether `e` reads any of the variables `names`."""
    return any(isinstance(v, Var) and v.name in names for v in walk_expr(e))


def access_kind(index: Sequence[Expr], name: str, shape: Sequence[int] | None = None) -> str:
    """uniform, contiguous, strided or gather: how the lanes of a vectorized loop over
    `name` see an access at `index` (of a buffer of `shape`, whose merged dimensions count
    as one: `flatten_index`). Strided: the last index is u + c * name, 2 <= c <=
    MAX_LOAD_STRIDE, and the others are uniform (`load_stride` gives c)."""
    if shape is not None:
        index = flatten_index(index, shape)
    coefs = [coefficient(i, name) for i in index]
    if all(c == 0 for c in coefs):
        return "uniform"
    if index and all(c == 0 for c in coefs[:-1]):
        if coefs[-1] == 1:
            return "contiguous"
        if coefs[-1] is not None and 2 <= coefs[-1] <= MAX_LOAD_STRIDE:
            return "strided"
    return "gather"


def distinct_lanes(index: Sequence[Expr], name: str, shape: Sequence[int] | None) -> bool:
    """Whether an access at `index` of a buffer of `shape` addresses a different element
    in every lane of a loop over `name`: its row-major offset is u + c * name, c != 0 (a
    scatter store needs that, or lanes would race for one element)."""
    if shape is None or len(shape) != len(index):
        return False
    coefs = [coefficient(i, name) for i in index]
    if any(c is None for c in coefs):
        return False
    return sum(c * s for c, s in zip(coefs, row_major_strides(shape))) != 0


def load_stride(index: Sequence[Expr], name: str, shape: Sequence[int]) -> int:
    """The elements between lanes of a strided access (`access_kind`)."""
    stride = coefficient(flatten_index(index, shape)[-1], name)
    assert stride is not None
    return stride


# -- dependence ----------------------------------------------------------------------------------

def _expressions(s: Stmt):
    for e in stmt_exprs(s):
        yield from walk_expr(e)


def stored_buffers(stmts: list[Stmt]) -> set[str]:
    """The buffers that `stmts` store to."""
    return {s.buffer for s in walk_stmts(stmts) if isinstance(s, Store)}


def independent(loop: For, kernel: Kernel) -> str | None:
    """None when `loop` (a loop of `kernel`) has independent iterations; else why not.

    Conservative: every store to a parameter has the loop's variable alone as one index
    component (or as the flat position of merged dimensions, `flatten_index`), or every
    store to it has on one axis a block of the variable's own (`_blocked_axis`: a group of
    rows at once), and a parameter both stored and read is accessed everywhere with the
    variable alone on one same axis. Locals are private per thread: the verifier checks
    they are written first."""
    locals_ = {b.name for b in kernel.locals}
    shapes = {b.name: b.shape for b in kernel.params}
    own = Var(loop.var.name)
    stores = [s for s in walk_stmts(loop.body) if isinstance(s, Store)
              and s.buffer not in locals_]
    stored, loaded = set(), set()
    blocked: dict[str, bool] = {}  # buffer -> whether each iteration writes a block of it
    for s in stores:
        stored.add(s.buffer)
        if own in s.index:
            continue
        if s.buffer not in blocked:
            blocked[s.buffer] = _blocked_axis(loop, [t.index for t in stores
                                                     if t.buffer == s.buffer])
        if blocked[s.buffer]:
            continue
        # A task loop over fused (n, c) writes out[n // C, n % C, ...]: the flat position
        # n * C + c is the loop variable. Every store to the buffer needs it on that axis.
        flat = [flatten_index(t.index, shapes[s.buffer]) for t in stores
                if t.buffer == s.buffer]
        if not any(all(len(i) > axis and i[axis] == own for i in flat)
                   for axis in range(len(flat[0]))):
            return f"a store to %{s.buffer} does not index by %{loop.var.name}"
    for s in walk_stmts(loop.body):
        for e in _expressions(s):
            if isinstance(e, Load) and e.buffer not in locals_:
                loaded.add(e.buffer)
    # Read and written is still independent when each iteration has its own slice.
    for name in sorted(stored & loaded):
        accesses = [s.index for s in walk_stmts(loop.body)
                    if isinstance(s, Store) and s.buffer == name]
        accesses += [e.index for s in walk_stmts(loop.body) for e in _expressions(s)
                     if isinstance(e, Load) and e.buffer == name]
        if not any(all(len(i) > axis and i[axis] == own for i in accesses)
                   for axis in range(len(accesses[0]))):
            return f"%{name} is both read and written in the loop"
    return None


def _blocked_axis(loop: For, indices: list[tuple[Expr, ...]]) -> bool:
    """Whether one axis of every index in `indices` (the stores to one buffer in `loop`)
    is c * v + r, v the loop's variable: the same c and the same terms free of the body's
    loops in each, and the terms of those loops spanning fewer than |c| values (rows
    6 * i + j, j < 6, for a group of six at once). Each iteration then writes a block of
    its own."""
    from ember.loops.verify import interval

    ranges = {s.var.name: (s.start.value, s.stop.value - 1) for s in walk_stmts(loop.body)
              if isinstance(s, For) and s.step == 1 and isinstance(s.start, Const)
              and isinstance(s.stop, Const)}
    inner = {s.var.name for s in walk_stmts(loop.body) if isinstance(s, For)}
    for axis in range(min(len(i) for i in indices)):
        forms = [affine_form(i[axis], {loop.var.name}) for i in indices]
        if any(f is None or not f.coefficients for f in forms):
            continue
        step = forms[0].coefficients[loop.var.name]
        outside = {tuple((c, t) for c, t in affine_terms(f.rest) if not _mentions(t, inner))
                   for f in forms}
        if {f.coefficients[loop.var.name] for f in forms} != {step} or len(outside) != 1:
            continue
        spans = [interval(affine_sum([(f.constant, Const(1))] + [
            (c, t) for c, t in affine_terms(f.rest) if _mentions(t, inner)]), ranges)
            for f in forms]
        if all(spans) and max(hi for _, hi in spans) - min(lo for lo, _ in spans) < abs(step):
            return True
    return False


def interchange_conflict(a: For, b: For, locals_: set[str]) -> str | None:
    """Why swapping the perfect nest a { b { ... } } may change results, or None.

    Every buffer the nest writes must be accessed at a single index. Iterations that touch
    the same element then differ only in variables the index does not determine; the
    interchange keeps their order as long as the index determines a's or b's variable (a
    component c * var + terms free of the nest's variables). Locals the body stores at its
    top level before any read are per-iteration scratch and exempt."""
    nest = {a.var.name} | {s.var.name for s in walk_stmts([b]) if isinstance(s, For)}
    scratch: set[str] = set()
    seen: set[str] = set()
    for s in b.body:
        read = {x.buffer for x in loads_in([s])}
        if isinstance(s, Store) and s.buffer in locals_ and s.buffer not in seen and \
                s.buffer not in read:
            scratch.add(s.buffer)
        seen |= read | stored_buffers([s])
    indices: dict[str, set[tuple[Expr, ...]]] = {}
    for s in walk_stmts(b.body):
        if isinstance(s, Store):
            indices.setdefault(s.buffer, set()).add(s.index)
    for load in loads_in(b.body):
        indices.setdefault(load.buffer, set()).add(load.index)

    def determines(index: tuple[Expr, ...], var: str) -> bool:
        forms = (affine_form(e, nest) for e in index)
        return any(f is not None and set(f.coefficients) == {var} for f in forms)

    for name in sorted(stored_buffers(b.body)):
        if len(indices[name]) != 1:
            return f"%{name} is written and accessed at more than one index in the nest"
        index = next(iter(indices[name]))
        if name not in scratch and not (determines(index, a.var.name)
                                        or determines(index, b.var.name)):
            return (f"iterations of both loops update the same elements of %{name}; the"
                    " interchange would reorder those updates")
    return None


# -- vector legality -----------------------------------------------------------------------------

MAX_LANES = 64

# The lane-varying operations that have vector code, by (op, operand family); the vector
# emitter's tables (ember/codegen/vector.py) implement exactly these, which a test checks.
VECTOR_UNARY = frozenset({("neg", "float"), ("abs", "float"), ("sqrt", "float"),
                          ("neg", "int"), ("not", "bool")})
VECTOR_BINARY = frozenset({
    *((op, "float") for op in ("add", "sub", "mul", "div", "max", "min",
                               "eq", "ne", "lt", "le", "gt", "ge")),
    *((op, "int") for op in ("add", "sub", "mul", "max", "min",
                             "eq", "ne", "lt", "le", "gt", "ge")),
    *((op, family) for op in ("bitwise_and", "bitwise_or", "bitwise_xor")
      for family in ("int", "bool")),
    ("and", "bool"), ("or", "bool"), ("xor", "bool"),
})
VECTOR_MATH = frozenset({"exp", "expm1", "log", "log1p", "tanh", "erf"})  # on f32 (vmath)

# The ops and types that a vectorized loop reduces across its lanes, with the identity that
# stands in for inactive lanes.
REDUCTION_IDENTITY: dict[tuple[str, DType], float | int] = {
    **{(op, t): value for t in (DType.f32, DType.f64)
       for op, value in (("add", -0.0), ("mul", 1.0), ("max", float("-inf")),
                         ("min", float("inf")))},
    **{(op, t): value for t in (DType.i32, DType.i64)
       for op, value in (("add", 0), ("mul", 1), ("max", -(1 << (8 * t.itemsize - 1))),
                         ("min", (1 << (8 * t.itemsize - 1)) - 1))},
}


def family(t: DType) -> str:
    """The operand family that selects vector code: bool, float or int."""
    return "bool" if t is DType.bool else "float" if t.is_float else "int"


def trip_bound(s: For) -> tuple[int, int, Expr | None] | None:
    """(start, the most iterations, the stop to check or None when the count is exact) for
    a loop with a constant start whose trip count has a constant bound."""
    if not isinstance(s.start, Const):
        return None
    start = int(s.start.value)
    if isinstance(s.stop, Const):
        return start, len(range(start, int(s.stop.value), s.step)), None
    if s.step == 1 and isinstance(s.stop, Binary) and s.stop.op == "min":
        for bound in (s.stop.a, s.stop.b):
            if isinstance(bound, Const) and bound.dtype is INDEX:
                return start, max(0, int(bound.value) - start), s.stop
    return None


@dataclass
class VectorPlan:
    width: int
    start: int
    stop: Expr | None  # the stop to mask lanes against; None when every lane runs
    lane_locals: set[str]  # locals held per lane in registers (uniform stores)
    reductions: set[str] = field(default_factory=set)  # locals the lanes reduce into


def _vector_cast(src: DType, dst: DType) -> bool:
    halves = (DType.f16, DType.bf16)
    return (src.is_float and dst.is_float and dst is not DType.bf16
            and not (src is DType.f64 and dst is DType.f16)) or \
        (src.is_int and src is not DType.bool and dst.is_float and dst not in halves) or \
        (src.is_int and dst.is_int) or (dst is DType.bool and src is not DType.bf16) or \
        (src is DType.bool and (dst.is_int or dst.is_float and dst not in halves))


def _no_vector_code(e: Expr) -> str | None:
    """Why lane-varying `e`'s own operation has no vector code (None: it has)."""
    if isinstance(e, Unary) and e.op in VECTOR_MATH:
        if e.a.dtype.is_float and e.a.dtype is not DType.f64:  # halves compute in f32
            return None
        return f"{e.op} on {e.a.dtype} has no vector code (vector math is f32)"
    if isinstance(e, Unary) and (e.op, family(e.a.dtype)) not in VECTOR_UNARY or \
            isinstance(e, Binary) and (e.op, family(e.a.dtype)) not in VECTOR_BINARY:
        return f"{e.op} on {e.a.dtype} has no vector code"
    if isinstance(e, Cast) and not _vector_cast(e.a.dtype, e.dtype):
        return f"the cast of {e.a.dtype} to {e.dtype} has no vector code"
    if isinstance(e, Bitcast):
        return "bitcast has no vector code"
    if isinstance(e, Fma) and not e.dtype.is_float:
        return "fma needs floats"
    return None


def has_vector_code(e: Expr) -> bool:
    """Whether `e`'s own operation, computed per lane, has vector code."""
    return _no_vector_code(e) is None


def lanes_compute(e: Expr) -> bool:
    """Whether every operation of `e`, but those of its loads' indices, has vector code."""
    return has_vector_code(e) and (isinstance(e, Load) or all(map(lanes_compute, operands(e))))


def is_reduction(st: Stmt, locals_: set[str], name: str) -> bool:
    """Whether `st` is `%acc[u] = op(%acc[u], x)`, u uniform in lane variable `name`, on a
    local of a type and op with a vector reduction (`REDUCTION_IDENTITY`)."""
    if not isinstance(st, Store) or st.buffer not in locals_ or \
            access_kind(st.index, name) != "uniform":
        return False
    value = st.value
    return isinstance(value, Binary) and \
        (value.op, value.dtype) in REDUCTION_IDENTITY and \
        value.a == Load(st.buffer, st.index, value.dtype)


def plan_vector(s: For, locals_: set[str], shapes: Mapping[str, Sequence[int]] | None = None,
                reductions: bool = False) -> VectorPlan | str:
    """How vectorized loop `s` (in a kernel whose buffers have `shapes`) runs on lanes, or
    why it cannot. With `reductions`, a local accumulated across the lanes (`is_reduction`)
    is reduced horizontally; without, such a body is refused.

    The lanes run the body statement by statement, which is the serial loop's meaning when
    no lane reads what another lane writes: a buffer the body stores to is read in it only
    at the one index it is stored at. Stores are contiguous, lane-private locals (stored
    at a uniform index before they are read), scatters to distinct elements, or
    reductions; `if`s are uniform; lane-varying operations need vector code."""
    shapes = shapes or {}
    bound = trip_bound(s)
    if s.step != 1 or bound is None:
        return "its trip count has no constant bound"
    start, width, stop = bound
    if not 1 <= width <= MAX_LANES:
        return f"its width {width} is not in [1, {MAX_LANES}]"
    name = s.var.name
    reduced = {st.buffer for st in s.body if is_reduction(st, locals_, name)} \
        if reductions else set()
    # Lane-private temporaries: locals stored at a uniform index at the top of the body.
    lane_locals = {st.buffer for st in s.body if isinstance(st, Store)
                   and st.buffer in locals_ and st.buffer not in reduced
                   and access_kind(st.index, name) == "uniform"}
    stmts = list(walk_stmts(s.body))
    varying: dict[Expr, bool] = {}

    def varies(e: Expr) -> bool:  # differs between lanes (memoized: trees share nodes)
        if e not in varying:
            if isinstance(e, Var):
                varying[e] = e.name == name
            elif isinstance(e, Load):
                varying[e] = e.buffer in lane_locals or any(varies(i) for i in e.index)
            else:
                varying[e] = any(varies(x) for x in operands(e))
        return varying[e]

    def check(e: Expr) -> str | None:
        """Why `e` has no vector code. Indices need none: a uniform or contiguous access
        computes lane 0's (scalar code), and a gather without it computes each lane's."""
        if isinstance(e, Load):
            if any(isinstance(y, Load) and y.buffer in lane_locals
                   for i in e.index for y in walk_expr(i)):
                return "an index reads a lane-private local"
            return None
        if varies(e) and not isinstance(e, (Var, Const)):
            why = _no_vector_code(e)
            if why:
                return why
        return next(filter(None, map(check, operands(e))), None)

    stores: dict[str, set[tuple[Expr, ...]]] = {}
    for st in stmts:
        if isinstance(st, For):
            return "its body has a loop"
        if isinstance(st, If):
            if varies(st.cond):
                return "its body has an if whose condition differs between lanes"
            continue
        why = check(st.value)
        if why:
            return why
        kind = access_kind(st.index, name, shapes.get(st.buffer))
        if st.buffer in reduced:
            if st not in s.body or not is_reduction(st, locals_, name) or \
                    not varies(st.value.b):
                return (f"%{st.buffer} is reduced under an if, over lane-uniform values or"
                        " stored otherwise too")
        elif st.buffer in lane_locals:
            if kind != "uniform" or st not in s.body:
                return f"%{st.buffer} is stored both per lane and not"
        elif kind != "contiguous" and (st.buffer in locals_ or not distinct_lanes(
                st.index, name, shapes.get(st.buffer))):
            return (f"a store to %{st.buffer} is neither contiguous, lane-private nor a"
                    f" scatter to distinct elements")
        elif st.value.dtype is DType.bf16 and varies(st.value):
            return "storing bf16 (rounding) has no vector code"
        stores.setdefault(st.buffer, set()).add(st.index)
    written: set[str] = set()
    for st in stmts:  # in order: no lane reads what another lane writes
        for e in [st.cond] if isinstance(st, If) else [*st.index, st.value]:
            for x in walk_expr(e):
                if not isinstance(x, Load) or x.buffer not in stores:
                    continue
                if x.buffer in reduced:
                    if not (isinstance(st, Store) and st.buffer == x.buffer and
                            x is st.value.a):
                        return f"%{x.buffer} is read while the lanes reduce into it"
                    continue
                if x.buffer in lane_locals and x.buffer not in written:
                    return f"%{x.buffer} is read before the lane stores it"
                if len(stores[x.buffer]) != 1 or x.index not in stores[x.buffer]:
                    return f"%{x.buffer} is read at another index than it is stored at"
        if isinstance(st, Store):
            if len(stores[st.buffer]) != 1 and not _apart(stores[st.buffer], name, width,
                                                          shapes.get(st.buffer)):
                return f"%{st.buffer} is stored at indices whose lanes may meet"
            written.add(st.buffer)
    return VectorPlan(width, start, stop, lane_locals, reductions=reduced)


def _apart(indices: set[tuple[Expr, ...]], lane: str, lanes: int,
           shape: Sequence[int] | None) -> bool:
    """Whether stores at `indices` of a buffer of `shape`, each by `lanes` lanes of a loop
    over `lane`, write distinct elements (so that storing one index for all lanes before
    the next gives what the serial loop gives): their row-major offsets are u + d + c *
    lane with the same u and c and constant d's no two of which are c * (j - i) apart for
    lanes i, j (Winograd's four points of a tile row: offsets one row of the output apart;
    a tile's four outputs, stride-2 scatters, one element and one row apart)."""
    if shape is None:
        return False
    offsets = []
    for index in indices:
        terms = [affine_map(i) for i in index]
        if len(index) != len(shape) or any(t is None for t in terms):
            return False
        flat: dict[str | None, int] = {}
        for t, stride in zip(terms, row_major_strides(shape)):
            for var, c in t.items():
                flat[var] = flat.get(var, 0) + c * stride
        offsets.append(flat)
    if any(not isinstance(c, int) for o in offsets for c in o.values()):
        return False  # strides known only at call time: not decided here
    first = offsets[0]
    step = first.get(lane, 0)
    if step == 0 or any({k: v for k, v in o.items() if k is not None and v} !=
                        {k: v for k, v in first.items() if k is not None and v}
                        for o in offsets):
        return False
    starts = sorted(o.get(None, 0) for o in offsets)
    return all(not ((b - a) % step == 0 and abs(b - a) // abs(step) < lanes)
               for i, a in enumerate(starts) for b in starts[i + 1:])


# Plans by loop: a loop is planned when each schedule step is verified and again when its
# code is emitted. Each entry holds its loop (an id names no other while it lives) and the
# buffers it was planned with; the loop IR is not changed in place.
_PLANS: OrderedDict[int, tuple[For, tuple, VectorPlan | str]] = OrderedDict()
_MAX_PLANS = 4096


def vector_plan_in(kernel: Kernel, s: For) -> VectorPlan | str:
    """`plan_vector` for a schedule's `vectorized` loop `s` of `kernel`: reductions across
    the lanes allowed, the kernel's buffers and locals as they are."""
    buffers = (tuple((b.name, b.shape) for b in kernel.params),
               tuple((b.name, b.shape) for b in kernel.locals))
    known = _PLANS.get(id(s))
    if known is not None and known[0] is s and known[1] == buffers:
        return known[2]
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    plan = plan_vector(s, {b.name for b in kernel.locals}, shapes, reductions=True)
    _PLANS[id(s)] = (s, buffers, plan)
    if len(_PLANS) > _MAX_PLANS:
        _PLANS.popitem(last=False)
    return plan


def transcendental(e: Expr) -> bool:
    """Whether `e` is a loop-IR unary op that is a graph op declared `transcendental` (the
    loop IR names them alike): worth storing once rather than computing twice."""
    return isinstance(e, Unary) and has_op(e.op) and "transcendental" in get_opdef(e.op).traits


# -- launches: a GPU kernel's body, in the order it runs ------------------------------------

def launches(kernel: Kernel) -> list[list[Stmt]]:
    """The kernel's body as launches, in order: each `threads` loop alone, and each run of
    other statements between them (one thread's work)."""
    groups: list[list[Stmt]] = []
    for s in kernel.body:
        if is_threads(s) or not groups or is_threads(groups[-1][0]):
            groups.append([s])
        else:
            groups[-1].append(s)
    return groups


def is_threads(s: Stmt) -> bool:
    """Whether `s` is a launch of a thread per iteration (a `threads` loop)."""
    return isinstance(s, For) and s.kind == "threads"
