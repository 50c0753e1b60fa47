"""The winograd_convs pass (ember/graph/passes/winograd_convs.py) and its kernels
(ember/loops/lower/ops/winograd.py): 3x3 convs at stride 1 with a constant filter, enough
channels and enough tiles become Winograd's F(2x2, 3x3); the others stay direct. Values:
compiled against the interpreter on the graph before the pass, with even and odd output
sizes, no padding and asymmetric padding, batches, bias and fused epilogues (ReLU, a
residual add) at the output transform's four stores per tile."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Builder, interpret
from ember.driver.pass_manager import run_passes
from ember.dtypes import DType
from ember.explain import explain
from ember.graph.ops.winograd import winograd_weights
from ember.graph.passes.fold import constant_value
from ember.graph.passes.winograd_convs import winograd_pitch
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


@pytest.mark.parametrize("x_shape, m, attrs, epilogue", [
    ((1, 64, 16, 16), 64, {"pads": (1, 1, 1, 1)}, "relu"),  # 64 tiles
    ((2, 64, 13, 11), 72, {"pads": (1, 1, 1, 1)}, "residual"),  # odd: half-outside tiles
    ((1, 96, 14, 14), 64, {}, ""),  # no padding: 12x12 out of 14x14
    ((1, 64, 12, 15), 64, {"pads": (0, 1, 2, 0)}, "relu"),  # asymmetric padding
])
def test_convs_become_winograd_and_match_the_interpreter(x_shape, m, attrs,
                                                         epilogue) -> None:
    w, bias = data(m, x_shape[1], 3, 3) / 10, data(m)
    graph = conv_graph(x_shape, w, bias, epilogue, **attrs)
    rewritten = run_passes(graph, ["winograd_convs", "dce"])
    names = op_names(rewritten)
    assert "conv" not in names
    assert {"winograd_input", "matmul", "winograd_output"} <= set(names)
    (matmul,) = [op for op in rewritten.walk() if op.name == "matmul"]
    np.testing.assert_allclose(constant_value(rewritten, matmul.operands[0]),
                               winograd_weights(w))
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


@pytest.mark.parametrize("x_shape, w_shape, attrs, kwargs, why", [
    ((1, 64, 16, 16), (64, 64, 3, 3), {"strides": (2, 2)}, {}, "stride 2"),
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


def test_the_input_transform_writes_four_points_a_pass() -> None:
    """Each pass over a channel's tiles stores 4 of the 16 points: all 16 at once were 16
    streams in one L1 set (their distance a multiple of 4 KiB)."""
    graph = run_passes(conv_graph((1, 64, 16, 16), data(64, 64, 3, 3), pads=(1, 1, 1, 1)),
                       ["winograd_convs", "dce"])
    (kernel,) = [k for k in lower_graph(graph, target=HOST).kernels if "winograd_input" in k.name]
    passes = [s for s in walk_stmts(kernel.body) if isinstance(s, For)
              and any(isinstance(t, Store) and t.buffer == "y0" and not isinstance(t.value, Const)
                      for t in s.body)]
    assert len(passes) == 4
    for loop in passes:
        points = {s.index[0] for s in loop.body if isinstance(s, Store) and s.buffer == "y0"}
        assert len(points) == 4


@pytest.mark.parametrize("size, rows_of_tiles", [(16, (8, 8)), (60, (30, 30)), (15, (8, 7))])
def test_the_scheduling_stage_puts_each_row_of_tiles_on_the_targets_lanes(size,
                                                                          rows_of_tiles) -> None:
    """The transforms lower to plain nests over the tiles; the scheduling stage vectorizes
    each row of tiles in blocks of the target's f32 lanes, a shorter row on one vector
    (the stores of a tile's several points go to elements no two lanes share).
    `rows_of_tiles`: the tiles of a row of the input transform and the whole ones of the
    output's (an odd output's last column of tiles is a loop of one tile: it stays
    serial)."""
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
