"""Loops of kind `unrolled` and `vectorized`: the body copied per iteration, or run once on
LLVM vectors whose lanes are the iterations.

**Unrolled.** A loop whose trip count has a constant bound is emitted as that many copies of
its body, the loop variable a constant in each: `for %i = 0 to 4 unrolled` gives four
copies; `for %i = 0 to min(4, %n) unrolled` four copies, each under `if i < min(4, %n)`.
Other loops (and ones longer than MAX_UNROLL) are emitted as serial loops. An unrolled loop
of W copies whose body is a vectorized loop of W lanes reading x[.., lane, .., copy] (a
block of a transpose, `block_transposes` in ember/loops/schedule.py) loads the block as W
vectors along the copies and transposes them with shuffles before the copies
(`transposed_loads`), so that no copy gathers.

**Vectorized.** `for %j = s to s + W vectorized` (constant s and W) runs its body once, on
vectors of W lanes, lane l standing for iteration s + l; `for %j = s to min(s + W, e)` is
the same with the lanes at or past `e` masked off (they load and store nothing; the body
does not run at all when no lane is active; when all W are, a second copy of the body runs
them unmasked). W is the trip count, not the target's width:
LLVM splits or widens the vectors to its registers. Which loops can run so, and how each
access is read, is `plan_vector` (ember/loops/analysis.py); the verifier rejects a
`vectorized` loop it refuses, so this module renders its plan and never falls back:

- a uniform load is one scalar load; a contiguous one a vector load; a strided one a
  masked load of the span the lanes cover and a shuffle; any other a gather, its lane
  offsets computed on vectors when its index has vector code (one vector GEP), else each
  lane's apart;
- a contiguous store is a vector store; a lane-private local is held in a register
  (after the loop it holds the last active lane's value); a store to distinct elements is
  a masked scatter; a reduction into a local combines the active lanes by halving, then
  with the accumulator (a float sum reassociated, as LLVM may a scalar accumulator's);
- a `select` whose condition differs between lanes and whose first side is a load of f32
  or f64 loads only on the lanes it picks, so that the other lanes may address memory
  outside the buffer (a conv's row segments);
- expressions the same in every lane are scalar code (ember.codegen.scalar); lane-varying
  ones are the vector instructions of the tables below, with the scalar code's semantics.

**Streaming stores.** A serial loop (or a thread's share of a parallel one) whose body is
one store, contiguous in its variable, to an output of at least STREAMING_BYTES is run as
serial iterations up to a cache line's start, then aligned non-temporal vectors of a line,
then serial iterations for the rest, and a fence. The output bypasses the caches, which
saves reading each line before it is written (`emit_streaming`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from llvmlite import ir

from ember.codegen import scalar, vmath
from ember.codegen.scalar import I32, I64, declare, storage_type, value_type
from ember.dtypes import DType
from ember.errors import VerificationError
from ember.graph.symbolic import definitely, is_static_shape
from ember.loops.analysis import (
    REDUCTION_IDENTITY,
    VectorPlan,
    access_kind,
    coefficient,
    family,
    has_vector_code,
    load_stride,
    plan_vector,
    trip_bound,
    vector_plan_in,
)
from ember.loops.ir import (
    Binary,
    Cast,
    Const,
    Expr,
    Fma,
    For,
    Load,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    operands,
    substitute,
    walk_expr,
)

if TYPE_CHECKING:
    from ember.codegen.llvm import KernelEmitter

MAX_UNROLL = 64  # copies; a longer unrolled loop is emitted as a serial one

# -- unrolled loops ----------------------------------------------------------------------------

def emit_unrolled(em: KernelEmitter, s: For) -> bool:
    """Emit `s` as copies of its body; False (nothing emitted) when its trip count has no
    constant bound of at most MAX_UNROLL."""
    bound = trip_bound(s)
    if bound is None or bound[1] > MAX_UNROLL:
        return False
    start, count, stop = bound
    slot = em.allocas.alloca(I64, name=s.var.name)
    limit = em.index(stop) if stop is not None else None
    transposed, outside = transposed_loads(em, s), em.transposed
    with em.binding(s.var.name, slot):
        for k in range(count):
            value = ir.Constant(I64, start + k * s.step)
            em.b.store(value, slot)
            em.known[s.var.name] = start + k * s.step
            em.transposed = {**outside, **{load: vectors[k]
                                           for load, vectors in transposed.items()}}
            if limit is None:
                em.stmts(s.body)
            else:
                with em.b.if_then(em.b.icmp_signed("<", value, limit)):
                    em.stmts(s.body)
    em.known.pop(s.var.name, None)
    em.transposed = outside
    return True


# Element types loaded and transposed as they are stored.
_TRANSPOSABLE = {DType.f32, DType.f64, DType.i32, DType.i64}


def transposed_loads(em: KernelEmitter, s: For) -> dict[Load, list[ir.Value]]:
    """A square block transposed in registers: in `for %a = 0 to W unrolled { for %b = 0
    to W vectorized { .. x[.., %b, .., %a] .. } }` (W a power of two, the load contiguous in
    %a and a gather in %b, x not stored in the block), the W vectors x[.., b, .., 0:W] for
    each b, loaded before the copies and transposed by log2(W) rounds of interleaving
    shuffles (the perfect shuffle: W log2(W) shuffles for W * W elements), so that copy a
    reads x[.., 0:W, .., a] as its vector a instead of gathering it. Either loop may stop
    early (`min(W, e)`: an edge block): the loads are masked to the elements inside it.
    Returns, per such load, the vector of each copy; {} when `s` is not such a block."""
    if len(s.body) != 1 or not isinstance(s.body[0], For) or s.body[0].kind != "vectorized" \
            or s.step != 1:
        return {}
    inner = s.body[0]
    outer_bound, inner_bound = trip_bound(s), trip_bound(inner)
    width = outer_bound[1] if outer_bound else 0
    if inner_bound is None or inner_bound[1] != width or width not in (4, 8, 16) or \
            inner.step != 1 or not all(isinstance(st, Store) for st in inner.body):
        return {}
    stored = {st.buffer for st in inner.body}
    a, lane = s.var.name, inner.var.name
    b = em.b
    found: dict[Load, list[ir.Value]] = {}
    for st in inner.body:
        for e in _unguarded_loads(st.value):
            buf = em.kernel.buffer(e.buffer)
            if e in found or e.buffer in stored or buf.dtype not in _TRANSPOSABLE or \
                    access_kind(e.index, lane, buf.shape) != "gather" or \
                    access_kind(e.index, a, buf.shape) != "contiguous" or \
                    any(coefficient(i, lane) is None for i in e.index):
                continue
            t = ir.VectorType(storage_type(buf.dtype), width)
            bits = ir.VectorType(ir.IntType(1), width)
            columns = None  # the lanes (values of %a) inside the block
            if outer_bound[2] is not None:
                first = [outer_bound[0] + k for k in range(width)]
                stop = em.index(outer_bound[2])
                columns = b.icmp_signed("<", ir.Constant(ir.VectorType(I64, width), first),
                                        splat(b, stop, width))
            rows = []
            for j in range(width):
                at = {lane: Const(inner_bound[0] + j), a: Const(outer_bound[0])}
                ptr, _ = em.element_ptr(e.buffer, [substitute(i, at) for i in e.index])
                mask = columns
                if inner_bound[2] is not None:  # rows past the stop load nothing
                    inside = b.icmp_signed("<", ir.Constant(I64, inner_bound[0] + j),
                                           em.index(inner_bound[2]))
                    row = splat(b, inside, width)
                    mask = row if mask is None else b.and_(mask, row)
                if mask is None:
                    rows.append(b.load(ptr, typ=t, align=buf.dtype.itemsize))
                    continue
                fn = declare(b, f"llvm.masked.load.{_mangle(t)}.p0", t,
                             [scalar.PTR, I32, bits, t])
                rows.append(b.call(fn, [ptr, ir.Constant(I32, buf.dtype.itemsize), mask,
                                        ir.Constant(t, None)]))
            found[e] = transpose_vectors(b, rows)
    return found


def splat(b: ir.IRBuilder, x: ir.Value, width: int) -> ir.Value:
    """Scalar `x` in each of `width` lanes."""
    if isinstance(x, ir.Constant):
        return ir.Constant(ir.VectorType(x.type, width), [x.constant] * width)
    one = b.insert_element(ir.Constant(ir.VectorType(x.type, width), ir.Undefined), x,
                           ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(one.type, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, width), [0] * width))


def _unguarded_loads(e: Expr):
    """The loads `e` always evaluates (not those on a side of a select)."""
    if isinstance(e, Load):
        yield e
    elif isinstance(e, Select):
        yield from _unguarded_loads(e.cond)
    else:
        for x in operands(e):
            yield from _unguarded_loads(x)


def transpose_vectors(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The columns of the square matrix whose rows are `rows` (a power of two of them):
    each round pairs vector i with vector i + n/2 and interleaves them, the low halves'
    lanes into one vector and the high halves' into the next; log2(n) rounds transpose."""
    n = len(rows)
    low = [m for j in range(n // 2) for m in (j, n + j)]
    high = [m for j in range(n // 2, n) for m in (j, n + j)]
    masks = [ir.Constant(ir.VectorType(I32, n), mask) for mask in (low, high)]
    for _ in range(n.bit_length() - 1):
        rows = [b.shuffle_vector(rows[i], rows[i + n // 2], mask)
                for i in range(n // 2) for mask in masks]
    return rows


# -- vectorized loops: emission ------------------------------------------------------------------

def _mangle(t: ir.Type) -> str:
    """LLVM's name suffix for an overloaded intrinsic's type (v16f32, p0, ...)."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_mangle(t.element)}"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    if isinstance(t, ir.PointerType):
        return "p0"
    return {"half": "f16", "float": "f32", "double": "f64"}[str(t)]


def _is_vector(x: ir.Value) -> bool:
    return isinstance(x.type, ir.VectorType)


class VectorBody:
    """Emits the body of one vectorized loop (checked by `plan_vector`) into the kernel
    emitter's current block; lane-uniform expressions go through its scalar code."""

    def __init__(self, em: KernelEmitter, s: For, plan: VectorPlan, streaming: bool = False):
        self.em, self.b, self.loop, self.plan = em, em.b, s, plan
        self.streaming = streaming  # stores to parameters are aligned, non-temporal vectors
        self.width = plan.width
        self.mask: ir.Value | None = None  # the active lanes, when the stop masks some
        self.count: ir.Value | None = None  # how many lanes are active, likewise
        self.lane_values: dict[str, ir.Value] = {}  # lane-private local -> its vector
        self.values: dict[tuple[Expr, ir.Block], ir.Value] = {}  # (KernelEmitter.values)

    def vec(self, t: ir.Type) -> ir.VectorType:
        return ir.VectorType(t, self.width)

    def splat(self, x: ir.Value) -> ir.Value:
        """`x` in every lane (vectors are returned as they are)."""
        return x if _is_vector(x) else splat(self.b, x, self.width)

    def lanes(self) -> ir.Constant:
        """The loop variable's value in each lane."""
        return ir.Constant(self.vec(I64), [self.plan.start + k for k in range(self.width)])

    def intrinsic(self, base: str, *xs: ir.Value) -> ir.Value:
        t = xs[0].type
        return self.b.call(declare(self.b, f"{base}.{_mangle(t)}", t, [x.type for x in xs]), xs)

    # -- the loop
    def emit(self) -> None:
        b, plan = self.b, self.plan
        if plan.stop is None:
            self.stmts(self.loop.body)
            self.finish()
            return
        stop = self.em.index(plan.stop)
        count = b.sub(stop, ir.Constant(I64, plan.start))
        # Whole vectors (a split's blocks but the last) store without a mask: a masked
        # store is microcode on AMD's cores (a transpose's blocks 4x slower on Zen 2).
        with b.if_else(b.icmp_signed(">=", count, ir.Constant(I64, self.width))) as (
                whole, part):
            with whole:
                self.stmts(self.loop.body)
                self.finish()
            with part:
                self.count = count
                self.mask = b.icmp_signed("<", self.lanes(), self.splat(stop))
                with b.if_then(b.icmp_signed(">", self.count, ir.Constant(I64, 0))):
                    self.stmts(self.loop.body)
                    self.finish()

    def finish(self) -> None:
        """After the body: each lane-private local holds its last active lane's value, as
        after the serial loop."""
        last = ir.Constant(I64, self.width - 1) if self.count is None else \
            self.b.sub(self.count, ir.Constant(I64, 1))
        for st in self.loop.body:
            if isinstance(st, Store) and st.buffer in self.lane_values:
                ptr, buf = self.em.element_ptr(st.buffer, st.index)
                lane = self.b.extract_element(self.lane_values.pop(st.buffer), last)
                self.b.store(scalar.to_storage(self.b, lane, buf.dtype), ptr)

    # -- statements
    def stmts(self, stmts: Sequence[Stmt]) -> None:
        for st in stmts:
            self.values.clear()  # (as the scalar emitter's: one statement's values)
            self.em.values.clear()
            if isinstance(st, Store):
                self.store(st)
                continue
            from ember.codegen.llvm import emit_if  # llvm imports this module

            # An If, uniform (plan_vector checked).
            emit_if(self.b, self.em.condition(st.cond), st, self.stmts)

    def store(self, st: Store) -> None:
        if st.buffer in self.plan.reductions:
            self.reduce(st)
            return
        value = self.expr(st.value)
        if st.buffer in self.plan.lane_locals:
            self.lane_values[st.buffer] = self.splat(value)
            return
        buf = self.em.kernel.buffer(st.buffer)
        if access_kind(st.index, self.loop.var.name, buf.shape) != "contiguous":
            self.scatter(st, value)
            return
        ptr, buf = self.base(st.buffer, st.index)
        raw = self.to_storage(value, buf.dtype) if _is_vector(value) else \
            self.splat(scalar.to_storage(self.b, value, buf.dtype))
        align = buf.dtype.itemsize
        if self.mask is None:
            streaming = self.streaming and st.buffer not in self.em.local_names
            store = self.b.store(raw, self.b.bitcast(ptr, raw.type.as_pointer()),
                                 align=self.width * align if streaming else align)
            if streaming:
                store.set_metadata("nontemporal",
                                   self.b.module.add_metadata([ir.Constant(I32, 1)]))
            return
        fn = declare(self.b, f"llvm.masked.store.{_mangle(raw.type)}.p0", ir.VoidType(),
                     [raw.type, scalar.PTR, I32, self.mask.type])
        self.b.call(fn, [raw, self.b.bitcast(ptr, scalar.PTR), ir.Constant(I32, align),
                         self.mask])

    def reduce(self, st: Store) -> None:
        """`%acc[u] = op(%acc[u], x)` over the active lanes: x's lanes combined by halving
        (inactive lanes and the padding to a power of two hold op's identity), then with
        the accumulator. A float sum is reassociated so, as a scalar accumulator's is
        (ember/codegen/llvm.py); max and min give what the serial loop gives."""
        b, e = self.b, st.value
        assert isinstance(e, Binary)
        identity = ir.Constant(value_type(e.dtype), REDUCTION_IDENTITY[e.op, e.dtype])
        lanes = self.expr(e.b)
        if self.mask is not None:
            lanes = b.select(self.mask, lanes, self.splat(identity))
        size = 1 << (self.width - 1).bit_length()
        if size != self.width:
            lanes = b.shuffle_vector(lanes, self.splat(identity), ir.Constant(
                ir.VectorType(I32, size), [min(k, self.width) for k in range(size)]))
        combine = _BINARY[e.op, family(e.dtype)]
        while size > 1:
            size //= 2
            low, high = (b.shuffle_vector(lanes, ir.Constant(lanes.type, None), ir.Constant(
                ir.VectorType(I32, size), list(range(first, first + size))))
                for first in (0, size))
            lanes = combine(self, e.dtype, low, high)
        total = b.extract_element(lanes, ir.Constant(I32, 0))
        value = self.em.expr_of(e, [self.em.expr(e.a), total])
        ptr, buf = self.em.element_ptr(st.buffer, st.index)
        b.store(scalar.to_storage(b, value, buf.dtype), ptr)

    def scatter(self, st: Store, value: ir.Value) -> None:
        """A store whose lanes' elements are apart (`distinct_lanes`): one masked scatter
        (a packed conv's write-back, output channels in the lanes)."""
        buf = self.em.kernel.buffer(st.buffer)
        raw = self.to_storage(value, buf.dtype) if _is_vector(value) else \
            self.splat(scalar.to_storage(self.b, value, buf.dtype))
        pointers = self.gather_pointers(st.buffer, st.index)
        mask = self.mask if self.mask is not None else \
            ir.Constant(self.vec(ir.IntType(1)), [1] * self.width)
        fn = declare(self.b, f"llvm.masked.scatter.{_mangle(raw.type)}.{_mangle(pointers.type)}",
                     ir.VoidType(), [raw.type, pointers.type, I32, mask.type])
        self.b.call(fn, [raw, pointers, ir.Constant(I32, buf.dtype.itemsize), mask])

    def base(self, name: str, index: Sequence[Expr]):
        """Pointer to lane 0's element and the buffer, for a contiguous access."""
        first = Const(self.plan.start)
        return self.em.element_ptr(name, [substitute(i, {self.loop.var.name: first})
                                          for i in index])

    # -- expressions
    def expr(self, e: Expr) -> ir.Value:
        """`e` as a vector, or as a scalar when it is the same in every lane."""
        key = (e, self.b.block)
        value = self.values.get(key)
        if value is None:
            value = self.values[key] = self._expr(e)
        return value

    def _expr(self, e: Expr) -> ir.Value:
        if isinstance(e, Var) and e.name == self.loop.var.name:
            return self.lanes()
        if isinstance(e, (Const, Var)):
            return self.em.expr(e)
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Select) and isinstance(e.a, Load) and self.varies(e.cond) and \
                e.a.dtype in (DType.f32, DType.f64) and e.a.buffer not in self.lane_values:
            buf = self.em.kernel.buffer(e.a.buffer)
            if access_kind(e.a.index, self.loop.var.name, buf.shape) != "uniform":
                # A guarded load: the lanes whose condition is false read nothing (a masked
                # load), so the index may leave the buffer there, as the interpreter's
                # select, which evaluates only the side it picks, allows.
                return self.load(e.a, self.expr(e.cond), self.expr(e.b))
        values = [self.expr(x) for x in operands(e)]
        if not any(_is_vector(v) for v in values):
            return self.em.expr_of(e, values)  # the scalar code, on the values computed here
        return self.vector_op(e, values)

    def load(self, e: Load, guard: ir.Value | None = None,
             otherwise: ir.Value | None = None) -> ir.Value:
        """`e` on the active lanes; with `guard` (a lane mask, from a select around the
        load), only where it holds, `otherwise` (f32 or f64) elsewhere."""
        if e.buffer in self.lane_values:
            return self.lane_values[e.buffer]
        if e in self.em.transposed and guard is None:
            return self.em.transposed[e]  # its lanes from a block transposed in registers
        buf = self.em.kernel.buffer(e.buffer)
        kind = access_kind(e.index, self.loop.var.name, buf.shape)
        if kind == "uniform":
            return self.em.expr(e)
        t = self.vec(storage_type(buf.dtype))
        align = ir.Constant(I32, buf.dtype.itemsize)
        mask = self.mask if guard is None else \
            guard if self.mask is None else self.b.and_(self.mask, guard)
        fill = ir.Constant(t, None) if otherwise is None else \
            otherwise if _is_vector(otherwise) else self.splat(otherwise)
        if kind == "contiguous":
            ptr, _ = self.base(e.buffer, e.index)
            if mask is None:
                raw = self.b.load(ptr, typ=t, align=buf.dtype.itemsize)
            else:
                fn = declare(self.b, f"llvm.masked.load.{_mangle(t)}.p0", t,
                             [scalar.PTR, I32, mask.type, t])
                raw = self.b.call(fn, [self.b.bitcast(ptr, scalar.PTR), align, mask, fill])
            return self.from_storage(raw, buf.dtype)
        if kind == "strided":
            return self.from_storage(self.strided_load(e, t, mask, fill), buf.dtype)
        pointers = self.gather_pointers(e.buffer, e.index)
        mask = mask if mask is not None else \
            ir.Constant(self.vec(ir.IntType(1)), [1] * self.width)
        fn = declare(self.b, f"llvm.masked.gather.{_mangle(t)}.{_mangle(pointers.type)}", t,
                     [pointers.type, I32, mask.type, t])
        raw = self.b.call(fn, [pointers, align, mask, fill])
        return self.from_storage(raw, buf.dtype)

    def strided_load(self, e: Load, t: ir.VectorType, mask: ir.Value | None,
                     fill: ir.Value) -> ir.Value:
        """A strided load (`access_kind`): one masked load of the span from lane 0's element,
        its lanes' elements enabled only (the others, and those of masked lanes, may lie
        outside the buffer), then a shuffle that picks them."""
        b, width = self.b, self.width
        buf = self.em.kernel.buffer(e.buffer)
        stride = load_stride(e.index, self.loop.var.name, buf.shape)
        span = ir.VectorType(t.element, width * stride)
        bit = ir.IntType(1)
        if mask is None:
            wide_mask = ir.Constant(ir.VectorType(bit, width * stride),
                                    [int(j % stride == 0) for j in range(width * stride)])
        else:  # lane l's element is j = l * stride; the rest pick lane `width` of the zeros
            wide_mask = b.shuffle_vector(
                mask, ir.Constant(mask.type, [0] * width),
                ir.Constant(ir.VectorType(I32, width * stride),
                            [j // stride if j % stride == 0 else width
                             for j in range(width * stride)]))
        ptr, _ = self.base(e.buffer, e.index)
        fn = declare(b, f"llvm.masked.load.{_mangle(span)}.p0", span,
                     [scalar.PTR, I32, wide_mask.type, span])
        raw = b.call(fn, [b.bitcast(ptr, scalar.PTR), ir.Constant(I32, buf.dtype.itemsize),
                          wide_mask, ir.Constant(span, ir.Undefined)])
        picked = b.shuffle_vector(raw, ir.Constant(span, ir.Undefined), ir.Constant(
            ir.VectorType(I32, width), [lane * stride for lane in range(width)]))
        return picked if mask is None else b.select(mask, picked, fill)

    def gather_pointers(self, name: str, index: Sequence[Expr]) -> ir.Value:
        """The lanes' element pointers for a gather: from the index computed on vectors
        when it has vector code (the element offsets in one vector), else from each lane's
        index computed apart (scalar code, once per lane)."""
        b, var = self.b, self.loop.var.name
        buf = self.em.kernel.buffer(name)
        if all(has_vector_code(x) for i in index for x in walk_expr(i)
               if not isinstance(x, (Var, Const, Load)) and self.varies(x)):
            offsets = None
            for i, stride in zip(index, buf.strides):
                term = self.splat(self.expr(i))
                if stride != 1:
                    term = b.mul(term, self.splat(self.em.stride(stride)))
                offsets = term if offsets is None else b.add(offsets, term)
            # 32-bit offsets: one gather instruction per 16 lanes
            if is_static_shape(buf.shape) and buf.numel < 2**31:
                offsets = b.trunc(offsets, self.vec(I32))
            base, _ = self.em.element_ptr(name, [Const(0)] * len(index))
            # A scalar base with vector offsets: LLVM's vector GEP, <width x ptr>.
            pointers = b.gep(base, [offsets], inbounds=True,
                             source_etype=storage_type(buf.dtype))
            pointers.type = self.vec(scalar.PTR)  # llvmlite types a GEP as its base
            return pointers
        pointers = ir.Constant(self.vec(scalar.PTR), ir.Undefined)
        for k in range(self.width):
            lane = Const(self.plan.start + k)
            ptr, _ = self.em.element_ptr(name, [substitute(i, {var: lane}) for i in index])
            pointers = b.insert_element(pointers, b.bitcast(ptr, scalar.PTR),
                                        ir.Constant(I32, k))
        return pointers

    def varies(self, e: Expr) -> bool:
        """Whether `e` differs between lanes."""
        return any(isinstance(x, Var) and x.name == self.loop.var.name
                   or isinstance(x, Load) and x.buffer in self.plan.lane_locals
                   for x in walk_expr(e))

    def from_storage(self, raw: ir.Value, t: DType) -> ir.Value:
        """Loaded lanes as register values (scalar.from_storage, on vectors)."""
        b = self.b
        if t is DType.bool:
            return b.icmp_unsigned("!=", raw, ir.Constant(raw.type, None))
        if t is DType.f16:
            return b.fpext(raw, self.vec(scalar.F32))
        if t is DType.bf16:
            wide = b.zext(raw, self.vec(I32))
            return b.bitcast(b.shl(wide, self.splat(ir.Constant(I32, 16))),
                             self.vec(scalar.F32))
        return raw

    def to_storage(self, v: ir.Value, t: DType) -> ir.Value:
        """Register lanes as the elements to store (bf16 never comes here: plan_vector)."""
        if t is DType.bool:
            return self.b.zext(v, self.vec(scalar.I8))
        if t is DType.f16:
            return self.b.fptrunc(v, self.vec(scalar.F16))
        return v

    def vector_op(self, e: Expr, values: list[ir.Value]) -> ir.Value:
        b = self.b
        if isinstance(e, Select):
            cond, x, y = values
            return b.select(cond, self.splat(x), self.splat(y))
        if isinstance(e, Fma):
            return self.intrinsic("llvm.fmuladd", *(self.splat(v) for v in values))
        if isinstance(e, Cast):
            return self.cast(e.a.dtype, e.dtype, values[0])
        if isinstance(e, Unary) and e.op in vmath.FUNCTIONS:  # whole vectors of f32
            return vmath.FUNCTIONS[e.op](b, values[0])
        if isinstance(e, Unary):
            return _UNARY[e.op, family(e.a.dtype)](self, values[0])
        return _BINARY[e.op, family(e.a.dtype)](self, e.a.dtype, *map(self.splat, values))

    def cast(self, src: DType, dst: DType, x: ir.Value) -> ir.Value:
        """scalar.cast on vectors, for the casts that `_vector_cast` allows."""
        b = self.b
        if dst is DType.bool:  # nonzero (a NaN too)
            if src is DType.bool:
                return x
            if src.is_float:
                return b.fcmp_unordered("!=", x, ir.Constant(x.type, None))
            return b.icmp_unsigned("!=", x, ir.Constant(x.type, None))
        if (src.is_int or src is DType.bool) and dst.is_int:  # bool: an unsigned i1
            target = self.vec(value_type(dst))
            width, wanted = x.type.element.width, target.element.width
            if wanted < width:
                return b.trunc(x, target)
            if wanted > width:
                return b.sext(x, target) if src.is_signed else b.zext(x, target)
            return x
        if src.is_float:
            if dst is DType.f16:  # round to half, computed in f32
                return b.fpext(b.fptrunc(x, self.vec(scalar.F16)), self.vec(scalar.F32))
            target = self.vec(value_type(dst))
            if target == x.type:
                return x
            return b.fpext(x, target) if dst is DType.f64 else b.fptrunc(x, target)
        convert = b.sitofp if src.is_signed else b.uitofp
        return convert(x, self.vec(value_type(dst)))


_FCMP = {"eq": "==", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ICMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

# Vector code with the semantics of the scalar tables (ember.codegen.scalar), for the ops
# that epilogues and packing use; a body with any other lane-varying op runs serially.
_UNARY: dict[tuple[str, str], Callable[[VectorBody, ir.Value], ir.Value]] = {
    ("neg", "float"): lambda v, x: v.b.fneg(x),
    ("abs", "float"): lambda v, x: v.intrinsic("llvm.fabs", x),
    ("sqrt", "float"): lambda v, x: v.intrinsic("llvm.sqrt", x),
    ("neg", "int"): lambda v, x: v.b.neg(x),
    ("not", "bool"): lambda v, x: v.b.not_(x),
}


def _icmp(cmp: str):
    return lambda v, t, x, y: (v.b.icmp_signed if t.is_signed else v.b.icmp_unsigned)(cmp, x, y)


_BINARY: dict[tuple[str, str], Callable[..., ir.Value]] = {
    ("add", "float"): lambda v, t, x, y: v.b.fadd(x, y),
    ("sub", "float"): lambda v, t, x, y: v.b.fsub(x, y),
    ("mul", "float"): lambda v, t, x, y: v.b.fmul(x, y),
    ("div", "float"): lambda v, t, x, y: v.b.fdiv(x, y),
    ("max", "float"): lambda v, t, x, y: scalar.FLOAT_BINARY["max"](v.b, t, x, y),
    ("min", "float"): lambda v, t, x, y: scalar.FLOAT_BINARY["min"](v.b, t, x, y),
    ("ne", "float"): lambda v, t, x, y: v.b.fcmp_unordered("!=", x, y),
    **{(op, "float"): lambda v, t, x, y, cmp=cmp: v.b.fcmp_ordered(cmp, x, y)
       for op, cmp in _FCMP.items()},
    ("add", "int"): lambda v, t, x, y: v.b.add(x, y),
    ("sub", "int"): lambda v, t, x, y: v.b.sub(x, y),
    ("mul", "int"): lambda v, t, x, y: v.b.mul(x, y),
    **{(op, "int"): _icmp(cmp) for op, cmp in _ICMP.items()},
    ("max", "int"): lambda v, t, x, y: v.b.select(_icmp(">")(v, t, x, y), x, y),
    ("min", "int"): lambda v, t, x, y: v.b.select(_icmp("<")(v, t, x, y), x, y),
    **{(op, family): lambda v, t, x, y, f=f: f(v.b, x, y)
       for op, f in (("bitwise_and", ir.IRBuilder.and_), ("bitwise_or", ir.IRBuilder.or_),
                     ("bitwise_xor", ir.IRBuilder.xor))
       for family in ("int", "bool")},
    ("and", "bool"): lambda v, t, x, y: v.b.and_(x, y),
    ("or", "bool"): lambda v, t, x, y: v.b.or_(x, y),
    ("xor", "bool"): lambda v, t, x, y: v.b.xor(x, y),
}


def emit_vectorized(em: KernelEmitter, s: For) -> None:
    """Emit vectorized loop `s` on vectors, as `plan_vector` (ember/loops/analysis.py)
    plans it; the verifier rejects any such loop that cannot be."""
    plan = vector_plan_in(em.kernel, s)
    if isinstance(plan, str):  # an unverified kernel: never run it serially in silence
        raise VerificationError(f"kernel @{em.kernel.name}: vectorized loop %{s.var.name}"
                                f" cannot run on lanes: {plan}")
    VectorBody(em, s, plan).emit()


# -- streaming stores ------------------------------------------------------------------------

STREAMING_BYTES = 16 << 20  # an output this large is not read back from the caches
STREAM_VECTOR_BYTES = 64  # a cache line: one aligned non-temporal vector store


def streaming_width(em: KernelEmitter, s: For) -> int | None:
    """The lanes of streaming-store vectors for serial loop `s`, or None when it is not a
    streaming loop: a loop of step 1 whose body is one store, contiguous in the loop's
    variable, to a parameter of at least STREAMING_BYTES, whose body vectorizes. Such a
    loop is a large elementwise kernel (or a thread's share of one): its stores bypass the
    caches (non-temporal), which saves reading each output line before writing it, a third
    of the memory traffic of a copy."""
    body = s.body
    if s.step != 1 or len(body) != 1 or not isinstance(body[0], Store):
        return None
    store = body[0]
    if store.buffer in em.local_names:
        return None
    buf = em.kernel.buffer(store.buffer)
    # (A size known at call time streams only where its bounds make it large for sure.)
    if not definitely(operator.ge, buf.nbytes, STREAMING_BYTES) or \
            STREAM_VECTOR_BYTES % buf.dtype.itemsize or \
            access_kind(store.index, s.var.name, buf.shape) != "contiguous" or \
            buf.dtype in (DType.bool, DType.bf16):
        return None
    return STREAM_VECTOR_BYTES // buf.dtype.itemsize


def emit_streaming(em: KernelEmitter, s: For, width: int, start: ir.Value,
                   stop: ir.Value) -> bool:
    """Run `s` (see `streaming_width`) from `start` to `stop` in three parts: serial
    iterations until the stored element is a cache line's start, aligned vectors of
    `width` lanes stored non-temporally while whole ones fit, serial iterations for the
    rest. Returns False (nothing emitted) when its body does not vectorize."""
    lane = Var(f"{s.var.name}.lane")
    at_lane = {s.var.name: s.var + lane}
    vector = For(lane, Const(0), Const(width),
                 [Store(st.buffer, tuple(substitute(i, at_lane) for i in st.index),
                        substitute(st.value, at_lane)) for st in s.body], 1, "vectorized")
    from ember.codegen.llvm import emit_while  # llvm imports this module

    plan = plan_vector(vector, em.local_names, em.shapes)
    if isinstance(plan, str):
        return False
    b = em.b
    store = s.body[0]
    counter = em.allocas.alloca(I64, name=s.var.name)
    b.store(start, counter)

    def misaligned(i: ir.Value) -> ir.Value:
        ptr, _ = em.element_ptr(store.buffer, store.index)
        off_line = b.and_(b.ptrtoint(ptr, I64), ir.Constant(I64, STREAM_VECTOR_BYTES - 1))
        return b.and_(b.icmp_signed("<", i, stop),
                      b.icmp_unsigned("!=", off_line, ir.Constant(I64, 0)))

    def serial() -> None:
        em.stmts(s.body)

    name = s.var.name
    with em.binding(name, counter):
        emit_while(b, counter, misaligned, serial, 1, f"{name}.peel")
        emit_while(b, counter,
                   lambda i: b.icmp_signed("<=", b.add(i, ir.Constant(I64, width)), stop),
                   VectorBody(em, vector, plan, streaming=True).emit, width, f"{name}.stream")
        emit_while(b, counter, lambda i: b.icmp_signed("<", i, stop), serial, 1, f"{name}.rest")
    # Non-temporal stores are weakly ordered: fence them before the loop's results are
    # used (by this thread's later code, or by another thread after the barrier).
    b.fence("seq_cst")
    return True
