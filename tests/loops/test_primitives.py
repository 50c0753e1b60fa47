"""Schedule primitives: each rewrite prints the expected loop IR, verifies, and computes what
the unscheduled kernel does (the loop interpreter on random inputs, LLVM for the loop kinds);
illegal rewrites are refused with the loop and the reason; schedules print, parse, serialise
and replay."""

from __future__ import annotations

import numpy as np
import pytest

from ember.codegen import cpu
from ember.codegen.llvm import kernel_module
from ember.errors import EmberError, ParseError, VerificationError
from ember.loops.analysis import plan_vector
from ember.loops.interp import LoopInterpreter
from ember.loops.ir import For, Kernel, Program
from ember.loops.primitives import (
    Schedule,
    ScheduleError,
    Step,
    cache_read,
    compute_at,
    fuse,
    parallel,
    reorder,
    split,
    tile,
    unroll,
    vectorize,
    vectorize_blocks,
)
from ember.loops.text import parse_kernel, print_kernel
from ember.loops.verify import verify_kernel
from ember.target import Target

HOST = Target.host()

SCALE = """kernel @scale(%x: f32[10,12], %b: f32[12], %y: f32[10,12]) {
  for %i = 0 to 10 {
    for %j = 0 to 12 {
      %y[%i, %j] = add(mul(%x[%i, %j], 2.0:f32), %b[%j])
    }
  }
}
"""

MATMUL = """kernel @mm(%a: f32[6,5], %b: f32[5,7], %c: f32[6,7]) {
  for %i = 0 to 6 {
    for %j = 0 to 7 {
      for %k = 0 to 5 {
        %c[%i, %j] = fma(%a[%i, %k], %b[%k, %j], %c[%i, %j])
      }
    }
  }
}
"""

TOTAL = """kernel @total(%x: f32[4,6], %y: f32[1]) {
  for %i = 0 to 4 {
    for %j = 0 to 6 {
      %y[0] = add(%y[0], %x[%i, %j])
    }
  }
}
"""

SCAN = """kernel @scan(%x: f32[5,6], %y: f32[5,6]) {
  for %i = 1 to 5 {
    for %j = 0 to 6 {
      %y[%i, %j] = add(%y[sub(%i, 1), %j], %x[%i, %j])
    }
  }
}
"""

RAGGED = """kernel @ragged(%n: i64[], %x: f32[20], %y: f32[20]) {
  for %i = 3 to %n[] {
    %y[%i] = mul(%x[%i], %x[%i])
  }
}
"""

STENCIL = """kernel @stencil(%x: f32[18], %y: f32[16]) {
  for %i = 0 to 16 {
    %y[%i] = add(add(%x[%i], %x[add(%i, 1)]), %x[add(%i, 2)])
  }
}
"""

PRODUCER_CONSUMER = """kernel @pc(%x: f32[8,6], %y: f32[8,6]) {
  local %t: f32[8,6]
  for %i = 0 to 8 {
    for %j = 0 to 6 {
      %t[%i, %j] = exp(%x[%i, %j])
    }
  }
  for %c = 0 to 8 {
    for %k = 0 to 6 {
      %y[%c, %k] = add(%t[%c, %k], %t[%c, sub(5, %k)])
    }
  }
}
"""


def inputs(kernel: Kernel, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(b.shape).astype(b.dtype.np) for b in kernel.params]


def interpret(kernel: Kernel, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The kernel run by the loop interpreter on copies of `arrays` (all parameters)."""
    copies = [a.copy() for a in arrays]
    LoopInterpreter(Program(kernel.name, [], [kernel], [])).call(kernel, copies)
    return copies


def check(before: Kernel, after: Kernel, arrays: list[np.ndarray] | None = None) -> str:
    """`after` verifies, prints and parses back, and computes exactly what `before` does;
    returns its text."""
    verify_kernel(after)
    text = print_kernel(after)
    assert print_kernel(parse_kernel(text)) == text
    for seed in range(2):
        data = arrays if arrays is not None else inputs(before, seed)
        for got, want in zip(interpret(after, data), interpret(before, data)):
            np.testing.assert_array_equal(got, want)
    return text


def body(text: str) -> str:
    """The statements of a kernel's text, without its header line and closing brace."""
    return "\n".join(text.splitlines()[1:-1]) + "\n"


# -- split -------------------------------------------------------------------------------------

def test_split_divisible() -> None:
    kernel = parse_kernel(SCALE)
    text = check(kernel, split(kernel, "j", 4))
    j = "add(mul(%j.o, 4), %j.i)"
    assert body(text) == f"""\
  for %i = 0 to 10 {{
    for %j.o = 0 to 3 {{
      for %j.i = 0 to 4 {{
        %y[%i, {j}] = add(mul(%x[%i, {j}], 2.0:f32), %b[{j}])
      }}
    }}
  }}
"""


def test_split_with_a_tail() -> None:
    kernel = parse_kernel(SCALE)
    text = check(kernel, split(kernel, "i", 4))
    assert "  for %i.o = 0 to 3 {\n    for %i.i = 0 to min(4, sub(10, mul(%i.o, 4))) {" in text
    # A factor past the trip count: one outer iteration, a partial inner loop.
    assert "for %i.o = 0 to 1 {" in check(kernel, split(kernel, "i", 16))


def test_split_of_a_loop_with_a_start_and_a_stop_read_from_memory() -> None:
    kernel = parse_kernel(RAGGED)
    text = check(kernel, split(kernel, "i", 4), [np.array(17), *inputs(kernel)[1:]])
    assert "for %i.o = 0 to floordiv(add(sub(%n[], 3), 3), 4) {" in text
    assert "for %i.i = 0 to min(4, sub(sub(%n[], 3), mul(%i.o, 4))) {" in text
    assert "%y[add(add(mul(%i.o, 4), %i.i), 3)]" in text
    for n in (0, 3, 4, 7, 20):  # empty, one, whole blocks and tails
        check(kernel, split(kernel, "i", 4), [np.array(n), *inputs(kernel)[1:]])


def test_names_of_new_loops_are_fresh() -> None:
    kernel = split(parse_kernel(SCALE), "i", 2)
    twice = split(kernel, "i.i", 2)
    assert {s.var.name for s in twice.walk() if isinstance(s, For)} == {
        "i.o", "i.i.o", "i.i.i", "j"}
    renamed = parse_kernel(SCALE.replace("%j", "%i.o"))
    assert "for %i.o1 = 0 to 5 {" in print_kernel(split(renamed, "i", 2))


def test_split_keeps_the_kinds_that_stay_meaningful() -> None:
    kernel = vectorize(parallel(parse_kernel(SCALE), "i"), "j")
    text = check(kernel, split(split(kernel, "i", 4), "j", 8))
    assert "for %i.o = 0 to 3 parallel {" in text and "for %i.i = 0 to min(4," in text
    assert "for %j.i = 0 to min(8, sub(12, mul(%j.o, 8))) vectorized {" in text


def test_split_refusals() -> None:
    kernel = parse_kernel(SCALE)
    with pytest.raises(ScheduleError, match="kernel @scale has no loop %q"):
        split(kernel, "q", 4)
    with pytest.raises(ScheduleError, match="factor must be at least 1"):
        split(kernel, "i", 0)
    stepped = parse_kernel(SCALE.replace("0 to 10", "0 to 10 step 2"))
    with pytest.raises(ScheduleError, match="%i: it has step 2"):
        split(stepped, "i", 2)
    assert issubclass(ScheduleError, EmberError)
    two_nests = parse_kernel(SCAN.replace("for %i = 1 to 5 {", "for %j = 0 to 6 {\n"
                                          "    %y[0, %j] = %x[0, %j]\n  }\n  for %i = 1 to 5 {"))
    with pytest.raises(ScheduleError, match="loop name %j is ambiguous \\(2 loops use it\\)"):
        split(two_nests, "j", 2)


# -- reorder -----------------------------------------------------------------------------------

def test_reorder_interchanges_a_perfect_nest() -> None:
    kernel = parse_kernel(MATMUL)
    text = check(kernel, reorder(kernel, "j", "k"))
    assert body(text) == """\
  for %i = 0 to 6 {
    for %k = 0 to 5 {
      for %j = 0 to 7 {
        %c[%i, %j] = fma(%a[%i, %k], %b[%k, %j], %c[%i, %j])
      }
    }
  }
"""
    check(kernel, reorder(kernel, "i", "j"))


def test_reorder_refusals() -> None:
    kernel = parse_kernel(MATMUL)
    with pytest.raises(ScheduleError, match="has no loop %z"):
        reorder(kernel, "i", "z")
    with pytest.raises(ScheduleError, match="%i and %k are not a perfect nest"):
        reorder(kernel, "i", "k")
    imperfect = parse_kernel(SCALE.replace("    for %j", "    %y[%i, 0] = 1.0:f32\n    for %j"))
    with pytest.raises(ScheduleError, match="not a perfect nest"):
        reorder(imperfect, "i", "j")
    triangular = parse_kernel(SCALE.replace("for %j = 0 to 12", "for %j = 0 to add(%i, 1)"))
    with pytest.raises(ScheduleError, match="the bounds of %j depend on %i"):
        reorder(triangular, "i", "j")
    # Interchange would reorder a float sum, or read a row before it is written.
    with pytest.raises(ScheduleError, match="both loops update the same elements of %y"):
        reorder(parse_kernel(TOTAL), "i", "j")
    with pytest.raises(ScheduleError, match="%y is written and accessed at more than one"):
        reorder(parse_kernel(SCAN), "i", "j")


def test_reorder_of_a_nest_with_per_iteration_scratch() -> None:
    kernel = parse_kernel("""kernel @k(%x: f32[3,4], %y: f32[3,4]) {
  local %t: f32[]
  for %i = 0 to 3 {
    for %j = 0 to 4 {
      %t[] = mul(%x[%i, %j], %x[%i, %j])
      %y[%i, %j] = add(%t[], 1.0:f32)
    }
  }
}""")
    check(kernel, reorder(kernel, "i", "j"))


# -- fuse --------------------------------------------------------------------------------------

def test_fuse() -> None:
    kernel = parse_kernel(SCALE)
    text = check(kernel, fuse(kernel, "i", "j"))
    i, j = "floordiv(%i_j, 12)", "mod(%i_j, 12)"
    assert body(text) == f"""\
  for %i_j = 0 to 120 {{
    %y[{i}, {j}] = add(mul(%x[{i}, {j}], 2.0:f32), %b[{j}])
  }}
"""
    strided = parse_kernel(SCAN.replace("for %j = 0 to 6", "for %j = 1 to 6 step 2"))
    assert "for %i_j = 0 to 12 {" in check(strided, fuse(strided, "i", "j"))


def test_fuse_refusals() -> None:
    ragged = parse_kernel(SCALE.replace("%y: f32[10,12]) {", "%y: f32[10,12], %n: i64[]) {")
                          .replace("0 to 12", "0 to %n[]"))
    with pytest.raises(ScheduleError, match="loop %j has no constant bounds"):
        fuse(ragged, "i", "j")
    with pytest.raises(ScheduleError, match="not a perfect nest"):
        fuse(parse_kernel(MATMUL), "i", "k")


# -- loop kinds --------------------------------------------------------------------------------

def test_vectorize_unroll_parallel_set_kinds() -> None:
    kernel = parse_kernel(SCALE)
    text = check(kernel, vectorize(unroll(parallel(kernel, "i"), "i"), "j"))
    assert "for %i = 0 to 10 unrolled {" in text and "for %j = 0 to 12 vectorized {" in text
    assert "for %i = 0 to 10 parallel {" in print_kernel(parallel(kernel, "i"))


def test_vectorize_refusals() -> None:
    with pytest.raises(ScheduleError, match="%i: it is not innermost \\(loop %j is inside"):
        vectorize(parse_kernel(SCALE), "i")
    ragged = parse_kernel(RAGGED)
    with pytest.raises(ScheduleError, match="cannot vectorize %i: its trip count is not"):
        vectorize(ragged, "i")
    with pytest.raises(ScheduleError, match="cannot unroll %i: its trip count has no"):
        unroll(ragged, "i")
    # The split's tail, min(8, e), is a constant bound: the backend masks the last lanes.
    text = print_kernel(vectorize(split(ragged, "i", 8), "i.i"))
    assert "for %i.i = 0 to min(8, sub(sub(%n[], 3), mul(%i.o, 8))) vectorized {" in text


def test_vectorize_refuses_a_body_the_lanes_cannot_run() -> None:
    """Legality is the loop analysis's (`plan_vector`): the refusal names the kernel, the
    loop and the reason, at schedule time rather than as a serial loop in code generation."""
    with pytest.raises(VerificationError, match="kernel @total: cannot vectorize %j: a store to"
                                                " %y is neither contiguous"):
        vectorize(parse_kernel(TOTAL), "j")
    with pytest.raises(VerificationError, match=r"step 1 \(vectorize j\): kernel @total"):
        Schedule.parse("vectorize j\n").apply(parse_kernel(TOTAL))


def test_vectorize_blocks_strip_mines_into_vectors_and_a_tail() -> None:
    """12 iterations in blocks of 8: one block (no block loop) and a tail of 4; 36 in
    blocks of 8: a block loop of 4 and a tail of 4."""
    kernel = parse_kernel(SCALE)
    text = check(kernel, vectorize_blocks(kernel, "j", 8))
    assert "for %j.l = 0 to 8 vectorized {" in text and "for %j.l = 0 to 4 vectorized {" in text
    assert "%j.v" not in text
    wide = parse_kernel(SCALE.replace("12", "36"))
    text = check(wide, vectorize_blocks(wide, "j", 8))
    assert "for %j.v = 0 to 4 {" in text and "add(%j.l, mul(%j.v, 8))" in text


ROW_SUMS = """kernel @row_sums(%x: f32[3,20], %y: f32[3], %z: f32[3]) {
  local %sum: f32[]
  local %most: f32[]
  for %i = 0 to 3 {
    %sum[] = 0.0:f32
    %most[] = -inf:f32
    for %j = 0 to 20 {
      %sum[] = add(%sum[], %x[%i, %j])
      %most[] = max(%most[], %x[%i, %j])
    }
    %y[%i] = %sum[]
    %z[%i] = %most[]
  }
}
"""


def test_vectorize_blocks_reduces_into_a_vector_of_partial_results() -> None:
    """A reduction into a local runs on lanes of partial results (started at the op's
    identity, blocks and tail alike), reduced across the lanes once after the loop."""
    kernel = parse_kernel(ROW_SUMS)
    whole = np.arange(60, dtype=np.float32).reshape(3, 20) % 7 - 3  # (sums exact in f32)
    text = check(kernel, vectorize_blocks(kernel, "j", 8), [whole, np.zeros(3, np.float32),
                                                             np.zeros(3, np.float32)])
    assert "local %sum.lanes: f32[8]" in text and "local %most.lanes: f32[8]" in text
    assert "%sum.lanes[%j.l] = -0.0:f32" in text and "%most.lanes[%j.l] = -inf:f32" in text
    assert "for %j.v = 0 to 2 {" in text and "for %j.l = 0 to 4 vectorized {" in text
    assert "%sum[] = add(%sum[], %sum.lanes[%j.l])" in text
    # A body that reads the accumulator elsewhere (a running sum) stays serial.
    running = parse_kernel(ROW_SUMS.replace("%most[] = max(%most[], %x[%i, %j])",
                                            "%most[] = max(%most[], %sum[])"))
    with pytest.raises(ScheduleError, match="cannot vectorize %j in blocks"):
        vectorize_blocks(running, "j", 8)


def test_vectorize_blocks_refusals() -> None:
    kernel = parse_kernel(SCALE)
    with pytest.raises(ScheduleError, match="%i in blocks: it is not innermost"):
        vectorize_blocks(kernel, "i", 8)
    with pytest.raises(ScheduleError, match="in blocks of 16: it runs 12 iterations"):
        vectorize_blocks(kernel, "j", 16)
    with pytest.raises(ScheduleError, match="serial loop with constant bounds"):
        vectorize_blocks(parse_kernel(RAGGED), "i", 4)
    with pytest.raises(ScheduleError, match="cannot vectorize %j in blocks: a store to"):
        vectorize_blocks(parse_kernel(TOTAL), "j", 4)  # a reduction into %y[0]
    assert Schedule.parse("vectorize_blocks j 8\n").steps == [Step("vectorize_blocks", ("j", 8))]


def test_parallel_refuses_carried_dependences() -> None:
    with pytest.raises(ScheduleError, match="cannot parallelize %i: %y is both read and"):
        parallel(parse_kernel(SCAN), "i")
    with pytest.raises(ScheduleError, match="a store to %y does not index by %j"):
        parallel(parse_kernel(TOTAL), "j")
    # A local that flows into the loop would need sharing between threads.
    with pytest.raises(ScheduleError, match="local %t is read in parallel loop %c"):
        parallel(parse_kernel(PRODUCER_CONSUMER), "c")


# -- tile --------------------------------------------------------------------------------------

def test_tile() -> None:
    kernel = parse_kernel(SCALE)
    text = check(kernel, tile(kernel, "i", "j", 4, 8))
    assert [line.strip() for line in text.splitlines() if "for" in line] == [
        "for %i.o = 0 to 3 {",
        "for %j.o = 0 to 2 {",
        "for %i.i = 0 to min(4, sub(10, mul(%i.o, 4))) {",
        "for %j.i = 0 to min(8, sub(12, mul(%j.o, 8))) {",
    ]
    matmul = parse_kernel(MATMUL)
    check(matmul, tile(matmul, "i", "j", 2, 4))
    with pytest.raises(ScheduleError, match="cannot tile %i and %j: .*same elements of %y"):
        tile(parse_kernel(TOTAL), "i", "j", 2, 2)


# -- cache_read --------------------------------------------------------------------------------

def test_cache_read_of_a_stencil_window() -> None:
    kernel = split(parse_kernel(STENCIL), "i", 4)
    text = check(kernel, cache_read(kernel, "x", "i.i"))
    window = "add(add(%x.cache[%i.i], %x.cache[add(%i.i, 1)]), %x.cache[add(%i.i, 2)])"
    assert body(text) == f"""\
  local %x.cache: f32[6]
  for %i.o = 0 to 4 {{
    for %x.c0 = 0 to 6 {{
      %x.cache[%x.c0] = %x[add(mul(%i.o, 4), %x.c0)]
    }}
    for %i.i = 0 to 4 {{
      %y[add(mul(%i.o, 4), %i.i)] = {window}
    }}
  }}
"""


def test_cache_read_of_a_matmul_panel() -> None:
    kernel = parse_kernel(MATMUL)
    text = check(kernel, cache_read(kernel, "b", "j"))
    assert "local %b.cache: f32[5,7]" in text
    assert "%c[%i, %j] = fma(%a[%i, %k], %b.cache[%k, %j], %c[%i, %j])" in text
    # The row of a that loop k reads: one axis of 1 dropped.
    text = check(kernel, cache_read(kernel, "a", "k"))
    assert "local %a.cache: f32[5]" in text and "%a.cache[%a.c1] = %a[%i, %a.c1]" in text


def test_cache_read_refusals() -> None:
    kernel = parse_kernel(STENCIL)
    with pytest.raises(ScheduleError, match="kernel @stencil has no buffer %w"):
        cache_read(kernel, "w", "i")
    with pytest.raises(ScheduleError, match="cannot cache %y at %i: the loop writes it"):
        cache_read(kernel, "y", "i")
    guarded = parse_kernel(STENCIL.replace("%y[%i] = add", "if lt(%i, 8) {\n%y[%i] = add")
                           .replace(")])\n", ")])\n}\n"))
    with pytest.raises(ScheduleError, match="a load of it is conditional"):
        cache_read(guarded, "x", "i")
    with pytest.raises(ScheduleError, match="loop %i.i has no constant, non-empty bounds"):
        cache_read(split(kernel, "i", 5), "x", "i.o")
    gather = parse_kernel(STENCIL.replace("%x[%i]", "%x[mul(%i, %i)]").replace("f32[18]",
                                                                            "f32[300]"))
    with pytest.raises(ScheduleError, match="index 0 of %x is not affine"):
        cache_read(gather, "x", "i")


# -- compute_at --------------------------------------------------------------------------------

def test_compute_at_moves_the_producer_into_its_consumer() -> None:
    kernel = parse_kernel(PRODUCER_CONSUMER)
    moved = compute_at(kernel, "i", "c")
    text = check(kernel, moved)
    assert body(text) == """\
  local %t: f32[8,6]
  for %c = 0 to 8 {
    for %j = 0 to 6 {
      %t[%c, %j] = exp(%x[%c, %j])
    }
    for %k = 0 to 6 {
      %y[%c, %k] = add(%t[%c, %k], %t[%c, sub(5, %k)])
    }
  }
"""
    # Each iteration now writes the rows of %t it reads: the loop may run in parallel.
    check(kernel, parallel(moved, "c"))


def test_compute_at_with_a_scratch_accumulator() -> None:
    kernel = parse_kernel("""kernel @softmax_num(%x: f32[5,7], %y: f32[5,7]) {
  local %acc: f32[]
  local %m: f32[5]
  for %i = 0 to 5 {
    %acc[] = -inf:f32
    for %j = 0 to 7 {
      %acc[] = max(%acc[], %x[%i, %j])
    }
    %m[%i] = %acc[]
  }
  for %r = 0 to 5 {
    for %k = 0 to 7 {
      %y[%r, %k] = exp(sub(%x[%r, %k], %m[%r]))
    }
  }
}""")
    text = check(kernel, parallel(compute_at(kernel, "i", "r"), "r"))
    assert "for %r = 0 to 5 parallel {\n    %acc[] = -inf:f32\n" in text
    assert "%m[%r] = %acc[]\n    for %k = 0 to 7 {" in text


def test_compute_at_refusals() -> None:
    kernel = parse_kernel(PRODUCER_CONSUMER)
    with pytest.raises(ScheduleError, match="%i is not a later loop of the block"):
        compute_at(kernel, "c", "i")
    with pytest.raises(ScheduleError, match="iterate different index spaces"):
        compute_at(parse_kernel(PRODUCER_CONSUMER.replace("%c = 0 to 8", "%c = 1 to 8")),
                   "i", "c")
    shifted = parse_kernel(PRODUCER_CONSUMER.replace("%t[%c, %k]", "%t[sub(7, %c), %k]"))
    with pytest.raises(ScheduleError, match="%t is not written at %i and read at %c on one"):
        compute_at(shifted, "i", "c")
    with pytest.raises(ScheduleError, match="must write locals only \\(it writes %y\\)"):
        compute_at(parse_kernel(SCALE.replace("  }\n}", "  }\n  for %c = 0 to 10 {\n"
                                              "    %y[%c, 0] = 0.0:f32\n  }\n}")), "i", "c")
    between = PRODUCER_CONSUMER.replace("  for %c", "  %t[0, 0] = 0.0:f32\n  for %c")
    with pytest.raises(ScheduleError, match="%t is used between them"):
        compute_at(parse_kernel(between), "i", "c")
    with pytest.raises(ScheduleError, match="the consumer writes %t"):
        compute_at(parse_kernel(PRODUCER_CONSUMER.replace("%y[%c, %k] =", "%t[%c, %k] =")),
                   "i", "c")
    with pytest.raises(ScheduleError, match="%x, which the producer reads, is written"):
        compute_at(parse_kernel(PRODUCER_CONSUMER.replace(
            "%y[%c, %k] = add", "%x[%c, %k] = add")), "i", "c")


# -- schedules as data -------------------------------------------------------------------------

SCHEDULE = """\
parallel i
tile i j 4 8
unroll i.i
vectorize j.i
"""


def test_schedule_text_and_json_round_trip() -> None:
    schedule = Schedule.parse(SCHEDULE)
    assert schedule.steps[1] == Step("tile", ("i", "j", 4, 8))
    assert str(schedule) == SCHEDULE
    assert Schedule.parse(str(schedule)) == schedule
    assert Schedule.from_json(schedule.to_json()) == schedule
    built = Schedule().then("parallel", "i").then("tile", "i", "j", 4, 8).then(
        "unroll", "i.i").then("vectorize", "j.i")
    assert built == schedule
    assert Schedule.parse("# tuned\n\nsplit i0 8  # by a vector\n") == Schedule(
        [Step("split", ("i0", 8))])


def test_malformed_schedules() -> None:
    with pytest.raises(ParseError, match=r"<schedule>:2:9: split expects an integer, found 'x'"):
        Schedule.parse("fuse i j\nsplit i x\n")
    with pytest.raises(ParseError, match=r":1:1: unknown primitive"):
        Schedule.parse("spilt i 8")
    with pytest.raises(ParseError, match="split takes 2 arguments"):
        Schedule.parse("split i 8 9")
    with pytest.raises(ScheduleError, match="'%i' is not a loop name"):
        Step("vectorize", ("%i",))
    with pytest.raises(ScheduleError, match="malformed schedule JSON: .*'8' is not an integer"):
        Schedule.from_json('{"steps": [["split", "i", "8"]]}')


def test_replay_applies_every_step() -> None:
    kernel = parse_kernel(SCALE)
    scheduled = Schedule.parse(SCHEDULE).apply(kernel)
    assert [(s.var.name, s.kind) for s in scheduled.walk() if isinstance(s, For)] == [
        ("i.o", "parallel"), ("j.o", "serial"), ("i.i", "unrolled"), ("j.i", "vectorized")]
    check(kernel, scheduled)
    with pytest.raises(ScheduleError, match=r"step 2 \(vectorize i\): cannot vectorize %i"):
        Schedule.parse("split j 4\nvectorize i\n").apply(kernel)


# -- through LLVM ------------------------------------------------------------------------------

def run_compiled(kernel: Kernel, arrays: list[np.ndarray]) -> list[np.ndarray]:
    jit = cpu.compile_module(kernel_module([verify_kernel(kernel)]), target=HOST)
    jit.set_num_threads("kernels", 2)
    copies = [a.copy() for a in arrays]
    jit.kernel(kernel.name, len(copies))(*(a.ctypes.data for a in copies))
    return copies


def test_scheduled_kernels_compute_the_same_through_llvm() -> None:
    cases = [
        (SCALE, SCHEDULE),
        (PRODUCER_CONSUMER, "compute_at i c\nparallel c\nvectorize k\n"),
        (STENCIL, "parallel i\nsplit i 4\ncache_read x i.i\nvectorize i.i\n"),
        (MATMUL, "tile i j 2 4\nreorder j.i k\nunroll i.i\nvectorize j.i\n"),
    ]
    for text, schedule in cases:
        kernel = parse_kernel(text)
        scheduled = Schedule.parse(schedule).apply(kernel)
        assert {s.kind for s in scheduled.walk() if isinstance(s, For)} > {"serial"}
        for loop in scheduled.walk():  # the backend grants each vectorize request
            if isinstance(loop, For) and loop.kind == "vectorized":
                assert not isinstance(plan_vector(loop, {b.name for b in scheduled.locals}), str)
        data = inputs(kernel, seed=3)
        want = run_compiled(kernel, data)
        for got, expected, reference in zip(run_compiled(scheduled, data), want,
                                            interpret(kernel, data)):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(got, reference, rtol=1e-6, atol=1e-6)
