"""Compute 3x3 convolutions at stride 1 by Winograd's F(mxm, 3x3) (ember/graph/ops/
winograd.py): F(4x4) where its tiles are enough (36 matrix products per 16 outputs, where
the direct conv does 144 multiplies), else F(2x2) (16 per 4, where it does 36).

    conv(x, W, b) {3x3, stride 1, pads p}  ->
        winograd_output(matmul(U, winograd_input(pad(x, p + [0, 0, eh, ew])))) {size} + b
        U = G W G^T [(m + 2)^2, M, C], a constant made here

`eh` and `ew` (less than m) pad an output to whole m x m tiles; the extra rows and columns
are computed and not stored. A grouped conv (G groups) makes a product per point and group:
U [(m + 2)^2, G, M/G, C/G] times V reshaped to [(m + 2)^2, G, C/G, T] (a group's channels
are contiguous in V, so the reshapes only rename dimensions and run as no call). RegNet's
3x3 convs, 64 channels a group, one thread: 128 at 56x56 3.0 -> 1.7 ms, 192 at 28x28
1.14 -> 0.60 ms, 512 at 14x14 0.92 -> 0.67 ms (direct implicit GEMM -> Winograd, the
transforms included). The matmul is the ordinary batched matmul ((m + 2)^2 of
[M, C] x [C, T] for T tiles) and the bias (or any epilogue) fuses into `winograd_output`'s
stores. Against F(2x2), F(4x4) does 1.78x fewer multiplies and moves 1.78x fewer bytes
between its three kernels, whose intermediates are that much smaller than the conv's
input and output (ResNet-50's 64 channels at 56x56: 3.2 MB each with F(2x2)); but it has
fewer, larger tiles: where they would be fewer than MIN_TILES, F(2x2) runs.
Measured on one thread, ResNet-50's 3x3 convs with bias and ReLU, ms (direct -> Winograd,
each kernel alone; the transforms take 0.1-0.3 of it):

    64x56x56 2.16 -> 1.45;  128x28x28 2.09 -> 1.34;  256x14x14 2.04 -> 1.38

and ResNet-50 as a whole 78.7 -> 73.0 ms (40.5 -> 38.1 on two threads).

Only convs with a constant filter are rewritten (the transform is done once, here), with
at least MIN_CHANNELS input and output channels (a group's): with fewer, the 16 products
are too small for the matmul schedule to run near its peak (32 channels at 56x56: 0.57 ->
0.47 ms; 16 at 112x112: 0.64 -> 0.59). `Config(winograd=False)` keeps every conv direct.
Runs before `pad_convs` (these convs pad their input here, to whole tiles) and
`group_convs` (which takes the grouped convs left).
"""

from __future__ import annotations

import math
from collections import Counter

from ember.dtypes import DType
from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Value
from ember.graph.ops.linalg import window_params
from ember.graph.ops.winograd import TRANSFORMS, output_tiles, transform, winograd_weights
from ember.graph.passes import graph_pass
from ember.graph.passes.fold import constant_value
from ember.graph.rewrite import PatternTable, apply_patterns

winograd_rewrites = PatternTable()

MIN_CHANNELS = 32
# Tiles per image: with fewer, each element of the transformed filter (16/9 the size of
# the filter, read from memory at every call) serves too few products. ResNet-50's 512
# channels at 7x7 (16 tiles) measured 2.2 -> 2.05 ms each in the model, but the model as
# a whole ran 1% slower with them (74.7 -> 75.5 ms on one thread, 39.2 -> 39.5 on two;
# medians of compiles timed in turn), its other kernels slowed by 34 MB more of filters.
MIN_TILES = 32


def winograd_tile(size) -> int | None:
    """The output tile for a conv's output of `size` [OH, OW]: the largest with at least
    MIN_TILES tiles an image, None when even the smallest has fewer."""
    fitting = [m for m in sorted(TRANSFORMS, reverse=True)
               if math.prod(output_tiles(size, m)) >= MIN_TILES]
    return fitting[0] if fitting else None


def winograd_conv(op: Op) -> bool:
    """Whether `op` is a conv this pass computes by Winograd's algorithm."""
    x, w = op.operands[:2]
    if not (op.name == "conv" and len(x.shape) == 4
            and all(v.dtype is DType.f32 for v in (*op.operands, op.result))
            and tuple(w.shape[2:]) == (3, 3)
            and min(w.shape[0] // op.attrs["groups"], w.shape[1]) >= MIN_CHANNELS):
        return False
    strides, _, _, dilations = window_params(2, op.attrs["strides"], op.attrs["pads"],
                                             op.attrs["dilations"])
    return tuple(strides) == (1, 1) and tuple(dilations) == (1, 1) and \
        winograd_tile(op.result.shape[2:]) is not None


def winograd_pitch(tiles: int, channels: tuple[int, ...], points: int = 16) -> int:
    """The columns to give V and the products for `tiles` tiles: the tiles, or a few more,
    so that the `points` points of a tile, `channels * pitch` floats apart in V (input
    channels) and in the products (output channels), share an L1 cache's sets (64, of 64
    bytes and 8 ways) at most 4 to a set, or as few as the distance allows. At a distance
    that is a multiple of 4 KiB all 16 of F(2x2) fell in one set: 64 channels at 56x56
    (784 tiles) took 0.27 ms in the output transform, 0.09 at a pitch of 785."""
    def crowding(pitch: int) -> int:  # the most points that share a set
        return max(max(Counter((a * pitch * c * 4 // 64) % 64 for a in range(points)).values())
                   for c in channels)

    # The first pitch with at most 4 to a set, else the first of the least crowded.
    return min(range(tiles, tiles + 16), key=lambda pitch: (max(crowding(pitch), 4), pitch))


@winograd_rewrites.on("conv")
def winograd(op: Op, b: Builder) -> list[Value] | None:
    weights = constant_value(b.graph, op.operands[1]) if winograd_conv(op) else None
    if weights is None or not op.result.type.is_static:
        # (Sizes known at call time: the products' columns would be too, and the matmul
        # schedule's panels need a number; the direct conv schedules take them.)
        return None
    x = op.operands[0]
    _, begins, ends, _ = window_params(2, op.attrs["strides"], op.attrs["pads"],
                                       op.attrs["dilations"])
    size = list(op.result.shape[2:])
    f = transform(winograd_tile(size))
    tiles = output_tiles(size, f.tile)
    # The input padded to whole tiles: m * tiles + 2 rows and columns.
    extra = [f.tile * t + 2 - (d + lo + hi)
             for t, d, lo, hi in zip(tiles, x.shape[2:], begins, ends)]
    ends = [hi + e for hi, e in zip(ends, extra)]
    if any((*begins, *ends)):
        x = b.op("pad", [x], {"pads": [0, 0, *begins, 0, 0, *ends]}, loc=op.loc).result
    m, c = weights.shape[0], x.shape[1]
    pitch = winograd_pitch(x.shape[0] * tiles[0] * tiles[1], (m, c), f.points)
    points = b.op("winograd_input", [x], {"pitch": pitch, "tile": f.tile}, loc=op.loc).result
    filters = winograd_weights(weights, f.tile)
    groups = op.attrs["groups"]
    if groups > 1:  # a product per point and group: the reshapes only rename dimensions
        filters = filters.reshape(f.points, groups, m // groups, c // groups)
        points = b.op("reshape", [points], {"shape": [f.points, groups, c // groups, pitch]},
                      loc=op.loc).result
    products = b.op("matmul", [b.constant(filters, name="winograd_weights"), points],
                    loc=op.loc).result
    if groups > 1:
        products = b.op("reshape", [products], {"shape": [f.points, m, pitch]},
                        loc=op.loc).result
    y = b.op("winograd_output", [products], {"size": size, "batch": x.shape[0],
                                             "tile": f.tile}, loc=op.loc).result
    if len(op.operands) > 2:
        bias = b.op("reshape", [op.operands[2]], {"shape": [op.result.shape[1], 1, 1]},
                    loc=op.loc).result
        y = b.op("add", [y, bias], loc=op.loc).result
    return [y]


@graph_pass("winograd_convs", "compute 3x3 convs at stride 1 by Winograd's F(mxm, 3x3)")
def winograd_convs(graph: Graph) -> Graph:
    apply_patterns(graph, winograd_rewrites)
    return graph
