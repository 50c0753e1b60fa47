"""What `slowness_notes` (ember/loops/diagnose.py) reads off a kernel's loops, and the flags
`ember.explain` raises with them."""

from __future__ import annotations

import pytest

from ember.explain import KernelInfo, Report
from ember.loops.diagnose import slowness_notes
from ember.loops.text import parse_kernel
from ember.runtime.machine import MachineLimits


def test_a_transposed_read_in_a_scalar_loop_is_against_the_layout() -> None:
    kernel = parse_kernel("""kernel @k(%x: f32[64,64], %y: f32[64,64]) {
  for %i = 0 to 64 parallel {
    for %j = 0 to 64 { %y[%i, %j] = erf(%x[%j, %i]) }
  }
}""")
    [note] = slowness_notes(kernel)
    assert note.startswith("scalar: its inner loop %j (64 iterations) reads %x across its"
                           " layout")
    assert note.endswith("(100% of its accesses)")


def test_a_body_without_vector_code_says_why() -> None:
    kernel = parse_kernel("""kernel @k(%x: f32[64], %y: f32[64]) {
  for %i = 0 to 64 parallel {
    if lt(%x[%i], 0.0:f32) { %y[%i] = 0.0:f32 } else { %y[%i] = %x[%i] }
  }
}""")
    [note] = slowness_notes(kernel)
    assert "has no vector form: its body has an if whose condition differs between lanes" \
        in note


def test_lanes_that_gather_and_a_kernel_on_one_thread() -> None:
    kernel = parse_kernel("""kernel @k(%x: f32[64,64], %y: f32[64,64]) {
  for %i = 0 to 64 {
    for %j = 0 to 64 vectorized { %y[%i, %j] = %x[%j, %i] }
  }
}""")
    assert slowness_notes(kernel) == [
        "its lanes over %j gather %x element by element (the index is not contiguous along"
        " the lanes) (100% of its accesses)",
        "one thread: none of its loops runs in parallel"]


def test_a_vectorized_parallel_kernel_has_no_notes() -> None:
    kernel = parse_kernel("""kernel @k(%x: f32[64,64], %y: f32[64,64]) {
  for %i = 0 to 64 parallel {
    for %j = 0 to 64 vectorized { %y[%i, %j] = mul(%x[%i, %j], 2.0:f32) }
  }
}""")
    assert slowness_notes(kernel) == []


def test_vector_loops_of_a_run_time_count_are_named() -> None:
    """A tile's store bounded by min(columns left, 16), which the loops' ranges cannot
    show whole: masked lanes (MobileNetV2's 1x1 convs before stop 40)."""
    kernel = parse_kernel("""kernel @k(%x: f32[8,100], %y: f32[8,100]) {
  for %i = 0 to 8 parallel {
    for %t = 0 to 7 {
      for %j = 0 to min(sub(100, mul(%t, 16)), 16) vectorized {
        %y[%i, add(mul(%t, 16), %j)] = %x[%i, add(mul(%t, 16), %j)]
      }
    }
  }
}""")
    assert slowness_notes(kernel) == [
        "1 of its vectorized loops run a count known only at run time, on masked lanes (%j to"
        " min(sub(100, mul(%t, 16)), 16)): a partial tile or row where the loops' ranges could"
        " not show it whole"]


def test_the_heaviest_loop_comes_first() -> None:
    kernel = parse_kernel("""kernel @k(%x: f32[64,64], %y: f32[64,64], %z: f32[4]) {
  for %a = 0 to 4 parallel { %z[%a] = exp(%x[%a, 0]) }
  for %i = 0 to 64 parallel {
    for %j = 0 to 64 { %y[%i, %j] = %x[%j, %i] }
  }
}""")
    notes = slowness_notes(kernel)
    assert notes[0].startswith("scalar: its inner loop %j")


def _limits(threads: int) -> MachineLimits:
    return MachineLimits("test", threads, peak_gflops_one_thread=100.0, bandwidth_gbs=10.0)


def _kernel(name: str, seconds: float, bound: float, notes=(), op: str = "") -> KernelInfo:
    """A kernel of one graph op, `op` (default: its name: kernels differ but for twins)."""
    return KernelInfo(name, [op or name], "op", 1000, 0, "", seconds, bound, tuple(notes))


def test_explain_flags_slow_kernels_that_take_time() -> None:
    report = Report([_kernel("slow", 0.5, 0.01, ["scalar: why"]),
                     _kernel("fast", 0.49, 0.4),  # at 82% of its roofline
                     _kernel("tiny", 0.01, 1e-7)],  # 1% of the time
                    {}, _limits(2), 1.0, "in sequence")
    [flag] = report.flags
    assert flag.kernel.name == "slow" and flag.reasons == ("scalar: why",)
    assert "flagged: 1 kernels" in str(report) and "    - scalar: why" in str(report)


def test_kernels_alike_are_flagged_together() -> None:
    """A model's layers make kernels alike (the same ops, schedule and sizes): twelve of
    1% each below their roofline are flagged as one, with their share summed; kernels
    that differ in size are not summed."""
    layers = [_kernel(f"softmax{i}", 0.01, 0.0005, ["scalar: why"], "softmax")
              for i in range(12)]
    other = KernelInfo("other", ["softmax"], "op", 2000, 0, "", 0.01, 0.0005)
    report = Report([_kernel("gemm", 0.87, 0.7), *layers, other], {}, _limits(2), 1.0,
                    "in sequence")
    [flag] = report.flags
    assert flag.kernel.name.startswith("softmax") and flag.twins == 11
    assert flag.share == pytest.approx(0.12) and flag.reasons == ("scalar: why",)
    assert "and 11 like it: 12.0% of the time" in str(report)


def test_small_kernels_and_one_thread_notes_on_one_thread_machines() -> None:
    report = Report([_kernel("small", 1e-5, 1e-6, ["one thread: none of its loops runs"])],
                    {}, _limits(1), 1e-5, "in sequence")
    [flag] = report.flags
    assert flag.reasons == ("small: 1.0 us of work at the roof, where a call's fixed costs"
                            " dominate",)
    unexplained = Report([_kernel("k", 1.0, 0.01)], {}, _limits(2), 1.0, "in sequence")
    assert unexplained.flags[0].reasons == ()
    assert "    - no known reason" in str(unexplained)


def test_a_division_left_by_a_reshape_is_named() -> None:
    """A loop wider than a vector is asked about a vector's lanes of it; a division of its
    variable in an index (a reshape that did not simplify) is what keeps it scalar."""
    kernel = parse_kernel("""kernel @k(%x: f32[64,300], %y: f32[64,300]) {
  for %i = 0 to 64 parallel {
    for %j = 0 to 300 { %y[%i, %j] = %x[floordiv(%j, 5), mod(%j, 5)] }
  }
}""")
    [note] = slowness_notes(kernel)
    assert note.startswith("scalar: its inner loop %j (300 iterations) reads %x at an index"
                           " that divides %j")
