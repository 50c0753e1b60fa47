"""The pad_convs pass (ember/graph/passes/pad_convs.py): a conv that lowers to an implicit
GEMM (f32, 2-D, one group) with padding gets an explicit pad op and no padding of its own;
other convs are left alone. Values: the interpreter on the graph before and after, and the
compiled graph (which runs the pass) against the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Builder, interpret
from ember.driver.pass_manager import run_passes

RNG = np.random.default_rng(3)


def conv(x_shape, w_shape, dtype="f32", groups=1, **attrs):
    b = Builder("conv")
    x, w = b.input("x", dtype, x_shape), b.input("w", dtype, w_shape)
    b.output(b.relu(b.conv(x, w, groups=groups, **attrs)))
    return b.build()


def ops(graph) -> list[tuple[str, dict]]:
    return [(op.name, dict(op.attrs)) for op in graph.walk() if op.name in ("pad", "conv")]


def test_padding_moves_into_a_pad_op() -> None:
    graph = conv((1, 4, 9, 7), (6, 4, 3, 3), pads=(1, 2, 0, 1), strides=(2, 1))
    inputs = [RNG.standard_normal((1, 4, 9, 7)).astype(np.float32),
              RNG.standard_normal((6, 4, 3, 3)).astype(np.float32)]
    want = interpret(graph, inputs)
    padded = run_passes(graph, ["pad_convs"])
    (pad, pad_attrs), (_, conv_attrs) = ops(padded)
    assert pad == "pad" and list(pad_attrs["pads"]) == [0, 0, 1, 2, 0, 0, 0, 1]
    assert not any(conv_attrs["pads"]) and list(conv_attrs["strides"]) == [2, 1]
    np.testing.assert_allclose(interpret(padded, inputs)[0], want[0], rtol=1e-6, atol=1e-6)
    assert ops(run_passes(padded, ["pad_convs"])) == ops(padded)  # nothing more to do


@pytest.mark.parametrize("graph", [
    conv((1, 4, 8, 8), (4, 1, 3, 3), groups=4, pads=(1, 1, 1, 1)),  # depthwise: own kernel
    conv((1, 4, 8, 8), (6, 2, 3, 3), groups=2, pads=(1, 1, 1, 1)),  # grouped
    conv((1, 4, 8, 8), (6, 4, 3, 3), dtype="f64", pads=(1, 1, 1, 1)),  # not an f32 GEMM
    conv((1, 4, 8, 8), (6, 4, 3, 3)),  # no padding
], ids=["depthwise", "grouped", "f64", "unpadded"])
def test_other_convs_keep_their_padding(graph) -> None:
    before = ops(graph)
    assert ops(run_passes(graph, ["pad_convs"])) == before


def test_compiled_padded_convs_match_the_interpreter() -> None:
    """Through ember.compile (the pass, then the GEMM's packing without bounds tests),
    including a last panel past N and output rows narrower than a panel."""
    for x_shape, w_shape, attrs in [((1, 8, 7, 7), (16, 8, 3, 3), {"pads": (1, 1, 1, 1)}),
                                    ((1, 3, 23, 23), (8, 3, 7, 7),
                                     {"pads": (3, 3, 3, 3), "strides": (2, 2)})]:
        graph = conv(x_shape, w_shape, **attrs)
        inputs = [RNG.standard_normal(x_shape).astype(np.float32),
                  RNG.standard_normal(w_shape).astype(np.float32)]
        compiled = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))
        np.testing.assert_allclose(compiled(*inputs)[0], interpret(graph, inputs)[0],
                                   rtol=1e-4, atol=1e-4)
        assert [k for k in ember.explain(compiled).kernels if "pad" in k.ops]
