"""What the fuzzers found, kept as tests (docs/reliability.md lists each with its fix)."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, Config, DType, interpret
from ember.driver.pipeline import compile_graph

CPU = Config(executor="cpu", disk_cache=False)
RNG = np.random.default_rng(3)


@pytest.mark.parametrize("window", ["avg_pool", "max_pool", "depthwise", "conv"])
def test_a_window_step_with_an_epilogue_that_has_no_vector_code(window: str) -> None:
    """Found by the model fuzzer: an average pool fused with a sin (which has no vector
    code) failed to compile, the pool step's lanes loop being refused by the verifier;
    the depthwise and packed-conv steps built their lanes' loops alike."""
    b = Builder(f"epilogue_{window}")
    x = b.input("x", DType.f32, (1, 4, 9, 9))
    if window == "depthwise":
        w = b.constant(RNG.standard_normal((4, 1, 3, 3)).astype(np.float32))
        y = b.conv(x, w, pads=(1, 1, 1, 1), groups=4)
    elif window == "conv":
        w = b.constant(RNG.standard_normal((8, 4, 3, 3)).astype(np.float32))
        y = b.conv(x, w, pads=(1, 1, 1, 1))
    else:
        y = getattr(b, window)(x, kernel=(2, 2), strides=(2, 2))
    b.output(b.sin(y))
    graph = b.build()
    inputs = [RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)]
    np.testing.assert_allclose(compile_graph(graph, CPU)(*inputs)[0],
                               interpret(graph, inputs)[0], rtol=1e-5, atol=1e-5)


def test_a_transpose_with_an_epilogue_that_has_no_vector_code() -> None:
    """Found by the model fuzzer: a transpose fused with a sin failed to compile, the
    transpose blocking vectorizing its lanes without asking whether sin can run on them."""
    b = Builder("transpose_sin")
    x = b.input("x", DType.f32, (8, 1, 8, 1))
    b.output(b.sin(b.transpose(b.reduce_sum(x, axes=(1, 3)), perm=(1, 0))))
    graph = b.build()
    inputs = [RNG.standard_normal((8, 1, 8, 1)).astype(np.float32)]
    np.testing.assert_allclose(compile_graph(graph, CPU)(*inputs)[0],
                               interpret(graph, inputs)[0], rtol=1e-5, atol=1e-5)


def test_a_transpose_beside_a_value_whose_operand_has_no_vector_code() -> None:
    """Found by tests/conformance/test_numerics.py: a fused kernel storing a transpose and
    `cast(isnan(x))` failed to compile. The transpose blocking asked whether the cast had
    vector code, not whether the isnan under it had."""
    b = Builder("transpose_isnan")
    x = b.input("x", DType.f32, (21, 21))
    b.output(b.cast(b.isnan(x), to=DType.u8))
    b.output(b.transpose(x, perm=(1, 0)))
    graph = b.build()
    inputs = [RNG.standard_normal((21, 21)).astype(np.float32)]
    inputs[0][3, 4] = np.nan
    for got, want in zip(compile_graph(graph, CPU)(*inputs), interpret(graph, inputs)):
        np.testing.assert_array_equal(got, want)
