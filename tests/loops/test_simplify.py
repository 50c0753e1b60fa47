"""Range-aware index simplification (ember/loops/simplify.py `simplify_kernel`): divisions
that inlined reshapes leave go away where the loop bounds allow, and every rewrite keeps
the value at every point of the loops' ranges."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ember.loops.analysis import access_kind, flatten_index
from ember.loops.cost import evaluate
from ember.loops.interp import LoopInterpreter
from ember.loops.ir import Binary, Const, Program, Select, Var
from ember.loops.simplify import simplify_access, simplify_index, simplify_kernel
from ember.loops.text import format_expr, parse_kernel, print_kernel

I, J = Var("i"), Var("j")
RANGES = {"i": (0, 4), "j": (0, 6)}  # inclusive


def e(op: str, a, b):
    return Binary(op, a, b if not isinstance(b, int) else Const(b))


FLAT = e("add", e("mul", I, 7), J)  # i * 7 + j, a flat position over [5, 7]

CASES = [
    (e("floordiv", FLAT, 7), "%i"),
    (e("mod", FLAT, 7), "%j"),
    (e("mod", I, 5), "%i"),  # already in [0, 5)
    (e("floordiv", J, 7), "0"),
    (e("floordiv", e("add", e("mul", I, 14), J), 7), "mul(%i, 2)"),
    # j - 1 may be negative: the quotient keeps a floor division, the remainder a mod.
    (e("floordiv", e("sub", FLAT, 1), 7), "add(%i, floordiv(add(%j, -1), 7))"),
    (e("mod", e("sub", FLAT, 1), 7), "mod(add(%j, -1), 7)"),
    (e("mod", e("add", I, 1), 5), "mod(add(%i, 1), 5)"),  # i + 1 reaches 5: kept
    (e("floordiv", e("mul", I, 3), 2), "floordiv(mul(%i, 3), 2)"),  # nothing to pull out
    # A factor of the divisor and of i's coefficient, j below it: floordiv(i * 7 + j, 14)
    # is floordiv(i, 2) (ConvNeXt's [56 * 56, 384] view of [56, 56, 384]).
    (e("floordiv", FLAT, 14), "floordiv(%i, 2)"),
    (e("mod", FLAT, 14), "add(mul(mod(%i, 2), 7), %j)"),
    (e("floordiv", e("add", FLAT, 1), 14), "floordiv(add(add(mul(%i, 7), %j), 1), 14)"),
    # A tile's rows left, min(30 - i * 6, 6), is 6 for every i in [0, 4]: whole tiles.
    (e("min", e("sub", Const(30), e("mul", I, 6)), 6), "6"),
    (e("max", e("sub", Const(30), e("mul", I, 6)), 6), "sub(30, mul(%i, 6))"),
    (e("min", e("sub", Const(29), e("mul", I, 6)), 6), "min(sub(29, mul(%i, 6)), 6)"),
    (e("max", J, e("add", I, 2)), "max(%j, add(%i, 2))"),  # the ranges overlap: kept
    (e("min", J, e("add", I, 6)), "%j"),
    # A packed panel's test lt(lane, columns left in the row) where whole panels fill it.
    (Select(e("lt", J, e("sub", Const(56), e("mul", I, 7))), I, J), "%i"),
    (Select(e("and", e("ge", J, 0), e("lt", J, e("add", I, 7))), I, J), "%i"),
    (Select(e("or", e("gt", J, 7), e("eq", I, 2)), I, J), "select(eq(%i, 2), %i, %j)"),
    (Select(e("ne", J, e("add", I, 7)), I, J), "%i"),
]


@pytest.mark.parametrize("expr, want", CASES)
def test_simplify_index(expr, want) -> None:
    got = simplify_index(expr, RANGES)
    assert format_expr(got) == want
    for i, j in itertools.product(range(5), range(7)):  # the same value everywhere
        assert evaluate(got, {"i": i, "j": j}) == evaluate(expr, {"i": i, "j": j})


RESHAPED = """kernel @k(%x: f32[4,6], %y: f32[2,4,3]) {
  for %a = 0 to 2 {
    for %b = 0 to 4 {
      for %c = 0 to 3 {
        %y[%a, %b, %c] = %x[floordiv(add(add(mul(%a, 12), mul(%b, 3)), %c), 6),
                            mod(add(add(mul(%a, 12), mul(%b, 3)), %c), 6)]
      }
    }
  }
}"""


def test_simplify_kernel_keeps_values_and_drops_what_it_can() -> None:
    kernel = parse_kernel(RESHAPED)
    simple = simplify_kernel(kernel)
    text = print_kernel(simple)
    # Alone, the row is a * 2 + floordiv(b * 3 + c, 6), and with c < 3 that is
    # floordiv(b, 2); but the flat position 12a + 3b + c has no division, so the access
    # keeps it (whole, code generation addresses it as one: simplify_access).
    assert "%x[floordiv(add(add(mul(%a, 12), mul(%b, 3)), %c), 6), " \
        "mod(add(add(mul(%a, 12), mul(%b, 3)), %c), 6)]" in text
    read = kernel.body[0].body[0].body[0].body[0].value.index
    assert simplify_access(read, (4, 6), {"a": (0, 1), "b": (0, 3), "c": (0, 2)}) == read
    flat = flatten_index(simple.body[0].body[0].body[0].body[0].value.index, (4, 6))
    assert [format_expr(x) for x in flat] == ["add(add(mul(%a, 12), mul(%b, 3)), %c)"]
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    for k in (kernel, simple):
        y = np.zeros((2, 4, 3), np.float32)
        LoopInterpreter(Program(k.name, [], [k], [])).call(k, [x, y])
        np.testing.assert_array_equal(y, x.reshape(2, 4, 3))


def test_a_reshaped_read_in_lane_blocks_stays_contiguous() -> None:
    """A [64, 56, 56] array read by its flat position in blocks of 16 lanes (GroupNorm's
    statistics over a whole group): dimension by dimension the channel simplifies to
    floordiv(64 * i + v, 196), which hides the flat position and made the lanes a gather
    (a 56-wide row is not a multiple of 16); the access keeps the flat position."""
    flat = e("add", e("mul", I, 1024), e("add", Var("l"), e("mul", Var("v"), 16)))
    index = (e("floordiv", flat, 3136), e("mod", e("floordiv", flat, 56), 56), e("mod", flat, 56))
    ranges = {"i": (0, 195), "v": (0, 63), "l": (0, 15)}
    alone = tuple(simplify_index(x, ranges) for x in index)
    assert format_expr(alone[0]) == "floordiv(add(mul(%i, 64), %v), 196)"
    assert access_kind(alone, "l", (64, 56, 56)) == "gather"
    kept = simplify_access(index, (64, 56, 56), ranges)
    assert access_kind(kept, "l", (64, 56, 56)) == "contiguous"
    for i, v, lane in itertools.product((0, 7, 195), (0, 63), (0, 15)):
        point = {"i": i, "v": v, "l": lane}
        assert [evaluate(x, point) for x in kept] == [evaluate(x, point) for x in index]
