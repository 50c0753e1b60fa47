"""Schedules shaped by the target's facts, not by the host's: synthetic targets (made with
`Target.with_`) get GEMM register tiles that fit their registers and keep their FMA units
busy, micro-kernels and elementwise loops as wide as their vectors, and the code compiled
for them computes what NumPy does; each preset gets the tiles its docstrings promise
(ember/loops/schedules/gemm.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ember
from ember import parse_graph, print_graph
from ember.codegen.cpu import llvm_ir_text
from ember.codegen.llvm import program_module
from ember.driver.pipeline import lower_to_program
from ember.dtypes import DType
from ember.graph.symbolic import symbol
from ember.loops.ir import Const, Fma, For, Kernel, Stmt, Store
from ember.loops.lower import lower_graph
from ember.loops.schedule import schedule_program
from ember.loops.schedules.gemm import (
    A_REUSE_PANELS,
    NC_COLUMNS,
    GemmSchedule,
    cache_blocks,
    conv_tile,
    default_tile,
    matrix_tile,
    matvec_width,
    pass_depth,
    register_tile,
    tile_rows,
    tile_vectors,
    whole_vectors,
)
from ember.target import Target

HOST = Target.host()
ZEN3 = Target.named("znver3")
# 8 f32 lanes, 16 registers, one FMA unit: AVX2 with a single FMA pipe.
EIGHT_LANES = ZEN3.with_(name="avx2-1fma", vector_bits=256, vector_registers=16, fma_units=1,
                         fma_latency=4)
# 4 f32 lanes, 32 registers, two FMA units: an SSE-width machine with AVX-512's registers.
FOUR_LANES = ZEN3.with_(name="sse-32regs", vector_bits=128, vector_registers=32, fma_units=2,
                        fma_latency=4)
# 24 accumulators would keep its FMA units busy; 16 registers hold at most 12 of them.
REGISTER_BOUND = ZEN3.with_(name="avx2-4fma", vector_bits=256, vector_registers=16,
                            fma_units=4, fma_latency=6)
SYNTHETIC = [EIGHT_LANES, FOUR_LANES, REGISTER_BOUND]
ids = [t.name for t in SYNTHETIC]
RNG = np.random.default_rng(11)


def matmul_graph(m=128, k=256, n=256) -> ember.Graph:
    b = ember.Builder("mm")
    b.output(b.matmul(b.input("x", "f32", (m, k)), b.input("y", "f32", (k, n))))
    return b.build()


def elementwise_graph(shape=(64, 101)) -> ember.Graph:
    """exp(x) + y; 101 columns leave a tail for both 8 and 4 lanes."""
    b = ember.Builder("ew")
    x, y = b.input("x", "f32", shape), b.input("y", "f32", shape)
    b.output(b.add(b.exp(x), y))
    return b.build()


def scheduled(graph, target: Target):
    return schedule_program(lower_graph(graph, target), target)


def loops_with_parents(stmts: list[Stmt], parents=()):
    """(loop, enclosing loops outermost first) for every For in `stmts`."""
    for s in stmts:
        if isinstance(s, For):
            yield s, parents
            yield from loops_with_parents(s.body, (*parents, s))


def micro_kernel(kernel: Kernel) -> tuple[For, For]:
    """(the unrolled row loop, the vectorized column loop) of the GEMM's FMA update."""
    found = [(loop, parents[-1]) for loop, parents in loops_with_parents(kernel.body)
             if loop.kind == "vectorized" and len(loop.body) == 1
             and isinstance(loop.body[0], Store) and isinstance(loop.body[0].value, Fma)]
    assert len(found) == 1, f"expected one FMA micro-kernel, found {len(found)}"
    columns, rows = found[0]
    assert rows.kind == "unrolled"
    return rows, columns


def extent(loop: For) -> int:
    assert loop.start == Const(0) and isinstance(loop.stop, Const)
    return int(loop.stop.value)


def constant_extents(kernel: Kernel, kind: str) -> set[int]:
    """The trip counts of `kernel`'s loops of `kind` whose bounds are constants."""
    return {extent(loop) for loop, _ in loops_with_parents(kernel.body)
            if loop.kind == kind and isinstance(loop.stop, Const)}


def vector_widths(ir_text: str, element: str = "float") -> set[int]:
    return {int(n) for n, t in re.findall(r"<(\d+) x (\w+)>", ir_text) if t == element}


# -- (a) the GEMM register tile --------------------------------------------------------------
@pytest.mark.parametrize("target", SYNTHETIC, ids=ids)
def test_register_tile_fits_the_registers_and_feeds_the_fma_units(target) -> None:
    """nr is whole vectors; accumulators + B's vectors + a broadcast fit the registers; there
    are fma_units * fma_latency accumulators, or as many as the registers allow."""
    mr, nr = register_tile(target)
    lanes = target.lanes(DType.f32)
    assert nr % lanes == 0
    across = nr // lanes
    accumulators = mr * across
    assert accumulators + across + 1 <= target.vector_registers
    most = (target.vector_registers - across - 1) // across * across
    assert accumulators >= min(target.fma_units * target.fma_latency, most)
    tile = matrix_tile(target, 128, 1024)
    assert default_tile(128, False, 256, target, a_pitch=1024) == tile
    assert tile.nr == nr and tile.mr == tile_rows(target, 128, 1024) <= mr
    assert tile.mr * across >= min(target.fma_units * target.fma_latency, most)


def test_register_bound_target_takes_every_register_it_can() -> None:
    """When FMA latency asks for more accumulators than fit, the tile uses all that fit."""
    assert register_tile(REGISTER_BOUND) == (6, 16)  # 12 accumulators + 2 + 1 = 15 of 16


@pytest.mark.parametrize("target", SYNTHETIC, ids=ids)
def test_lowered_matmul_micro_kernel_has_the_targets_tile(target) -> None:
    """A 128x256x256 matmul's micro-kernel: mr rows unrolled, nr lanes vectorized, an
    mr x nr accumulator."""
    mr, nr = tile_rows(target, 128, 256 * 4), register_tile(target)[1]
    kernel, = scheduled(matmul_graph(), target).kernels
    rows, columns = micro_kernel(kernel)
    assert (extent(rows), extent(columns)) == (mr, nr)
    assert any(b.shape == (mr, nr) for b in kernel.locals)
    # the other vectorized loops (packing B, zeroing the tile) are nr lanes too
    assert constant_extents(kernel, "vectorized") == {nr}


def test_synthetic_targets_get_different_micro_kernels() -> None:
    """The same 128-row matmul lowered for three targets. 8 lanes x 16 registers: 2 vectors
    across, 6 rows (6x16). 4 lanes x 32 registers and one FMA unit: 2 vectors, 14 rows
    (16 loads per 28 FMA cycles), and 10 tiles of 13 cover 128 rows in fewer FMA rounds
    than 10 of 14 or 11 of 12 (13x8). The same with two FMA units: 2 vectors would ask 16
    loads per 14 cycles, 4 vectors of 6 rows ask 10 per 12 (6x16, four vectors)."""
    one_fma = FOUR_LANES.with_(name="sse-32regs-1fma", fma_units=1)
    assert [tile_vectors(t) for t in (EIGHT_LANES, one_fma, FOUR_LANES)] == [2, 2, 4]
    shapes = [tuple(map(extent, micro_kernel(scheduled(matmul_graph(), t).kernels[0])))
              for t in (EIGHT_LANES, one_fma, FOUR_LANES)]
    assert shapes == [(6, 16), (13, 8), (6, 16)]


# -- (b) elementwise kernels -----------------------------------------------------------------
@pytest.mark.parametrize("target", [EIGHT_LANES, FOUR_LANES], ids=ids[:2])
def test_elementwise_loops_are_as_wide_as_the_targets_vectors(target) -> None:
    """exp(x) + y on f32[64, 101]: vectorized blocks of lanes(f32), then a shorter tail."""
    lanes = target.lanes(DType.f32)
    program, _ = lower_to_program(elementwise_graph(),
                                  ember.Config(executor="cpu", target=target))
    kernel, = program.kernels
    vectorized = [extent(loop) for loop, _ in loops_with_parents(kernel.body)
                  if loop.kind == "vectorized"]
    assert vectorized == [lanes, 101 % lanes]
    blocks = [extent(loop) for loop, _ in loops_with_parents(kernel.body)
              if any(inner.kind == "vectorized" for inner in loop.body if isinstance(inner, For))
              and loop.kind == "serial" and len(loop.body) == 1]
    assert 101 // lanes in blocks


@pytest.mark.parametrize("target", [EIGHT_LANES, FOUR_LANES], ids=ids[:2])
def test_llvm_ir_vectors_are_the_targets_width(target) -> None:
    """In LLVM IR the elementwise kernel's float vectors are one register of the target's,
    and the matmul's are its tile's nr lanes (nr / lanes registers: codegen gives LLVM a
    vectorized loop's whole trip count, ember/codegen/vector.py)."""
    lanes, (_, nr) = target.lanes(DType.f32), register_tile(target)
    for graph, want in ((elementwise_graph(), {lanes, 101 % lanes}), (matmul_graph(), {nr})):
        program, plan = lower_to_program(graph, ember.Config(executor="cpu", target=target))
        widths = vector_widths(llvm_ir_text(program_module(program, plan.offsets), target,
                                            optimized=False))
        assert widths == want, (graph.name, sorted(widths))


# -- numerics: the synthetic targets' code runs on an x86 host with AVX2 ---------------------
runs_here = pytest.mark.skipif(
    not (EIGHT_LANES.runs_here() and set(ZEN3.features) <= set(HOST.features)),
    reason="the synthetic targets are x86 with AVX2: their code runs on such a host only")


@runs_here
@pytest.mark.parametrize("target", [EIGHT_LANES, FOUR_LANES], ids=ids[:2])
def test_matmul_compiled_for_synthetic_target_matches_numpy(target) -> None:
    """A 128x256x256 and an odd 37x70x29 matmul compiled for the target give NumPy's."""
    config = ember.Config(executor="cpu", target=target, disk_cache=False)
    for m, k, n in ((128, 256, 256), (37, 70, 29)):
        x = RNG.standard_normal((m, k)).astype(np.float32)
        y = RNG.standard_normal((k, n)).astype(np.float32)
        got, = ember.compile(matmul_graph(m, k, n), config=config)(x, y)
        np.testing.assert_allclose(got, x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)


@runs_here
@pytest.mark.parametrize("target", [EIGHT_LANES, FOUR_LANES], ids=ids[:2])
def test_elementwise_compiled_for_synthetic_target_matches_numpy(target) -> None:
    """exp(x) + y compiled for the target gives NumPy's, the tail included."""
    config = ember.Config(executor="cpu", target=target, disk_cache=False)
    x, y = (RNG.standard_normal((64, 101)).astype(np.float32) for _ in range(2))
    got, = ember.compile(elementwise_graph(), config=config)(x, y)
    np.testing.assert_allclose(got, np.exp(x) + y, rtol=1e-6, atol=1e-6)


# -- (c) the presets' documented tiles --------------------------------------------------------
# register_tile: tile_vectors across (the fewest whose tallest tile asks at most one load a
# cycle of its FMA units: (rows + vectors) * fma_units / (rows * vectors) <= 1); the most
# rows = (registers - vectors - 1) // vectors (accumulators + B's vectors + 1 broadcast
# fit; tile_rows picks a matmul's rows up to these).
# conv_tile: CONV_COLUMNS (16) f32 across; rows = (registers - vectors - 1) // vectors,
# at most 8. matvec_width: MAX 256 bytes of f32 across, at most (registers - 2) // 2 vectors
# (two rows of accumulators and their broadcasts), a power of two of them.
PRESET_TILES = {
    # 8 lanes, 16 registers, 2 FMA x 4: no width asks one load a cycle or less (2 vectors:
    # 6 rows, 8 loads per 6 cycles; 4 vectors: 2 rows, 6 per 4), 2 is the fewest loads;
    # conv: 16 columns = 2 vectors, same 6 rows; matvec: 8 vectors of 256 bytes but only
    # (16 - 2) // 2 = 7 fit, and 4 is the power of two below: 32 columns.
    "znver3": ((6, 16), (6, 16), 32),
    # 16 lanes, 32 registers, 1 FMA x 4: 2 vectors (16 loads per 28 cycles), (32 - 3) // 2
    # = 14 rows; conv: 16 columns are 1 vector, so 2 vectors, 14 rows cut to 8; matvec:
    # 256 bytes = 4 vectors.
    "znver4": ((14, 32), (8, 32), 64),
    # 16 lanes, 32 registers, 2 FMA x 4: 2 vectors would ask 16 loads per 14 cycles, 4
    # vectors of (32 - 5) // 4 = 6 rows ask 10 per 12; conv and matvec as znver4.
    "sapphirerapids": ((6, 64), (8, 32), 64),
    # 4 lanes, 32 registers, 2 FMA x 4: 4 vectors of 6 rows, as sapphirerapids; conv:
    # 16 columns = 4 vectors, (32 - 4 - 1) // 4 = 6 rows (24 + 4 + 1 = 29 registers);
    # matvec: 256 bytes = 16 vectors, (32 - 2) // 2 = 15 fit, 8 of them: 32 columns.
    "neoverse-n1": ((6, 16), (6, 16), 32),
    # 4 lanes, 32 registers, 1 FMA x 4: 2 vectors of 14 rows, as znver4.
    "aarch64-linux-gnu": ((14, 8), (6, 16), 32),
}


@pytest.mark.parametrize("name", PRESET_TILES)
def test_preset_tiles_are_the_documented_ones(name) -> None:
    """register_tile, conv_tile and matvec_width of each CPU preset."""
    target = Target.named(name)
    assert (register_tile(target), conv_tile(target), matvec_width(target)) == \
        PRESET_TILES[name]


@pytest.mark.parametrize("name", PRESET_TILES)
def test_preset_conv_and_matvec_tiles_fit_the_registers(name) -> None:
    """The conv tile's accumulators, its B vectors and a broadcast fit the registers, and a
    matrix-vector tile's two rows of accumulators and two broadcasts do."""
    target = Target.named(name)
    lanes = target.lanes(DType.f32)
    mr, nr = conv_tile(target)
    assert nr % lanes == 0 and mr * (nr // lanes) + nr // lanes + 1 <= target.vector_registers
    width = matvec_width(target)
    assert width % lanes == 0 and 2 * (width // lanes) + 2 <= target.vector_registers
    assert width * 4 <= 256 and whole_vectors(width, lanes)
    assert default_tile(1, False, 4 * width, target).nr == width


# A square sgemm's tile rows and blocks on each preset. Rows: at most the registers' 14 (6
# with 16 registers or four vectors across); A's rows 4 KiB apart (K = 1024) all fall in
# one set of a 4 KiB-way L1 (znver3/4: 32 KiB 8-way), so the rows stop at its ways. 16
# rows: two tiles of 8 (three of 6 where 6 is the most). kc: the deepest B panel
# (kc x nr f32) in half of L2.
PRESET_BLOCKS = {
    "znver3": (6, 6, 256 << 10 >> 6),
    "znver4": (8, 8, 512 << 10 >> 7),
    "sapphirerapids": (6, 6, 1 << 20 >> 8),
    "neoverse-n1": (6, 6, 512 << 10 >> 6),
}


@pytest.mark.parametrize("name", PRESET_BLOCKS)
def test_preset_gemm_rows_and_blocks_derive_from_its_caches(name) -> None:
    """tile_rows for 1024 rows 4 KiB apart and for 16 rows; cache_blocks' kc."""
    target = Target.named(name)
    rows_1024, rows_16, kc = PRESET_BLOCKS[name]
    assert tile_rows(target, 1024, 4096) == rows_1024
    assert tile_rows(target, 16, 4096) == rows_16
    mr, nr = rows_1024, register_tile(target)[1]
    blocks = cache_blocks(target, mr, nr)
    assert blocks["kc"] == kc
    assert blocks["mc"] % mr == 0 and blocks["nc"] % nr == 0
    assert matrix_tile(target, 1024, 4096) == GemmSchedule(mr=mr, nr=nr, parallel=target.cores,
                                                            **blocks)


@pytest.mark.parametrize("name", PRESET_BLOCKS)
def test_preset_pass_depth_keeps_b_in_l1(name) -> None:
    """pass_depth: passes that keep a panel's block of B in half of L1 (a transformer
    projection of 50 rows, K = 768; 1024 x 1024); one pass of all K when K is that shallow
    already, A is larger than the cores' L2s together, or the rows are known only at call
    time."""
    target = Target.named(name)
    schedule = matrix_tile(target, 50)
    in_l1 = target.l1d_bytes // 2 // (4 * schedule.nr)
    assert 16 <= in_l1 < 768 and 4 * in_l1 * schedule.nr <= target.l1d_bytes // 2
    assert pass_depth(schedule, target, 50, 768) == in_l1
    assert pass_depth(schedule, target, 1024, 1024) == in_l1
    beyond = target.cores * target.l2_bytes // (4 * 1024) + 1  # rows of A beyond the L2s
    assert pass_depth(schedule, target, beyond, 1024) == schedule.kc
    assert schedule.kc == cache_blocks(target, schedule.mr, schedule.nr)["kc"]
    assert pass_depth(schedule, target, 50, in_l1) == schedule.kc
    assert pass_depth(schedule, target, symbol("rows"), 768) == schedule.kc  # (any size)


@pytest.mark.parametrize("name", PRESET_BLOCKS)
@pytest.mark.parametrize("rows", [50, 256])
def test_a_larger_than_half_of_l2_serves_several_panels_a_pass(name, rows) -> None:
    """In passes, a block of columns is A_REUSE_PANELS panels or more where A (rows x K)
    fills more than half of L2, so that each pass's slice of A, read from L3, serves
    them all; A in L2 keeps the narrower blocks (NC_COLUMNS)."""
    target = Target.named(name)
    k, n = target.l2_bytes // 4 // 200, 2048  # A of 50 rows: a quarter of L2; 256: 1.28x
    b = ember.Builder("projection")
    b.output(b.matmul(b.input("x", "f32", (rows, k)), b.constant(np.ones((k, n), np.float32))))
    schedules: dict = {}
    lower_to_program(b.build(), ember.Config(executor="cpu", target=target), {}, schedules)
    (chosen,) = [v["schedule"] for key, v in schedules.items() if key.startswith("gemm/")]
    nr = chosen["nr"]
    assert chosen["kc"] == target.l1d_bytes // 2 // (4 * nr)
    if rows * k * 4 > target.l2_bytes // 2:
        assert chosen["nc"] >= A_REUSE_PANELS * nr
    else:
        assert chosen["nc"] == nr * max(1, round(NC_COLUMNS / nr))


@runs_here
def test_matmul_in_passes_of_the_l1s_depth_matches_numpy() -> None:
    """A projection whose A stays in L2 (50 rows), by constant weights packed at compile
    time, with a depth that no pass divides and a last panel of a few columns: summed in
    passes of the L1's depth, it gives NumPy's."""
    m, k, n = 50, 770, 200
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    b = ember.Builder("projection")
    b.output(b.matmul(b.input("x", "f32", (m, k)), b.constant(w)))
    graph, config = b.build(), ember.Config(executor="cpu", disk_cache=False)
    schedules: dict = {}
    lower_to_program(parse_graph(print_graph(graph)), config, {}, schedules)
    (chosen,) = [v["schedule"] for key, v in schedules.items() if key.startswith("gemm/")]
    assert chosen["kc"] < k  # (in passes)
    got, = ember.compile(graph, config=config)(x)
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
