"""Simplification of loop IR expressions: constant folding and affine index identities.

Applied as expressions are built (`ir.binary`) so that lowering can write index
arithmetic naively (`i * 1 + 0`) and still get clean IR: integer constants fold,
x + 0, x - 0, x * 1, x * 0, x // 1 and x % 1 disappear, constants move to the right of
commutative ops, and (x + c1) + c2 becomes x + (c1 + c2).

`simplify_kernel` then uses what the loop bounds say about each variable's range to
remove the divisions that inlined reshapes leave (a fused kernel reading a [128, 3072]
buffer through a flat view): with 0 <= j < 3072,

    floordiv(add(mul(%i, 3072), %j), 3072) -> %i       mod(add(mul(%i, 3072), %j), 3072) -> %j

(a term whose coefficient the divisor divides leaves the remainder and joins the quotient;
a rest whose range lies in [0, d) is its own remainder and has quotient 0). Indices without
divisions are affine, which is what vector code and LLVM's vectorizer need. The same
ranges decide the bounds that schedules write for partial tiles (`min(rows left, mr)`)
and the tests of their packing (`lt(lane, columns left)`) where every tile is whole: a
constant trip count, and a plain load instead of a select.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ember.dtypes import DType
from ember.loops.analysis import affine_sum, affine_terms
from ember.loops.ir import (
    INDEX,
    Binary,
    Const,
    Expr,
    For,
    If,
    Kernel,
    Load,
    Prefetch,
    Select,
    Stmt,
    Store,
    binary,
    const,
)

COMMUTATIVE = {"add", "mul", "max", "min", "and", "or", "eq", "ne",
               "bitwise_and", "bitwise_or", "bitwise_xor"}

INT_FOLD = {
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
    if ca is not None and cb is not None and a.dtype == b.dtype and op in INT_FOLD:
        value = INT_FOLD[op](ca, cb)
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
    if op == "add" and a.dtype is INDEX and (whole := _regrouped(a, b)) is not None:
        return whole
    return Binary(op, a, b)


def _regrouped(a: Expr, b: Expr) -> Expr | None:
    """x for floordiv(x, d) * d + mod(x, d) (in either order): floor division's identity,
    which a reshape's index leaves when it regroups dims by a size known only at call time
    (by a constant, the ranges remove both divisions)."""
    for high, low in ((a, b), (b, a)):
        if isinstance(high, Binary) and high.op == "mul" and isinstance(low, Binary) and \
                low.op == "mod":
            for q, d in ((high.a, high.b), (high.b, high.a)):
                if isinstance(q, Binary) and q.op == "floordiv" and q.a == low.a and \
                        q.b == d == low.b:
                    return low.a
    return None


# -- range-aware simplification of a kernel's indices ----------------------------------------

Ranges = dict[str, tuple[int, int]]  # loop variable -> inclusive [lo, hi]


def _divide(op: str, a: Expr, d: int, ranges: Ranges) -> Expr | None:
    """floordiv(a, d) or mod(a, d) without the division where the ranges allow."""
    from ember.loops.verify import interval

    terms = affine_terms(a)
    scaled = _common_factor(op, terms, d, ranges)
    if scaled is not None:
        return scaled
    whole = [(c // d, t) for c, t in terms if c % d == 0]
    rest = [(c, t) for c, t in terms if c % d]
    if not whole and (span := interval(a, ranges)) is not None and not 0 <= span[0] <= span[1] < d:
        return None  # nothing to pull out, and not already in [0, d): keep the division
    remainder = affine_sum(rest)
    span = interval(remainder, ranges)
    inside = span is not None and 0 <= span[0] and span[1] < d
    if op == "mod":
        return remainder if inside else Binary("mod", remainder, Const(d)) if whole else None
    quotient = affine_sum(whole)
    if inside:
        return quotient
    return binary("add", quotient, Binary("floordiv", remainder, Const(d))) if whole else None


def _common_factor(op: str, terms: list, d: int, ranges: Ranges) -> Expr | None:
    """floordiv(g * h + low, g * k) = floordiv(h, k) and mod(g * h + low, g * k) =
    mod(h, k) * g + low, for a factor g > 1 of d and of the coefficients of the terms in
    h, when low lies in [0, g): a reshape that merges dims and one that splits them again
    (a [56 * 56, 384] view of a [56, 56, 384] array read as [3136, 384]: floordiv(384 * i
    + j, 21504) with 0 <= j < 384 is floordiv(i, 56))."""
    from ember.loops.verify import interval

    for g in sorted({math.gcd(c, d) for c, _ in terms}, reverse=True):
        if g in (1, d):
            continue
        high = [(c // g, t) for c, t in terms if c % g == 0]
        low = [(c, t) for c, t in terms if c % g]
        span = interval(affine_sum(low), ranges) if low else (0, 0)
        if not high or span is None or not 0 <= span[0] <= span[1] < g:
            continue
        inner = affine_sum(high)
        divided = _divide(op, inner, d // g, ranges) or Binary(op, inner, Const(d // g))
        if op == "floordiv":
            return divided
        return binary("add", binary("mul", divided, Const(g)), affine_sum(low)) if low \
            else binary("mul", divided, Const(g))
    return None


def simplify_index(e: Expr, ranges: Ranges, shapes: Mapping[str, tuple] | None = None) -> Expr:
    """`e` with floordiv and mod by positive constants removed where `ranges` allow; each
    min or max whose operands' ranges decide it replaced by the operand it picks (a
    tile's `min(rows left, mr)` where every tile is whole), and each comparison they
    decide by its value, with the selects and logic that it decides. The loads of buffers
    whose `shapes` are given are simplified as accesses (`simplify_access`)."""
    from ember.loops.ir import map_expr, walk_expr
    from ember.loops.verify import interval

    if not any(_decidable(x) for x in walk_expr(e)):
        return e  # nothing the ranges could decide: skip rebuilding the tree

    def access(x: Expr) -> Expr | None:
        if isinstance(x, Load) and shapes is not None and x.buffer in shapes:
            return Load(x.buffer, simplify_access(x.index, shapes[x.buffer], ranges, shapes),
                        x.dtype)
        return None

    def node(x: Expr) -> Expr | None:
        if isinstance(x, Select):
            return _chosen(x)
        if not isinstance(x, Binary):
            return None
        if x.op in COMPARISONS and x.a.dtype is INDEX:
            a, b = interval(x.a, ranges), interval(x.b, ranges)
            if a is not None and b is not None:
                return _compared(x.op, a, b)
        if x.op in ("and", "or"):
            return _logic(x)
        if x.dtype is not INDEX:
            return None
        if x.op in ("floordiv", "mod"):
            d = _int_const(x.b)
            if d is not None and d > 0:
                return _divide(x.op, x.a, d, ranges)
        elif x.op in ("min", "max"):
            a, b = interval(x.a, ranges), interval(x.b, ranges)
            if a is not None and b is not None:
                smaller, larger = (x.a, x.b) if a[1] <= b[0] else \
                    (x.b, x.a) if b[1] <= a[0] else (None, None)
                if smaller is not None:
                    return smaller if x.op == "min" else larger
        return None

    return map_expr(e, node, access)


def simplify_access(index: Sequence[Expr], shape: Sequence, ranges: Ranges,
                    shapes: Mapping[str, tuple] | None = None) -> tuple[Expr, ...]:
    """An index into a buffer of `shape`, simplified (`simplify_index`) without losing the
    flat position that dimensions split by it share (`merged_dims`): a reshape of a
    [64, 56, 56] array read as [200704] in blocks of 16 indexes it by [floordiv(f, 3136),
    mod(floordiv(f, 56), 56), mod(f, 56)] with f = 1024 * i + 16 * v + lane, and
    simplifying each dimension alone gives floordiv(64 * i + v, 196) for the first, which
    no longer shows f, so the lanes would be gathered. Where dimensions alone keep a
    division, a group whose flat position simplifies to one without any is split from it
    again in the form `merged_dims` recognizes, and code generation addresses f. (Loads
    in the index, of buffers whose `shapes` are given, are accesses too.)"""
    from ember.loops.analysis import merged_dims

    simple = tuple(simplify_index(i, ranges, shapes) for i in index)
    if not any(_has_division(i) for i in simple):
        return simple
    flat, _, counts = merged_dims(index, shape)
    if len(flat) == len(index):
        return simple
    out: list[Expr] = []
    for position, count in zip(flat, counts):
        at = len(out)
        group = shape[at:at + count]
        position = simplify_index(position, ranges, shapes)
        if count == 1 or _has_division(position) or \
                not all(isinstance(d, int) and d > 1 for d in group):
            out.extend(simple[at:at + count])
        else:
            out.extend(_split(position, group))
    return tuple(out)


def _split(position: Expr, extents: Sequence[int]) -> list[Expr]:
    """A flat position's row-major index in `extents`, as `merged_dims` merges it back."""
    inner = math.prod(extents[1:])
    out: list[Expr] = [Binary("floordiv", position, Const(inner))]
    for extent in extents[1:-1]:
        inner //= extent
        out.append(Binary("mod", Binary("floordiv", position, Const(inner)), Const(extent)))
    out.append(Binary("mod", position, Const(extents[-1])))
    return out


def _has_division(e: Expr) -> bool:
    from ember.loops.ir import walk_expr

    return any(isinstance(x, Binary) and x.op in ("floordiv", "mod") for x in walk_expr(e))


COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


def _decidable(x: Expr) -> bool:
    """Whether ranges could decide `x`: a division, min or max of indices, or a comparison
    of them (the selects and logic around one follow it). A float max (a ReLU) is not."""
    if not isinstance(x, Binary):
        return False
    if x.op in COMPARISONS:
        return x.a.dtype is INDEX
    return x.op in ("floordiv", "mod", "min", "max") and x.dtype is INDEX


def _compared(op: str, a: tuple[int, int], b: tuple[int, int]) -> Const | None:
    """The comparison `a op b` of two ranges when it holds for all or none of their
    values (a panel's `lt(lane, columns left in the row)` where the row holds every
    panel whole)."""
    if op in ("gt", "ge"):
        op, a, b = {"gt": "lt", "ge": "le"}[op], b, a
    if op == "lt":
        value = True if a[1] < b[0] else False if a[0] >= b[1] else None
    elif op == "le":
        value = True if a[1] <= b[0] else False if a[0] > b[1] else None
    else:
        apart = a[1] < b[0] or b[1] < a[0]
        same = a[0] == a[1] == b[0] == b[1]
        value = (same if op == "eq" else apart) if same or apart else None
    return None if value is None else Const(value, DType.bool)


def _logic(x: Binary) -> Expr | None:
    """and/or with a constant side: the other side, or the constant."""
    for known, other in ((x.a, x.b), (x.b, x.a)):
        if isinstance(known, Const) and known.dtype is DType.bool:
            if bool(known.value) == (x.op == "and"):
                return other  # and(true, y), or(false, y)
            return known  # and(false, y), or(true, y)
    return None


def _chosen(x: Select) -> Expr | None:
    if isinstance(x.cond, Const) and x.cond.dtype is DType.bool:
        return x.a if x.cond.value else x.b
    return None


def simplify_kernel(kernel: Kernel) -> Kernel:
    """`kernel` with every expression's index arithmetic simplified by the ranges of the
    loops around it (`simplify_index`)."""
    from ember.loops.verify import interval

    shapes = {b.name: tuple(b.shape) for b in (*kernel.params, *kernel.locals)}

    def block(stmts: list[Stmt], ranges: Ranges) -> list[Stmt]:
        out: list[Stmt] = []
        for s in stmts:
            if isinstance(s, For):
                start, stop = simplify_index(s.start, ranges), simplify_index(s.stop, ranges)
                inner = dict(ranges)
                low, high = interval(start, ranges), interval(stop, ranges)
                if s.step == 1 and low is not None and high is not None and low[0] < high[1]:
                    inner[s.var.name] = (low[0], high[1] - 1)
                else:
                    inner.pop(s.var.name, None)
                out.append(replace(s, start=start, stop=stop, body=block(s.body, inner)))
            elif isinstance(s, If):
                cond = simplify_index(s.cond, ranges)
                if isinstance(cond, Const):  # decided by the ranges: the branch it takes
                    out.extend(block(s.then if cond.value else s.orelse, ranges))
                else:
                    out.append(If(cond, block(s.then, ranges), block(s.orelse, ranges)))
            elif isinstance(s, Prefetch):
                out.append(Prefetch(s.buffer, simplify_access(s.index, shapes[s.buffer], ranges,
                                                              shapes)))
            else:
                index = simplify_access(s.index, shapes[s.buffer], ranges, shapes) \
                    if s.buffer in shapes else tuple(simplify_index(i, ranges) for i in s.index)
                out.append(Store(s.buffer, index, simplify_index(s.value, ranges, shapes)))
        return out

    return replace(kernel, body=block(kernel.body, {}))
