"""A hypothesis strategy for random valid ONNX models, on NNSmith's idea: a graph grows one
operator at a time, each drawn among those whose constraints the values built so far can
meet (shapes that broadcast, a matmul's inner sizes, a window that fits), its attributes
and weights drawn to satisfy them; 5 to 30 operators of opset 17 on f32 tensors.

    model, feeds = draw(onnx_models())   # an onnx.ModelProto, and {input name: array}
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# Continuous functions only: a Floor after a sum that two runtimes round differently may
# step by one, a disagreement that says nothing.
UNARY = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Erf", "Softsign", "Sin", "Cos"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + a),
                    reversed((1,) * (len(a) - len(b)) + b)):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))


class _ModelMaker:
    def __init__(self, draw):
        self.draw = draw
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.count = 0
        self.rng = np.random.default_rng(draw(st.integers(0, 2**31)))
        self.ops = {"unary": self.unary, "binary": self.binary, "matmul": self.matmul,
                    "gemm": self.gemm, "transpose": self.transpose, "reshape": self.reshape,
                    "concat": self.concat, "slice": self.slice, "reduce": self.reduce,
                    "softmax": self.softmax, "layer_norm": self.layer_norm, "conv": self.conv,
                    "pool": self.pool, "gather": self.gather, "where": self.where,
                    "safe_math": self.safe_math}

    # -- helpers ---------------------------------------------------------------------------
    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def pick(self, rank: int | None = None, min_rank: int = 0) -> str | None:
        names = [n for n, s in self.shapes.items()
                 if (rank is None or len(s) == rank) and len(s) >= min_rank]
        return self.draw(st.sampled_from(sorted(names))) if names else None

    def weight(self, shape: tuple[int, ...], scale: float = 0.5) -> str:
        name = self.name("w")
        data = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.initializers.append(numpy_helper.from_array(data, name))
        return name

    def ints(self, values, base: str = "k") -> str:
        name = self.name(base)
        self.initializers.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def node(self, op: str, inputs: list[str], shape: tuple[int, ...], pool: bool = True,
             **attrs) -> str:
        """A node of one output of `shape`; in the pool of values later nodes read (f32)
        unless `pool` is false."""
        out = self.name("v")
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        if pool:
            self.shapes[out] = shape
        return out

    def input(self, shape: tuple[int, ...]) -> str:
        name = f"in{len(self.inputs)}"
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        self.feeds[name] = self.rng.standard_normal(shape).astype(np.float32)
        self.shapes[name] = shape
        return name

    def shape(self, min_rank: int = 1, max_rank: int = 4) -> tuple[int, ...]:
        rank = self.draw(st.integers(min_rank, max_rank))
        return tuple(self.draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8])) for _ in range(rank))

    # -- operators (each returns None when the pool cannot meet its constraints) -------------
    def unary(self):
        x = self.pick()
        return self.node(self.draw(st.sampled_from(UNARY)), [x], self.shapes[x])

    def safe_math(self):
        """Functions with a domain, on values made to lie in it: log(|x| + 1), sqrt(|x|),
        x / (|y| + 1), exp(-|x|)."""
        x = self.pick()
        one = self.weight((1,), 0.0)
        self.initializers[-1] = numpy_helper.from_array(np.ones(1, np.float32), one)
        magnitude = self.node("Abs", [x], self.shapes[x])
        kind = self.draw(st.sampled_from(["log", "sqrt", "div", "exp"]))
        if kind == "log":
            return self.node("Log", [self.node("Add", [magnitude, one], self.shapes[x])],
                             self.shapes[x])
        if kind == "sqrt":
            return self.node("Sqrt", [magnitude], self.shapes[x])
        if kind == "exp":
            return self.node("Exp", [self.node("Neg", [magnitude], self.shapes[x])],
                             self.shapes[x])
        y = self.pick()
        shape = _broadcast(self.shapes[x], self.shapes[y])
        if shape is None:
            return None
        denominator = self.node("Add", [self.node("Abs", [y], self.shapes[y]), one],
                                self.shapes[y])
        return self.node("Div", [x, denominator], shape)

    def binary(self):
        x, y = self.pick(), self.pick()
        shape = _broadcast(self.shapes[x], self.shapes[y])
        if shape is None:
            return None
        return self.node(self.draw(st.sampled_from(BINARY)), [x, y], shape)

    def where(self):
        x, y = self.pick(), self.pick()
        shape = _broadcast(self.shapes[x], self.shapes[y])
        if shape is None:
            return None
        cond = self.node("Greater", [x, y], shape, pool=False)  # (bool)
        return self.node("Where", [cond, x, y], shape)

    def matmul(self):
        x = self.pick(min_rank=1)
        k = self.shapes[x][-1]
        n = self.draw(st.sampled_from([1, 3, 8, 17]))
        return self.node("MatMul", [x, self.weight((k, n))], (*self.shapes[x][:-1], n))

    def gemm(self):
        x = self.pick(rank=2)
        if x is None:
            return None
        m, k = self.shapes[x]
        n = self.draw(st.sampled_from([1, 4, 9]))
        trans_b = self.draw(st.integers(0, 1))
        w = self.weight((n, k) if trans_b else (k, n))
        return self.node("Gemm", [x, w, self.weight((n,))], (m, n), transB=trans_b,
                         alpha=self.draw(st.sampled_from([1.0, 0.5])))

    def transpose(self):
        x = self.pick(min_rank=2)
        if x is None:
            return None
        perm = self.draw(st.permutations(range(len(self.shapes[x]))))
        return self.node("Transpose", [x], tuple(self.shapes[x][p] for p in perm),
                         perm=list(perm))

    def reshape(self):
        x = self.pick()
        size = int(np.prod(self.shapes[x]))
        target = (size,) if len(self.shapes[x]) != 1 else (1, size)
        spec = list(target)
        if len(spec) == 2:
            spec[1] = -1
        return self.node("Reshape", [x, self.ints(spec)], target)

    def concat(self):
        x = self.pick(min_rank=1)
        axis = self.draw(st.integers(0, len(self.shapes[x]) - 1))
        shape = list(self.shapes[x])
        shape[axis] *= 2
        return self.node("Concat", [x, x], tuple(shape), axis=axis)

    def slice(self):
        x = self.pick(min_rank=1)
        shape = self.shapes[x]
        axis = self.draw(st.integers(0, len(shape) - 1))
        if shape[axis] < 2:
            return None
        start = self.draw(st.integers(0, shape[axis] - 2))
        end = self.draw(st.integers(start + 1, shape[axis]))
        step = self.draw(st.sampled_from([1, 2]))
        out = list(shape)
        out[axis] = len(range(start, end, step))
        return self.node("Slice", [x, self.ints([start]), self.ints([end]),
                                   self.ints([axis]), self.ints([step])], tuple(out))

    def reduce(self):
        x = self.pick(min_rank=1)
        shape = self.shapes[x]
        axes = sorted(self.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
        keep = self.draw(st.integers(0, 1))
        out = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keep else \
            tuple(d for i, d in enumerate(shape) if i not in axes)
        op = self.draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax"]))
        if op == "ReduceSum":  # (axes an input from opset 13; the others from 18)
            return self.node(op, [x, self.ints(axes)], out, keepdims=keep)
        return self.node(op, [x], out, axes=axes, keepdims=keep)

    def softmax(self):
        x = self.pick(min_rank=1)
        axis = self.draw(st.integers(-len(self.shapes[x]), len(self.shapes[x]) - 1))
        return self.node("Softmax", [x], self.shapes[x], axis=axis)

    def layer_norm(self):
        x = self.pick(min_rank=1)
        width = self.shapes[x][-1]
        return self.node("LayerNormalization", [x, self.weight((width,)), self.weight((width,))],
                         self.shapes[x], axis=-1, epsilon=1e-5)

    def conv(self):
        x = self.pick(rank=4)
        if x is None:
            x = self.input((self.draw(st.integers(1, 2)), self.draw(st.integers(1, 4)),
                            self.draw(st.integers(3, 9)), self.draw(st.integers(3, 9))))
        n, c, h, w = self.shapes[x]
        group = self.draw(st.sampled_from([g for g in (1, 2, 3) if c % g == 0]))
        out_channels = group * self.draw(st.integers(1, 3))
        kh, kw = self.draw(st.integers(1, min(3, h))), self.draw(st.integers(1, min(3, w)))
        stride, pad = self.draw(st.integers(1, 2)), self.draw(st.integers(0, 1))
        dilation = self.draw(st.sampled_from([1, 1, 2]))
        oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
        ow = (w + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
        if oh < 1 or ow < 1:
            return None
        return self.node("Conv", [x, self.weight((out_channels, c // group, kh, kw)),
                                  self.weight((out_channels,))], (n, out_channels, oh, ow),
                         group=group, strides=[stride, stride], pads=[pad] * 4,
                         dilations=[dilation, dilation])

    def pool(self):
        x = self.pick(rank=4)
        if x is None:
            return None
        n, c, h, w = self.shapes[x]
        k = self.draw(st.integers(1, min(3, h, w)))
        stride = self.draw(st.integers(1, 2))
        oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
        op = self.draw(st.sampled_from(["MaxPool", "AveragePool"]))
        return self.node(op, [x], (n, c, oh, ow), kernel_shape=[k, k], strides=[stride] * 2)

    def gather(self):
        x = self.pick(min_rank=1)
        shape = self.shapes[x]
        axis = self.draw(st.integers(0, len(shape) - 1))
        count = self.draw(st.integers(1, 4))
        picks = [int(self.rng.integers(-shape[axis], shape[axis])) for _ in range(count)]
        out = (*shape[:axis], count, *shape[axis + 1:])
        return self.node("Gather", [x, self.ints(picks, "i")], out, axis=axis)

    # -- the model -----------------------------------------------------------------------------
    def make(self) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        for _ in range(self.draw(st.integers(1, 2))):
            self.input(self.shape())
        target = self.draw(st.integers(5, 30))
        attempts = 0
        while len(self.nodes) < target and attempts < 4 * target:
            attempts += 1
            op = self.draw(st.sampled_from(sorted(self.ops)))
            self.ops[op]()
        produced = [n.output[0] for n in self.nodes if n.output[0] in self.shapes]
        last = self.draw(st.lists(st.sampled_from(produced), min_size=1, max_size=3,
                                  unique=True)) if produced else list(self.feeds)[:1]
        outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, self.shapes[n])
                   for n in last]
        graph = helper.make_graph(self.nodes, "random", self.inputs, outputs,
                                  self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        return model, self.feeds


@st.composite
def onnx_models(draw) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    return _ModelMaker(draw).make()
