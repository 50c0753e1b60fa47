"""Fold affine maps into the weights of the convolution or matmul before them.

Inference-mode batch-norm arrives as `(conv(x, W, b) - mean) * scale + shift` (after
constant folding), and many models scale or shift a projection by constants. When such an
op's constant is the same along every axis but the output-channel axis (dim 1 of a
convolution, the last dim of a matmul), and the convolution or matmul has no other user:

    conv(x, W, b) * s  ->  conv(x, W * s[m], b * s)        matmul(x, B) * s  ->  matmul(x, B * s[n])
    conv(x, W, b) + t  ->  conv(x, W, b + t)               (matmul keeps its add: the epilogue)
    conv(x, W, b) - t  ->  conv(x, W, b - t)
    conv(x, W, b) / s  ->  conv(x, W / s[m], b / s)

so the batch-norm disappears and the convolution's epilogue keeps only the activation.
The weights must be constants of a float dtype; the new ones are computed in float64 and
rounded once.
"""

from __future__ import annotations

import numpy as np

from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Region, Value
from ember.graph.passes import graph_pass
from ember.graph.passes.fold import constant_value

AFFINE = ("mul", "div", "add", "sub")


def _uses(region: Region) -> dict[Value, int]:
    count: dict[Value, int] = {}
    for op in region.walk():
        for v in op.operands:
            count[v] = count.get(v, 0) + 1
    for v in region.outputs:
        count[v] = count.get(v, 0) + 1
    return count


def per_channel(data: np.ndarray, out_shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """`data` as one value per channel of `axis` of `out_shape`, if it broadcasts to the
    output and varies along that axis only; else None."""
    rank = len(out_shape)
    if data.ndim > rank:
        return None
    shape = (1,) * (rank - data.ndim) + data.shape
    for a, (d, o) in enumerate(zip(shape, out_shape)):
        if d != 1 and (a != axis or d != o):
            return None
    return np.broadcast_to(data.reshape(shape[axis]), (out_shape[axis],))


class _Folder:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.folded = 0

    def region(self, region: Region) -> None:
        for op in region.ops:
            for inner in op.regions:
                self.region(inner)
        uses = _uses(self.graph.body)
        kept: list[Op] = []
        replaced: dict[Value, Value] = {}
        for op in region.ops:
            op.operands = [replaced.get(v, v) for v in op.operands]
            new = self.fold(op, uses) if op.name in AFFINE else None
            if new is None:
                kept.append(op)
                continue
            producer, new_ops = new
            kept.remove(producer)
            kept.extend(new_ops)
            replaced[op.result] = new_ops[-1].result
            uses[new_ops[-1].result] = uses.get(op.result, 0)
            self.folded += 1
        region.ops = kept
        region.outputs = [replaced.get(v, v) for v in region.outputs]
        if replaced:
            self._remap_nested(region, replaced)

    def _remap_nested(self, region: Region, replaced: dict[Value, Value]) -> None:
        for op in region.ops:
            for inner in op.regions:
                for nested in inner.walk():
                    nested.operands = [replaced.get(v, v) for v in nested.operands]
                inner.outputs = [replaced.get(v, v) for v in inner.outputs]

    def fold(self, op: Op, uses: dict[Value, int]) -> tuple[Op, list[Op]] | None:
        x, y = op.operands
        # The producer is the first operand (or the second, for commutative add and mul).
        for source, const in ((x, y), (y, x)) if op.name in ("add", "mul") else ((x, y),):
            producer = source.producer
            if (producer is None or producer.name not in ("conv", "matmul")
                    or uses.get(source, 0) != 1 or source.type != op.result.type
                    or not source.dtype.is_float):
                continue
            data = constant_value(self.graph, const)
            if data is None:
                continue
            folded = (self.conv(producer, op.name, data) if producer.name == "conv"
                      else self.matmul(producer, op.name, data))
            if folded is not None:
                return producer, folded
        return None

    def _constant(self, b: Builder, data: np.ndarray, like: Value, hint: str) -> Value:
        return b.constant(data.astype(like.dtype.np), name=self.graph.fresh_constant_name(hint))

    def conv(self, conv: Op, how: str, data: np.ndarray) -> list[Op] | None:
        out = conv.result
        channel = per_channel(data, out.shape, 1)
        weight = constant_value(self.graph, conv.operands[1])
        if channel is None or weight is None:
            return None
        bias = (constant_value(self.graph, conv.operands[2]) if len(conv.operands) > 2
                else np.zeros(out.shape[1], weight.dtype))
        if bias is None:
            return None
        c = channel.astype(np.float64)
        w, bias64 = weight.astype(np.float64), bias.astype(np.float64)
        scale = c.reshape((-1,) + (1,) * (weight.ndim - 1))
        if how == "mul":
            w, bias64 = w * scale, bias64 * c
        elif how == "div":
            w, bias64 = w / scale, bias64 / c
        elif how == "add":
            bias64 = bias64 + c
        else:
            bias64 = bias64 - c
        b = Builder(graph=self.graph, region=Region())
        operands = [conv.operands[0], self._constant(b, w, conv.operands[1], "folded_weight"),
                    self._constant(b, bias64, conv.operands[1], "folded_bias")]
        b.op("conv", operands, dict(conv.attrs), loc=conv.loc)
        return b.region.ops

    def matmul(self, matmul: Op, how: str, data: np.ndarray) -> list[Op] | None:
        if how not in ("mul", "div"):
            return None  # a matmul has no bias: the add stays, for the epilogue
        out = matmul.result
        weight = constant_value(self.graph, matmul.operands[1])
        if weight is None or weight.ndim < 2 or len(out.shape) < 1:
            return None
        channel = per_channel(data, out.shape, len(out.shape) - 1)
        if channel is None:
            return None
        c = channel.astype(np.float64)
        w = weight.astype(np.float64)
        w = w * c if how == "mul" else w / c
        b = Builder(graph=self.graph, region=Region())
        operands = [matmul.operands[0], self._constant(b, w, matmul.operands[1], "folded_weight")]
        b.op("matmul", operands, dict(matmul.attrs), loc=matmul.loc)
        return b.region.ops


@graph_pass("fold_affine", "fold constant per-channel scales and shifts (batch-norm) into the"
                           " weights of the convolution or matmul before them")
def fold_affine(graph: Graph) -> Graph:
    _Folder(graph).region(graph.body)
    return graph
