"""The default schedule: which loops become parallel, and which must not (with reasons);
scheduled programs compute what unscheduled ones do."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import VerificationError
from ember.codegen import cpu
from ember.codegen.llvm import kernel_module
from ember.loops import schedule
from ember.loops.ir import For
from ember.loops.primitives import Schedule
from ember.loops.schedule import (
    block_transposes,
    default_schedule,
    parallelize,
    vectorize_inner_loops,
)
from ember.loops.text import parse_kernel, print_kernel
from ember.loops.verify import verify_kernel
from ember.target import Target

HOST = Target.host()

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


FUSED_TASKS = """kernel @planes(%x: f32[2,64,16,16], %y: f32[2,64,16,16]) {
  for %nc = 0 to 128 {
    for %p = 0 to 256 {
      %y[floordiv(%nc, 64), mod(%nc, 64), floordiv(%p, 16), mod(%p, 16)] =
          mul(%x[floordiv(%nc, 64), mod(%nc, 64), floordiv(%p, 16), mod(%p, 16)], 2.0:f32)
    }
  }
}
"""


def test_a_task_loop_over_merged_dimensions_parallelizes() -> None:
    """A depthwise conv or pool over (image, channel) pairs writes y[nc // C, nc % C, ..]:
    each iteration has its own plane (position nc of the merged first two axes)."""
    scheduled = default_schedule(parse_kernel(FUSED_TASKS))
    assert kinds(scheduled) == ["parallel", "serial"]


def test_a_merged_store_beside_another_axis_conflicts() -> None:
    # Iteration 0 writes y[0, 0, j] for every j through the first store; iteration 5
    # writes y[0, 0, 5] through the second, which has %nc alone on another axis.
    kernel = parse_kernel("""kernel @k(%x: f32[2,64,128], %y: f32[2,64,128]) {
  for %nc = 0 to 128 {
    for %j = 0 to 128 {
      %y[floordiv(%nc, 64), mod(%nc, 64), %j] = %x[floordiv(%nc, 64), mod(%nc, 64), %j]
    }
    %y[0, 0, %nc] = 0.0:f32
  }
}""")
    with pytest.raises(VerificationError, match="does not index by %nc"):
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


# -- vectorized inner loops ----------------------------------------------------------------------

def test_inner_elementwise_loops_are_vectorized_in_blocks_and_a_tail() -> None:
    """An inner loop of 40 f32 iterations on 16 lanes (AVX-512): two vectorized blocks of
    16 and a vectorized tail of 8, with the same lanes as the serial loop (and right on the
    host, whatever its width)."""
    kernel = vectorize_inner_loops(parse_kernel("""kernel @k(%x: f32[3,40], %y: f32[3,40]) {
  for %i = 0 to 3 {
    for %j = 0 to 40 {
      %y[%i, %j] = erf(%x[%i, %j])
    }
  }
}"""), target=Target.named("znver4"))
    assert print_kernel(kernel) == """kernel @k(%x: f32[3,40], %y: f32[3,40]) {
  for %i = 0 to 3 {
    for %j.v = 0 to 2 {
      for %j.l = 0 to 16 vectorized {
        %y[%i, add(%j.l, mul(%j.v, 16))] = erf(%x[%i, add(%j.l, mul(%j.v, 16))])
      }
    }
    for %j.l = 0 to 8 vectorized {
      %y[%i, add(%j.l, 32)] = erf(%x[%i, add(%j.l, 32)])
    }
  }
}
"""
    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    y = np.zeros_like(x)
    jit = cpu.compile_module(kernel_module([verify_kernel(kernel)]), target=HOST)
    jit.kernel("k", 2)(x.ctypes.data, y.ctypes.data)
    np.testing.assert_allclose(y, ember.interpret(erf_graph(x.shape), [x])[0], rtol=1e-6,
                               atol=1e-6)


SHORT_ROWS = """kernel @k(%x: f32[3,7,7], %y: f32[3,7,7], %m: f32[3]) {
  local %acc: f32[]
  for %c = 0 to 3 {
    %acc[] = 0.0:f32
    for %h = 0 to 7 {
      for %w = 0 to 7 {
        %acc[] = add(%acc[], %x[%c, %h, %w])
      }
    }
    %m[%c] = %acc[]
    for %h2 = 0 to 7 {
      for %w2 = 0 to 7 {
        %y[%c, %h2, %w2] = erf(%x[%c, %h2, %w2])
      }
    }
  }
}"""


def test_rows_shorter_than_a_vector_are_fused_with_the_loop_around_them() -> None:
    """A 7x7 plane's rows are shorter than 16 lanes: the plane's two loops become one over
    its 49 contiguous positions (`fuse`), which runs on lanes, for a sum (an SE block's
    mean) and an elementwise op alike; the values stay the serial loops'."""
    kernel = vectorize_inner_loops(parse_kernel(SHORT_ROWS), target=Target.named("znver4"))
    text = print_kernel(kernel)
    assert "for %h_w.l = 0 to 16 vectorized" in text and "%h2_w2.l" in text, text
    assert "for %w = 0 to 7" not in text and "for %w2 = 0 to 7" not in text
    x = np.random.default_rng(1).standard_normal((3, 7, 7)).astype(np.float32)
    y, m = np.zeros_like(x), np.zeros(3, np.float32)
    host = vectorize_inner_loops(parse_kernel(SHORT_ROWS), target=HOST)
    jit = cpu.compile_module(kernel_module([verify_kernel(host)]), target=HOST)
    jit.kernel("k", 3)(x.ctypes.data, y.ctypes.data, m.ctypes.data)
    np.testing.assert_allclose(m, x.sum(axis=(1, 2)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, ember.interpret(erf_graph(x.shape), [x])[0], rtol=1e-6,
                               atol=1e-6)


def test_short_rows_read_across_are_not_fused() -> None:
    """Fusing a transposed plane's loops would gather: they stay as they are."""
    kernel = parse_kernel("""kernel @t(%x: f32[7,7], %y: f32[7,7]) {
  for %i = 0 to 7 {
    for %j = 0 to 7 {
      %y[%i, %j] = %x[%j, %i]
    }
  }
}""")
    assert print_kernel(vectorize_inner_loops(kernel, target=Target.named("znver4"))) == \
        print_kernel(kernel)


def erf_graph(shape):
    b = ember.Builder("erf")
    b.output(b.erf(b.input("x", "f32", shape)))
    return b.build()


@pytest.mark.parametrize("text", [TOTAL, """kernel @t(%x: f32[64,64], %y: f32[64,64]) {
  for %i = 0 to 64 {
    for %j = 0 to 64 {
      %y[%i, %j] = %x[%j, %i]
    }
  }
}"""])
def test_reductions_into_buffers_and_gathers_stay_serial(text: str) -> None:
    """A running sum into an output (a lane would read what the previous one wrote) and a
    transpose (gathers, slower than the serial loop's scalar loads) keep their loops."""
    kernel = parse_kernel(text)
    assert print_kernel(vectorize_inner_loops(kernel, target=HOST)) == print_kernel(kernel)


def test_a_reduction_into_a_local_runs_on_lanes_of_partial_results() -> None:
    """A row's max into a local: each lane keeps its own, the lanes reduced once after the
    row (LLVM's vectorizer keeps a float reduction serial; a softmax's exp ran scalar)."""
    kernel = parse_kernel(ROW_MAX)
    scheduled = vectorize_inner_loops(kernel, target=HOST)
    lanes = HOST.lanes(ember.DType.f32)
    assert f"local %acc.lanes: f32[{lanes}]" in print_kernel(scheduled)
    x = np.random.default_rng(3).standard_normal((1024, 64)).astype(np.float32)
    y = np.zeros(1024, np.float32)
    jit = cpu.compile_module(kernel_module([verify_kernel(scheduled)]), target=HOST)
    jit.kernel("row_max", 2)(x.ctypes.data, y.ctypes.data)
    np.testing.assert_array_equal(y, x.max(axis=1))


def test_an_output_in_place_of_its_input_runs_vectorized() -> None:
    """GELU on a matmul's output, planned in place of it: the vectorized loop computes the
    same as the interpreter (LLVM's own vectorizer ran such a loop serially)."""
    b = ember.Builder("g")
    x, w = b.input("x", "f32", (32, 48)), b.input("w", "f32", (48, 40))
    b.output(b.add(b.gelu(b.matmul(x, w)), b.constant(np.ones(40, np.float32))))
    graph = b.build()
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((32, 48)).astype(np.float32),
              rng.standard_normal((48, 40)).astype(np.float32)]
    run = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))
    np.testing.assert_allclose(run(*inputs)[0], ember.interpret(graph, inputs)[0],
                               rtol=1e-5, atol=1e-5)


# -- transposes in blocks ----------------------------------------------------------------------

TRANSPOSE = """kernel @t(%x: f32[40,20], %y: f32[20,40]) {
  for %i = 0 to 20 {
    for %j = 0 to 40 {
      %y[%i, %j] = mul(%x[%j, %i], 2.0:f32)
    }
  }
}"""


def test_a_transposing_nest_is_tiled_into_square_blocks(monkeypatch) -> None:
    """The store runs along %j, the load along %i: 8x8 blocks, %i's rows unrolled and %j's
    lanes vectorized (code generation transposes a block in registers), the last row of
    blocks short."""
    monkeypatch.setattr(schedule, "transpose_block", lambda target: 8)
    kernel = block_transposes(parse_kernel(TRANSPOSE), target=HOST)
    store = ("%y[add(mul(%i.o, 8), %i.i), add(mul(%j.o, 8), %j.i)] ="
             " mul(%x[add(mul(%j.o, 8), %j.i), add(mul(%i.o, 8), %i.i)], 2.0:f32)")
    assert print_kernel(kernel) == f"""kernel @t(%x: f32[40,20], %y: f32[20,40]) {{
  for %i.o = 0 to 3 {{
    for %j.o = 0 to 5 {{
      for %i.i = 0 to min(8, sub(20, mul(%i.o, 8))) unrolled {{
        for %j.i = 0 to 8 vectorized {{
          {store}
        }}
      }}
    }}
  }}
}}
"""


NARROW_TRANSPOSE = """kernel @t(%x: f32[4,64], %y: f32[64,4]) {
  for %i = 0 to 64 {
    for %j = 0 to 4 {
      %y[%i, %j] = %x[%j, %i]
    }
  }
}"""


@pytest.mark.parametrize("text", [SCALE.format(n=64), ROW_MAX, NARROW_TRANSPOSE])
def test_other_nests_are_not_blocked(text: str) -> None:
    """Contiguous on both sides, a reduction, and a transpose narrower than a block."""
    kernel = parse_kernel(text)
    assert print_kernel(block_transposes(kernel, target=HOST)) == print_kernel(kernel)


@pytest.mark.parametrize("shape, perm", [
    ((128, 12, 64), (1, 2, 0)),  # BERT's key heads, every block full
    ((12, 100, 72), (0, 2, 1)),  # edge blocks on both sides
    ((37, 53), (1, 0)),
    ((3, 5, 17, 19), (0, 3, 2, 1)),
    ((6, 7), (1, 0)),  # smaller than a block: not blocked
])
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "f16"])
def test_blocked_transposes_compute_the_transpose(shape, perm, dtype) -> None:
    x = (np.random.default_rng(0).standard_normal(shape) * 100).astype(dtype_np(dtype))
    b = ember.Builder("t")
    b.output(b.add(b.transpose(b.input("x", dtype, shape), perm=perm),
                   b.constant(np.ones((), dtype_np(dtype)))))
    run = ember.compile(b.build(), config=ember.Config(executor="cpu", disk_cache=False))
    np.testing.assert_array_equal(run(x)[0], x.transpose(perm) + 1)


def dtype_np(dtype: str):
    return {"f32": np.float32, "f64": np.float64, "i32": np.int32, "f16": np.float16}[dtype]


def test_a_full_block_is_transposed_in_registers() -> None:
    """No gather in a kernel of full blocks: vector loads and interleaving shuffles."""
    side = schedule.transpose_block(target=HOST)
    rows, cols = 4 * side, 2 * side
    kernel = vectorize_inner_loops(block_transposes(parse_kernel(
        f"""kernel @t(%x: f32[{rows},{cols}], %y: f32[{cols},{rows}]) {{
  for %i = 0 to {cols} {{
    for %j = 0 to {rows} {{
      %y[%i, %j] = %x[%j, %i]
    }}
  }}
}}"""), target=HOST), target=HOST)
    text = str(kernel_module([verify_kernel(kernel)]))
    assert "shufflevector" in text and "gather" not in text
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    y = np.zeros((cols, rows), np.float32)
    run = cpu.compile_module(kernel_module([kernel]), target=HOST).kernel("t", 2)
    run(x.ctypes.data, y.ctypes.data)
    np.testing.assert_array_equal(y, x.T)


def test_the_default_schedule_is_a_list_of_primitives_that_replays() -> None:
    """A transposing nest's blocks, a parallel loop and vectorized blocks, as steps that
    print, parse back and, replayed on the unscheduled kernel, give the scheduled one."""
    for text in (TRANSPOSE, SCALE.format(n=1024)):
        kernel = parse_kernel(text)
        steps = schedule.default_kernel_schedule(kernel, HOST)
        assert steps.steps, text
        replayed = Schedule.parse(str(steps)).apply(kernel)
        assert print_kernel(replayed) == print_kernel(schedule.schedule_kernel(kernel, HOST))
    names = [s.name for s in schedule.default_kernel_schedule(parse_kernel(TRANSPOSE),
                                                               HOST).steps]
    assert names[:5] == ["split", "split", "reorder", "unroll", "vectorize"]
    names = [s.name for s in schedule.default_kernel_schedule(parse_kernel(SCALE.format(
        n=1024)), HOST).steps]
    assert names == ["parallel", "vectorize_blocks"]
