"""The winograd_convs pass (ember/graph/passes/winograd_convs.py) and its kernels
(ember/loops/lower/ops/winograd.py): 3x3 convs at stride 1 with a constant filter, enough
channels and enough tiles become Winograd's F(4x4, 3x3), or F(2x2, 3x3) where the larger
tiles would be too few; the others stay direct. Values: compiled against the interpreter
on the graph before the pass, with output sizes that are whole tiles and sizes that are
not, no padding and asymmetric padding, batches, bias and fused epilogues (ReLU, a
residual add) at the output transform's stores."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import ember
from ember import Builder, interpret
from ember.driver.pass_manager import run_passes
from ember.dtypes import DType
from ember.explain import explain
from ember.graph.ops.winograd import winograd_weights
from ember.graph.passes.fold import constant_value
from ember.graph.passes.winograd_convs import winograd_pitch, winograd_tile
from ember.loops.ir import (
    Binary,
    Cast,
    Const,
    For,
    If,
    Load,
    Store,
    Var,
    loads_in,
    walk_stmts,
)
from ember.loops.lower import lower_graph
from ember.loops.schedule import schedule_kernel
from ember.target import Target

HOST = Target.host()

RNG = np.random.default_rng(29)
CPU = ember.Config(executor="cpu", disk_cache=False)


def data(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def conv_graph(x_shape, w, bias=None, epilogue="", weights_as_input=False, dtype="f32",
               **attrs):
    b = Builder("conv")
    x = b.input("x", dtype, x_shape)
    filters = b.input("w", dtype, w.shape) if weights_as_input else b.constant(w, name="w")
    args = [x, filters] + ([b.constant(bias, name="b")] if bias is not None else [])
    y = b.conv(*args, **attrs)
    if epilogue == "relu":
        y = b.max(y, b.constant(np.float32(0)))
    elif epilogue == "residual":
        y = b.max(b.add(y, b.input("r", "f32", tuple(y.shape))), b.constant(np.float32(0)))
    b.output(y)
    return b.build()


def op_names(graph) -> list[str]:
    return [op.name for op in graph.walk() if op.name not in ("constant",)]


@pytest.mark.parametrize("x_shape, m, attrs, epilogue, tile", [
    ((1, 64, 16, 16), 64, {"pads": (1, 1, 1, 1)}, "relu", 2),  # 64 tiles (16 of 4x4)
    ((2, 64, 13, 11), 72, {"pads": (1, 1, 1, 1)}, "residual", 2),  # half-outside tiles
    ((1, 96, 14, 14), 64, {}, "", 2),  # no padding: 12x12 out of 14x14
    ((1, 64, 12, 15), 64, {"pads": (0, 1, 2, 0)}, "relu", 2),  # asymmetric padding
    ((1, 32, 28, 28), 40, {"pads": (1, 1, 1, 1)}, "relu", 4),  # 49 tiles of 4x4
    ((2, 32, 26, 23), 32, {"pads": (1, 1, 1, 1)}, "residual", 4),  # 2 and 3 rows outside
    ((1, 48, 26, 27), 32, {"pads": (0, 1, 2, 0)}, "", 4),  # 26x25 outputs
])
def test_convs_become_winograd_and_match_the_interpreter(x_shape, m, attrs, epilogue,
                                                         tile) -> None:
    w, bias = data(m, x_shape[1], 3, 3) / 10, data(m)
    graph = conv_graph(x_shape, w, bias, epilogue, **attrs)
    rewritten = run_passes(graph, ["winograd_convs", "dce"])
    names = op_names(rewritten)
    assert "conv" not in names
    assert {"winograd_input", "matmul", "winograd_output"} <= set(names)
    (transform,) = [op for op in rewritten.walk() if op.name == "winograd_input"]
    assert transform.attrs["tile"] == tile
    (matmul,) = [op for op in rewritten.walk() if op.name == "matmul"]
    np.testing.assert_allclose(constant_value(rewritten, matmul.operands[0]),
                               winograd_weights(w, tile))
    args = [data(*x_shape)] + ([data(*graph.outputs[0].shape)] if epilogue == "residual"
                               else [])
    want = interpret(graph, args)[0]
    compiled = ember.compile(graph, config=CPU)
    np.testing.assert_allclose(compiled(*args)[0], want, rtol=1e-4, atol=1e-4)
    # The epilogue runs at the output transform's stores: one kernel after the matmul.
    kernels = [k.name for k in explain(compiled, measure=False).kernels]
    assert sum("winograd_output" in k for k in kernels) == 1
    if epilogue:
        assert not any(k.endswith(("_max", "_add")) and "winograd" not in k
                       for k in kernels), kernels


@pytest.mark.parametrize("x_shape, m, groups, epilogue, tile", [
    ((1, 128, 16, 16), 128, 2, "relu", 2),  # RegNet's: 64 channels a group
    ((2, 96, 13, 11), 96, 3, "residual", 2),  # 32 a group, a batch, half-outside tiles
    ((1, 96, 28, 28), 192, 3, "", 4),  # 32 in and 64 out a group, 4x4 tiles
])
def test_grouped_convs_become_a_product_per_point_and_group(x_shape, m, groups, epilogue,
                                                            tile) -> None:
    """A grouped conv's Winograd products are one batched matmul over (point, group):
    [P', G, M/G, C/G] x [P', G, C/G, T], V and the products reshaped (renamed) around it."""
    w, bias = data(m, x_shape[1] // groups, 3, 3) / 10, data(m)
    graph = conv_graph(x_shape, w, bias, epilogue, pads=(1, 1, 1, 1), groups=groups)
    rewritten = run_passes(graph, ["winograd_convs", "dce"])
    assert "conv" not in op_names(rewritten)
    (matmul,) = [op for op in rewritten.walk() if op.name == "matmul"]
    filters = constant_value(rewritten, matmul.operands[0])
    points = (tile + 2) ** 2
    assert filters.shape == (points, groups, m // groups, x_shape[1] // groups)
    np.testing.assert_allclose(filters.reshape(points, m, -1), winograd_weights(w, tile))
    args = [data(*x_shape)] + ([data(*graph.outputs[0].shape)] if epilogue == "residual"
                               else [])
    compiled = ember.compile(graph, config=CPU)
    np.testing.assert_allclose(compiled(*args)[0], interpret(graph, args)[0], rtol=1e-4,
                               atol=1e-4)
    # The reshapes around the matmul rename its operand and result in place: no calls.
    kernels = [k.name for k in explain(compiled, measure=False).kernels]
    assert not any("reshape" in k and "winograd" not in k for k in kernels), kernels


@pytest.mark.parametrize("x_shape, w_shape, attrs, kwargs, why", [
    ((1, 64, 16, 16), (64, 64, 3, 3), {"strides": (2, 2)}, {}, "stride 2"),
    ((1, 64, 16, 16), (64, 16, 3, 3), {"groups": 4}, {}, "16 input channels a group"),
    ((1, 64, 16, 16), (32, 32, 3, 3), {"groups": 2}, {}, "16 output channels a group"),
    ((1, 64, 16, 16), (64, 64, 3, 3), {"dilations": (2, 2)}, {}, "dilated"),
    ((1, 64, 16, 16), (64, 64, 1, 1), {}, {}, "a 1x1 conv"),
    ((1, 16, 16, 16), (64, 16, 3, 3), {}, {}, "16 input channels: small products"),
    ((1, 64, 16, 16), (16, 64, 3, 3), {}, {}, "16 output channels"),
    ((1, 64, 9, 9), (64, 64, 3, 3), {"pads": (1, 1, 1, 1)}, {}, "25 tiles"),
    ((1, 64, 16, 16), (64, 64, 3, 3), {}, {"weights_as_input": True}, "filter not constant"),
    ((1, 128, 16, 16), (128, 1, 3, 3), {"groups": 128}, {}, "depthwise"),
    ((1, 64, 16, 16), (64, 64, 3, 3), {}, {"dtype": "f16"}, "f16"),
])
def test_convs_that_stay_direct(x_shape, w_shape, attrs, kwargs, why) -> None:
    dtype = np.float16 if kwargs.get("dtype") == "f16" else np.float32
    graph = conv_graph(x_shape, data(*w_shape).astype(dtype), **attrs, **kwargs)
    assert "conv" in op_names(run_passes(graph, ["winograd_convs", "dce"])), why


def test_the_config_can_keep_convs_direct() -> None:
    graph = conv_graph((1, 64, 16, 16), data(64, 64, 3, 3) / 10, pads=(1, 1, 1, 1))
    x = data(1, 64, 16, 16)
    for winograd in (True, False):
        compiled = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False,
                                                            winograd=winograd))
        kernels = [k.name for k in explain(compiled, measure=False).kernels]
        assert any("winograd" in k for k in kernels) == winograd, kernels
        np.testing.assert_allclose(compiled(x)[0], interpret(graph, [x])[0], rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("tiles, channels, pitch", [
    (784, (64, 64), 785),  # 64 channels at 56x56: 784 * 64 floats is 49 * 4 KiB
    (196, (128, 128), 197),  # 128 at 28x28: the 16 points fell in 2 sets
    (49, (256, 256), 49),  # 4 sets already
])
def test_the_winograd_pitch_spreads_the_points_over_cache_sets(tiles, channels, pitch):
    assert winograd_pitch(tiles, channels) == pitch
    for c in channels:
        assert len({(a * pitch * c * 4 // 64) % 64 for a in range(16)}) >= 4


@pytest.mark.parametrize("tiles, channels, most", [(196, (64, 64), 4), (36, (96, 64), 4),
                                                   (49, (128, 128), 5)])
def test_the_pitch_spreads_the_36_points_of_4x4_tiles_over_cache_sets(tiles, channels,
                                                                      most) -> None:
    """At most 4 points of a tile in one of L1's 64 sets; with 128 channels, whose rows
    are 8 cache lines, no pitch reaches more than 8 sets: 5 of 36 in one."""
    pitch = winograd_pitch(tiles, channels, 36)
    assert tiles <= pitch < tiles + 16
    for c in channels:
        sets = Counter((a * pitch * c * 4 // 64) % 64 for a in range(36))
        assert max(sets.values()) <= most


@pytest.mark.parametrize("size, tile", [((56, 56), 4), ((28, 28), 4), ((22, 23), 4),
                                        ((20, 20), 2), ((14, 14), 2), ((7, 7), None)])
def test_the_tile_is_the_largest_that_makes_enough_tiles(size, tile) -> None:
    """4x4 outputs a tile where that makes at least MIN_TILES (32) tiles: 22x23 makes 36;
    20x20 makes 25, so 2x2 (100); at 7x7 neither makes enough."""
    assert winograd_tile(size) == tile


@pytest.mark.parametrize("size, points_a_pass, loads_a_pass", [
    (16, [4, 8, 4], [8, 8, 8]),  # F(2x2): B^T's rows read tile rows {0, 2}, {1, 2} twice, {1, 3}
    (28, [6, 24, 6], [18, 24, 18]),  # F(4x4): {0, 2, 4}, {1, 2, 3, 4} four times, {1, 3, 5}
])
def test_the_input_transform_stores_a_few_rows_of_points_a_pass(size, points_a_pass,
                                                                 loads_a_pass) -> None:
    """Each pass over a channel's tiles stores the rows of points of the transform's rows
    that read the same rows of the tile, which it loads once: all 16 points of F(2x2) at
    once were 16 streams in one L1 set (their distance a multiple of 4 KiB), and F(4x4)'s
    rows 1-4, a pass each, loaded the same four rows of the tile four times."""
    graph = run_passes(conv_graph((1, 64, size, size), data(64, 64, 3, 3), pads=(1, 1, 1, 1)),
                       ["winograd_convs", "dce"])
    (kernel,) = [k for k in lower_graph(graph, target=HOST).kernels if "winograd_input" in k.name]
    passes = [s for s in walk_stmts(kernel.body) if isinstance(s, For)
              and any(isinstance(t, Store) and t.buffer == "y0" and not isinstance(t.value, Const)
                      for t in s.body)]
    assert [len({s.index[0] for s in loop.body if isinstance(s, Store) and s.buffer == "y0"})
            for loop in passes] == points_a_pass
    assert [sum(isinstance(load, Load) and load.buffer == "x0" for load in loads_in(loop.body))
            for loop in passes] == loads_a_pass


@pytest.mark.parametrize("size, rows_of_tiles", [(16, (8, 8)), (60, (15, 15)), (15, (8, 7)),
                                                 (26, (7, 6))])
def test_the_scheduling_stage_puts_each_row_of_tiles_on_the_targets_lanes(size,
                                                                          rows_of_tiles) -> None:
    """The transforms lower to plain nests over the tiles; the scheduling stage vectorizes
    each row of tiles in blocks of the target's f32 lanes, a shorter row on one vector
    (the stores of a tile's several points go to elements no two lanes share).
    `rows_of_tiles`: the tiles of a row of the input transform and the whole ones of the
    output's (2x2 tiles at 16 and 15, 4x4 at 60 and 26; the last column of tiles of an
    output that is not whole tiles is a loop of one tile: it stays serial)."""
    graph = run_passes(conv_graph((1, 32, size, size), data(32, 32, 3, 3), pads=(1, 1, 1, 1)),
                       ["winograd_convs", "dce"])
    lanes = HOST.lanes(DType.f32)
    for kernel in lower_graph(graph, target=HOST).kernels:
        if "winograd" not in kernel.name:
            continue
        assert not any(isinstance(s, For) and s.kind == "vectorized"
                       for s in walk_stmts(kernel.body)), "the lowering schedules nothing"
        scheduled = schedule_kernel(kernel, HOST)
        tiles = rows_of_tiles["output" in kernel.name]
        widths = {int(s.stop.value) - int(s.start.value) for s in walk_stmts(scheduled.body)
                  if isinstance(s, For) and s.kind == "vectorized"}
        assert widths == ({lanes, tiles % lanes} - {0} if tiles >= lanes else {tiles}), \
            (kernel.name, widths)


def test_an_epilogue_needs_final_values() -> None:
    """A fused root's lowering may store its result in several places (Winograd's four
    outputs a tile), but one that reads it back (partial sums) gets no epilogue:
    lower_rooted refuses a body where `loads_in` finds a load of the root, in values,
    conditions or loop bounds."""
    f32 = ember.DType.f32

    def reads_root(stmts) -> bool:
        return any(load.buffer == "root" for load in loads_in(stmts))

    read_back = Store("root", (), Binary("add", Load("root", (), f32), Const(1.0, f32)))
    assert reads_root([read_back])
    bounded = For(Var("i"), Const(0), Cast(ember.DType.i64, Load("root", (), f32)), [])
    assert reads_root([If(Const(True), [bounded], [])])
    assert not reads_root([Store("root", (), Load("other", (), f32))])
