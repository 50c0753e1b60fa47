"""Pack the constant weights of convolutions on small planes for a kernel that puts output
channels in the vector lanes.

    conv(x, W, b) {pads = 0}  ->  packed_conv(x, Wp, b)    Wp[q, k, l] = W[q * L + l, k]

The implicit GEMM (ember/loops/schedules/conv.py) puts output positions in
the lanes, 16 to a vector: a 7x7 plane's 49 positions take 64 lanes, and its write-back
is contiguous. `packed_conv` puts output channels there instead (every lane busy when M is
a multiple of 16) and reads the weights as packed panels, contiguous per k, at the price
of a write-back that turns the tile around: per output channel, a gather of its
positions from the tile's sums (which were scatters to memory before: ResNet's
residual-add convs went 8% faster since). So it pays
where each output element sums many products (K = C * KH * KW) and the plane is small.
Measured on one thread (ms, implicit GEMM -> packed):

    7x7:   320->1280 0.49 -> 0.39;  960->320 0.39 -> 0.28;  2048->512 1.29 -> 0.93;
           512->2048 1.27 -> 1.16;  160->960 0.19 -> 0.17;  3x3 512->512 2.76 -> 2.19
    14x14: 576->96 0.26 -> 0.22;  1024->256 1.08 -> 1.01;  3x3 256->256 2.38 -> 2.09;
           96->576 0.22 -> 0.25 and 64->384 0.105 -> 0.127 (K too short: slower)
    28x28 and up: within noise for K >= 512, slower below (128->512: 0.95 -> 1.16)

The weights are packed once, here, into a new constant (the old one is left to `dce`).
Runs after `pad_convs`, so that the conv has no padding left.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Value
from ember.graph.ops.linalg import pack_conv_weights, window_params
from ember.graph.passes import graph_pass
from ember.graph.passes.fold import constant_value
from ember.graph.passes.pad_convs import gemm_conv
from ember.graph.rewrite import PatternTable, apply_patterns

MAX_PACKED_PLANE = 256  # output positions: 16x16 (the measured gains are on 7x7 and 14x14)
MIN_PACKED_DEPTH = 256  # products per output element (K); shorter ones turn tiles too often
# ... unless the plane wastes many of the implicit GEMM's lanes: 160->960 at 7x7 (K = 160,
# 49 positions in 64 lanes) gained 12%, while 96->576 at 14x14 (196 in 208) lost 13%.
MIN_PACKED_DEPTH_WASTEFUL = 128
# Unconfigured (a pass run by name, not the backend's), the facts of a machine of 16-lane
# f32 vectors and 32 registers: the implicit GEMM's tile is 16 positions across, and a
# packed tile's panel 32 output channels (or 16).
GEMM_LANES = 16


def default_panels(m: int) -> int | None:
    return 32 if m % 32 == 0 else 16 if m % 16 == 0 else None


PanelWidth = Callable[[int], int | None]  # output channels M -> panel width, or None


def packed_lanes(op: Op, panel_width: PanelWidth = default_panels,
                 gemm_lanes: int = GEMM_LANES) -> int | None:
    """The panel width for `op`'s packed form, or None when it should keep the GEMM.
    `panel_width(M)`: the target's widest panel of output channels that divides M (the
    packed conv schedule's register tile: ember/loops/schedules/packed_conv.py);
    `gemm_lanes`: the implicit GEMM's tile width."""
    if not gemm_conv(op):
        return None
    _, begins, ends, _ = window_params(2, op.attrs["strides"], op.attrs["pads"],
                                       op.attrs["dilations"])
    m, c, kh, kw = op.operands[1].shape
    positions = op.result.shape[2] * op.result.shape[3]
    depth = c * kh * kw
    lanes = panel_width(m)
    if any((*begins, *ends)) or lanes is None or positions > MAX_PACKED_PLANE:
        return None
    lanes_used = positions / (-(-positions // gemm_lanes) * gemm_lanes)
    if depth < (MIN_PACKED_DEPTH if lanes_used > 0.8 else MIN_PACKED_DEPTH_WASTEFUL):
        return None
    return lanes


def packed_weights(op: Op, b: Builder, panel_width: PanelWidth,
                   gemm_lanes: int) -> list[Value] | None:
    lanes = packed_lanes(op, panel_width, gemm_lanes)
    weights = constant_value(b.graph, op.operands[1]) if lanes else None
    if weights is None:
        return None
    packed = b.constant(pack_conv_weights(weights, lanes), name="packed_weights")
    attrs = {"kernel_shape": list(weights.shape[2:]), "strides": op.attrs["strides"],
             "dilations": op.attrs["dilations"]}
    return [b.op("packed_conv", [op.operands[0], packed, *op.operands[2:]], attrs,
                 loc=op.loc).result]


@graph_pass("pack_convs", "pack the constant weights of convs on small planes, output"
            " channels in the lanes")
def pack_convs(graph: Graph, panel_width: PanelWidth | None = None,
               gemm_lanes: int = GEMM_LANES) -> Graph:
    """`panel_width` and `gemm_lanes` are the target's (the driver's backend gives them;
    see `packed_lanes`)."""
    table = PatternTable()
    table.add("conv", functools.partial(packed_weights, panel_width=panel_width or
                                        default_panels, gemm_lanes=gemm_lanes))
    apply_patterns(graph, table)
    return graph
