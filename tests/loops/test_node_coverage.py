"""Every loop-IR expression and statement kind is handled by every module that walks the
loop IR: the printer and parser, the verifier, the interpreter and the simplifier (the
scalar code generator: tests/codegen/test_node_coverage.py). Each module dispatches on the
node's class, so these tests run it on one sample per class (tests/loops/node_samples.py):
a module without a branch for a kind raises, returns a wrong value or leaves the kind's
operands unvisited, and the test of that kind fails."""

from __future__ import annotations

import numpy as np
import pytest

from ember.loops.interp import LoopInterpreter
from ember.loops.ir import Expr, Program, Stmt, stmt_exprs, walk_expr, walk_stmts
from ember.loops.simplify import simplify_kernel
from ember.loops.text import parse_kernel, print_kernel
from ember.loops.verify import verify_kernel
from tests.loops.node_samples import (
    EXPR_SAMPLES,
    REDUNDANT_INDEX,
    SAMPLES,
    STMT_SAMPLES,
    inputs,
    kinds,
)

KINDS = sorted(SAMPLES, key=lambda c: c.__name__)


def test_every_node_kind_has_a_sample() -> None:
    assert set(EXPR_SAMPLES) == kinds(Expr), "add a sample to tests/loops/node_samples.py"
    assert set(STMT_SAMPLES) == kinds(Stmt), "add a sample to tests/loops/node_samples.py"


@pytest.mark.parametrize("kind", KINDS, ids=lambda c: c.__name__)
def test_the_sample_contains_its_kind(kind: type) -> None:
    kernel = SAMPLES[kind].kernel()
    found = {type(s) for s in walk_stmts(kernel.body)}
    found |= {type(x) for s in walk_stmts(kernel.body) for e in stmt_exprs(s)
              for x in walk_expr(e)}
    assert kind in found


@pytest.mark.parametrize("kind", KINDS, ids=lambda c: c.__name__)
def test_printer_and_parser_round_trip(kind: type) -> None:
    kernel = SAMPLES[kind].kernel(REDUNDANT_INDEX)
    text = print_kernel(kernel)
    assert parse_kernel(text) == kernel, text


@pytest.mark.parametrize("kind", KINDS, ids=lambda c: c.__name__)
def test_verifier_accepts(kind: type) -> None:
    verify_kernel(SAMPLES[kind].kernel(REDUNDANT_INDEX))


@pytest.mark.parametrize("kind", KINDS, ids=lambda c: c.__name__)
def test_interpreter_computes(kind: type) -> None:
    sample = SAMPLES[kind]
    kernel = sample.kernel(REDUNDANT_INDEX)
    x, y = inputs(), np.zeros(kernel.params[1].shape, kernel.params[1].dtype.np)
    LoopInterpreter(Program(kernel.name, [], [kernel], [])).call(kernel, [x, y])
    np.testing.assert_allclose(y, sample.expected(x), rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS, ids=lambda c: c.__name__)
def test_simplifier_reaches_every_operand(kind: type) -> None:
    sample = SAMPLES[kind]
    assert simplify_kernel(sample.kernel(REDUNDANT_INDEX)) == sample.kernel()
