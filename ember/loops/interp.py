"""A scalar interpreter for loop-IR programs, in Python: slow, simple, and exact enough to
test lowerings on small shapes without going through LLVM.

Values are NumPy scalars of each expression's dtype; f16/bf16 compute in f32 and round at
stores and casts, as the generated code does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ember.dtypes import DType
from ember.errors import DataError, InterpreterError
from ember.graph.ops.elementwise import BINARY_OPS as GRAPH_BINARY
from ember.graph.ops.elementwise import UNARY_OPS as GRAPH_UNARY
from ember.graph.ops.elementwise import float_to_int
from ember.graph.ops.registry import get_opdef
from ember.loops.ir import (
    Binary,
    Bitcast,
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
    ProgramIf,
    ProgramLoop,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    failure_message,
)

_HALF = (DType.f16, DType.bf16)
# Unary ops that are graph special ops computed in f64 (lgamma, erfc), like generated code.
F64_UNARY = ("lgamma", "erfc")


def _compute_type(dtype: DType) -> np.dtype:
    return np.dtype(np.float32) if dtype in _HALF else dtype.np


def _scalar(value, dtype: DType):
    with np.errstate(all="ignore"):
        return np.asarray(value).astype(_compute_type(dtype))[()]


def _unary(op: str, a):
    if op == "not":
        return np.logical_not(a)
    if op == "bitwise_not":
        return np.invert(a)
    fn = GRAPH_UNARY[op][0] if op in GRAPH_UNARY else None
    if fn is None:
        raise InterpreterError(f"loop interpreter: unknown unary op {op}")
    with np.errstate(all="ignore"):
        return fn(np.asarray(a))[()]


def _binary(op: str, a, b, dtype: DType):
    if op == "floordiv":
        with np.errstate(all="ignore"):
            return np.floor_divide(a, b) if b != 0 or dtype.is_float else 0
    if op in ("div", "mod", "fmod") and dtype.is_int and b == 0:
        return _scalar(0, dtype)  # as the reference and the generated code do
    fn = GRAPH_BINARY[op][0]
    with np.errstate(all="ignore"):
        return fn(np.asarray(a), np.asarray(b))[()]


class LoopInterpreter:
    def __init__(self, program: Program):
        self.program = program

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        p = self.program
        memory: dict[str, np.ndarray] = {}
        for buffer, array in zip(p.of_kind("input"), inputs):
            memory[buffer.name] = np.array(array, dtype=buffer.dtype.np)
        for buffer in p.of_kind("constant"):
            memory[buffer.name] = np.array(p.constants[buffer.name], dtype=buffer.dtype.np)
        for buffer in (*p.of_kind("output"), *p.of_kind("temp"), *p.of_kind("status")):
            memory[buffer.name] = np.zeros(buffer.shape, buffer.dtype.np)
        self.statuses = {b.name for b in p.of_kind("status")}
        self.steps(p.steps, memory)
        return [memory[b.name] for b in p.of_kind("output")]

    def steps(self, steps, memory) -> None:
        for step in steps:
            if isinstance(step, Call):
                kernel = self.program.kernel(step.kernel)
                self.call(kernel, [memory[a] for a in step.args])
                failed = next((int(memory[a]) for a in step.args if a in self.statuses
                               and memory[a]), 0)
                if failed:  # (as the compiled entry returns after the call)
                    raise DataError(failure_message(
                        self.program.name, [kernel.origin or kernel.name], failed))
            elif isinstance(step, ProgramIf):
                self.steps(step.then if bool(memory[step.cond]) else step.orelse, memory)
            elif isinstance(step, ProgramLoop):
                memory[step.counter][()] = 0
                while int(memory[step.counter]) < int(memory[step.trip_count]) and \
                        bool(memory[step.cond]):
                    self.steps(step.body, memory)
                    memory[step.counter][()] += 1

    def call(self, kernel: Kernel, args: list[np.ndarray]) -> None:
        buffers = {b.name: a for b, a in zip(kernel.params, args)}
        for b in kernel.locals:
            buffers[b.name] = np.zeros(b.shape, b.dtype.np)
        self.block(kernel.body, buffers, {})

    def block(self, stmts: Sequence[Stmt], buffers, env) -> None:
        for s in stmts:
            if isinstance(s, For):
                start, stop = int(self.eval(s.start, buffers, env)), int(
                    self.eval(s.stop, buffers, env))
                for i in range(start, stop, s.step):
                    env[s.var.name] = i
                    self.block(s.body, buffers, env)
            elif isinstance(s, Store):
                index = tuple(int(self.eval(e, buffers, env)) for e in s.index)
                target = buffers[s.buffer]
                if any(not 0 <= i < d for i, d in zip(index, target.shape)):
                    raise InterpreterError(f"store to %{s.buffer}{list(index)} is out of"
                                           f" bounds {list(target.shape)}")
                with np.errstate(all="ignore"):
                    target[index] = np.asarray(self.eval(s.value, buffers, env)).astype(
                        target.dtype)
            elif isinstance(s, If):
                branch = s.then if bool(self.eval(s.cond, buffers, env)) else s.orelse
                self.block(branch, buffers, env)

    def eval(self, e: Expr, buffers, env):
        if isinstance(e, Const):
            return _scalar(e.value, e.dtype)
        if isinstance(e, Var):
            return np.int64(env[e.name])
        if isinstance(e, Load):
            index = tuple(int(self.eval(i, buffers, env)) for i in e.index)
            source = buffers[e.buffer]
            if any(not 0 <= i < d for i, d in zip(index, source.shape)):
                raise InterpreterError(f"load of %{e.buffer}{list(index)} is out of bounds"
                                       f" {list(source.shape)}")
            return _scalar(source[index], e.dtype)
        if isinstance(e, Unary):
            a = self.eval(e.a, buffers, env)
            if e.op in F64_UNARY:  # the graph op's reference, in f64
                return _scalar(get_opdef(e.op).reference(np.asarray(a, np.float64)), e.dtype)
            return _scalar(_unary(e.op, a), e.dtype)
        if isinstance(e, Binary):
            a, b = self.eval(e.a, buffers, env), self.eval(e.b, buffers, env)
            return _scalar(_binary(e.op, a, b, e.a.dtype), e.dtype)
        if isinstance(e, Select):
            cond = bool(self.eval(e.cond, buffers, env))
            return self.eval(e.a if cond else e.b, buffers, env)
        if isinstance(e, Fma):  # rounded twice; generated code may round once
            a, b, c = (self.eval(x, buffers, env) for x in (e.a, e.b, e.c))
            return _scalar(_binary("add", _binary("mul", a, b, e.dtype), c, e.dtype), e.dtype)
        if isinstance(e, Cast):
            value = self.eval(e.a, buffers, env)
            if e.dtype is DType.bool:
                return np.bool_(value != 0)
            if e.dtype.is_int and e.a.dtype.is_float:
                return _scalar(float_to_int(np.asarray(value), e.dtype), e.dtype)
            rounded = np.asarray(value).astype(e.dtype.np)  # round to the (half) type
            return _scalar(rounded, e.dtype)
        if isinstance(e, Bitcast):
            # Narrow to the source type first: halves are held widened to f32 here.
            bits = np.asarray(self.eval(e.a, buffers, env)).astype(e.a.dtype.np)
            if e.dtype is DType.bool:
                return np.bool_(bits.view(np.uint8) != 0)
            return _scalar(bits.view(e.dtype.np), e.dtype)
        raise TypeError(e)


def run_program(program: Program, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Interpret `program` on `inputs`; returns its outputs."""
    return LoopInterpreter(program).run(inputs)
