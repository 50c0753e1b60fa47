"""Pack the constant right operand of matmuls into the panels that the matmul schedule's
micro-kernel reads, once, at compile time.

    matmul(x, W) {W constant [K, N]}  ->  packed_matmul(x, Wp) {n = N}
        Wp[p, k, l] = W[k, p * L + l]  (zero past N)

The matmul schedule (ember/loops/schedules/gemm.py) copies B into panels of `nr` columns,
contiguous per k, before its micro-kernel reads them: for a layer's weights that copy is
the same at every call. With the panels made here, of the width the schedule's tile
takes on the target, it reads them in place. Measured on one thread, 128 rows (a
transformer's tokens), GFLOP/s copied -> in place:

    128x768x3072 93 -> 107;  128x3072x768 97 -> 108;  128x768x2304 92 -> 108;
    128x768x768 103 -> 115

A matrix-vector product (one or two rows) reads each element of B once, so it never
copied B; its panels, 64 columns wide, make that read one sequential stream instead of
64-column pieces of rows 2-3 KiB apart (one thread: the MLP's 784x512 layer 38 -> 26 us
around a 7-us call, 43 -> 62 GB/s). Small matrices, whose copy costs little, and
matrices narrower than a tile are left alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ember.dtypes import DType
from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Value
from ember.graph.ops.linalg import pack_matmul_weights
from ember.graph.passes import graph_pass
from ember.graph.passes.fold import constant_value
from ember.graph.rewrite import PatternTable, apply_patterns

MIN_PACKED_ELEMENTS = 1 << 16  # K * N: below this, B's copy is a few microseconds


PanelWidth = Callable[[tuple[int, ...], int], int]


def packed_weights(op: Op, b: Builder, panel_width: PanelWidth) -> list[Value] | None:
    x, w = op.operands
    if (x.dtype is not DType.f32 or w.dtype is not DType.f32 or len(x.shape) < 2
            or len(w.shape) != 2 or not w.type.is_static  # (weights have numbers)
            or w.shape[0] * w.shape[1] < MIN_PACKED_ELEMENTS):
        return None
    lanes = panel_width(x.shape, w.shape[1])
    # A narrower matrix is one panel, its own layout; and its tile, as wide as it, would
    # not read panels of the schedule's width in place.
    weights = constant_value(b.graph, w) if w.shape[1] >= lanes else None
    if weights is None:
        return None
    panels = pack_matmul_weights(weights, lanes)
    panels.flags.writeable = False  # (the graph takes it as it is: no one else holds it)
    packed = b.constant(panels, name="packed_weights")
    return [b.op("packed_matmul", [x, packed], {"n": w.shape[1]}, loc=op.loc).result]


@graph_pass("pack_matmuls", "pack the constant right operand of matmuls into the panels"
            " the matmul schedule reads")
def pack_matmuls(graph: Graph, panel_width: PanelWidth | None = None) -> Graph:
    """`panel_width(x_shape, n)` is the register tile's columns for x times a matrix of n
    columns on the target (the driver's backend gives it); without it, nothing is packed."""
    if panel_width is None:
        return graph
    table = PatternTable()
    table.add("matmul", functools.partial(packed_weights, panel_width=panel_width))
    apply_patterns(graph, table)
    return graph
