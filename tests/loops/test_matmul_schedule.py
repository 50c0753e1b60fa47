"""The matmul schedule (ember/loops/schedules/gemm.py) and the loop kinds it relies on.

The plain nest before and the blocked nest after on a small case; values of compiled
matmuls against NumPy on odd shapes, batches, vectors, halves and a fused epilogue; the
multi-pass path (K split, partial sums in a workspace); and code generation of `unrolled`
and `vectorized` loops and `fma` (ember/codegen/vector.py): the micro-kernel is vector
FMAs, masked and lane-private loops compute what serial loops do, and loops that cannot
be vectorized run serially.
"""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest

import ember
from ember import Builder, DType
from ember.codegen import cpu
from ember.codegen.llvm import kernel_module, program_module
from ember.driver.pass_manager import run_passes
from ember.errors import ParseError, ScheduleError, VerificationError
from ember.loops import interp
from ember.loops.analysis import plan_vector
from ember.loops.ir import Const, Fma, For, Kernel, Load, Store, Var, loads_in, walk_stmts
from ember.loops.lower import lower_graph
from ember.loops.lower.core import LowerContext
from ember.loops.lower.ops.linalg import plain_matmul
from ember.loops.primitives import Schedule, Step
from ember.loops.schedule import schedule_program
from ember.loops.schedules import gemm
from ember.loops.simplify import simplify_kernel
from ember.loops.text import parse_kernel, parse_program, print_kernel
from ember.loops.verify import verify_kernel, verify_program
from ember.runtime.memory_plan import plan_memory
from ember.target import PRESETS, Target

HOST = Target.host()

RNG = np.random.default_rng(7)
CPU = ember.Config(executor="cpu", disk_cache=False)


def matmul_graph(a_shape, b_shape, dtype="f32") -> ember.graph.ir.Graph:
    b = Builder("mm")
    x, y = b.input("x", dtype, a_shape), b.input("y", dtype, b_shape)
    b.output(b.matmul(x, y))
    return b.build()


def data(shape, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def check_compiled(a_shape, b_shape, dtype="f32", rtol=1e-5) -> None:
    np_dtype = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]
    x, y = data(a_shape, np_dtype), data(b_shape, np_dtype)
    got = ember.compile(matmul_graph(a_shape, b_shape, dtype), config=CPU)(x, y)[0]
    want = np.matmul(x.astype(np.float64), y.astype(np.float64))
    assert got.shape == want.shape and got.dtype == np_dtype
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=rtol * scale)


def kernel_of(graph) -> Kernel:
    """The graph's one kernel, lowered and scheduled."""
    program = verify_program(schedule_program(lower_graph(graph, target=HOST), HOST))
    return program.kernels[0]


@pytest.fixture
def schedule(monkeypatch):
    """Schedule matmuls with the GemmSchedule given to the returned function."""
    def use(**params) -> gemm.GemmSchedule:
        chosen = gemm.GemmSchedule(**params)
        monkeypatch.setattr(gemm, "default_gemm_schedule", lambda g, target: chosen)
        return chosen
    return use


# -- before and after ----------------------------------------------------------------------

def test_plain_nest_is_matched() -> None:
    ctx = LowerContext(matmul_graph((7, 13), (13, 5)).ops[-1], HOST)
    plain = plain_matmul(ctx)
    text = print_kernel(Kernel("plain", [*ctx.inputs, *ctx.outputs], plain, ctx.locals))
    assert "%t0[] = add(%t0[], mul(%x0[%i0, %i2], %x1[%i2, %i1]))" in text
    g = gemm.match_gemm(plain)
    assert (g.row, g.m, g.col, g.n, g.k, g.depth, g.batch) == ("i0", 7, "i1", 5, "i2", 13, ())
    assert g.a == Load("x0", (Var("i0"), Var("i2")), DType.f32)


def test_match_finds_batch_and_vector_roles() -> None:
    ctx = LowerContext(matmul_graph((2, 1, 3, 4), (4, 5)).ops[-1], HOST)
    g = gemm.match_gemm(plain_matmul(ctx))
    assert [e for _, e in g.batch] == [2, 1] and (g.m, g.n, g.depth) == (3, 5, 4)
    ctx = LowerContext(matmul_graph((4,), (2, 4, 3)).ops[-1], HOST)
    g = gemm.match_gemm(plain_matmul(ctx))
    assert g.row is None and g.m == 1 and [e for _, e in g.batch] == [2] and g.n == 3
    ctx = LowerContext(matmul_graph((3, 4), (4,)).ops[-1], HOST)
    g = gemm.match_gemm(plain_matmul(ctx))
    assert g.col is None and g.n == 1 and g.m == 3


def test_schedule_after(schedule, monkeypatch) -> None:
    # 7 x 13 x 5 with 3 x 4 tiles, blocks of 6 rows and 8 columns, K in two passes (B
    # packed, as one too large to read in place would be).
    schedule(mr=3, nr=4, kc=8, mc=6, nc=8, pack_a=True, parallel=2)
    monkeypatch.setattr(gemm, "B_IN_PLACE_WHOLE_BYTES", 0)
    kernel = kernel_of(matmul_graph((7, 13), (13, 5)))
    text = print_kernel(kernel)
    assert print_kernel(parse_kernel(text)) == text
    locals_ = {b.name: b.shape for b in kernel.locals}
    assert (3, 4) in locals_.values()  # the register tile
    assert (2, 7, 4) in locals_.values()  # B: 2 panels of 4 columns, 7 deep (13 = 7 + 6)
    assert (2, 3, 7) in locals_.values()  # A: 2 tiles of 3 rows, rows of 7 (one chunk)
    assert (2, 2, 2, 3, 4) in locals_.values()  # partial sums: 2 blocks of 2 tiles, 2 panels
    loops = [s for s in kernel.walk() if isinstance(s, For)]
    assert loops[0].kind == "serial"  # too little work for a thread team
    kinds = {s.kind for s in loops}
    assert {"unrolled", "vectorized"} <= kinds
    fmas = [s for s in kernel.walk() if getattr(s, "value", None) is not None
            and isinstance(s.value, Fma)]
    assert len(fmas) == 1
    stores = [s for s in kernel.walk() if getattr(s, "buffer", None) == "y0"]
    assert len(stores) == 1  # the one store per element that a fused epilogue replaces
    assert re.search(r"if eq\(%pc\d+, 1\)", text)  # only the last pass writes the output
    x, y = data((7, 13)), data((13, 5))
    program = verify_program(lower_graph(matmul_graph((7, 13), (13, 5)), target=HOST))
    np.testing.assert_allclose(interp.run_program(program, [x, y])[0], x @ y, rtol=1e-5,
                               atol=1e-5)


def test_one_tile_reads_b_in_place() -> None:
    # A vector times a matrix: no packed B; the last panel (past N) reads B's last column.
    kernel = kernel_of(matmul_graph((17,), (17, 40)))
    nr = gemm.default_tile(1, False, 40, HOST).nr  # the host's default tile width at N = 40
    assert [b.shape for b in kernel.locals] == [(), (1, nr)]
    text = print_kernel(kernel)
    assert "if le(add(mul(%jr" in text and "%x1[%k" in text and ", 39)]" in text


def test_big_matmul_runs_on_a_team() -> None:
    kernel = kernel_of(matmul_graph((256, 256), (256, 256)))
    assert kernel.body[0].kind == "parallel"
    assert not any(isinstance(s, For) and s.kind == "parallel" for s in walk_stmts(
        kernel.body[0].body))


@pytest.mark.parametrize("dtype", ["i32", "f64"])
def test_int_and_f64_keep_the_plain_nest(dtype) -> None:
    text = print_kernel(kernel_of(matmul_graph((4, 6), (6, 3), dtype)))
    assert "fma(" not in text and "vectorized" not in text and "= add(" in text


# -- values --------------------------------------------------------------------------------

@pytest.mark.parametrize("a_shape, b_shape", [
    ((1, 1), (1, 1)),
    ((7, 13), (13, 5)),
    ((65, 129), (129, 33)),
    ((200, 300), (300, 100)),  # enough work for the thread team
    ((3, 2, 5, 7), (7, 9)),  # batch rows fold into one matrix
    ((2, 1, 5, 7), (3, 7, 20)),  # batch broadcast on both sides
    ((4, 9, 17), (4, 17, 18)),  # batched B: one task per batch
    ((17,), (17, 20)),  # vector @ matrix
    ((20, 17), (17,)),  # matrix @ vector
    ((17,), (17,)),  # dot
    ((3, 17), (2, 17, 1)),
])
def test_values(a_shape, b_shape) -> None:
    check_compiled(a_shape, b_shape)


@pytest.mark.parametrize("dtype, rtol", [("f16", 2e-2), ("bf16", 5e-2)])
def test_halves_compute_in_f32(dtype, rtol) -> None:
    check_compiled((37, 45), (45, 50), dtype, rtol)
    text = print_kernel(kernel_of(matmul_graph((37, 45), (45, 50), dtype)))
    assert f"f32({'%x0'}[" in text  # A is widened once, into its copy


def test_long_k_sums_passes() -> None:
    check_compiled((9, 5000), (5000, 20), rtol=1e-4)  # K over the default kc: two passes


@pytest.mark.parametrize("params", [
    dict(mr=1, nr=1, kc=3, mc=1, nc=1),
    dict(mr=3, nr=4, kc=8, mc=6, nc=8, pack_a=True, parallel=4),
    dict(mr=4, nr=8, kc=16, mc=8, nc=16, pack_a=False),
    dict(mr=6, nr=32, kc=17, mc=12, nc=64, pack_a=True),
    dict(mr=8, nr=16, kc=1000, mc=96, nc=256, pack_a=False, parallel=1),
])
def test_schedules_agree(schedule, params) -> None:
    schedule(**params)
    for a_shape, b_shape in [((33, 41), (41, 19)), ((2, 3, 16), (16, 65)), ((70,), (70, 7))]:
        check_compiled(a_shape, b_shape, rtol=1e-4)


def test_fused_epilogue() -> None:
    b = Builder("dense")
    x, w, bias = b.input("x", "f32", (45, 70)), b.input("w", "f32", (70, 37)), \
        b.input("b", "f32", (37,))
    b.output(b.relu(b.add(b.matmul(x, w), bias)))
    graph = b.build()
    compiled = ember.compile(graph, config=CPU)
    assert len(ember.explain(compiled).kernels) == 1
    inputs = [data((45, 70)), data((70, 37)), data((37,))]
    want = np.maximum(inputs[0] @ inputs[1] + inputs[2], 0)
    np.testing.assert_allclose(compiled(*inputs)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("depth", [70, 1100])  # one pass of k, and several
def test_transcendental_epilogue_writes_rows_from_a_staging_tile(depth) -> None:
    """A GELU after the matmul runs a row of the tile at a time, from a copy of the
    register tile: the unrolled write-back would interleave mr erfs and spill."""
    b = Builder("dense_gelu")
    x, w, bias = b.input("x", "f32", (45, depth)), b.input("w", "f32", (depth, 37)), \
        b.input("b", "f32", (37,))
    b.output(b.gelu(b.add(b.matmul(x, w), bias)))
    graph = b.build()
    kernel = kernel_of(run_passes(graph, ["decompose", "fuse", "dce"]))
    (write,) = [s for s in walk_stmts(kernel.body) if isinstance(s, For)
                and any(isinstance(t, Store) and t.buffer == "y0" for t in s.body)]
    row_loop = next(s for s in walk_stmts(kernel.body) if isinstance(s, For) and write in s.body)
    assert write.kind == "vectorized" and row_loop.kind == "serial", print_kernel(kernel)
    read = {load.buffer for load in loads_in(row_loop.body)}
    tile = gemm.default_tile(45, False, 37, HOST)  # the copy of the register tile
    assert [buf.shape for buf in kernel.locals if buf.name in read and buf.shape] == \
        [(min(tile.mr, 45), min(tile.nr, 37))]
    inputs = [data((45, depth)), data((depth, 37)), data((37,))]
    u = inputs[0].astype(np.float64) @ inputs[1] + inputs[2]
    want = 0.5 * u * (1 + np.vectorize(math.erf)(u / math.sqrt(2)))
    got = ember.compile(graph, config=CPU)(*inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_micro_kernel_is_vector_fma() -> None:
    if not {"avx2", "fma"} <= set(HOST.features):
        pytest.skip("the host has no AVX2 and FMA")
    program = verify_program(schedule_program(lower_graph(matmul_graph((64, 64), (64, 64)),
                                                          target=HOST), HOST))
    plan = plan_memory(program)
    asm = cpu.assembly_text(program_module(program, plan), target=HOST)
    assert re.search(r"vfmadd\d+ps\s+[^\n]*%[yz]mm", asm)


# -- fma ---------------------------------------------------------------------------------------

def test_fma_text_verify_and_interp() -> None:
    text = """kernel @k(%x: f32[4], %y: f32[4]) {
  for %i = 0 to 4 {
    %y[%i] = fma(%x[%i], 2.0:f32, 1.0:f32)
  }
}
"""
    kernel = parse_kernel(text)
    assert print_kernel(kernel) == text
    verify_kernel(kernel)
    with pytest.raises(VerificationError, match="fma of i32"):
        verify_kernel(parse_kernel("kernel @k(%x: i32[4]) { %x[0] = fma(%x[1], %x[2], %x[3]) }"))
    with pytest.raises(ParseError, match="fma takes 3 operands"):
        parse_kernel("kernel @k(%x: f32[4]) { %x[0] = fma(%x[1], %x[2]) }")
    program = parse_program(text + "program @p {\n  input %a: f32[4]\n  output %b: f32[4]\n"
                            "  call @k(%a, %b)\n}\n")
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(interp.run_program(program, [x])[0], 2 * x + 1)


# -- unrolled and vectorized loops ---------------------------------------------------------------

def run(text: str, *arrays: np.ndarray) -> None:
    kernel = verify_kernel(parse_kernel(text))
    jit = cpu.compile_module(kernel_module([kernel]), target=HOST)
    jit.kernel(kernel.name, len(arrays))(*(a.ctypes.data for a in arrays))


def test_masked_vector_loop_and_unrolled_guard() -> None:
    # Lanes past min(16, n) neither load nor store; rows past min(4, n) are skipped.
    text = """kernel @k(%n: i64[], %x: f16[4,16], %y: f32[4,16]) {
  for %i = 0 to min(4, %n[]) unrolled {
    for %j = 0 to min(16, %n[]) vectorized {
      %y[%i, %j] = fma(f32(%x[%i, %j]), 2.0:f32, f32(%j))
    }
  }
}"""
    for n in (0, 3, 16, 40):
        x = data((4, 16), np.float16)
        y = np.full((4, 16), -7, np.float32)
        run(text, np.array(n, np.int64), x, y)
        want = np.full((4, 16), -7, np.float32)
        k = min(4, n)
        want[:k, :min(16, n)] = (2 * x.astype(np.float32) + np.arange(16))[:k, :min(16, n)]
        np.testing.assert_allclose(y, want, rtol=1e-6)


def test_lane_private_local_gather_and_uniform_if() -> None:
    text = """kernel @k(%x: f32[8,8], %flag: bool[], %y: f32[8], %last: f32[]) {
  local %t: f32[]
  for %j = 0 to 8 vectorized {
    %t[] = add(%x[%j, 1], %x[2, %j])
    if %flag[] {
      %y[%j] = mul(%t[], %t[])
    } else {
      %y[%j] = neg(%t[])
    }
  }
  %last[] = %t[]
}"""
    x = data((8, 8))
    for flag in (True, False):
        y, last = np.zeros(8, np.float32), np.zeros((), np.float32)
        run(text, x, np.array(flag), y, last)
        t = x[:, 1] + x[2, :]
        np.testing.assert_allclose(y, t * t if flag else -t, rtol=1e-6)
        assert last == t[-1]


def test_vector_stores_of_every_storage_type() -> None:
    # A uniform value rounded once (bf16, f16) and splat; an i64 lane index cast to f32; bool.
    text = """kernel @k(%x: f32[], %y: bf16[8], %z: f16[8], %w: bool[8]) {
  for %j = 0 to 8 vectorized {
    %y[%j] = bf16(%x[])
    %z[%j] = f16(%x[])
    %w[%j] = gt(%x[], f32(%j))
  }
}"""
    x = np.array(3.14159, np.float32)
    y, z, w = np.zeros(8, ml_dtypes.bfloat16), np.zeros(8, np.float16), np.zeros(8, bool)
    run(text, x, y, z, w)
    assert (y == x.astype(ml_dtypes.bfloat16)).all() and (z == x.astype(np.float16)).all()
    np.testing.assert_array_equal(w, np.arange(8) < x)


@pytest.mark.parametrize("body, why", [
    ("%y[%j] = %x[%j]\n %x[add(%j, 1)] = 1.0:f32", "read at another index"),
    ("%x[0] = %y[%j]", "nor a scatter to distinct elements"),
    ("if lt(%j, 3) { %y[%j] = 0.0:f32 }", "condition differs between lanes"),
    ("%y[%j] = floor(mul(%x[%j], 0.5:f32))", "floor on f32 has no vector code"),
    ("%y[%j] = %t[]\n %t[] = %x[%j]", "read before the lane stores it"),
])
def test_loops_that_cannot_run_on_lanes_fail_verification(body, why) -> None:
    """A `vectorized` loop the lanes cannot run is refused with its reason, by the verifier
    and by code generation (which no longer runs it serially in silence)."""
    text = f"""kernel @k(%x: f32[9], %y: f32[9]) {{
  local %t: f32[]
  %t[] = 5.0:f32
  for %j = 0 to 8 vectorized {{
    {body}
  }}
}}"""
    kernel = parse_kernel(text)
    reason = plan_vector(kernel.body[1], {"t"})
    assert isinstance(reason, str) and why in reason
    with pytest.raises(VerificationError, match=r"kernel @k: vectorized loop %j cannot run on"
                                                 r" lanes: .*" + re.escape(why)):
        verify_kernel(kernel)
    with pytest.raises(VerificationError, match=re.escape(why)):
        kernel_module([kernel])


def test_unrolled_loop_is_copied() -> None:
    kernel = verify_kernel(parse_kernel("""kernel @k(%x: f32[3], %y: f32[3]) {
  for %i = 0 to 3 unrolled { %y[%i] = mul(%x[%i], 2.0:f32) }
}"""))
    ir = cpu.llvm_ir_text(kernel_module([kernel]), optimized=False, target=HOST)
    assert "i.header" not in ir  # no loop: three copies of the body
    assert Const(3) == kernel.body[0].stop


def test_matrix_vector_takes_wide_tiles() -> None:
    """One row: matvec_width columns per tile (64 on AVX-512: four independent
    accumulators per k), values right for a width that is not a multiple of the tile."""
    from ember.loops.cost import schedule_summary

    kernel = kernel_of(matmul_graph((1, 96), (96, 200)))
    assert f"vectorized {gemm.matvec_width(HOST)}" in schedule_summary(kernel)
    check_compiled((1, 96), (96, 200))


def test_matrix_vector_columns_make_the_tasks(schedule) -> None:
    """A vector times a 512 x 256 matrix has one tile of rows; its columns are split into
    `parallel` tasks (each thread streams its own part of the matrix). Values stay right
    when the columns do not split evenly."""
    schedule(nr=64, parallel=4)
    kernel = kernel_of(matmul_graph((1, 512), (512, 256)))
    assert kernel.body[0].kind == "parallel" and kernel.body[0].stop == Const(4)
    schedule(nr=64, parallel=2)
    kernel = kernel_of(matmul_graph((1, 512), (512, 200)))
    assert kernel.body[0].kind == "parallel" and kernel.body[0].stop == Const(2)
    check_compiled((1, 512), (512, 200))
    schedule(nr=64, parallel=4)
    kernel = kernel_of(matmul_graph((1, 16), (16, 256)))  # 4K multiply-adds: one thread
    assert not any(isinstance(s, For) and s.kind == "parallel" for s in kernel.walk())


def test_write_back_without_vector_code_is_a_serial_loop() -> None:
    """A bf16 tile's write-back (its rounding has no vector code) and a one-column tile's
    store are serial loops in the lowered IR, so that the program verifies and the IR says
    how the loops run."""
    for graph in (matmul_graph((37, 45), (45, 50), "bf16"), matmul_graph((20, 17), (17,))):
        kernel = kernel_of(graph)
        writes = [s for s in walk_stmts(kernel.body) if isinstance(s, For) and
                  any(isinstance(t, Store) and t.buffer == "y0" for t in s.body)]
        assert writes and all(s.kind == "serial" for s in writes)


def test_gemm_is_a_primitive() -> None:
    """The matmul schedule is one step of a kernel's schedule: printed, parsed back and
    replayed it gives the same kernel; a loop that heads no matmul nest is refused."""
    program = lower_graph(matmul_graph((7, 13), (13, 5)), target=HOST)
    plain = simplify_kernel(program.kernels[0])
    chosen = gemm.GemmSchedule(mr=3, nr=4, kc=8, mc=6, nc=8, pack_a=True, parallel=2)
    step = Step(*gemm.gemm_step("i0", chosen))
    text = str(Schedule([step]))
    assert text == "gemm i0 3 4 8 6 8 1 2\n"
    replayed = Schedule.parse(text).apply(plain)
    assert print_kernel(replayed) == print_kernel(step.apply(plain))
    assert (3, 4) in [b.shape for b in replayed.locals]  # the register tile
    program.kernels = [replayed]
    x, y = data((7, 13)), data((13, 5))
    np.testing.assert_allclose(interp.run_program(program, [x, y])[0], x @ y, rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(ScheduleError, match="not the outermost loop of an f32 matmul"):
        Step(*gemm.gemm_step("i1", chosen)).apply(plain)


# -- vector widths ---------------------------------------------------------------------------

CPU_PRESETS = [t for t in PRESETS.values() if t.kind == "cpu"]


@pytest.mark.parametrize("target", CPU_PRESETS, ids=lambda t: t.name)
def test_fitted_tiles_are_whole_vectors(target) -> None:
    """A matmul narrower than the default tile but wider than a vector (N = 24 of 16
    lanes) gets a tile of whole vectors, its columns past N masked: a <24 x float> tile
    was shuffled through the stack by LLVM (512x512x24: 2.5 ms, 20x torch's)."""
    lanes = target.lanes(DType.f32)
    for n in range(1, 5 * lanes):
        ctx = LowerContext(matmul_graph((64, 32), (32, n)).ops[-1], target)
        g = gemm.match_gemm(plain_matmul(ctx))
        fitted = gemm.fit_schedule(g, gemm.default_gemm_schedule(g, target), target)
        vectors = fitted.nr // lanes
        assert fitted.nr <= lanes or (fitted.nr % lanes == 0 and vectors & (vectors - 1) == 0)
        assert fitted.nr >= min(n, lanes)


def test_a_tile_of_three_vectors_is_refused_with_its_reason(schedule) -> None:
    lanes = HOST.lanes(DType.f32)
    schedule(mr=4, nr=3 * lanes)
    with pytest.raises(ScheduleError, match=rf"nr={3 * lanes} .*power of two of vectors"):
        kernel_of(matmul_graph((64, 64), (64, 256)))


@pytest.mark.parametrize("n", [17, 24, 31])
def test_a_tile_rounded_up_past_n_computes_the_matmul(n) -> None:
    check_compiled((37, 29), (29, n))


@pytest.mark.parametrize("name, cols, vectors", [
    ("znver4", 40, 1), ("znver4", 48, 1), ("znver4", 64, 2), ("znver4", 1000, 2),
    ("sapphirerapids", 100, 1), ("sapphirerapids", 200, 2), ("sapphirerapids", 64, 4),
    ("sapphirerapids", 1000, 4), ("znver3", 20, 1), ("znver3", 32, 2),
    ("neoverse-n1", 40, 2)])
def test_the_tile_is_narrower_where_the_wide_one_would_pad_an_eighth_more(name, cols,
                                                                         vectors) -> None:
    """N = 40 of 16 lanes: 48 columns in tiles of one vector, 64 in tiles of two (a tile
    of one measured 1.3x faster at 512x512x40 on Zen 4); N = 200: 208 against 224, too
    little to give up two vectors' loads per FMA, but 256 in tiles of four is. The rows
    stay at most the two-vector tile's, or as many as keep the FMA units busy where that
    is more (AVX2's one-vector tile: 6 rows were 6 accumulators for 2 units)."""
    target = Target.named(name)
    lanes = target.lanes(DType.f32)
    tile = gemm.matrix_tile(target, 512, None, cols=cols)
    assert tile.nr == vectors * lanes
    busy = -(-target.fma_units * target.fma_latency // vectors)
    assert tile.mr <= max(gemm.register_tile(target, max(vectors, 2))[0], busy)
    assert tile.mr * vectors >= min(busy * vectors, gemm.register_tile(target, vectors)[0])


@pytest.mark.parametrize("m, k, n", [(1, 300, 1000), (2, 7, 65), (1, 1, 4096), (2, 129, 3000),
                                     (1, 64, 100)])
@pytest.mark.parametrize("epilogue", [False, True])
def test_a_matrix_vector_product_streams_the_rows_of_b(m, k, n, epilogue) -> None:
    """One or two rows times a B read in place, wider than the tile: per k, the task's
    columns of row k of B into sums kept in a local (gemm._RowStream), a masked chunk past
    the whole ones of N; with a fused epilogue, the same values as NumPy."""
    b = ember.Builder("mv")
    y = b.matmul(b.input("a", "f32", (m, k)), b.input("b", "f32", (k, n)))
    b.output(b.tanh(y) if epilogue else y)
    graph = b.build()
    tile = gemm.default_tile(m, False, n, HOST)
    (_, g), = gemm.matmul_nests(lower_graph(graph, target=HOST).kernels[0])
    assert gemm.streams_rows(g, tile)
    kernel = kernel_of(graph)
    width = next(buf.shape[1] for buf in kernel.locals if len(buf.shape) == 2)
    assert width % tile.nr == 0 and 4 * m * width <= gemm.ROW_STREAM_BYTES
    assert not any(len(buf.shape) == 3 for buf in kernel.locals)  # nothing packed
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    got, = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))(x, w)
    want = x.astype(np.float64) @ w
    np.testing.assert_allclose(got, np.tanh(want) if epilogue else want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, k", [(32, 32), (33, 40), (7, 100), (1, 17), (700, 300)])
@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("target", ["host", "znver3", "znver4", "sapphirerapids", "neoverse-n1"])
def test_a_matrix_times_a_vector_runs_dot_products_on_lanes_along_k(m, k, epilogue,
                                                                      target) -> None:
    """A @ v (fewer columns than the tile's lanes, A and v contiguous along k): each
    element a dot product, partial sums on the tile's lanes along k and one horizontal
    sum a row (gemm._DotRows); rows past the last tile and a k tail shorter than the
    lanes still give NumPy's values, with a fused epilogue too."""
    machine = Target.get(target)
    b = ember.Builder("av")
    y = b.matmul(b.input("a", "f32", (m, k)), b.input("v", "f32", (k,)))
    b.output(b.tanh(y) if epilogue else y)
    graph = b.build()
    (_, g), = gemm.matmul_nests(lower_graph(graph, target=machine).kernels[0])
    tile = gemm.fit_schedule(g, gemm.default_gemm_schedule(g, machine), machine)
    assert gemm.dots_rows(g, tile.nr) and tile.nr == machine.lanes(DType.f32) * \
        gemm.tile_vectors(machine)
    program = verify_program(schedule_program(lower_graph(graph, target=machine), machine))
    lanes = min(tile.nr, 1 << (k - 1).bit_length())  # a shallow K: the lanes that cover it
    assert any(isinstance(s, For) and s.kind == "vectorized" and s.stop == Const(lanes)
               for s in walk_stmts(program.kernels[0].body))
    x = RNG.standard_normal((m, k)).astype(np.float32)
    v = RNG.standard_normal(k).astype(np.float32)
    want = x.astype(np.float64) @ v
    want = np.tanh(want) if epilogue else want
    if machine.runs_here() and set(machine.features) <= set(HOST.features):
        got, = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False,
                                                        target=machine))(x, v)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if m * k <= 4000:  # (the loop interpreter runs in Python)
        np.testing.assert_allclose(interp.run_program(program, [x, v])[0], want, rtol=1e-4,
                                   atol=1e-4)


def test_columns_that_are_not_contiguous_along_k_keep_the_blocked_tile() -> None:
    """B of three columns reads k with a stride: the tile stays along the columns."""
    (_, g), = gemm.matmul_nests(lower_graph(matmul_graph((30, 64), (64, 3)),
                                            target=HOST).kernels[0])
    assert not gemm.dots_rows(g, gemm.default_gemm_schedule(g, HOST).nr)
    check_compiled((30, 64), (64, 3))


@pytest.mark.parametrize("m, k, n, in_place", [(32, 64, 128, True), (12, 128, 96, True),
                                               (40, 256, 1024, False), (200, 64, 64, False)])
def test_a_small_row_major_b_is_read_in_place_by_few_tiles(m, k, n, in_place) -> None:
    """A B of at most B_IN_PLACE_WHOLE_BYTES read by at most B_IN_PLACE_TILES row tiles
    is read where it lies (no packed panel local); a larger B, or more tiles, packs it."""
    graph = matmul_graph((m, k), (k, n))
    kernel = kernel_of(graph)
    packed = any(len(buf.shape) == 3 for buf in kernel.locals)
    assert packed is not in_place
    check_compiled((m, k), (k, n))
