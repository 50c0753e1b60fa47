"""The pack_convs pass (ember/graph/passes/pack_convs.py) and the kernel it chooses
(`packed_conv`, ember/loops/schedules/packed_conv.py): convs on small planes with constant
weights and long sums get packed weights and output channels in the vector lanes; others
keep the implicit GEMM. Values: compiled against the interpreter on the graph before the
pass, on planes whose positions fill whole tiles and ones that leave a partial last tile,
with strides, dilations, 3x3 taps, batches, bias and fused epilogues (ReLU6, a residual
add)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Builder, interpret
from ember.driver.pass_manager import run_passes
from ember.graph.ops.linalg import unpack_conv_weights
from ember.loops.analysis import access_kind
from ember.loops.ir import For, Prefetch, Store, walk_stmts
from ember.loops.lower import lower_graph
from ember.loops.schedule import schedule_program
from ember.loops.text import format_expr
from ember.target import Target

HOST = Target.host()

RNG = np.random.default_rng(17)
CPU = ember.Config(executor="cpu", disk_cache=False)


def data(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def conv_graph(x_shape, w, bias=None, epilogue="", **attrs):
    b = Builder("conv")
    x = b.input("x", "f32", x_shape)
    args = [x, b.constant(w, name="w")] + ([b.constant(bias, name="b")] if bias is not None
                                           else [])
    y = b.conv(*args, **attrs)
    if epilogue == "relu6":
        y = b.min(b.max(y, b.constant(np.float32(0))), b.constant(np.float32(6)))
    elif epilogue == "residual":
        y = b.add(y, b.input("r", "f32", tuple(y.shape)))
    b.output(y)
    return b.build()


def op_names(graph) -> list[str]:
    return [op.name for op in graph.walk() if "conv" in op.name]


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 256, 7, 7), (64, 256, 1, 1), {}),  # 49 positions: 7 tiles of 7
    ((1, 128, 7, 7), (32, 128, 1, 1), {}),  # K = 128 on a plane that wastes lanes
    ((1, 64, 9, 9), (48, 64, 3, 3), {}),  # 3x3 taps, M = 48: panels of 16
    ((2, 256, 11, 11), (32, 256, 1, 1), {"strides": (2, 2)}),  # 36 positions: 6 tiles of 6
    ((1, 32, 9, 9), (32, 32, 3, 3), {"pads": (1, 1, 1, 1), "dilations": (2, 2)}),
    ((1, 256, 5, 5), (32, 256, 1, 1), {}),  # 25 positions: a partial last tile
])
def test_small_plane_convs_are_packed_and_match_the_interpreter(x_shape, w_shape,
                                                                attrs) -> None:
    w, bias = data(*w_shape) / 10, data(w_shape[0])
    graph = conv_graph(x_shape, w, bias, **attrs)
    x = data(*x_shape)
    want = interpret(graph, [x])[0]
    packed = run_passes(graph, ["pad_convs", "pack_convs", "dce"])
    assert op_names(packed) == ["packed_conv"]
    (op,) = [op for op in packed.walk() if op.name == "packed_conv"]
    np.testing.assert_array_equal(
        unpack_conv_weights(packed.constant_data(op.operands[1].producer),
                            op.attrs["kernel_shape"]), w)
    assert "w" not in packed.constants  # the unpacked weights are gone
    np.testing.assert_allclose(interpret(packed, [x])[0], want, rtol=1e-5, atol=1e-5)
    compiled = ember.compile(graph, config=CPU)
    np.testing.assert_allclose(compiled(x)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("epilogue", ["relu6", "residual"])
def test_packed_conv_takes_a_fused_epilogue(epilogue: str) -> None:
    graph = conv_graph((1, 320, 7, 7), data(64, 320, 1, 1) / 10, data(64), epilogue)
    inputs = [data(1, 320, 7, 7)] + ([data(1, 64, 7, 7)] if epilogue == "residual" else [])
    compiled = ember.compile(graph, config=CPU)
    (kernel,) = ember.explain(compiled).kernels
    assert "packed_conv" in kernel.ops and len(kernel.ops) > 1
    np.testing.assert_allclose(compiled(*inputs)[0], interpret(graph, inputs)[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("epilogue", ["tanh", "residual"])
def test_an_epilogue_by_channel_runs_on_whole_vectors_of_channels(epilogue: str) -> None:
    """A bias and an activation read nothing by position: they run where the tile holds
    channels in its lanes (whole vectors), before the write-back turns it; a residual add
    reads its operand by position and stays in the write-back."""
    b = Builder("conv")
    x = b.input("x", "f32", (1, 128, 7, 7))
    y = b.conv(x, b.constant(data(64, 128, 1, 1) / 10), b.constant(data(64)))
    y = b.tanh(y) if epilogue == "tanh" else b.add(y, b.input("r", "f32", (1, 64, 7, 7)))
    b.output(y)
    graph = b.build()
    packed = run_passes(graph, ["pad_convs", "pack_convs", "dce", "fuse"])
    avx512 = Target.named("znver4")
    (kernel,) = schedule_program(lower_graph(packed, target=avx512), avx512).kernels
    (store,) = [s for s in walk_stmts(kernel.body) if isinstance(s, Store) and s.buffer == "y0"]
    (copy,) = [s for s in walk_stmts(kernel.body) if isinstance(s, Store)
               and s.buffer == kernel.locals[-1].name]
    text = format_expr(copy.value) + " / " + format_expr(store.value)
    if epilogue == "tanh":
        assert "tanh(" in format_expr(copy.value) and "tanh(" not in format_expr(store.value)
    else:
        assert "%x3[" in format_expr(store.value), text
    inputs = [data(1, 128, 7, 7)] + ([data(1, 64, 7, 7)] if epilogue == "residual" else [])
    np.testing.assert_allclose(ember.compile(graph, config=CPU)(*inputs)[0],
                               interpret(graph, inputs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape", [
    ((1, 256, 28, 28), (64, 256, 1, 1)),  # a plane of 784 positions: the GEMM's
    ((1, 96, 14, 14), (64, 96, 1, 1)),  # K = 96 on a plane that fills its lanes
    ((1, 256, 7, 7), (40, 256, 1, 1)),  # 40 output channels: not whole vectors
])
def test_other_convs_keep_the_implicit_gemm(x_shape, w_shape) -> None:
    graph = conv_graph(x_shape, data(*w_shape))
    assert op_names(run_passes(graph, ["pad_convs", "pack_convs"])) == ["conv"]


def test_weights_given_at_call_time_are_not_packed() -> None:
    b = Builder("conv")
    b.output(b.conv(b.input("x", "f32", (1, 256, 7, 7)), b.input("w", "f32", (64, 256, 1, 1))))
    assert op_names(run_passes(b.build(), ["pad_convs", "pack_convs"])) == ["conv"]


def test_packed_conv_nest_keeps_a_register_tile_and_turns_it_once_per_tile() -> None:
    """(Its sum in passes of 128 channels: the panel's 256 do not fit half of a 32 KiB
    L1.)"""
    graph = run_passes(conv_graph((1, 256, 7, 7), data(64, 256, 1, 1)), ["pack_convs", "dce"])
    avx512 = Target.named("znver4")  # panels of 2 vectors by up to 8 positions
    (kernel,) = schedule_program(lower_graph(graph, target=avx512), avx512).kernels
    loops = list(walk_stmts(kernel.body))
    vectorized = [s for s in loops if isinstance(s, For) and s.kind == "vectorized"]
    # Channels in the lanes for the sum (32 a vector); positions in the lanes for the
    # write-back (the tile's 7), whose store to the output is contiguous.
    assert sorted({int(s.stop.value) for s in vectorized}) == [7, 32]
    (store,) = [s for s in loops if isinstance(s, Store) and s.buffer == "y0"]
    (lanes,) = [s for s in vectorized if store in list(walk_stmts(s.body))]
    assert access_kind(store.index, lanes.var.name, kernel.buffer("y0").shape) == "contiguous"
    # Accumulators, sums, and the partial sums of a task's 2 tiles between passes.
    assert [b.shape for b in kernel.locals] == [(7, 32), (7, 32), (2, 7, 32)]
    # One outer loop over tasks (2 panels of 32 channels x 4 groups of the 7 tiles of 7
    # positions, for the preset's 8 cores), run by a team: 800K multiply-adds.
    task = kernel.body[0]
    assert isinstance(task, For) and int(task.stop.value) == 8 and task.kind == "parallel"


@pytest.mark.parametrize("channels, groups", [(0, 1), (96, 1), (100, 2), (256, 3), (7, 5)])
def test_a_packed_conv_in_passes_of_input_channels_keeps_its_values(channels,
                                                                      groups) -> None:
    """Passes of `channels` input channels (0: one; 100 leaves a pass of 56; 256, all of
    them, one) and a panel's 5 tiles in `groups` tasks (2: of 3 and 2 tiles), compiled:
    the graph interpreter's values."""
    from dataclasses import replace

    from ember.loops.primitives import Step
    from ember.loops.schedules import packed_conv as pc
    from ember.runtime.executable import compile_program
    from ember.runtime.memory_plan import plan_memory

    graph = conv_graph((1, 256, 5, 5), data(32, 256, 1, 1), data(32), "relu6")
    program = lower_graph(run_passes(graph, ["pack_convs", "dce", "fuse"]), target=HOST)
    (kernel,) = program.kernels
    ((loop, _),) = pc.nests(kernel)
    scheduled = Step("packed_conv", (loop, 6, channels, groups)).apply(kernel)
    passes = [s for s in walk_stmts(scheduled.body) if isinstance(s, For)
              and s.var.name.startswith("pass")]
    assert len(passes) == (0 if channels in (0, 256) else 1)
    program = replace(program, kernels=[scheduled])
    x = data(1, 256, 5, 5)
    (got,) = compile_program(program, HOST, plan_memory(program))(x)
    np.testing.assert_allclose(got, interpret(graph, [x])[0], rtol=1e-4, atol=1e-4)


def test_the_tiles_of_a_panel_prefetch_the_next_panels_rows() -> None:
    """Per input channel, each tile prefetches lines of the next panel's rows for that
    channel (its 9 taps for a 3x3 filter), the plane's tiles taking different lines; the
    last panel's read its own (in bounds). One panel: nothing to prefetch."""
    avx512 = Target.named("znver4")  # panels of 32 channels, tiles of 7 positions
    graph = run_passes(conv_graph((1, 64, 9, 9), data(128, 64, 3, 3)), ["pack_convs", "dce"])
    (kernel,) = schedule_program(lower_graph(graph, target=avx512), avx512).kernels
    prefetches = [s for s in walk_stmts(kernel.body) if isinstance(s, Prefetch)]
    assert prefetches and {p.buffer for p in prefetches} == {kernel.params[1].name}
    panel, k, lane = (format_expr(i) for i in prefetches[0].index)
    last = kernel.params[1].shape[0] - 1
    assert panel.startswith("min(") and panel.endswith(f", {last})") if last > 1 else \
        panel == "1", panel  # (two panels: the second is the next of both)
    assert "mul(%c" in k and "mod(" in lane, (k, lane)
    one = run_passes(conv_graph((1, 64, 7, 7), data(32, 64, 1, 1)), ["pack_convs", "dce"])
    (kernel,) = schedule_program(lower_graph(one, target=avx512), avx512).kernels
    assert not any(isinstance(s, Prefetch) for s in walk_stmts(kernel.body))


def test_a_half_packed_conv_runs_its_plain_nest() -> None:
    """The packed conv's schedule is f32; an f16 one keeps the plain nest (f32 sums)."""
    from ember.graph.ops.linalg import pack_conv_weights

    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 3, 3, 3)).astype(np.float16)
    b = Builder("pc")
    x = b.input("x", "f16", (1, 3, 9, 9))
    b.output(b.op("packed_conv", [x, b.constant(pack_conv_weights(w, 8))],
                  {"kernel_shape": (3, 3)}).result)
    graph = b.build()
    xs = rng.standard_normal((1, 3, 9, 9)).astype(np.float16)
    got = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))(xs)[0]
    np.testing.assert_allclose(got.astype(np.float32),
                               interpret(graph, [xs])[0].astype(np.float32), rtol=1e-2,
                               atol=1e-2)


@pytest.mark.parametrize("name, channels, lanes", [
    ("znver4", 64, 32), ("znver4", 48, 16), ("znver4", 40, None),
    ("sapphirerapids", 64, 64), ("znver3", 64, 16), ("znver3", 40, 8), ("znver3", 36, None),
    ("neoverse-n1", 64, 16), ("neoverse-n1", 36, 4)])
def test_packed_panels_come_from_the_target(name, channels, lanes) -> None:
    """The panel is the widest power of two of vectors, up to the GEMM micro-kernel's
    vectors across, that divides the channels: 2 of AVX-512's 16 lanes on one FMA unit, 4
    on two, 2 of AVX2's 8, 4 of NEON's 4."""
    from ember.loops.schedules.packed_conv import panel_lanes

    assert panel_lanes(Target.named(name), channels) == lanes


@pytest.mark.parametrize("name, plane, rows", [
    ("znver3", 7, 5), ("znver3", 14, 6), ("znver4", 7, 7), ("znver4", 14, 8),
    ("sapphirerapids", 14, 6)])
def test_the_tiles_rows_come_from_the_registers_and_the_plane(name, plane, rows) -> None:
    """As many positions as the GEMM's register tile of the panel's vectors holds (6 by 2
    vectors of AVX2's 16 registers, 8 at most), one or two fewer where that leaves fewer
    positions past the plane (7x7: 49 positions are 9 tiles of 6, 10 of 5)."""
    from ember.driver.backend import CpuBackend
    from ember.graph.passes import get_pass
    from ember.loops.schedules import packed_conv as pc

    target = Target.named(name)
    packing = CpuBackend(target).configure(get_pass("pack_convs"))
    graph = run_passes(packing.run(conv_graph((1, 256, plane, plane), data(64, 256, 1, 1))),
                       ["dce"])
    kernel, = lower_graph(graph, target=target).kernels
    (_, nest), = pc.nests(kernel)
    assert pc.default_parameters(nest, target) == {"rows": rows}


@pytest.mark.parametrize("channels_out, groups", [(320, 8), (512, 1), (128, 4)])
def test_passes_and_task_groups_come_from_l1_and_the_cores(channels_out, groups) -> None:
    """pass_channels on a Sapphire Rapids preset (48 KiB of L1, 8 cores, panels of 64):
    passes of 96 input channels (96 rows of 64 floats: half of L1); a panel's 33 tiles in
    groups enough that the tasks are a multiple of the 8 cores (5 panels: 40 tasks)."""
    from ember.driver.backend import CpuBackend
    from ember.graph.passes import get_pass
    from ember.loops.schedules import packed_conv as pc

    target = Target.named("sapphirerapids")
    packing = CpuBackend(target).configure(get_pass("pack_convs"))
    graph = run_passes(packing.run(conv_graph((1, 1024, 14, 14),
                                              data(channels_out, 1024, 1, 1))), ["dce"])
    kernel, = lower_graph(graph, target=target).kernels
    (_, nest), = pc.nests(kernel)
    assert pc.pass_channels(nest, 6, target) == (96, groups)


def test_the_backend_packs_for_its_target() -> None:
    """An AVX2 target's compile packs a 7x7 conv of 64 channels in panels of 16."""
    from ember.driver.backend import CpuBackend
    from ember.graph.passes import get_pass

    graph = conv_graph((1, 256, 7, 7), data(64, 256, 1, 1))
    packing = CpuBackend(Target.named("znver3")).configure(get_pass("pack_convs"))
    packed = packing.run(graph)
    (op,) = [op for op in packed.walk() if op.name == "packed_conv"]
    assert op.operands[1].shape == (4, 256, 16)
