"""A hypothesis strategy for random well-typed graphs, shared by the property tests.

Graphs mix op families (elementwise, comparison/where, cast, reduction, shape, matmul,
constants) and structured control flow (`if`, `loop`), on small f32 tensors;
`random_graphs(wide=True)` adds what the differential fuzzer needs
(tests/fuzz/test_random_pipeline.py).
`random_graphs(symbolic=True)`: the inputs' leading dims are one symbolic size, `?n`
(ember/graph/symbolic.py), and the inputs are drawn at one value of it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ember import Builder, DType
from ember.graph.ir import Graph, Value
from ember.graph.symbolic import Dim, symbol

UNARY = ["neg", "abs", "tanh", "sigmoid", "sin", "floor", "exp", "erf"]
BINARY = ["add", "sub", "mul", "max", "min", "div"]


def _broadcastable(a: Value, b: Value) -> bool:
    return all(x == y or 1 in (x, y) for x, y in zip(reversed(a.shape), reversed(b.shape)))


class _GraphMaker:
    def __init__(self, draw, symbolic: bool = False, wide: bool = False):
        self.draw = draw
        self.symbolic = symbolic
        self.wide = wide
        self.b = Builder("random")
        self.pool: list[Value] = []
        self.families = {"unary": self.unary, "binary": self.binary, "where": self.where,
                         "cast": self.cast, "reduce": self.reduce, "transpose": self.transpose,
                         "reshape": self.reshape, "slice": self.slice, "concat": self.concat,
                         "matmul": self.matmul, "constant": self.constant, "if": self.if_,
                         "loop": self.loop}
        if wide:
            self.families |= {"conv": self.conv, "pool": self.pool_2d, "rows": self.rows,
                              "long_reduce": self.long_reduce, "shared": self.shared}

    def pick(self, rank_at_least: int = 0, nonempty: bool = False) -> Value | None:
        choices = [v for v in self.pool if v.type.rank >= rank_at_least
                   and not (nonempty and v.type.numel == 0)]
        return self.draw(st.sampled_from(choices)) if choices else None

    def shape(self, max_rank: int = 3) -> tuple[int, ...]:
        # Wide graphs have empty dims too, and odd sizes past a vector's lanes.
        sizes = st.sampled_from([0, 1, 2, 3, 5, 9, 17]) if self.wide else st.integers(1, 4)
        return tuple(self.draw(st.lists(sizes, max_size=max_rank)))

    # -- the wide families: windows, rows, long and strided reductions, shared values -------
    def conv(self, b: Builder):
        """A 2-D convolution of odd sizes (strides, padding, dilation, groups), on an input
        of its own."""
        groups = self.draw(st.sampled_from([1, 1, 2, 3]))
        channels = groups * self.draw(st.integers(1, 3))
        height, width = (self.draw(st.integers(1, 9)) for _ in range(2))
        kernel = (self.draw(st.integers(1, min(3, height))),
                  self.draw(st.integers(1, min(3, width))))
        x = self.fresh_input((self.draw(st.integers(1, 2)), channels, height, width))
        out = groups * self.draw(st.integers(1, 3))
        w = b.constant(self.array((out, channels // groups, *kernel)))
        pad = self.draw(st.integers(0, 1))
        return b.conv(x, w, strides=(self.draw(st.integers(1, 2)),) * 2, pads=(pad,) * 4,
                      groups=groups)

    def pool_2d(self, b: Builder):
        x = self.pick(rank_at_least=4, nonempty=True)
        if x is None or len(x.shape) != 4 or min(x.shape[2:]) < 2:
            return None
        op = self.draw(st.sampled_from(["max_pool", "avg_pool"]))
        return getattr(b, op)(x, kernel=(2, 2), strides=(self.draw(st.integers(1, 2)),) * 2,
                              ceil_mode=self.draw(st.booleans()))

    def rows(self, b: Builder):
        """Softmax or layer norm along the last axis (reductions inside a fused row)."""
        x = self.pick(rank_at_least=1, nonempty=True)
        if x is None:
            return None
        return (b.softmax if self.draw(st.booleans()) else b.layer_norm)(x, axis=-1)

    def long_reduce(self, b: Builder):
        """A sum or max over thousands of elements, along a contiguous or a strided axis."""
        rows, length = self.draw(st.integers(1, 3)), self.draw(st.integers(1000, 5000))
        x = self.fresh_input((length, rows) if self.draw(st.booleans()) else (rows, length))
        axis = 0 if x.shape[0] == length else 1
        op = self.draw(st.sampled_from(["reduce_sum", "reduce_max", "reduce_mean"]))
        return getattr(b, op)(x, axes=(axis,), keepdims=False)

    def shared(self, b: Builder):
        """A value read by two consumers, one of them a reduction (what fusion must not
        compute twice or out of order)."""
        x = self.pick(nonempty=True)
        if x is None:
            return None
        y = b.exp(b.neg(b.abs(x)))
        return b.add(y, b.reduce_max(y, axes=tuple(range(x.type.rank)), keepdims=True))

    def fresh_input(self, shape: tuple[int, ...]) -> Value:
        """A new f32 input of `shape` (kept with its array)."""
        value = self.b.input(f"in{len(self.inputs)}", DType.f32, shape)
        self.inputs.append(self.array(shape))
        return value

    # -- families; each may decline by returning None ---------------------------------------
    def unary(self, b: Builder):
        return getattr(b, self.draw(st.sampled_from(UNARY)))(self.pick())

    def binary(self, b: Builder):
        x, y = self.pick(), self.pick()
        if not _broadcastable(x, y):
            return None
        return getattr(b, self.draw(st.sampled_from(BINARY)))(x, y)

    def where(self, b: Builder):
        x, y = self.pick(), self.pick()
        if not _broadcastable(x, y):
            return None
        return b.where(b.lt(x, y), x, y)

    def cast(self, b: Builder):
        dtype = self.draw(st.sampled_from([DType.f16, DType.bf16, DType.i32, DType.f64]))
        return b.cast(b.cast(self.pick(), to=dtype), to=DType.f32)

    def reduce(self, b: Builder):
        x = self.pick()
        axes = self.draw(st.lists(st.integers(0, max(x.type.rank - 1, 0)), unique=True,
                                  max_size=x.type.rank)) if x.type.rank else []
        op = self.draw(st.sampled_from(["reduce_sum", "reduce_max", "reduce_min"]))
        return getattr(b, op)(x, axes=axes, keepdims=self.draw(st.booleans()))

    def transpose(self, b: Builder):
        x = self.pick()
        return b.transpose(x, perm=self.draw(st.permutations(range(x.type.rank))))

    def reshape(self, b: Builder):
        x = self.pick()
        return b.reshape(x, shape=(x.type.numel,) if x.type.rank != 1 else (1, x.type.numel))

    def slice(self, b: Builder):
        x = self.pick(rank_at_least=1, nonempty=True)
        if x is None:
            return None
        starts, ends, steps = [], [], []
        for d in x.shape:
            if isinstance(d, Dim):  # a symbolic size: all of it
                starts.append(0)
                ends.append(d)
                steps.append(1)
                continue
            step = self.draw(st.sampled_from([1, 2, -1]))
            start = self.draw(st.integers(0, d - 1))
            if step > 0:
                end = self.draw(st.integers(start + 1, d))
            else:
                end = self.draw(st.integers(-1, start - 1))
            starts.append(start)
            ends.append(end)
            steps.append(step)
        return b.slice(x, starts=starts, ends=ends, steps=steps)

    def concat(self, b: Builder):
        x = self.pick(rank_at_least=1)
        if x is None:
            return None
        return b.concat(x, x, axis=self.draw(st.integers(0, x.type.rank - 1)))

    def matmul(self, b: Builder):
        x = self.pick(rank_at_least=1)
        if x is None:
            return None
        k = x.shape[-1]
        if isinstance(k, Dim):
            return None  # a constant operand has numbers for sizes
        w = b.constant(self.array((k, self.draw(st.integers(1, 4)))))
        return b.matmul(x, w)

    def constant(self, b: Builder):
        return b.constant(self.array(self.shape()))

    def if_(self, b: Builder):
        x = self.pick()
        cond = b.gt(b.reduce_sum(x, axes=tuple(range(x.type.rank))), 0.0)
        then_op, else_op = (self.draw(st.sampled_from(UNARY)) for _ in range(2))
        (r,) = b.if_(cond, lambda t: [getattr(t, then_op)(x)],
                     lambda e: [getattr(e, else_op)(e.mul(x, 0.5))])
        return r

    def loop(self, b: Builder):
        x = self.pick()
        trips = self.draw(st.integers(0, 3))
        n = b.constant(np.int64(trips))
        true = b.constant(True)

        def body(lb, i, acc):
            nxt = lb.tanh(lb.add(acc, lb.cast(i, to=DType.f32)))
            return [true, nxt, lb.reduce_sum(nxt, axes=())]

        final, scan = b.loop(n, true, [x], body, num_scan=1, scan_length=trips)
        return self.draw(st.sampled_from([final, scan]))

    def array(self, shape) -> np.ndarray:
        seed = self.draw(st.integers(0, 2**31))
        return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

    def make(self) -> tuple[Graph, list[np.ndarray]]:
        b = self.b
        inputs = self.inputs = []
        n = self.draw(st.integers(1, 4))
        for i in range(self.draw(st.integers(1, 3))):
            shape = self.shape()
            declared = shape
            if self.symbolic and shape:
                shape = (n,) + shape[1:]
                declared = (symbol("n"),) + shape[1:]
            self.pool.append(b.input(f"in{i}", DType.f32, declared))
            inputs.append(self.array(shape))
        for _ in range(self.draw(st.integers(1, 10))):
            family = self.draw(st.sampled_from(sorted(self.families)))
            value = self.families[family](b)
            if value is not None:
                self.pool.append(value)
        outputs = self.draw(st.lists(st.sampled_from(self.pool), min_size=1, max_size=3))
        b.output(*outputs)
        return b.build(), inputs


@st.composite
def random_graphs(draw, symbolic: bool = False, wide: bool = False
                  ) -> tuple[Graph, list[np.ndarray]]:
    """A random graph and inputs for it; `wide` adds empty and odd dims, convolutions,
    pooling, rows (softmax, layer norm), long and strided reductions and shared values."""
    return _GraphMaker(draw, symbolic, wide).make()
