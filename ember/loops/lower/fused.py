"""Lowering a `graph.fused` op to one kernel.

Every value of the region has a *source*: how to read it at an index. Region arguments
are loads of the kernel's input buffers; one-element constants are literals; elementwise
and index-map ops are inlined: their own lowering runs in a context that captures the
value function it passes to `store_each` instead of building a loop nest, and its operand
loads resolve through the sources of its operands. So `relu(x * w + b)` becomes one store
of `max(x[i] * w[i] + b[i], 0)`.

The kernel's structure comes from the group's kind (ember/graph/fusion/policy.py):

- injective: one nest over the output shape, storing every output;
- reduction / contraction: the root's own lowering, whose operand loads resolve through
  the sources (producers inlined into a reduction's loop) and whose single store of each
  result element is replaced by a store into a scalar, then the stores of the epilogue's
  outputs at that index (the epilogue reads the root's value from the scalar);
- row: a nest over the axes that are not reduced; inside it, each reduction in program
  order accumulates its row into a scalar, values of the reduced shape computed from them
  are kept in scalars as soon as they can be, then one nest over the row writes the
  outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ember.errors import UnsupportedOpError
from ember.graph.fusion.policy import FusionPlan, Refusal, classify, inlinable, reachable_from
from ember.graph.ir import Graph, Op, Value
from ember.loops.analysis import transcendental
from ember.loops.ir import (
    Binary,
    Buffer,
    Const,
    Expr,
    For,
    If,
    Load,
    Stmt,
    Store,
    Var,
    const,
    loads_in,
    map_expr,
    substitute,
    walk_expr,
)
from ember.loops.lower.core import LowerContext, find_lowering
from ember.loops.lower.ops.reduce import COMBINE, accumulate, narrow, widen

Source = Callable[[Sequence[Expr]], Expr]


class _OpContext(LowerContext):
    """The context of one member op: its loads resolve through the kernel's sources, and
    its locals and loop variables are the kernel's."""

    def __init__(self, op: Op, kernel: FusedKernel, input_names: Sequence[str] | None = None):
        super().__init__(op, kernel.ctx.target)
        self.kernel = kernel
        if input_names is not None:  # a root reading kernel parameters by name keeps working
            self.inputs = [Buffer(name, b.dtype, b.shape)
                           for name, b in zip(input_names, self.inputs)]

    def load(self, i: int, index: Sequence[Expr | int]) -> Expr:
        return self.kernel.read(self.op.operands[i], [_index(e) for e in index])

    def var(self, hint: str = "i") -> Var:
        return self.kernel.ctx.var(hint)

    def local(self, dtype, shape=()) -> Buffer:
        return self.kernel.ctx.local(dtype, shape)


class _InlineContext(_OpContext):
    """Runs an elementwise or index-map lowering for its value function, building nothing."""

    captured: Source | None = None

    def store_each(self, value, out: int = 0) -> list[Stmt]:
        if out != 0 or self.captured is not None:
            raise UnsupportedOpError(f"{self.op.where()}: cannot inline an op with several"
                                     " outputs")
        self.captured = value
        return []

    def nest(self, shape, body, kinds=None) -> list[Stmt]:
        raise UnsupportedOpError(f"{self.op.where()}: its lowering builds loops, so it cannot"
                                 " be inlined into a fused kernel")


def _index(e: Expr | int) -> Expr:
    return e if isinstance(e, Expr) else Const(int(e))


class FusedKernel:
    """The lowering of one fused op: `ctx` is the kernel's (parameters x0.. for operands,
    y0.. for results), `sources` say how to read each region value at an index."""

    def __init__(self, op: Op, graph: Graph, ctx: LowerContext):
        self.op = op
        self.ctx = ctx
        region = op.regions[0]
        self.region = region
        members = [m for m in region.ops if m.name != "constant"]
        plan = classify(members, region.outputs)
        if isinstance(plan, Refusal):
            raise UnsupportedOpError(f"{op.where()}: cannot lower: {plan.reason}")
        self.plan: FusionPlan = plan
        self.sources: dict[Value, Source] = {}
        for k, arg in enumerate(region.args):
            self.sources[arg] = lambda index, k=k: LowerContext.load(self.ctx, k, index)
        for member in region.ops:
            if member.name == "constant":
                data = graph.constant_data(member)
                literal = const(data.reshape(()).item(), member.result.dtype)
                self.sources[member.result] = lambda index, c=literal: c
            elif inlinable(member):
                self.sources[member.result] = self._inline(member)

    def read(self, value: Value, index: Sequence[Expr]) -> Expr:
        """The value of `value` at `index`, as an expression."""
        return self.sources[value](index)

    def _inline(self, member: Op) -> Source:
        fn = find_lowering(member.name)
        if fn is None:
            raise UnsupportedOpError(f"{member.where()}: no lowering to loops")
        sub = _InlineContext(member, self)
        if fn(sub) or sub.captured is None:
            raise UnsupportedOpError(f"{member.where()}: its lowering is not one value per"
                                     " element, so it cannot be inlined")
        return sub.captured

    # -- kinds ---------------------------------------------------------------------------------
    def lower(self) -> list[Stmt]:
        kind = self.plan.kind
        if kind == "injective":
            return self.ctx.nest(self.plan.shape, self.store_outputs)
        if kind == "row":
            return self.lower_row()
        return self.lower_rooted()

    def store_outputs(self, index: Sequence[Expr],
                      which: Sequence[int] | None = None) -> list[Stmt]:
        outputs = self.region.outputs
        picked = range(len(outputs)) if which is None else which
        return [Store(self.ctx.outputs[k].name, tuple(index), self.read(outputs[k], index))
                for k in picked]

    def lower_rooted(self) -> list[Stmt]:
        """A reduction or contraction root with its epilogue."""
        root = self.plan.root
        names = []
        for k, value in enumerate(root.operands):
            arg = next((i for i, a in enumerate(self.region.args) if a is value), None)
            names.append(f"x{arg}" if arg is not None else f"inlined{k}")
        rctx = _OpContext(root, self, names)
        rctx.outputs = [Buffer("root", root.result.dtype, root.result.shape)]
        fn = find_lowering(root.name)
        if fn is None:
            raise UnsupportedOpError(f"{root.where()}: no lowering to loops")
        scalar = self.ctx.local(root.result.dtype)
        self.sources[root.result] = lambda index: Load(scalar.name, (), scalar.dtype)
        body = fn(rctx)
        stores = 0

        def rewrite(stmts: list[Stmt]) -> list[Stmt]:
            nonlocal stores
            out: list[Stmt] = []
            for s in stmts:
                if isinstance(s, Store) and s.buffer == "root":
                    stores += 1
                    out.append(Store(scalar.name, (), s.value))
                    out.extend(self.store_outputs(s.index))
                elif isinstance(s, For):
                    out.append(replace(s, body=rewrite(s.body)))
                elif isinstance(s, If):
                    out.append(replace(s, then=rewrite(s.then), orelse=rewrite(s.orelse)))
                else:
                    out.append(s)
            return out

        # Each store of the result gets the epilogue at its index: right when every store
        # is of a final value (several are for parts of the output: Winograd's four
        # outputs of a tile), not when the result is read back (partial sums).
        if any(load.buffer == "root" for load in loads_in(body)):
            raise UnsupportedOpError(f"{root.where()}: its lowering reads its result back;"
                                     " an epilogue needs final values")
        body = rewrite(body)
        if stores == 0:
            raise UnsupportedOpError(f"{root.where()}: its lowering stores no result")
        return body

    def lower_row(self) -> list[Stmt]:
        plan = self.plan
        shape, axes = plan.shape, plan.axes
        rank = len(shape)
        outer_axes = [a for a in range(rank) if a not in axes]
        reduced = tuple(1 if a in axes else d for a, d in enumerate(shape))
        dependent = reachable_from(plan.reductions, self.region.ops) - set(plan.reductions)
        outputs = self.region.outputs
        full_outputs = [k for k, v in enumerate(outputs) if v.shape == shape]
        reduced_outputs = [k for k, v in enumerate(outputs) if v.shape != shape]

        def per_row(outer: list[Var]) -> list[Stmt]:
            at = dict(zip(outer_axes, outer))
            row_index = [at.get(a, Const(0)) for a in range(rank)]

            def full(inner: Sequence[Var]) -> list[Expr]:
                where = {**at, **dict(zip(axes, inner))}
                return [where[a] for a in range(rank)]

            stmts: list[Stmt] = []
            for member in self.region.ops:
                if member in plan.reductions:
                    stmts += self.reduce_row(member, [shape[a] for a in axes], full)
                elif member in dependent and member.result.shape == reduced:
                    stmts.append(self.keep_scalar(member, row_index))
            stmts += [Store(self.ctx.outputs[k].name, tuple(row_index),
                            self.read(outputs[k], row_index)) for k in reduced_outputs]
            if full_outputs:
                stmts += self.ctx.nest([shape[a] for a in axes],
                                       lambda inner: self.store_outputs(full(inner),
                                                                        full_outputs))
            return self.reuse_last_term(stmts)

        return self.ctx.nest([shape[a] for a in outer_axes], per_row)

    def reuse_last_term(self, stmts: list[Stmt]) -> list[Stmt]:
        """A row whose output pass recomputes what its last reduction summed (softmax's
        exp(x - max)) stores that term into the output during the reduction and reads it
        back, instead of computing it twice; and a division by a row scalar (the sum)
        becomes a multiplication by its reciprocal, computed once per row.

            for %i2 { %s = add(%s, exp(x - m)) }          for %i2 { %y[%i2] = exp(x - m)
            ...                                       ->            %s = add(%s, %y[%i2]) }
            for %i3 { %y[%i3] = div(exp(x - m), %t) }    %r = div(1, %t)
                                                          for %i3 { %y[%i3] = mul(%y[%i3], %r) }

        Only for one reduced axis, one full output and a term with a transcendental in it
        (recomputing a load or an add costs less than reading it back)."""
        last = stmts[-1] if stmts else None
        loops = [k for k, s in enumerate(stmts[:-1]) if isinstance(s, For)]
        if not (isinstance(last, For) and len(last.body) == 1 and
                isinstance(last.body[0], Store) and loops):
            return stmts
        reduction = stmts[loops[-1]]
        if len(reduction.body) != 1 or not isinstance(reduction.body[0], Store):
            return stmts
        out, step = last.body[0], reduction.body[0]
        if not (isinstance(step.value, Binary) and step.value.op == "add" and
                isinstance(step.value.a, Load) and step.value.a.buffer == step.buffer):
            return stmts
        term = step.value.b
        moved = substitute(term, {reduction.var.name: last.var})
        expensive = any(transcendental(x) for x in walk_expr(term))
        stored = next((b for b in self.ctx.outputs if b.name == out.buffer), None)
        if not expensive or stored is None or term.dtype is not stored.dtype or not any(
                x == moved for x in walk_expr(out.value)) or any(
                isinstance(x, Load) and x.buffer == out.buffer for x in walk_expr(out.value)):
            return stmts
        at = tuple(substitute(i, {last.var.name: reduction.var}) for i in out.index)
        stashed = Load(out.buffer, at, term.dtype)
        reduction = replace(reduction, body=[
            Store(out.buffer, at, term),
            Store(step.buffer, (), Binary("add", step.value.a, stashed))])
        value = map_expr(out.value, lambda x: Load(out.buffer, out.index, term.dtype)
                         if x == moved else None)
        prologue: list[Stmt] = []
        if (isinstance(value, Binary) and value.op == "div" and isinstance(value.b, Load)
                and not value.b.index and value.dtype.is_float):
            reciprocal = self.ctx.local(value.dtype)
            prologue = [Store(reciprocal.name, (), Binary("div", const(1.0, value.dtype),
                                                          value.b))]
            value = Binary("mul", value.a, Load(reciprocal.name, (), value.dtype))
        return [*stmts[:loops[-1]], reduction, *stmts[loops[-1] + 1:-1], *prologue,
                replace(last, body=[Store(out.buffer, out.index, value)])]

    def reduce_row(self, member: Op, extents: list[int],
                   full: Callable[[Sequence[Var]], list[Expr]]) -> list[Stmt]:
        """acc = combine over the row of the member's operand; the result kept in a scalar."""
        stmts, value = accumulate(
            self.ctx, COMBINE[member.name], member.operands[0].dtype.compute, extents,
            lambda inner: widen(self.read(member.operands[0], full(inner))))
        result = self.ctx.local(member.result.dtype)
        self.sources[member.result] = lambda index: Load(result.name, (), result.dtype)
        return [*stmts, Store(result.name, (), narrow(value, member.result.dtype))]

    def keep_scalar(self, member: Op, row_index: list[Expr]) -> Stmt:
        """Compute a reduced-shape value once per row, into a scalar its readers load."""
        value = self.read(member.result, row_index)
        scalar = self.ctx.local(member.result.dtype)
        self.sources[member.result] = lambda index: Load(scalar.name, (), scalar.dtype)
        return Store(scalar.name, (), value)


def lower_fused(op: Op, graph: Graph, ctx: LowerContext) -> tuple[
        list[Stmt], list[Buffer], list[Buffer], list[Buffer]]:
    """(body, inputs, outputs, locals) of the kernel of fused op `op`; `ctx` is the
    kernel's context (its parameters are the fused op's operands and results)."""
    kernel = FusedKernel(op, graph, ctx)
    body = kernel.lower()
    return body, kernel.ctx.inputs, kernel.ctx.outputs, kernel.ctx.locals

