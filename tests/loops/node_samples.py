"""One small kernel per loop-IR node kind, with the values it must compute.

The completeness tests (tests/loops/test_node_coverage.py, tests/codegen/test_node_coverage.py)
run every module that walks the loop IR over these samples, so a module that lacks a kind
fails there. A new expression or statement kind needs a sample here; a test checks that
every class of ember/loops/ir.py has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ember.dtypes import DType
from ember.loops import ir
from ember.loops.ir import (
    INDEX,
    Binary,
    Bitcast,
    Buffer,
    Cast,
    Const,
    Expr,
    Fma,
    For,
    If,
    Kernel,
    Load,
    Prefetch,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    const,
)

N = 8
F32 = DType.f32
I = Var("i")
# The simplifier turns this index into %i (i ranges over [0, N)): a sample built with it
# simplifies to the same sample built with %i exactly when every walk reaches the load.
REDUNDANT_INDEX = Binary("mod", I, Const(N))


def x_at(index: Expr) -> Load:
    return Load("x", (index,), F32)


@dataclass(frozen=True)
class Sample:
    """A kernel over x: f32[N] writing y[N] (zero before), built around the index it reads
    x at, and what y holds after it runs."""

    out: DType
    body: Callable[[Expr], list[Stmt]]
    expected: Callable[[np.ndarray], np.ndarray]

    def kernel(self, index: Expr = I) -> Kernel:
        return Kernel("sample", [Buffer("x", F32, (N,)), Buffer("y", self.out, (N,))],
                      self.body(index))


def _each(value: Callable[[Expr], Expr]) -> Callable[[Expr], list[Stmt]]:
    """for %i { %y[%i] = value(x read at the index) }"""
    return lambda index: [For(I, Const(0), Const(N), [Store("y", (I,), value(x_at(index)))])]


ONE = const(1.0, F32)

EXPR_SAMPLES: dict[type, Sample] = {
    Const: Sample(F32, _each(lambda x: const(2.5, F32)), lambda x: np.full_like(x, 2.5)),
    Var: Sample(INDEX, _each(lambda x: I), lambda x: np.arange(N)),
    Load: Sample(F32, _each(lambda x: x), lambda x: x),
    Unary: Sample(F32, _each(lambda x: Unary("exp", x)), np.exp),
    Binary: Sample(F32, _each(lambda x: Binary("add", x, ONE)), lambda x: x + 1),
    Select: Sample(F32, _each(lambda x: Select(Binary("lt", x, const(0.0, F32)), x, ONE)),
                   lambda x: np.where(x < 0, x, 1)),
    Fma: Sample(F32, _each(lambda x: Fma(x, x, ONE)), lambda x: x * x + 1),
    Cast: Sample(DType.i32, _each(lambda x: Cast(DType.i32, x)), lambda x: x.astype(np.int32)),
    Bitcast: Sample(DType.i32, _each(lambda x: Bitcast(DType.i32, x)),
                    lambda x: x.view(np.int32)),
}


def _from_two(index: Expr) -> list[Stmt]:
    return [For(I, Const(2), Const(N), [Store("y", (I,), x_at(index))], kind="unrolled")]


def _abs_by_if(index: Expr) -> list[Stmt]:
    x = x_at(index)
    return [For(I, Const(0), Const(N), [If(Binary("lt", x, const(0.0, F32)),
                                           [Store("y", (I,), Unary("neg", x))],
                                           [Store("y", (I,), x)])])]


def _prefetch_then_copy(index: Expr) -> list[Stmt]:
    return [For(I, Const(0), Const(N), [Prefetch("x", (index,)), Store("y", (I,), x_at(I))])]


def _skip_two(x: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros(2, x.dtype), x[2:]])


STMT_SAMPLES: dict[type, Sample] = {
    For: Sample(F32, _from_two, _skip_two),
    Store: Sample(F32, _each(lambda x: x), lambda x: x),
    If: Sample(F32, _abs_by_if, np.abs),
    Prefetch: Sample(F32, _prefetch_then_copy, lambda x: x),  # a hint: no value changes
}

SAMPLES = {**EXPR_SAMPLES, **STMT_SAMPLES}


def kinds(base: type) -> set[type]:
    """The node classes of ember/loops/ir.py derived from `base`."""
    return {c for c in vars(ir).values()
            if isinstance(c, type) and issubclass(c, base) and c is not base}


def inputs() -> np.ndarray:
    return np.linspace(-2.0, 2.0, N, dtype=np.float32)
