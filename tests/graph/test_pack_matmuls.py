"""The pack_matmuls pass (ember/graph/passes/pack_matmuls.py) and its kernel
(`packed_matmul`, ember/loops/lower/ops/linalg.py, read in place by the matmul schedule):
matmuls by a constant matrix get its panels packed at compile time, in the width of the
tile the schedule gives them (64 columns for a matrix-vector product); small,
narrow or non-constant matrices and other dtypes keep `matmul`. Values: compiled
against the interpreter on the graph before the pass, with N a multiple of the panel
width and not, batches, one and two rows, fused epilogues, and a schedule whose tile is
narrower than the panels (which copies them)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Builder, interpret
from ember.driver.backend import CpuBackend, _panel_width
from ember.driver.pass_manager import run_passes
from ember.graph.ops.linalg import unpack_matmul_weights
from ember.graph.passes.fold import constant_value
from ember.loops.ir import For, Prefetch, walk_expr, walk_stmts
from ember.loops.lower import lower_graph
from ember.loops.schedule import schedule_program
from ember.loops.schedules import gemm
from ember.loops.text import format_expr, print_kernel
from ember.target import Target

HOST = Target.host()


def scheduled_kernel(graph):
    """The graph's first kernel, lowered and scheduled for the host."""
    return schedule_program(lower_graph(graph, target=HOST), HOST).kernels[0]
BACKEND = CpuBackend(HOST)


def panel_width(x_shape, n: int) -> int:
    return _panel_width(HOST, x_shape, n)


def packed_graph(graph):
    """`graph` after pack_matmuls, with the host backend's panel widths, and dce."""
    return run_passes(graph, ["pack_matmuls", "dce"], configure=BACKEND.configure)

RNG = np.random.default_rng(23)
CPU = ember.Config(executor="cpu", disk_cache=False)


def data(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def matmul_graph(x_shape, w, epilogue=False):
    b = Builder("mm")
    y = b.matmul(b.input("x", "f32", x_shape), b.constant(w, name="w"))
    if epilogue:  # a bias and a ReLU: the fused epilogue of a linear layer
        y = b.max(b.add(y, b.constant(data(w.shape[1]), name="bias")),
                  b.constant(np.float32(0)))
    b.output(y)
    return b.build()


def check_compiled(graph, x) -> None:
    want = interpret(graph, [x])[0]
    got = ember.compile(graph, config=CPU)(x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("x_shape, n, epilogue", [
    ((40, 256), 320, False),  # N a multiple of 16 and 32
    ((3, 300), 250, True),  # N past the last panel's end; three rows
    ((2, 24, 128), 520, True),  # a batch, folded into rows
    ((1, 784), 512, True),  # a matrix-vector product: 64-column panels
    ((2, 300), 330, False),  # two rows, N past the last panel's end
    ((2, 1, 512), 256, False),  # two rows in a batch: the matrix tile's panels
])
def test_constant_matrices_are_packed_and_match_the_interpreter(x_shape, n,
                                                                 epilogue) -> None:
    w = data(x_shape[-1], n) / 10
    graph = matmul_graph(x_shape, w, epilogue)
    packed = packed_graph(graph)
    (op,) = [op for op in packed.walk() if "matmul" in op.name]
    assert op.name == "packed_matmul" and op.attrs["n"] == n
    wp = constant_value(packed, op.operands[1])
    assert wp.shape[2] == panel_width(x_shape, n)
    np.testing.assert_array_equal(unpack_matmul_weights(wp, n), w)
    check_compiled(graph, data(*x_shape))


@pytest.mark.parametrize("x_shape", [(64, 256), (1, 256), (2, 1, 256)])
def test_the_schedule_reads_the_panels_in_place(x_shape) -> None:
    """No copy of B: the kernel's only locals are the register tile and the accumulator,
    and the micro-kernel loads a row of the tile's panel."""
    graph = packed_graph(matmul_graph(x_shape, data(256, 512)))
    kernel = scheduled_kernel(graph)
    lanes = panel_width(x_shape, 512)
    assert [b.shape for b in kernel.locals if len(b.shape) == 3] == []
    text = print_kernel(kernel)
    assert "fma(%x0[" in text and f"0 to {lanes} vectorized" in text


def test_the_tiles_of_a_panel_prefetch_the_next_one() -> None:
    """Each k step of a tile over packed weights prefetches a line of the same row of the
    panel after its own (the last panel's tiles: their own panel's, in bounds), and the
    block's tiles take different lines, so that together they cover the row."""
    x_shape, n = (64, 256), 512
    graph = packed_graph(matmul_graph(x_shape, data(256, n)))
    kernel = scheduled_kernel(graph)
    lanes = panel_width(x_shape, n)
    prefetches = [s for s in walk_stmts(kernel.body) if isinstance(s, Prefetch)]
    assert prefetches and {p.buffer for p in prefetches} == {"x1"}
    (k_loop,) = {id(s): s for s in walk_stmts(kernel.body) if isinstance(s, For)
                 and any(p is s.body[0] for p in prefetches)}.values()
    panel, k, line = prefetches[0].index
    assert k_loop.var in set(walk_expr(k))  # the step's row (of its pass: k0 + k)
    assert format_expr(panel).startswith("min(")
    assert format_expr(panel).endswith(f", {n // lanes - 1})")  # the last panel, at most
    assert "mod(" in format_expr(line) or lanes * 4 <= gemm.CACHE_LINE_BYTES
    check_compiled(matmul_graph(x_shape, data(256, n) / 10), data(*x_shape))


def test_a_narrower_tile_copies_the_panels(monkeypatch) -> None:
    """A schedule whose tile is not the panel width (a tuned one, say) packs B from the
    panels as it would from any B, and computes the same values."""
    narrow = gemm.GemmSchedule(mr=4, nr=8)
    monkeypatch.setattr(gemm, "default_gemm_schedule", lambda g, target: narrow)
    graph = matmul_graph((20, 256), data(256, 300) / 10)
    kernel = scheduled_kernel(packed_graph(graph))
    assert any(len(b.shape) == 3 for b in kernel.locals)  # the copied panels
    check_compiled(graph, data(20, 256))


@pytest.mark.parametrize("x_shape, w_shape, dtype, why", [
    ((4, 8192), (8192, 10), "f32", "narrower than a tile: one panel, as it lies"),
    ((8, 64), (64, 64), "f32", "4096 elements: the copy costs little"),
    ((8, 256), (256, 256), "f16", "only f32 is packed"),
])
def test_matmuls_that_keep_their_matrix(x_shape, w_shape, dtype, why) -> None:
    b = Builder("mm")
    w = RNG.standard_normal(w_shape).astype({"f32": np.float32, "f16": np.float16}[dtype])
    b.output(b.matmul(b.input("x", dtype, x_shape), b.constant(w)))
    graph = packed_graph(b.build())
    assert [op.name for op in graph.walk() if "matmul" in op.name] == ["matmul"], why


def test_a_matrix_that_is_an_input_is_not_packed() -> None:
    b = Builder("mm")
    b.output(b.matmul(b.input("x", "f32", (8, 256)), b.input("w", "f32", (256, 256))))
    graph = packed_graph(b.build())
    assert [op.name for op in graph.walk() if "matmul" in op.name] == ["matmul"]


@pytest.mark.parametrize("n", [48, 50])
def test_a_transposed_weight_packs_as_a_contiguous_one(n) -> None:
    """A Linear's weight [N, K] reaches packing as its transposed view: the panels read its
    rows in blocks, and are the same as those of the contiguous matrix."""
    from ember.graph.ops.linalg import pack_matmul_weights

    weight = np.random.default_rng(3).standard_normal((n, 37)).astype(np.float32)
    from_view = pack_matmul_weights(weight.T, 16)
    np.testing.assert_array_equal(from_view, pack_matmul_weights(np.ascontiguousarray(weight.T),
                                                                  16))
    np.testing.assert_array_equal(unpack_matmul_weights(from_view, n), weight.T)
