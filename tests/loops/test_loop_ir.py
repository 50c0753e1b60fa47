"""The loop IR's text form and verifier."""

from __future__ import annotations

import pytest

from ember import ParseError, VerificationError
from ember.loops.text import parse_kernel, parse_program, print_kernel, print_program
from ember.loops.verify import verify_kernel, verify_program

ROW_SUM = """kernel @row_sum(%x: f32[4,8], %y: f32[4]) loc("graph.reduce_sum") {
  local %acc: f32[]
  for %i = 0 to 4 parallel {
    %acc[] = 0.0:f32
    for %j = 7 to -1 step -1 {
      %acc[] = add(%acc[], %x[%i, %j])
    }
    if gt(%acc[], 1e+30:f32) {
      %y[%i] = inf:f32
    } else {
      %y[%i] = select(isnan(%acc[]), 0.0:f32, %acc[])
    }
  }
}
"""

PROGRAM = ROW_SUM + """
program @main {
  input %x: f32[4,8]
  output %y: f32[4]
  temp %n: i64[]
  temp %c: bool[]
  if %c {
    call @row_sum(%x, %y)
  } else {
  }
  loop %n, %c, %n {
    call @row_sum(%x, %y)
  }
}
"""


def test_kernel_and_program_round_trip_and_verify() -> None:
    kernel = parse_kernel(ROW_SUM)
    assert print_kernel(kernel) == ROW_SUM
    verify_kernel(kernel)
    program = parse_program(PROGRAM)
    assert print_program(parse_program(print_program(program))) == print_program(program)
    verify_program(program)


@pytest.mark.parametrize(("text", "message"), [
    (ROW_SUM.replace("%x[%i, %j]", "%x[%i, add(%j, 1)]"), "may go out of bounds"),
    (ROW_SUM.replace("%x[%i, %j]", "%x[%i]"), "uses 1 indices, its rank is 2"),
    (ROW_SUM.replace("%acc[] = 0.0:f32", "%acc[] = 0:i32"), "store of a i32 value"),
    (ROW_SUM.replace("add(%acc[], %x[%i, %j])", "add(%acc[], f64(%x[%i, %j]))"),
     "operand dtypes differ"),
    # A prefetch is a hint, but its address is one the kernel could read.
    (ROW_SUM.replace("%acc[] = 0.0:f32", "prefetch %x[add(%i, 1), 0]\n    %acc[] = 0.0:f32"),
     "prefetch of %x may go out of bounds"),
    (ROW_SUM.replace("%acc[] = 0.0:f32", "prefetch %x[%i]\n    %acc[] = 0.0:f32"),
     "prefetch of %x uses 1 indices"),
])
def test_verifier_errors(text: str, message: str) -> None:
    with pytest.raises(VerificationError, match=message):
        verify_kernel(parse_kernel(text))


def test_vectorized_loops_must_run_on_lanes() -> None:
    """A `vectorized` loop is a promise code generation keeps: the verifier rejects one
    whose body the lanes cannot run, with the reason; a reduction across the lanes is fine."""
    lanes = ROW_SUM.replace("for %j = 7 to -1 step -1 {", "for %j = 0 to 8 vectorized {")
    verify_kernel(parse_kernel(lanes))
    floor = lanes.replace("add(%acc[], %x[%i, %j])", "add(%acc[], floor(%x[%i, %j]))")
    with pytest.raises(VerificationError, match="kernel @row_sum: vectorized loop %j cannot run"
                                                " on lanes: floor on f32 has no vector code"):
        verify_kernel(parse_kernel(floor))
    outer = ROW_SUM.replace("for %i = 0 to 4 parallel {", "for %i = 0 to 4 vectorized {")
    with pytest.raises(VerificationError, match="loop %i cannot run on lanes: its body has a"
                                                " loop"):
        verify_kernel(parse_kernel(outer))
    backwards = ROW_SUM.replace("step -1 {", "step -1 vectorized {")
    with pytest.raises(VerificationError, match="its trip count has no constant bound"):
        verify_kernel(parse_kernel(backwards))


def test_guarded_accesses_are_not_range_checked() -> None:
    text = ROW_SUM.replace("%acc[] = add(%acc[], %x[%i, %j])",
                           "if lt(%j, 7) {\n        %acc[] = add(%acc[], %x[%i, add(%j, 1)])\n"
                           "      }")
    verify_kernel(parse_kernel(text))


def test_program_call_types_are_checked() -> None:
    with pytest.raises(VerificationError, match="parameter %x is f32"):
        verify_program(parse_program(PROGRAM.replace("input %x: f32[4,8]", "input %x: f32[4,9]")))


@pytest.mark.parametrize("broken", [
    ROW_SUM.replace("%acc[] = 0.0:f32", "%acc[] = 0.5"),
    ROW_SUM.replace("for %j", "for %i"),
    ROW_SUM.replace("%x[%i, %j]", "%z[%i, %j]"),
    ROW_SUM.replace("add(", "plus("),
    ROW_SUM[:-20],
])
def test_parse_errors(broken: str) -> None:
    with pytest.raises(ParseError):
        parse_kernel(broken)


@pytest.mark.parametrize("start, stop, step, want", [
    (0, 10, 1, (0, 9)), (7, -1, -1, (0, 7)), (10, 0, -3, (1, 10)), (3, 3, 1, (0, -1)),
    (0, 10**15, 7, (0, 10**15 - 6)),  # found from the ends, not by walking the range
])
def test_loop_ranges_are_the_ends_of_the_iteration_space(start, stop, step, want) -> None:
    from ember.loops.ir import Const, For, Var
    from ember.loops.verify import _loop_range

    assert _loop_range(For(Var("i"), Const(start), Const(stop), [], step), {}) == want


def test_a_long_loop_is_checked_against_its_buffer() -> None:
    """The verifier bounds an index by its loop's ends (a loop of 10^12 trips over a
    buffer of 10^12 elements is fine; one more trip is not)."""
    text = ("kernel @long(%x: f32[1000000000000], %y: f32[1000000000000]) {\n"
            "  for %i = 0 to {n} {\n    %y[%i] = %x[%i]\n  }\n}\n")
    verify_kernel(parse_kernel(text.replace("{n}", str(10**12))))
    with pytest.raises(VerificationError, match="out of"):
        verify_kernel(parse_kernel(text.replace("{n}", str(10**12 + 1))))


TILED_LOCAL = """kernel @k(%x: f32[8,10], %y: f32[8]) {
  local %t: f32[10]
  for %i = 0 to 8 parallel {
    for %j = 0 to 3 {
      for %jj = 0 to min(sub(10, mul(%j, 4)), 4) {
        %t[add(mul(%j, 4), %jj)] = %x[%i, add(mul(%j, 4), %jj)]
      }
    }
    %y[%i] = %t[9]
  }
}"""


def test_a_local_written_by_tiles_counted_from_outer_loops_is_written_first() -> None:
    """The last tile's count, min(10 - 4 * j, 4), is at least 2 for every j in [0, 2]: each
    thread writes %t before it reads it. With a fourth tile the count may be negative
    (the loop may not run), and the read may see nothing."""
    verify_kernel(parse_kernel(TILED_LOCAL))
    with pytest.raises(VerificationError, match="local %t is read in parallel loop %i before"
                                                " the iteration writes it"):
        verify_kernel(parse_kernel(TILED_LOCAL.replace("for %j = 0 to 3", "for %j = 0 to 4")))
