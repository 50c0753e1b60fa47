"""Every unary and binary op of the loop IR has scalar code for each type family (float,
int, bool) that its graph op takes, and vector code (a vector
emitter entry or an f32 vmath function) unless it is listed as scalar-only here: an op
without vector code makes a vectorized loop that computes it on its lanes run serially, so
that must be a decision written down, not an omission."""

from __future__ import annotations

import pytest

from ember.codegen import scalar, vector, vmath
from ember.dtypes import FLOAT_TYPES, INT_TYPES, DType
from ember.graph.ops.elementwise import BINARY_OPS as GRAPH_BINARY
from ember.graph.ops.elementwise import UNARY_OPS as GRAPH_UNARY
from ember.loops.ir import BINARY_OPS, UNARY_OPS

SCALAR_UNARY = {"float": scalar.FLOAT_UNARY, "int": scalar.INT_UNARY, "bool": scalar.BOOL_UNARY}
SCALAR_BINARY = {"float": scalar.FLOAT_BINARY, "int": scalar.INT_BINARY,
                 "bool": scalar.BOOL_BINARY}
# The types of the loop-IR ops that are not elementwise graph ops of the same name.
LOOP_ONLY_TYPES = {
    "erfc": FLOAT_TYPES, "lgamma": FLOAT_TYPES,  # graph special ops, floats only
    "floordiv": FLOAT_TYPES | INT_TYPES,  # index arithmetic, and floor division of floats
}
VECTOR_UNARY = {op for op, _family in vector._UNARY} | set(vmath.FUNCTIONS)
VECTOR_BINARY = {op for op, _family in vector._BINARY}

# Ops with no vector code on any type: loops computing them on their lanes stay serial.
SCALAR_ONLY_UNARY = {
    # C library calls per element (directly or through an LLVM intrinsic), no vmath version.
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "erfc", "lgamma",
    # Inline scalar code without a vector entry yet.
    "rsqrt", "floor", "ceil", "round", "trunc", "sign", "isnan", "isinf", "bitwise_not",
}
SCALAR_ONLY_BINARY = {
    # pow and float remainders call the C library; integer division and shifts guard
    # their right operand per element.
    "floordiv", "mod", "fmod", "pow", "shl", "shr",
}


def families(op: str, graph_table: dict) -> set[str]:
    """The type families `op` takes: its graph op's allowed dtypes, else LOOP_ONLY_TYPES."""
    allowed = graph_table[op][1] if op in graph_table else LOOP_ONLY_TYPES.get(op)
    assert allowed is not None, f"say in LOOP_ONLY_TYPES which types loop op '{op}' takes"
    return {"bool" if t is DType.bool else "float" if t.is_float else "int" for t in allowed}


@pytest.mark.parametrize("op", sorted(UNARY_OPS))
def test_unary_op_has_scalar_code(op: str) -> None:
    missing = [f for f in sorted(families(op, GRAPH_UNARY)) if op not in SCALAR_UNARY[f]]
    assert not missing, f"'{op}' has no scalar code for {missing} (ember/codegen/scalar.py)"


@pytest.mark.parametrize("op", sorted(BINARY_OPS))
def test_binary_op_has_scalar_code(op: str) -> None:
    missing = [f for f in sorted(families(op, GRAPH_BINARY)) if op not in SCALAR_BINARY[f]]
    assert not missing, f"'{op}' has no scalar code for {missing} (ember/codegen/scalar.py)"


@pytest.mark.parametrize("op", sorted(UNARY_OPS))
def test_unary_op_has_vector_code_or_is_scalar_only(op: str) -> None:
    assert (op in VECTOR_UNARY) != (op in SCALAR_ONLY_UNARY), (
        f"'{op}': give it vector code (codegen/vector.py _UNARY or codegen/vmath.py) or list"
        " it in SCALAR_ONLY_UNARY; not both")


@pytest.mark.parametrize("op", sorted(BINARY_OPS))
def test_binary_op_has_vector_code_or_is_scalar_only(op: str) -> None:
    assert (op in VECTOR_BINARY) != (op in SCALAR_ONLY_BINARY), (
        f"'{op}': give it vector code (codegen/vector.py _BINARY) or list it in"
        " SCALAR_ONLY_BINARY; not both")


def test_scalar_only_lists_name_loop_ir_ops() -> None:
    assert SCALAR_ONLY_UNARY <= UNARY_OPS and SCALAR_ONLY_BINARY <= BINARY_OPS
