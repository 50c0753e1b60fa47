"""Simplification of loop IR expressions: constant folding and affine index identities.

Applied as expressions are built (`ir.binary`) so that lowering can write index
arithmetic naively (`i * 1 + 0`) and still get clean IR: integer constants fold,
x + 0, x - 0, x * 1, x * 0, x // 1 and x % 1 disappear, constants move to the right of
commutative ops, and (x + c1) + c2 becomes x + (c1 + c2).
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.loops.ir import Binary, Const, Expr, const

COMMUTATIVE = {"add", "mul", "max", "min", "and", "or", "eq", "ne",
               "bitwise_and", "bitwise_or", "bitwise_xor"}

_INT_FOLD = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b if b else None,
    "mod": lambda a, b: a % b if b else None,
    "max": max,
    "min": min,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


def _int_const(e: Expr) -> int | None:
    if isinstance(e, Const) and e.dtype.is_int and not isinstance(e.value, bool):
        return int(e.value)
    return None


def simplify_binary(op: str, a: Expr, b: Expr) -> Expr:
    """Binary(op, a, b), simplified where that is exact for integer (index) arithmetic."""
    ca, cb = _int_const(a), _int_const(b)
    if ca is not None and cb is not None and a.dtype == b.dtype and op in _INT_FOLD:
        value = _INT_FOLD[op](ca, cb)
        if value is not None:
            return const(value, DType.bool if isinstance(value, bool) else a.dtype)
    if op in COMMUTATIVE and ca is not None and cb is None:
        a, b, ca, cb = b, a, cb, ca
    if a.dtype.is_int and cb is not None:
        if cb == 0 and op in ("add", "sub", "shl", "shr"):
            return a
        if cb == 1 and op in ("mul", "floordiv"):
            return a
        if cb == 0 and op == "mul":
            return b
        if cb == 1 and op == "mod":
            return Const(0, a.dtype)
        # (x + c1) + c2 -> x + (c1 + c2): keeps affine indices short.
        if op in ("add", "sub") and isinstance(a, Binary) and a.op == "add":
            inner = _int_const(a.b)
            if inner is not None:
                total = inner + cb if op == "add" else inner - cb
                return simplify_binary("add", a.a, Const(total, a.dtype))
    return Binary(op, a, b)
