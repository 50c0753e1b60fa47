"""The default schedule: which loops become parallel, and which must not (with reasons);
scheduled programs compute what unscheduled ones do."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import VerificationError
from ember.loops.ir import For
from ember.loops.schedule import default_schedule, parallelize
from ember.loops.text import parse_kernel, print_kernel

SCALE = """kernel @scale(%x: f32[{n},64], %y: f32[{n},64]) {{
  for %i = 0 to {n} {{
    for %j = 0 to 64 {{
      %y[%i, %j] = mul(%x[%i, %j], 2.0:f32)
    }}
  }}
}}
"""

ROW_MAX = """kernel @row_max(%x: f32[1024,64], %y: f32[1024]) {
  local %acc: f32[]
  for %i = 0 to 1024 {
    %acc[] = -inf:f32
    for %j = 0 to 64 {
      %acc[] = max(%acc[], %x[%i, %j])
    }
    %y[%i] = %acc[]
  }
}
"""

SCAN = """kernel @scan(%x: f32[1024,64], %y: f32[1024,64]) {
  for %j = 0 to 64 {
    %y[0, %j] = %x[0, %j]
  }
  for %i = 1 to 1024 {
    for %j = 0 to 64 {
      %y[%i, %j] = add(%y[sub(%i, 1), %j], %x[%i, %j])
    }
  }
}
"""

TOTAL = """kernel @total(%x: f32[1024,64], %y: f32[1]) {
  for %i = 0 to 1024 {
    for %j = 0 to 64 {
      %y[0] = add(%y[0], %x[%i, %j])
    }
  }
}
"""


def kinds(kernel):
    return [s.kind for s in kernel.walk() if isinstance(s, For)]


def test_big_nests_run_their_outer_loop_in_parallel() -> None:
    scheduled = default_schedule(parse_kernel(SCALE.format(n=1024)))
    assert kinds(scheduled) == ["parallel", "serial"]
    assert "for %i = 0 to 1024 parallel" in print_kernel(scheduled)


def test_small_nests_stay_serial() -> None:
    assert kinds(default_schedule(parse_kernel(SCALE.format(n=4)))) == ["serial", "serial"]


def test_locals_are_private_so_row_reductions_parallelize() -> None:
    assert kinds(default_schedule(parse_kernel(ROW_MAX))) == ["parallel", "serial"]


def test_a_scan_reads_what_another_iteration_writes() -> None:
    kernel = parse_kernel(SCAN)
    assert kinds(default_schedule(kernel)) == ["serial", "serial", "serial"]
    with pytest.raises(VerificationError, match="%y is both read and written"):
        parallelize(kernel, kernel.body[1])


def test_stores_that_ignore_the_loop_variable_conflict() -> None:
    kernel = parse_kernel(TOTAL)
    assert kinds(default_schedule(kernel)) == ["serial", "serial"]
    with pytest.raises(VerificationError, match="does not index by %i"):
        parallelize(kernel, kernel.body[0])


def test_scheduled_models_compute_the_same(monkeypatch) -> None:
    b = ember.Builder("g")
    x = b.input("x", "f32", (256, 512))
    w = b.input("w", "f32", (512, 64))
    h = b.softmax(b.relu(b.matmul(x, w)), axis=-1)
    b.output(h, b.reduce_sum(x, axes=(0,), keepdims=False))
    graph = b.build()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((256, 512)).astype(np.float32),
              rng.standard_normal((512, 64)).astype(np.float32)]
    want = ember.interpret(graph, inputs)
    for threads in ("1", "2"):
        monkeypatch.setenv("EMBER_NUM_THREADS", threads)
        run = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))
        for got, expected in zip(run(*inputs), want):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
