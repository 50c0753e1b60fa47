"""Pack the constant right operand of matmuls into the panels that the matmul schedule's
micro-kernel reads, once, at compile time.

    matmul(x, W) {W constant [K, N]}  ->  packed_matmul(x, Wp) {n = N}
        Wp[p, k, l] = W[k, p * L + l]  (zero past N)

The matmul schedule (ember/loops/schedules/gemm.py) copies B into panels of `nr` columns,
contiguous per k, before its micro-kernel reads them: for a layer's weights that copy is
the same at every call. With the panels made here, of the width the schedule's tile
takes on this host, it reads them in place. Measured on one thread, 128 rows (a
transformer's tokens), GFLOP/s copied -> in place:

    128x768x3072 93 -> 107;  128x3072x768 97 -> 108;  128x768x2304 92 -> 108;
    128x768x768 103 -> 115

A matrix-vector product (one or two rows) reads B in place already, as it lies, and is
left alone; so are small matrices, whose copy costs little.
"""

from __future__ import annotations

import math

from ember.dtypes import DType
from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Value
from ember.graph.ops.linalg import pack_matmul_weights
from ember.graph.passes import graph_pass
from ember.graph.passes.fold import constant_value
from ember.graph.rewrite import PatternTable, apply_patterns

matmul_packing = PatternTable()

MIN_PACKED_ELEMENTS = 1 << 16  # K * N: below this, B's copy is a few microseconds


def panel_width() -> int:
    """The columns of the matmul schedule's register tile on this host."""
    from ember.loops.schedules.gemm import matrix_tile

    return matrix_tile().nr


@matmul_packing.on("matmul")
def packed_weights(op: Op, b: Builder) -> list[Value] | None:
    x, w = op.operands
    if (x.dtype is not DType.f32 or w.dtype is not DType.f32 or len(x.shape) < 2
            or len(w.shape) != 2
            or math.prod(x.shape[:-1]) <= 2 or w.shape[0] * w.shape[1] < MIN_PACKED_ELEMENTS):
        return None
    weights = constant_value(b.graph, w)
    if weights is None:
        return None
    packed = b.constant(pack_matmul_weights(weights, panel_width()), name="packed_weights")
    return [b.op("packed_matmul", [x, packed], {"n": w.shape[1]}, loc=op.loc).result]


@graph_pass("pack_matmuls", "pack the constant right operand of matmuls into the panels"
            " the matmul schedule reads")
def pack_matmuls(graph: Graph) -> Graph:
    apply_patterns(graph, matmul_packing)
    return graph
