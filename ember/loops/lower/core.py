"""Lowering graph ops to loop-IR kernels: the registry and the context a lowering sees.

A lowering is `fn(ctx: LowerContext) -> list[Stmt]` registered for graph op names with
`@lowering("add", "sub")`. It writes the body of one kernel whose parameters are the op's
operands (`ctx.inputs`, named x0, x1, ...) followed by its results (`ctx.outputs`, y0,
y1, ...), using the helpers below: most ops say what the value at an output index is
(`ctx.store_each(lambda idx: ...)`), reductions and the like build their own nests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ember.dtypes import DType
from ember.errors import UnsupportedOpError
from ember.graph.ir import Op
from ember.loops.ir import (
    STATUS_DTYPE,
    Buffer,
    Const,
    Expr,
    For,
    If,
    Load,
    Stmt,
    Store,
    Var,
    as_expr,
    const,
)
from ember.target import Target

Lowering = Callable[["LowerContext"], list[Stmt]]
_LOWERINGS: dict[str, Lowering] = {}


def lowering(*opnames: str) -> Callable[[Lowering], Lowering]:
    """Register `fn` as the lowering of the graph ops `opnames`."""

    def register(fn: Lowering) -> Lowering:
        for name in opnames:
            assert name not in _LOWERINGS, f"two lowerings for graph.{name}"
            _LOWERINGS[name] = fn
        return fn

    return register


def find_lowering(opname: str) -> Lowering | None:
    from ember.loops.lower import ops  # noqa: F401  (registration)

    return _LOWERINGS.get(opname)


def lowered_ops() -> list[str]:
    from ember.loops.lower import ops  # noqa: F401

    return sorted(_LOWERINGS)


class LowerContext:
    """One graph op being lowered to one kernel for the compile's `target` (which no
    lowering reads now: lowerings write the algorithm, and the scheduling stage fits it to
    the target)."""

    def __init__(self, op: Op, target: Target):
        self.op = op
        self.target = target
        self.attrs = op.attrs
        self.inputs = [Buffer(f"x{i}", v.dtype, v.shape) for i, v in enumerate(op.operands)]
        self.outputs = [Buffer(f"y{i}", v.dtype, v.shape) for i, v in enumerate(op.results)]
        self.locals: list[Buffer] = []
        self._vars = 0
        # The op's result is given its first operand's memory (a scatter into a graph
        # input that the graph computes in place): that result holds the operand already.
        self.in_place = False
        self.status: Buffer | None = None  # the program's status word, once a check writes it

    def unsupported(self, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.op.where()}: cannot lower: {why}")

    # -- names ---------------------------------------------------------------------------------
    def var(self, hint: str = "i") -> Var:
        self._vars += 1
        return Var(f"{hint}{self._vars - 1}")

    def local(self, dtype: DType, shape: Sequence[int] = ()) -> Buffer:
        buffer = Buffer(f"t{len(self.locals)}", dtype, tuple(shape))
        self.locals.append(buffer)
        return buffer

    # -- expressions -------------------------------------------------------------------------
    def load(self, i: int, index: Sequence[Expr | int]) -> Load:
        """Operand `i` at `index` (one entry per dim)."""
        buffer = self.inputs[i]
        return Load(buffer.name, tuple(_expr(e) for e in index), buffer.dtype)

    def load_broadcast(self, i: int, out_index: Sequence[Expr]) -> Load:
        """Operand `i` at the output index, under NumPy broadcasting (size-1 dims read 0)."""
        shape = self.inputs[i].shape
        tail = list(out_index)[len(out_index) - len(shape):] if shape else []
        return self.load(i, [Const(0) if d == 1 else e for d, e in zip(shape, tail)])

    @staticmethod
    def const(value: Any, dtype: DType) -> Const:
        return const(value, dtype)

    # -- statements ----------------------------------------------------------------------------
    def fail_if(self, cond: Expr, failure: int) -> If:
        """A statement writing `failure` (ember.loops.ir.CHECK_FAILURES) to the program's
        status word where `cond` holds: the kernel takes the word as its last parameter."""
        if self.status is None:
            self.status = Buffer("status", STATUS_DTYPE, ())
        return If(cond, [Store(self.status.name, (), Const(failure, STATUS_DTYPE))])

    @property
    def params(self) -> list[Buffer]:
        """The kernel's parameters: the operands, the results, then the status word if a
        check writes it."""
        return [*self.inputs, *self.outputs, *([self.status] if self.status else [])]

    def nest(self, shape: Sequence[int], body: Callable[[list[Var]], list[Stmt]],
             kinds: Sequence[str] | None = None) -> list[Stmt]:
        """Loops over `shape` (outermost first) around body(index variables)."""
        index = [self.var() for _ in shape]
        stmts = body(index)
        for depth in reversed(range(len(shape))):
            kind = kinds[depth] if kinds else "serial"
            stmts = [For(index[depth], Const(0), as_expr(shape[depth]), stmts, 1, kind)]
        return stmts

    def store_each(self, value: Callable[[list[Var]], Expr], out: int = 0) -> list[Stmt]:
        """Store value(index) at every index of output `out`: the shape of most ops."""
        buffer = self.outputs[out]

        def body(index: list[Var]) -> list[Stmt]:
            return [Store(buffer.name, tuple(index), value(index))]

        return self.nest(buffer.shape, body)


def _expr(e: Expr | int) -> Expr:
    return as_expr(e)
