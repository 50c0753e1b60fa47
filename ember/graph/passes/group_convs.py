"""Run grouped convolutions with each group of channels as an image of its own.

    conv(x [N, C, H, W], W [M, C/G, KH, KW], b) {groups = G}
      ->  reshape(grouped_conv(reshape(x, [N*G, C/G, H, W]), W' [G, M/G, C/G, KH, KW],
                               b' [G, M/G]), [N, M, OH, OW])

A group's input channels are contiguous in x, as are its output channels in the result,
so both reshapes only rename dimensions. In the grouped nest an image's input channel no
longer follows its output channel (the group does, through the image), which is the
implicit GEMM's shape (ember/loops/schedules/conv.py: one GEMM per image, its filter
w[image % G]). The plain grouped nest ran RegNet's 3x3 convs (64 channels a group) at 1%
of the roofline. Depthwise convs (one input channel a group) keep their own schedule.
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.graph.builder import Builder
from ember.graph.ir import Op, Value
from ember.graph.passes import graph_pass
from ember.graph.passes.convs_2d import reshaped, sink_reshape
from ember.graph.rewrite import ANY, PatternTable, apply_patterns

as_images = PatternTable()


@as_images.on("conv")
def groups_as_images(op: Op, b: Builder) -> list[Value] | None:
    x, w = op.operands[:2]
    groups = op.attrs["groups"]
    shapes = (*x.shape, *op.result.shape)
    if groups == 1 or len(x.shape) != 4 or w.shape[1] == 1 or \
            not all(isinstance(d, int) for d in shapes) or 0 in shapes or \
            any(v.dtype is not DType.f32 for v in (*op.operands, op.result)):
        return None
    n, c, h, width = x.shape
    m, cg, kh, kw = w.shape
    operands = [reshaped(b, x, [n * groups, cg, h, width], op.loc),
                reshaped(b, w, [groups, m // groups, cg, kh, kw], op.loc)]
    if len(op.operands) > 2:
        operands.append(reshaped(b, op.operands[2], [groups, m // groups], op.loc))
    conv = b.op("grouped_conv", operands, {key: op.attrs[key] for key in
                                           ("strides", "pads", "dilations")}, loc=op.loc)
    return [b.op("reshape", [conv.result], {"shape": list(op.result.shape)},
                 loc=op.loc).result]


as_images.add(ANY, sink_reshape)


@graph_pass("group_convs", "run grouped convs with each group of channels as an image")
def group_convs(graph):
    apply_patterns(graph, as_images)
    return graph
