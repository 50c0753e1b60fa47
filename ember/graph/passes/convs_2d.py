"""Run 1-D convolutions as 2-D ones over a plane one row high.

    conv(x [N, C, L], W [M, C/g, K])  ->  reshape(conv(reshape(x, [N, C, 1, L]),
                                                       reshape(W, [M, C/g, 1, K])), [N, M, L'])

Every fast conv kernel here is 2-D: the implicit GEMM, the packed conv, the depthwise
schedule (ember/loops/schedules/). A 1-D conv (an audio encoder's feature extractor, a
temporal conv) otherwise keeps the plain nest, one multiply-add at a time over its 3-tap
window, at 1-5% of the roofline. The reshapes only rename dimensions; the elementwise ops
on the reshaped result (an activation, a scale) move before the reshape (`sink_reshape`),
where fusion makes them the conv's epilogue. Runs before `pad_convs`, which then pads the
row as it pads any 2-D conv.
"""

from __future__ import annotations

from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Value
from ember.graph.ops.linalg import window_params
from ember.graph.passes import graph_pass
from ember.graph.passes.fold import constant_value
from ember.graph.rewrite import ANY, PatternTable, apply_patterns

as_2d = PatternTable()


def reshaped(b: Builder, value: Value, shape: list[int], loc: str | None) -> Value:
    """`value` under `shape`: a new constant when it is one (not a reshape per call)."""
    weights = constant_value(b.graph, value)
    if weights is not None and weights.size > 1:
        return b.constant(weights.reshape(shape), name="weights")
    return b.op("reshape", [value], {"shape": shape}, loc=loc).result


@as_2d.on("conv")
def conv_as_2d(op: Op, b: Builder) -> list[Value] | None:
    x, w = op.operands[:2]
    if len(x.shape) != 3 or not all(isinstance(d, int) for d in (*x.shape, *op.result.shape)):
        return None
    strides, begins, ends, dilations = window_params(1, op.attrs["strides"], op.attrs["pads"],
                                                     op.attrs["dilations"])
    n, c, length = x.shape
    m, cg, k = w.shape
    conv = b.op("conv", [reshaped(b, x, [n, c, 1, length], op.loc),
                         reshaped(b, w, [m, cg, 1, k], op.loc), *op.operands[2:]],
                {"strides": [1, *strides], "pads": [0, *begins, 0, *ends],
                 "dilations": [1, *dilations], "groups": op.attrs["groups"]}, loc=op.loc)
    return [b.op("reshape", [conv.result], {"shape": list(op.result.shape)},
                 loc=op.loc).result]


def _reshaped_conv(value: Value) -> Value | None:
    """The conv result that `value` reshapes, if it is such a reshape."""
    op = value.producer
    if op is None or op.name != "reshape":
        return None
    source = op.operands[0].producer
    return op.operands[0] if source is not None and source.name in CONVS else None


CONVS = ("conv", "grouped_conv")


def sink_reshape(op: Op, b: Builder) -> list[Value] | None:
    """An elementwise op on a conv's reshaped result (and on single elements) computed on
    the result before the reshape: it is then the conv's epilogue, fused into its stores,
    instead of another pass over its output."""
    if op.opdef.category != "elementwise" or len(op.results) != 1:
        return None
    sources = [_reshaped_conv(v) for v in op.operands]
    shapes = {s.shape for s in sources if s is not None}
    if len(shapes) != 1 or any(s is None and v.type.numel != 1 for s, v in
                                zip(sources, op.operands)):
        return None
    operands = [s if s is not None else
                b.op("reshape", [v], {"shape": []}, loc=op.loc).result
                for s, v in zip(sources, op.operands)]
    mapped = b.op(op.name, operands, dict(op.attrs), loc=op.loc).result
    return [b.op("reshape", [mapped], {"shape": list(op.result.shape)}, loc=op.loc).result]


as_2d.add(ANY, sink_reshape)


@graph_pass("convs_2d", "run 1-D convs as 2-D convs over a plane one row high")
def convs_2d(graph: Graph) -> Graph:
    apply_patterns(graph, as_2d)
    return graph
