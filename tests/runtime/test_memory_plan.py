"""The static memory plan: liveness, packing with reuse, in-place, alignment, control flow."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

import numpy as np

from ember.loops.ir import Kernel, Program
from ember.loops.text import parse_kernel, parse_program
from ember.runtime.memory_plan import (
    ALIGNMENT,
    MemoryPlan,
    inplace_pairs,
    live_intervals,
    plan_memory,
)

RELU = """
kernel @relu(%x: f32[4,8], %out: f32[4,8]) {
  for %i0 = 0 to 4 parallel {
    for %i1 = 0 to 8 vectorized {
      %out[%i0, %i1] = max(%x[%i0, %i1], 0.0:f32)
    }
  }
}
"""
ADD = """
kernel @add(%x: f32[4,8], %y: f32[4,8], %out: f32[4,8]) {
  for %i0 = 0 to 4 {
    for %i1 = 0 to 8 {
      %out[%i0, %i1] = add(%x[%i0, %i1], %y[%i0, %i1])
    }
  }
}
"""
TRANSPOSE = """
kernel @transpose(%x: f32[8,8], %out: f32[8,8]) {
  for %i0 = 0 to 8 {
    for %i1 = 0 to 8 {
      %out[%i0, %i1] = %x[%i1, %i0]
    }
  }
}
"""


def check_plan(program: Program, plan: MemoryPlan) -> None:
    """Every invariant a plan must keep: alignment, bounds, and no two temps that are live
    at the same step share a byte, except an in-place pair at the step that hands over."""
    temps = {b.name: b for b in program.of_kind("temp")}
    assert set(plan.offsets) == set(temps)
    assert plan.arena_size % ALIGNMENT == 0
    assert plan.arena_size >= plan.peak_bytes
    for name, b in temps.items():
        assert plan.offsets[name] % ALIGNMENT == 0
        assert plan.offsets[name] + b.nbytes <= plan.arena_size
    names = sorted(temps)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (fa, la), (fb, lb) = plan.intervals[a], plan.intervals[b]
            oa, ob = plan.offsets[a], plan.offsets[b]
            sa, sb = temps[a].nbytes, temps[b].nbytes
            if not (fa <= lb and fb <= la) or not (oa < ob + sb and ob < oa + sa):
                continue
            handover = (plan.inplace.get(b) == a and la == fb) or \
                (plan.inplace.get(a) == b and lb == fa)
            assert handover and oa == ob, f"%{a} and %{b} are live together and overlap"


def chain(n: int, kernel: str = RELU, shape: str = "f32[4,8]") -> Program:
    lines = [f"  input %a: {shape}", f"  output %y: {shape}"]
    lines += [f"  temp %t{i}: {shape}" for i in range(n)]
    names = ["a", *(f"t{i}" for i in range(n)), "y"]
    name = kernel.split("@")[1].split("(")[0]
    lines += [f"  call @{name}(%{src}, %{dst})" for src, dst in zip(names, names[1:])]
    return parse_program(kernel + "program @main {\n" + "\n".join(lines) + "\n}\n")


def test_chain_of_elementwise_ops_runs_in_one_buffer() -> None:
    program = chain(6)
    plan = plan_memory(program)
    check_plan(program, plan)
    assert plan.arena_size == 128  # one f32[4,8]
    assert set(plan.offsets.values()) == {0}
    assert plan.inplace == {f"t{i + 1}": f"t{i}" for i in range(5)}
    assert plan.total_bytes == 6 * 128 and plan.peak_bytes == 128


def test_chain_without_inplace_ping_pongs_between_two_buffers() -> None:
    program = chain(6)
    plan = plan_memory(program, inplace=False)
    check_plan(program, plan)
    assert plan.arena_size == 256 and plan.peak_bytes == 256
    assert len(set(plan.offsets.values())) == 2 and plan.inplace == {}


def test_non_elementwise_chain_reuses_dead_buffers_but_not_in_place() -> None:
    program = chain(5, TRANSPOSE, "f32[8,8]")
    assert inplace_pairs(program.kernels[0]) == {}
    plan = plan_memory(program)
    check_plan(program, plan)
    assert plan.inplace == {} and plan.arena_size == 512


def test_offsets_are_aligned_for_odd_sizes() -> None:
    text = """
kernel @cp(%x: u8[3], %out: u8[3]) {
  for %i = 0 to 3 {
    %out[%i] = %x[%i]
  }
}
kernel @cat(%a: u8[3], %b: u8[3], %c: u8[3], %out: u8[9]) {
  for %i = 0 to 3 {
    %out[%i] = %a[%i]
    %out[add(%i, 3)] = %b[%i]
    %out[add(%i, 6)] = %c[%i]
  }
}
program @main {
  input %x: u8[3]
  temp %a: u8[3]
  temp %b: u8[3]
  temp %c: u8[3]
  output %y: u8[9]
  call @cp(%x, %a)
  call @cp(%x, %b)
  call @cp(%x, %c)
  call @cat(%a, %b, %c, %y)
}
"""
    program = parse_program(text)
    plan = plan_memory(program)
    check_plan(program, plan)
    assert sorted(plan.offsets.values()) == [0, 64, 128] and plan.arena_size == 192
    assert plan.peak_bytes == 9


def test_inplace_legality() -> None:
    assert inplace_pairs(parse_kernel(ADD)) == {"out": "x"}
    broadcast = parse_kernel("""
kernel @badd(%b: f32[8], %x: f32[4,8], %out: f32[4,8]) {
  for %i0 = 0 to 4 {
    for %i1 = 0 to 8 {
      %out[%i0, %i1] = add(%b[%i1], %x[%i0, %i1])
    }
  }
}""")
    assert inplace_pairs(broadcast) == {"out": "x"}
    reduction = parse_kernel("""
kernel @sum(%x: f32[4,8], %out: f32[4]) {
  for %i0 = 0 to 4 {
    %out[%i0] = 0.0:f32
    for %i1 = 0 to 8 {
      %out[%i0] = add(%out[%i0], %x[%i0, %i1])
    }
  }
}""")
    assert inplace_pairs(reduction) == {}
    repeated = parse_kernel("""
kernel @rep(%x: f32[4], %out: f32[4]) {
  for %j = 0 to 2 {
    for %i = 0 to 4 {
      %out[%i] = add(%x[%i], 1.0:f32)
    }
  }
}""")
    assert inplace_pairs(repeated) == {}  # the second pass would read what the first wrote
    split = parse_kernel("""
kernel @neg(%x: f32[4,8], %out: f32[32]) {
  for %i0 = 0 to 4 {
    for %i1 = 0 to 8 vectorized {
      %out[add(mul(%i0, 8), %i1)] = neg(%x[%i0, %i1])
    }
  }
}""")
    assert inplace_pairs(split) == {"out": "x"}  # same byte offsets: a reshape is fine
    shifted = parse_kernel("""
kernel @shift(%x: f32[9], %out: f32[8]) {
  for %i = 0 to 8 {
    %out[%i] = %x[add(%i, 1)]
  }
}""")
    assert inplace_pairs(shifted) == {}
    widening = parse_kernel("""
kernel @wide(%x: f16[8], %out: f32[8]) {
  for %i = 0 to 8 {
    %out[%i] = f32(%x[%i])
  }
}""")
    assert inplace_pairs(widening) == {}


BLOCKS_AND_TAIL = """
kernel @gelu(%x: f32[4,7,7], %out: f32[4,7,7]) {
  for %c = 0 to 4 {
    for %v = 0 to 3 {
      for %l = 0 to 16 vectorized {
        %out[%c, floordiv(add(%l, mul(%v, 16)), 7), mod(add(%l, mul(%v, 16)), 7)] =
            neg(%x[%c, floordiv(add(%l, mul(%v, 16)), 7), mod(add(%l, mul(%v, 16)), 7)])
      }
    }
    for %l = 0 to TAIL vectorized {
      %out[%c, floordiv(add(%l, 48), 7), mod(add(%l, 48), 7)] =
          neg(%x[%c, floordiv(add(%l, 48), 7), mod(add(%l, 48), 7)])
    }
  }
}"""


def test_a_vectorized_loops_blocks_and_tail_may_write_in_place() -> None:
    """A 7x7 plane vectorized along its flat position (3 blocks of 16 and a tail of 1):
    two stores, each injective, writing apart ranges that together cover the plane, so each
    element is still written once, from its own input element. A tail that overlaps the
    blocks (2 lanes: position 48 and 49 of a 49-position plane, into the next plane) may
    not."""
    assert inplace_pairs(parse_kernel(BLOCKS_AND_TAIL.replace("TAIL", "1"))) == {"out": "x"}
    overlapping = BLOCKS_AND_TAIL.replace("TAIL", "1").replace("add(%l, 48)", "add(%l, 47)")
    assert inplace_pairs(parse_kernel(overlapping)) == {}


def test_a_copy_onto_itself_is_no_call() -> None:
    """A reshape's copy whose output the plan puts in its input's place emits no call:
    its data is already there (and the program's values are the same)."""
    text = """
kernel @double(%x: f32[2,8], %out: f32[2,8]) {
  for %i0 = 0 to 2 { for %i1 = 0 to 8 { %out[%i0, %i1] = mul(%x[%i0, %i1], 2.0:f32) } }
}
kernel @reshape(%x: f32[2,8], %out: f32[4,4]) {
  for %i0 = 0 to 4 { for %i1 = 0 to 4 {
    %out[%i0, %i1] = %x[floordiv(add(mul(%i0, 4), %i1), 8), mod(add(mul(%i0, 4), %i1), 8)]
  } }
}
kernel @neg(%x: f32[4,4], %out: f32[4,4]) {
  for %i0 = 0 to 4 { for %i1 = 0 to 4 { %out[%i0, %i1] = neg(%x[%i0, %i1]) } }
}
program @main {
  input %x: f32[2,8]
  temp %a: f32[2,8]
  temp %b: f32[4,4]
  output %y: f32[4,4]
  call @double(%x, %a)
  call @reshape(%a, %b)
  call @neg(%b, %y)
}"""
    from ember.codegen.llvm import program_module
    from ember.loops.analysis import copies_onto_itself, identity_copy
    from ember.runtime.executable import compile_program
    from ember.target import Target

    program = parse_program(text)
    plan = plan_memory(program)
    assert identity_copy(program.kernel("reshape")) == ("out", "x")
    assert identity_copy(program.kernel("double")) is None
    assert plan.offsets["a"] == plan.offsets["b"]
    assert copies_onto_itself(program, program.steps[1], plan.offsets)
    module = str(program_module(program, plan.offsets))
    assert 'call void @"double"' in module and 'call void @"reshape"' not in module
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    (y,) = compile_program(program, Target.host(), plan)(x)
    np.testing.assert_array_equal(y, -2 * x.reshape(4, 4))


def test_a_copy_in_vector_blocks_and_a_tail_is_an_identity_copy() -> None:
    """A vectorized reshape's copy stores twice (its blocks and its tail): each store
    copies an element to the offset it comes from, so the kernel is still an identity
    copy; a store of a value that is not a load, or of another element, is not."""
    from ember.loops.analysis import identity_copy

    copy = BLOCKS_AND_TAIL.replace("TAIL", "1").replace("neg(", "add(0.0:f32, ")
    assert identity_copy(parse_kernel(copy)) is None  # (the add: not a load)
    copy = re.sub(r"add\(0\.0:f32, (%x\[.*\])\)$", r"\1", copy, flags=re.M)
    assert identity_copy(parse_kernel(copy)) == ("out", "x")
    shifted = copy.replace("%x[%c, floordiv(add(%l, 48), 7)", "%x[%c, floordiv(add(%l, 47), 7)")
    assert identity_copy(parse_kernel(shifted)) is None


def test_declared_inplace_pairs_are_checked_and_respected() -> None:
    @dataclass(slots=True)
    class DeclaredKernel(Kernel):
        inplace: dict[str, str] = field(default_factory=dict)

    k = parse_kernel(ADD)
    declared = DeclaredKernel(k.name, k.params, k.body, k.locals, inplace={"out": "y"})
    assert inplace_pairs(declared) == {"out": "y"}
    declared.inplace = {}
    assert inplace_pairs(declared) == {}
    declared.inplace = {"out": "x", "x": "out"}  # the second is not legal: x is never stored
    assert inplace_pairs(declared) == {"out": "x"}


def test_no_inplace_when_the_input_lives_on_or_is_passed_twice() -> None:
    program = parse_program(ADD + RELU + """
program @main {
  input %a: f32[4,8]
  temp %t0: f32[4,8]
  temp %t1: f32[4,8]
  temp %t2: f32[4,8]
  output %y: f32[4,8]
  call @relu(%a, %t0)
  call @add(%t0, %t0, %t1)
  call @add(%t1, %t0, %t2)
  call @relu(%t2, %y)
}
""")
    plan = plan_memory(program)
    check_plan(program, plan)
    # t1 cannot take t0's memory (t0 is read twice by that call and again later);
    # t2 may take t1's, which dies at the call that writes t2.
    assert plan.inplace == {"t2": "t1"}
    assert plan.offsets["t0"] != plan.offsets["t1"]


LOOP_PROGRAM = RELU + ADD + """
kernel @init(%out: f32[4,8]) {
  for %i0 = 0 to 4 {
    for %i1 = 0 to 8 {
      %out[%i0, %i1] = 0.0:f32
    }
  }
}
kernel @step(%c: i64[], %n: i64[], %done: bool[]) {
  %done[] = lt(add(%c[], 1), %n[])
}
program @main {
  input %a: f32[4,8]
  input %n: i64[]
  output %y: f32[4,8]
  temp %acc: f32[4,8]
  temp %body: f32[4,8]
  temp %cond: bool[]
  temp %count: i64[]
  temp %before: f32[4,8]
  temp %after: f32[4,8]
  temp %other: f32[4,8]
  call @relu(%a, %before)
  call @init(%acc)
  loop %n, %cond, %count {
    call @relu(%before, %body)
    call @add(%acc, %body, %acc)
    call @step(%count, %n, %cond)
  }
  call @relu(%acc, %after)
  call @relu(%after, %other)
  if %cond {
    call @relu(%other, %y)
  } else {
    call @relu(%a, %y)
  }
}
"""


def test_control_flow_steps_count_as_one_interval() -> None:
    program = parse_program(LOOP_PROGRAM)
    intervals = live_intervals(program)
    assert intervals["before"] == (0, 2)  # read in every iteration: live through the loop
    assert intervals["body"] == (2, 2)
    assert intervals["acc"] == (1, 3)
    assert intervals["count"] == (2, 2) and intervals["cond"] == (2, 5)
    assert intervals["other"] == (4, 5)
    plan = plan_memory(program)
    check_plan(program, plan)
    # body, acc and before are all live inside the loop: three distinct regions.
    assert len({plan.offsets[n] for n in ("before", "body", "acc")}) == 3
    # after takes acc's memory in place; other takes after's.
    assert plan.inplace == {"after": "acc", "other": "after"}


def test_plan_json_round_trip_and_report() -> None:
    program = parse_program(LOOP_PROGRAM)
    plan = plan_memory(program)
    again = MemoryPlan.from_json(plan.to_json())
    assert again == plan
    text = plan.report()
    assert "arena" in text and "peak live" in text and "in place" in text


def test_empty_and_zero_size_temps() -> None:
    program = parse_program("""
kernel @fill(%out: f32[0,4]) {
}
program @main {
  temp %z: f32[0,4]
  call @fill(%z)
}
""")
    plan = plan_memory(program)
    assert plan.arena_size == 0 and plan.offsets == {"z": 0}
    empty = parse_program("program @main {\n}\n")
    assert plan_memory(empty).arena_size == 0


def random_program(rng: random.Random, steps: int) -> Program:
    """A random DAG of elementwise and reshuffling calls over temps of a few sizes."""
    sizes = [1, 3, 16, 17, 64, 100]
    kernels, decls, calls, live = {}, ["  input %in: f32[16]"], [], [("in", 16)]
    for i in range(steps):
        n = rng.choice(sizes)
        src, m = rng.choice(live)
        kind = rng.choice(["ew", "rev", "mix"])
        if kind == "ew" and m == n:
            name, body = f"ew{n}", "%out[%i] = neg(%x[%i])"
            params = f"%x: f32[{n}], %out: f32[{n}]"
            args = f"%{src}"
        elif kind == "mix" and len(live) > 1:
            (a, ma), (b, mb) = rng.sample(live, 2)
            name = f"mix{ma}_{mb}_{n}"
            params = f"%x: f32[{ma}], %z: f32[{mb}], %out: f32[{n}]"
            body = f"%out[%i] = add(%x[mod(%i, {ma})], %z[mod(%i, {mb})])"
            args = f"%{a}, %{b}"
        else:
            name = f"rev{m}_{n}"
            params = f"%x: f32[{m}], %out: f32[{n}]"
            body = f"%out[%i] = %x[sub({m - 1}, mod(%i, {m}))]"
            args = f"%{src}"
        kernels[name] = (f"kernel @{name}({params}) {{\n  for %i = 0 to {n} {{\n"
                         f"    {body}\n  }}\n}}\n")
        decls.append(f"  temp %t{i}: f32[{n}]")
        calls.append(f"  call @{name}({args}, %t{i})")
        live.append((f"t{i}", n))
        if len(live) > 4:
            live.pop(rng.randrange(len(live) - 1))
    return parse_program("".join(kernels.values()) + "program @main {\n"
                         + "\n".join(decls + calls) + "\n}\n")


def test_random_programs_keep_every_invariant() -> None:
    rng = random.Random(7)
    saved = 0
    for _ in range(60):
        program = random_program(rng, rng.randrange(1, 25))
        for inplace in (True, False):
            plan = plan_memory(program, inplace=inplace)
            check_plan(program, plan)
            saved += plan.total_bytes - plan.arena_size
    assert saved > 0
