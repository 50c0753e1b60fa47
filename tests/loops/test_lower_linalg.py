"""Lowering of matmul, conv and conv_transpose to loops."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, DType
from tests.loops.lowering_check import check_lowering

RNG = np.random.default_rng(5)


def data(shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-100, 100, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 4), (4, 5)),
    ((4,), (4,)),
    ((4,), (2, 4, 3)),
    ((2, 1, 3, 4), (4, 5)),
    ((2, 1, 2, 3), (3, 3, 2)),
    ((2, 3, 4), (4,)),
])
def test_matmul_shapes(a_shape, b_shape) -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, a_shape)
    y = b.input("y", DType.f32, b_shape)
    b.output(b.matmul(x, y))
    check_lowering(b.build(), [data(a_shape), data(b_shape)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [DType.i8, DType.i32, DType.u8])
def test_integer_matmul_wraps(dtype) -> None:
    b = Builder("g")
    x = b.input("x", dtype, (3, 6))
    y = b.input("y", dtype, (6, 2))
    b.output(b.matmul(x, y))
    check_lowering(b.build(), [data((3, 6), dtype.np), data((6, 2), dtype.np)])


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
def test_half_matmul(dtype) -> None:
    b = Builder("g")
    x = b.input("x", dtype, (3, 8))
    y = b.input("y", dtype, (8, 2))
    b.output(b.matmul(x, y))
    tol = 1e-2 if dtype is DType.f16 else 5e-2
    check_lowering(b.build(), [data((3, 8), dtype.np), data((8, 2), dtype.np)], rtol=tol,
                   atol=tol)


CONV_CASES = [
    # x shape, w shape, attrs, bias
    ((1, 2, 5), (3, 2, 3), {}, False),
    ((2, 2, 6), (2, 1, 2), {"strides": (2,), "pads": (1, 2), "dilations": (2,),
                            "groups": 2}, True),
    ((1, 2, 5, 4), (4, 2, 3, 2), {"pads": (1, 0, 1, 1)}, True),
    ((1, 4, 5, 5), (4, 2, 2, 3), {"strides": (2, 1), "pads": (0, 2, 1, 2),
                                  "dilations": (2, 1), "groups": 2}, False),
    ((1, 3, 4, 4), (3, 1, 3, 3), {"pads": (1, 1, 1, 1), "groups": 3}, True),  # depthwise
    ((1, 1, 3, 3, 3), (2, 1, 2, 2, 2), {"pads": (1, 0, 0, 0, 1, 1)}, True),
]


@pytest.mark.parametrize("x_shape, w_shape, attrs, bias", CONV_CASES)
def test_conv(x_shape, w_shape, attrs, bias) -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, x_shape)
    w = b.input("w", DType.f32, w_shape)
    operands = [x, w]
    inputs = [data(x_shape), data(w_shape)]
    if bias:
        operands.append(b.input("b", DType.f32, (w_shape[0],)))
        inputs.append(data((w_shape[0],)))
    b.output(b.conv(*operands, **attrs))
    check_lowering(b.build(), inputs, rtol=1e-5, atol=1e-5)


def test_conv_f16() -> None:
    b = Builder("g")
    x = b.input("x", DType.f16, (1, 2, 4, 4))
    w = b.input("w", DType.f16, (2, 2, 3, 3))
    bias = b.input("b", DType.f16, (2,))
    b.output(b.conv(x, w, bias, pads=(1, 1, 1, 1), strides=(2, 2)))
    check_lowering(b.build(), [data((1, 2, 4, 4), np.float16), data((2, 2, 3, 3), np.float16),
                               data((2,), np.float16)], rtol=1e-2, atol=1e-2)


CONV_TRANSPOSE_CASES = [
    # x shape, w shape, attrs, bias
    ((1, 2, 4), (2, 3, 3), {}, False),
    ((2, 2, 3), (2, 1, 3), {"strides": (2,), "pads": (1, 0), "groups": 2,
                            "output_padding": (1,)}, True),
    ((1, 2, 3), (2, 2, 2), {"strides": (3,), "dilations": (2,), "pads": (0, 2)}, True),
    ((1, 2, 3, 3), (2, 2, 3, 2), {"strides": (2, 1), "pads": (1, 0, 1, 1),
                                  "output_padding": (1, 0)}, True),
    ((1, 4, 2, 3), (4, 1, 2, 2), {"strides": (2, 3), "dilations": (1, 2), "groups": 2},
     False),
    ((1, 2, 2, 2, 2), (2, 1, 2, 2, 2), {"strides": (2, 2, 1), "pads": (0, 1, 0, 1, 0, 0)},
     True),
]


@pytest.mark.parametrize("x_shape, w_shape, attrs, bias", CONV_TRANSPOSE_CASES)
def test_conv_transpose(x_shape, w_shape, attrs, bias) -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, x_shape)
    w = b.input("w", DType.f32, w_shape)
    operands = [x, w]
    inputs = [data(x_shape), data(w_shape)]
    groups = attrs.get("groups", 1)
    if bias:
        operands.append(b.input("b", DType.f32, (w_shape[1] * groups,)))
        inputs.append(data((w_shape[1] * groups,)))
    b.output(b.conv_transpose(*operands, **attrs))
    check_lowering(b.build(), inputs, rtol=1e-5, atol=1e-5)


def test_conv_transpose_bf16() -> None:
    b = Builder("g")
    x = b.input("x", DType.bf16, (1, 2, 3, 3))
    w = b.input("w", DType.bf16, (2, 2, 2, 2))
    b.output(b.conv_transpose(x, w, strides=(2, 2), pads=(0, 0, 1, 1)))
    check_lowering(b.build(), [data((1, 2, 3, 3), DType.bf16.np),
                               data((2, 2, 2, 2), DType.bf16.np)], rtol=5e-2, atol=5e-2)
