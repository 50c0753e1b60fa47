"""Give padded convolutions an explicit pad op, so that the conv itself reads no padding.

    conv(x, W, b) {pads = [1, 1, 1, 1]}  ->  conv(pad(x, [0, 0, 1, 1, 0, 0, 1, 1]), W, b) {pads = 0}

This is for the convolutions that lower to an implicit GEMM (f32, two spatial axes, one
group; ember/loops/schedules/conv.py), whose packing reads the input as the
columns of B. Without padding in the conv, every tap of every output lies inside its input:
the packing has no bounds tests and no selects, and at column stride 1 each panel inside an
output row is a row segment of the padded input, one vector load per k. The pad op copies
the input once (a 64-channel 56x56 input: 0.8 MB), which costs less than what the tests
cost the packing: a 64x56x56 3x3 conv measured 1.45 ms padded in the conv, 1.26 ms on an
input padded before it (2 threads).

Canonicalization does the opposite (a pad absorbed into the conv it feeds), so this pass
runs after it, just before fusion: it is a lowering decision, not a simplification.
Depthwise convolutions keep their padding (their own kernel pads per channel); grouped
ones, run with their groups as images (`grouped_conv`), are padded as any.
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Value
from ember.graph.ops.linalg import window_params
from ember.graph.passes import graph_pass
from ember.graph.rewrite import PatternTable, apply_patterns

conv_padding = PatternTable()


def gemm_conv(op: Op) -> bool:
    """Whether `op` is a conv that the scheduling stage makes an implicit GEMM (an f32 2-D
    conv with one group: ember/loops/schedules/conv.py)."""
    x, w = op.operands[:2]
    return (op.name == "conv" and len(x.shape) == 4 and op.attrs["groups"] == 1
            and all(v.dtype is DType.f32 for v in (*op.operands, op.result))
            and 0 not in op.result.shape and 0 not in w.shape[1:])


def padded_gemm_conv(op: Op) -> bool:
    """Whether `op` is an implicit GEMM's conv: one of one group, or a grouped conv with
    its groups run as images (`grouped_conv`, ember/graph/passes/group_convs.py, which
    makes only f32 ones)."""
    return gemm_conv(op) or op.name == "grouped_conv"


@conv_padding.on("conv", "grouped_conv")
def explicit_padding(op: Op, b: Builder) -> list[Value] | None:
    if not padded_gemm_conv(op):
        return None
    _, begins, ends, _ = window_params(2, op.attrs["strides"], op.attrs["pads"],
                                       op.attrs["dilations"])
    if not any((*begins, *ends)):
        return None
    padded = b.op("pad", [op.operands[0]], {"pads": [0, 0, *begins, 0, 0, *ends]},
                  loc=op.loc).result
    return [b.op(op.name, [padded, *op.operands[1:]], {**op.attrs, "pads": [0, 0, 0, 0]},
                 loc=op.loc).result]


@graph_pass("pad_convs", "give convs that lower to an implicit GEMM an explicit pad op")
def pad_convs(graph: Graph) -> Graph:
    apply_patterns(graph, conv_padding)
    return graph
