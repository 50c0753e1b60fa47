"""Convs through the matmul schedule (implicit GEMM, ember/loops/schedules/conv.py
`conv_gemm`): an f32 2-D conv with one group is out[n] = W (M x K) times im2col(x[n])
(K x P), its B panels packed from x through the window index with zeros for the padding.

Values of compiled convs against torch.nn.functional.conv2d on odd shapes (1x1, 3x3 with
padding, 7x7 stride 2, dilation, non-square inputs and kernels, batches, with and without
bias, channels that are not a multiple of the tile), the nest's shape (a packed, register-
blocked, parallel GEMM), and a fused epilogue through ember.compile.

Depthwise convs (`depthwise_conv`: a zero-padded plane per channel, vectors of output
columns) likewise: strides, dilations, asymmetric pads, widths below, at and past a vector,
batches, bias and a fused clip (MobileNet's ReLU6).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember import Builder
from ember.loops.ir import Const, Fma, For, Select, walk_expr, walk_stmts
from ember.loops.lower import lower_graph
from ember.loops.schedule import schedule_program
from ember.target import Target

HOST = Target.host()
# The tiles these tests name are AVX-512's (16 f32 lanes, 32 registers, two FMA units).
SPR = Target.named("sapphirerapids")

RNG = np.random.default_rng(11)
CPU = ember.Config(executor="cpu", disk_cache=False)


def data(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def conv_graph(x_shape, w_shape, bias, strides, pads, dilations, groups=1):
    b = Builder("conv")
    x, w = b.input("x", "f32", x_shape), b.input("w", "f32", w_shape)
    args = [x, w] + ([b.input("b", "f32", (w_shape[0],))] if bias else [])
    b.output(b.conv(*args, strides=strides, pads=pads, dilations=dilations, groups=groups))
    return b.build()


def torch_conv(x, w, bias, strides, pads, dilations, groups=1) -> np.ndarray:
    ph0, pw0, ph1, pw1 = pads
    xt = torch.nn.functional.pad(torch.from_numpy(x).double(), (pw0, pw1, ph0, ph1))
    bt = torch.from_numpy(bias).double() if bias is not None else None
    return torch.nn.functional.conv2d(xt, torch.from_numpy(w).double(), bt, strides, 0,
                                      dilations, groups).numpy()


CASES = [  # x shape, w shape, bias, strides, pads (h0, w0, h1, w1), dilations
    ((1, 64, 7, 7), (32, 64, 1, 1), False, (1, 1), (0, 0, 0, 0), (1, 1)),  # 1x1: a GEMM
    ((1, 5, 9, 9), (7, 5, 3, 3), True, (1, 1), (1, 1, 1, 1), (1, 1)),  # 3x3 pad 1
    ((1, 3, 23, 23), (13, 3, 7, 7), True, (2, 2), (3, 3, 3, 3), (1, 1)),  # 7x7 stride 2
    ((2, 4, 12, 11), (9, 4, 3, 3), False, (1, 1), (2, 2, 2, 2), (2, 2)),  # dilation 2
    ((2, 3, 10, 17), (11, 3, 2, 5), True, (2, 1), (0, 2, 1, 1), (1, 1)),  # non-square
    ((1, 17, 6, 5), (19, 17, 1, 1), True, (2, 2), (0, 0, 0, 0), (1, 1)),  # 1x1 stride 2
    ((1, 8, 5, 40), (20, 8, 3, 3), False, (1, 2), (1, 0, 1, 0), (1, 1)),  # one pad axis
    # Rows of 45 and 37 columns: panels inside a row are packed by row segments
    # (`b_direct`), the others, and the padding rows, by the general gather.
    ((1, 6, 12, 45), (10, 6, 3, 3), True, (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 4, 11, 40), (7, 4, 3, 3), False, (2, 1), (2, 2, 2, 2), (2, 2)),
]


@pytest.mark.parametrize("x_shape, w_shape, bias, strides, pads, dilations", CASES)
def test_conv_values_against_torch(x_shape, w_shape, bias, strides, pads, dilations) -> None:
    graph = conv_graph(x_shape, w_shape, bias, strides, pads, dilations)
    x, w = data(*x_shape), data(*w_shape)
    args = [x, w] + ([data(w_shape[0])] if bias else [])
    got = ember.compile(graph, config=CPU)(*args)[0]
    want = torch_conv(x, w, args[2] if bias else None, strides, pads, dilations)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1, np.abs(want).max()))


@pytest.mark.parametrize("x_shape, w_shape, bias, strides, pads, dilations",
                         [c for c in CASES if any(c[4])])
def test_padding_inside_the_conv_against_torch(x_shape, w_shape, bias, strides, pads,
                                               dilations) -> None:
    """Without the graph passes (so without pad_convs' explicit pad op), the packing reads
    the padding itself: zeros by selects around clamped loads."""
    from ember.runtime.executable import compile_program

    graph = conv_graph(x_shape, w_shape, bias, strides, pads, dilations)
    x, w = data(*x_shape), data(*w_shape)
    args = [x, w] + ([data(w_shape[0])] if bias else [])
    got = compile_program(schedule_program(lower_graph(graph, HOST), HOST), target=HOST)(*args)[0]
    want = torch_conv(x, w, args[2] if bias else None, strides, pads, dilations)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1, np.abs(want).max()))


def test_conv_nest_is_the_gemm_schedule() -> None:
    """A padded 3x3 conv is the blocked GEMM: a parallel task loop, a vector-FMA
    micro-kernel, and B packed through a select (zeros in the padding), not an If."""
    graph = conv_graph((1, 16, 28, 28), (32, 16, 3, 3), True, (1, 1), (1, 1, 1, 1), (1, 1))
    (kernel,) = schedule_program(lower_graph(graph, target=HOST), HOST).kernels
    loops = [s for s in walk_stmts(kernel.body) if isinstance(s, For)]
    kinds = {loop.kind for loop in loops}
    assert {"parallel", "vectorized", "unrolled"} <= kinds
    exprs = [e for s in walk_stmts(kernel.body) for e in _exprs(s)]
    assert any(isinstance(e, Fma) for e in exprs) and any(isinstance(e, Select) for e in exprs)


def _exprs(stmt):
    for value in (getattr(stmt, "value", None), *getattr(stmt, "index", ())):
        if value is not None:
            yield from walk_expr(value)


def test_grouped_conv_keeps_the_plain_nest() -> None:
    graph = conv_graph((1, 4, 6, 6), (4, 2, 3, 3), False, (1, 1), (1, 1, 1, 1), (1, 1), 2)
    (kernel,) = schedule_program(lower_graph(graph, target=HOST), HOST).kernels
    assert not any(isinstance(s, For) and s.kind == "parallel"
                   for s in walk_stmts(kernel.body))
    x, w = data(1, 4, 6, 6), data(4, 2, 3, 3)
    got = ember.compile(graph, config=CPU)(x, w)[0]
    want = torch_conv(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1), 2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_epilogue_through_compile() -> None:
    """conv + bias + residual + relu: the epilogue replaces the GEMM's single store."""
    b = Builder("block")
    x, w = b.input("x", "f32", (2, 6, 10, 10)), b.input("w", "f32", (10, 6, 3, 3))
    bias, skip = b.input("b", "f32", (10,)), b.input("skip", "f32", (2, 10, 5, 5))
    y = b.conv(x, w, bias, strides=(2, 2), pads=(1, 1, 1, 1))
    b.output(b.relu(b.add(y, skip)))
    xs, ws, bs, ss = data(2, 6, 10, 10), data(10, 6, 3, 3), data(10), data(2, 10, 5, 5)
    got = ember.compile(b.build(), config=CPU)(xs, ws, bs, ss)[0]
    want = np.maximum(torch_conv(xs, ws, bs, (2, 2), (1, 1, 1, 1), (1, 1)) + ss, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# -- depthwise ----------------------------------------------------------------------------------

DEPTHWISE = [  # x shape, kernel, bias, strides, pads (h0, w0, h1, w1), dilations
    ((1, 8, 9, 9), (3, 3), True, (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 5, 14, 14), (3, 3), False, (2, 2), (1, 1, 1, 1), (1, 1)),  # stride 2
    ((2, 3, 20, 37), (5, 5), True, (1, 1), (2, 2, 2, 2), (1, 1)),  # past two vectors
    ((1, 4, 11, 16), (3, 3), False, (1, 1), (2, 2, 2, 2), (2, 2)),  # dilation
    ((1, 6, 7, 7), (3, 3), True, (1, 1), (0, 1, 2, 0), (1, 1)),  # asymmetric pads
    ((1, 3, 6, 40), (1, 3), False, (1, 3), (0, 0, 0, 0), (1, 1)),  # no pad, stride 3
]


@pytest.mark.parametrize("x_shape, kernel, bias, strides, pads, dilations", DEPTHWISE)
def test_depthwise_values_against_torch(x_shape, kernel, bias, strides, pads,
                                        dilations) -> None:
    channels = x_shape[1]
    w_shape = (channels, 1, *kernel)
    graph = conv_graph(x_shape, w_shape, bias, strides, pads, dilations, channels)
    x, w = data(*x_shape), data(*w_shape)
    args = [x, w] + ([data(channels)] if bias else [])
    got = ember.compile(graph, config=CPU)(*args)[0]
    want = torch_conv(x, w, args[2] if bias else None, strides, pads, dilations, channels)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 2])
def test_depthwise_nest_reads_a_padded_plane_in_vectors(batch: int) -> None:
    graph = conv_graph((batch, 32, 28, 28), (32, 1, 3, 3), True, (1, 1), (1, 1, 1, 1),
                       (1, 1), 32)
    (kernel,) = schedule_program(lower_graph(graph, HOST), HOST).kernels
    # The (image, channel) task loop is parallel by the default schedule, batches too.
    assert isinstance(kernel.body[0], For) and kernel.body[0].kind == "parallel"
    loops = [s for s in walk_stmts(kernel.body) if isinstance(s, For)]
    assert {"parallel", "vectorized", "unrolled"} <= {loop.kind for loop in loops}
    plane = max(kernel.locals, key=lambda b: b.numel)
    # A row of 28 outputs is one block: padded rows times 28 + 2 columns, rounded up to
    # whole blocks.
    assert plane.numel == -(-30 * (28 + 2) // 28) * 28
    # The taps read the plane, never x under a test: no selects in the sums.
    exprs = [e for s in walk_stmts(kernel.body) for e in _exprs(s)]
    assert any(isinstance(e, Fma) for e in exprs)
    assert not any(isinstance(e, Select) for e in exprs)


def test_depthwise_with_fused_clip() -> None:
    b = Builder("dw")
    x, w = b.input("x", "f32", (1, 16, 13, 13)), b.input("w", "f32", (16, 1, 3, 3))
    y = b.conv(x, w, strides=(2, 2), pads=(1, 1, 1, 1), groups=16)
    b.output(b.clip(y, min=0.0, max=6.0))
    xs, ws = data(1, 16, 13, 13) * 4, data(16, 1, 3, 3)
    compiled = ember.compile(b.build(), config=CPU)
    assert len(ember.explain(compiled).kernels) == 1
    want = np.clip(torch_conv(xs, ws, None, (2, 2), (1, 1, 1, 1), (1, 1), 16), 0, 6)
    np.testing.assert_allclose(compiled(xs, ws)[0], want, rtol=1e-5, atol=1e-5)


def test_panels_inside_a_row_load_row_segments() -> None:
    """At column stride 1, the packing has a branch for panels inside one output row: its
    reads of x are contiguous in the lane (one vector load per k), the other branch's
    gathers."""
    from ember.loops.analysis import access_kind

    graph = conv_graph((1, 8, 20, 40), (16, 8, 3, 3), False, (1, 1), (1, 1, 1, 1), (1, 1))
    (kernel,) = schedule_program(lower_graph(graph, target=HOST), HOST).kernels
    shapes = {b.name: b.shape for b in kernel.params}
    kinds = set()
    for loop in walk_stmts(kernel.body):
        if isinstance(loop, For) and loop.kind == "vectorized":
            for s in loop.body:
                for e in walk_expr(getattr(s, "value", Const(0))):
                    if getattr(e, "buffer", None) == "x0":
                        kinds.add(access_kind(e.index, loop.var.name, shapes["x0"]))
    assert {"contiguous", "gather"} <= kinds


def test_pointwise_conv_panels_are_contiguous_loads() -> None:
    """A 1x1 conv at stride 1 reads x as a K x P matrix: its column blocks start inside
    rows (224 columns of 56-wide rows here), and its loads of x are still contiguous (a
    block's row plus the rows its lanes pass is one flat position): no gather. (Its 24
    channels are 3 row tiles, which read x in place:
    `test_short_pointwise_panels_are_read_in_place`.)"""
    from ember.loops.analysis import access_kind

    graph = conv_graph((1, 144, 56, 56), (24, 144, 1, 1), False, (1, 1), (0, 0, 0, 0), (1, 1))
    # (As compiled: simplification moves the block's first row out of the quotient.)
    (kernel,) = schedule_program(lower_graph(graph, HOST), HOST).kernels
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    kinds = set()
    for loop in walk_stmts(kernel.body):
        if isinstance(loop, For) and loop.kind == "vectorized":
            for s in loop.body:
                for e in walk_expr(s.value):
                    if getattr(e, "buffer", None) in ("x0", "y0"):
                        kinds.add(access_kind(e.index, loop.var.name, shapes[e.buffer]))
                if s.buffer == "y0":
                    kinds.add(access_kind(s.index, loop.var.name, shapes["y0"]))
    assert kinds == {"contiguous"}


@pytest.mark.parametrize("out_channels, copied", [(16, False), (64, False), (128, True)])
def test_short_pointwise_panels_are_read_in_place(out_channels: int, copied: bool) -> None:
    """A 1x1 conv at stride 1 whose panels are short (32 channels: K x 32 floats, 4 KiB)
    reads them from x in place when few row tiles read each (MobileNetV2's 1x1 convs to
    16-64 channels), and copies them for many (128 channels: 16 tiles of 8 or 22 of 6, on
    Sapphire Rapids' tiles).
    Values match torch, the partial last panel (400 positions) included."""
    graph = conv_graph((1, 32, 20, 20), (out_channels, 32, 1, 1), True, (1, 1),
                       (0, 0, 0, 0), (1, 1))
    (kernel,) = schedule_program(lower_graph(graph, SPR), SPR).kernels
    assert any(len(b.shape) == 3 for b in kernel.locals) == copied  # the packed B block
    x, w, bias = data(1, 32, 20, 20), data(out_channels, 32, 1, 1), data(out_channels)
    got = ember.compile(graph, config=CPU)(x, w, bias)[0]
    np.testing.assert_allclose(got, torch_conv(x, w, bias, (1, 1), (0, 0, 0, 0), (1, 1)),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("width,stride", [(7, 1), (14, 1), (45, 1), (7, 2), (29, 2), (9, 3)])
def test_unpadded_panels_are_masked_row_segments(width: int, stride: int) -> None:
    """Without padding (after pad_convs), every panel is packed from row segments of x:
    each a load masked to its lanes (contiguous at column stride 1, strided at 2 or 3), in
    a vectorized loop, so no gather and no read outside x (rows narrower than a panel take
    several segments)."""
    from ember.loops.analysis import access_kind, plan_vector

    graph = conv_graph((1, 4, width + 2, width + 2), (16, 4, 3, 3), False, (stride, stride),
                       (0, 0, 0, 0), (1, 1))
    (kernel,) = schedule_program(lower_graph(graph, target=HOST), HOST).kernels
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    kinds = set()
    for loop in walk_stmts(kernel.body):
        if isinstance(loop, For) and loop.kind == "vectorized":
            reads_x = [e for s in loop.body for e in walk_expr(getattr(s, "value", Const(0)))
                       if getattr(e, "buffer", None) == "x0"]
            if reads_x:
                assert not isinstance(plan_vector(loop, {b.name for b in kernel.locals},
                                                  shapes), str)
                kinds |= {access_kind(e.index, loop.var.name, shapes["x0"]) for e in reads_x}
    assert kinds == {"contiguous" if stride == 1 else "strided"}
    x, w = data(1, 4, width + 2, width + 2), data(16, 4, 3, 3)
    got = ember.compile(graph, config=CPU)(x, w)[0]
    want = torch_conv(x, w, None, (stride, stride), (0, 0, 0, 0), (1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride", [2, 3, 5])
def test_depthwise_strided_plane_copies_are_strided_loads(stride: int) -> None:
    """At stride 2-4 the plane copy fills each column phase with vectorized loops whose
    loads of x are strided (every s-th column: no gather); past MAX_LOAD_STRIDE it is one
    serial loop dealing every phase from consecutive input columns (for LLVM's
    vectorizer). Both compute the conv."""
    from ember.loops.analysis import MAX_LOAD_STRIDE, access_kind

    b = Builder("dw")
    b.output(b.conv(b.input("x", "f32", (1, 4, 40, 40)), b.input("w", "f32", (4, 1, 3, 3)),
                    strides=(stride, stride), pads=(1, 1, 1, 1), groups=4))
    graph = b.build()
    (kernel,) = schedule_program(lower_graph(graph, target=HOST), HOST).kernels
    plane = kernel.locals[0].name
    shapes = {p.name: p.shape for p in kernel.params}
    copies = [s for s in walk_stmts(kernel.body) if isinstance(s, For)
              and s.body and all(getattr(x, "buffer", None) == plane for x in s.body)
              and any(getattr(e, "buffer", None) == "x0" for x in s.body
                      for e in walk_expr(x.value))]
    if stride <= MAX_LOAD_STRIDE:
        assert copies and all(s.kind == "vectorized" for s in copies)
        assert {access_kind(e.index, s.var.name, shapes["x0"]) for s in copies for x in s.body
                for e in walk_expr(x.value) if getattr(e, "buffer", None) == "x0"} == {"strided"}
    else:
        assert any(s.kind == "serial" and len(s.body) == stride for s in copies)
    x, w = data(1, 4, 40, 40), data(4, 1, 3, 3)
    got = ember.compile(graph, config=CPU)(x, w)[0]
    want = torch_conv(x, w, None, (stride, stride), (1, 1, 1, 1), (1, 1), 4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("height,width,accumulators", [
    (56, 56, (2, 56)), (13, 64, (1, 64)), (4, 64, (2, 64)), (14, 14, (7, 14)),
    (7, 7, (7, 7)), (9, 20, (3, 20)), (6, 100, (6, 16))])
def test_depthwise_sums_a_group_of_output_vectors_at_once(height: int, width: int,
                                                          accumulators: tuple) -> None:
    """On 16 lanes: a row of up to 4 vectors is one block, its columns the lanes, and rows
    of it make up about 8 vectors (a divisor of the height); a wider row is blocks of 16
    columns, 8 at once. The accumulator local holds a block per chain, and every grouping
    computes the conv (on the host)."""
    b = Builder("dw")
    b.output(b.conv(b.input("x", "f32", (1, 3, height, width)),
                    b.input("w", "f32", (3, 1, 3, 3)), pads=(1, 1, 1, 1), groups=3))
    graph = b.build()
    (kernel,) = schedule_program(lower_graph(graph, target=SPR), SPR).kernels
    assert kernel.locals[1].shape == accumulators
    x, w = data(1, 3, height, width), data(3, 1, 3, 3)
    got = ember.compile(graph, config=CPU)(x, w)[0]
    want = torch_conv(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1), 3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_depthwise_step_takes_a_channel_multiplier_and_leaves_a_large_plane_plain(
        monkeypatch) -> None:
    """The step reads the plain nest, not the op: a conv with two output channels per input
    channel (each reads one) gets the depthwise schedule, its x read at channel m // 2;
    a plane larger than the stack budget keeps the plain nest. Both compute the conv."""
    from ember.loops.schedules import depthwise

    graph = conv_graph((1, 3, 10, 12), (6, 1, 3, 3), True, (1, 1), (1, 1, 1, 1), (1, 1), 3)
    x, w, bias = data(1, 3, 10, 12), data(6, 1, 3, 3), data(6)
    want = torch_conv(x, w, bias, (1, 1), (1, 1, 1, 1), (1, 1), 3)
    for budget, scheduled in ((depthwise.MAX_DEPTHWISE_PLANE, True), (64, False)):
        monkeypatch.setattr(depthwise, "MAX_DEPTHWISE_PLANE", budget)
        (kernel,) = schedule_program(lower_graph(graph, HOST), HOST).kernels
        assert any(isinstance(e, Fma) for s in walk_stmts(kernel.body)
                   for e in _exprs(s)) == scheduled
        ember.driver.pipeline.clear_memory_cache()
        got = ember.compile(graph, config=CPU)(x, w, bias)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
