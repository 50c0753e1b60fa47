"""The passes that bring convs to the shapes the fast conv kernels take: `convs_2d` (a 1-D
conv as a 2-D one, one row high) and `group_convs` (a grouped conv's groups as images,
`grouped_conv`). Values: the interpreter before and after each pass, and compiled code
(which runs them) against the interpreter; the compiled convs must get the implicit GEMM
(vectorized and unrolled), not the plain nest that ran them at 1-5% of the roofline."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Builder, interpret
from ember.driver.pass_manager import run_passes

RNG = np.random.default_rng(5)


def conv(x_shape, w_shape, dtype="f32", groups=1, bias=True, **attrs):
    b = Builder("conv")
    x, w = b.input("x", dtype, x_shape), b.input("w", dtype, w_shape)
    operands = [x, w] + ([b.input("b", dtype, (w_shape[0],))] if bias else [])
    b.output(b.relu(b.conv(*operands, groups=groups, **attrs)))
    return b.build()


def inputs_of(graph) -> list[np.ndarray]:
    return [RNG.standard_normal(v.shape).astype(v.dtype.np) for v in graph.inputs]


def op_names(graph) -> list[str]:
    return [op.name for op in graph.walk()]


@pytest.mark.parametrize("graph", [
    conv((1, 8, 9, 7), (6, 4, 3, 3), groups=2, pads=(1, 1, 1, 1), strides=(2, 1)),
    conv((2, 6, 5, 5), (9, 2, 1, 1), groups=3, bias=False),
], ids=["padded-strided", "two-images-1x1"])
def test_groups_become_images(graph) -> None:
    inputs = inputs_of(graph)
    rewritten = run_passes(graph, ["group_convs"])
    assert "grouped_conv" in op_names(rewritten) and "conv" not in op_names(rewritten)
    np.testing.assert_allclose(interpret(rewritten, inputs)[0], interpret(graph, inputs)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("graph", [
    conv((1, 4, 8, 8), (4, 1, 3, 3), groups=4, pads=(1, 1, 1, 1)),  # depthwise: own kernel
    conv((1, 4, 8, 8), (6, 2, 3, 3), dtype="f64", groups=2),
    conv((1, 4, 8, 8), (6, 4, 3, 3)),  # one group
], ids=["depthwise", "f64", "one-group"])
def test_other_convs_keep_their_groups(graph) -> None:
    assert op_names(run_passes(graph, ["group_convs"])) == op_names(graph)


@pytest.mark.parametrize("graph", [
    conv((1, 4, 20), (6, 4, 3), pads=(1, 2), strides=(2,), dilations=(2,)),
    conv((2, 8, 16), (8, 2, 5), groups=4, bias=False, pads=(2, 2)),
], ids=["strided-dilated", "grouped"])
def test_1d_convs_become_2d(graph) -> None:
    inputs = inputs_of(graph)
    rewritten = run_passes(graph, ["convs_2d"])
    [conv_op] = [op for op in rewritten.walk() if op.name == "conv"]
    assert len(conv_op.operands[0].shape) == 4
    np.testing.assert_allclose(interpret(rewritten, inputs)[0], interpret(graph, inputs)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("graph", [
    conv((1, 8, 9, 7), (6, 4, 3, 3), groups=2, pads=(1, 1, 1, 1), strides=(2, 1)),
    conv((1, 64, 14, 14), (64, 16, 3, 3), groups=4, pads=(1, 1, 1, 1)),
    conv((1, 32, 40), (32, 32, 3), strides=(2,)),  # an audio encoder's feature conv
    conv((1, 48, 49), (48, 3, 16), groups=16, pads=(8, 8)),  # its positional conv
], ids=["grouped", "regnet-like", "1d", "1d-grouped"])
def test_compiled_convs_match_the_interpreter_on_the_gemm(graph) -> None:
    inputs = inputs_of(graph)
    compiled = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))
    np.testing.assert_allclose(compiled(*inputs)[0], interpret(graph, inputs)[0],
                               rtol=1e-4, atol=1e-4)
    [kernel] = [k for k in ember.explain(compiled, measure=False).kernels if "conv" in
                k.name]
    assert "vectorized" in kernel.schedule and "unrolled" in kernel.schedule, kernel
    assert len(kernel.ops) > 1, kernel  # the relu moved before the reshape: its epilogue
