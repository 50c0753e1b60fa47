"""matmul, packed_matmul, conv, packed_conv, grouped_conv, conv_transpose and Winograd's transforms
(winograd_input, winograd_output): type inference, errors, and semantics against NumPy
and PyTorch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import Builder, DType, ShapeError, interpret, parse_graph, print_graph
from ember.dtypes import from_numpy
from ember.graph.ops.linalg import (
    pack_conv_weights,
    pack_matmul_weights,
    unpack_conv_weights,
    unpack_matmul_weights,
)
from ember.graph.ops.winograd import winograd_weights

RNG = np.random.default_rng(0)


def build(opname, types, **attrs):
    """A graph of one op whose operands are inputs of `types`, (dtype, shape) pairs."""
    b = Builder(opname)
    args = [b.input(f"x{i}", dtype, shape) for i, (dtype, shape) in enumerate(types)]
    b.output(getattr(b, opname)(*args, **attrs))
    return b.build()


def result_type(opname, *shapes, dtype=DType.f32, **attrs):
    return str(build(opname, [(dtype, s) for s in shapes], **attrs).outputs[0].type)


def run(opname, *arrays, **attrs):
    """Interpret the op on `arrays`, checking on the way that its graph round-trips."""
    graph = build(opname, [(from_numpy(a.dtype), a.shape) for a in arrays], **attrs)
    text = print_graph(graph)
    assert print_graph(parse_graph(text)) == text
    return interpret(graph, arrays)[0]


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def T(array):
    return torch.from_numpy(array)


# -- matmul ----------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((3,), (3,), "f32[]"),
    ((3,), (3, 4), "f32[4]"),
    ((2, 3), (3,), "f32[2]"),
    ((2, 3), (3, 4), "f32[2,4]"),
    ((5, 2, 3), (3, 4), "f32[5,2,4]"),
    ((2, 1, 2, 3), (4, 3, 5), "f32[2,4,2,5]"),
    ((4,), (2, 4, 5), "f32[2,5]"),
    ((2, 3, 4), (4,), "f32[2,3]"),
]


@pytest.mark.parametrize("a, b, expected", MATMUL_SHAPES)
def test_matmul_types(a, b, expected):
    assert result_type("matmul", a, b) == expected


@pytest.mark.parametrize("types, match", [
    ([(DType.f32, (2, 3)), (DType.f32, (4, 5))], "contracted dims differ"),
    ([(DType.f32, (2, 2, 3)), (DType.f32, (3, 3, 4))], "do not broadcast"),
    ([(DType.f32, (2, 3)), (DType.f16, (3, 4))], "one dtype"),
    ([(DType.bool, (2, 3)), (DType.bool, (3, 4))], "dtype bool"),
    ([(DType.f32, ()), (DType.f32, (3, 4))], "rank >= 1"),
])
def test_matmul_errors(types, match):
    with pytest.raises(ShapeError, match=match):
        build("matmul", types)


@pytest.mark.parametrize("a, b, _", MATMUL_SHAPES)
def test_matmul_matches_torch(a, b, _):
    x, y = randn(*a), randn(*b)
    np.testing.assert_allclose(run("matmul", x, y), torch.matmul(T(x), T(y)).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_matmul_int32_and_wrapping():
    x = RNG.integers(-100, 100, (2, 3, 4)).astype(np.int32)
    y = RNG.integers(-100, 100, (4, 5)).astype(np.int32)
    np.testing.assert_array_equal(run("matmul", x, y), torch.matmul(T(x), T(y)).numpy())
    big = np.full((1, 2), 100, np.int8)  # 100*100 + 100*100 wraps in i8
    assert run("matmul", big, big.T)[0, 0] == np.int8(np.int64(20000).astype(np.int8))


def test_matmul_f16():
    x, y = randn(3, 8, 16, dtype=np.float16), randn(16, 4, dtype=np.float16)
    out = run("matmul", x, y)
    assert out.dtype == np.float16
    expected = torch.matmul(T(x).float(), T(y).float()).half().numpy()
    np.testing.assert_allclose(out.astype(np.float32), expected.astype(np.float32),
                               rtol=1e-2, atol=1e-2)


# -- conv ------------------------------------------------------------------------------


def test_conv_types():
    assert result_type("conv", (2, 3, 9, 9), (8, 3, 3, 3)) == "f32[2,8,7,7]"
    assert result_type("conv", (2, 4, 9, 10), (6, 2, 3, 2), (6,), strides=(2, 1),
                       pads=(1, 0, 2, 1), dilations=(1, 2), groups=2) == "f32[2,6,5,9]"
    assert result_type("conv", (1, 2, 10), (4, 2, 3), strides=(3,)) == "f32[1,4,3]"
    assert result_type("conv", (1, 2, 4, 5, 6), (4, 1, 2, 2, 2), groups=2,
                       dtype=DType.f16) == "f16[1,4,3,4,5]"


@pytest.mark.parametrize("x, w, attrs, match", [
    ((1, 3, 8, 8), (4, 2, 3, 3), {}, "x has 3 channels"),
    ((1, 2, 8, 8), (4, 2, 3, 3), {"pads": (1, 1)}, "pads must have 4 entries"),
    ((1, 2, 8, 8), (4, 2, 3, 3), {"strides": (1, 1, 1)}, "strides must have 2 entries"),
    ((1, 2, 8, 8), (4, 2, 3, 3), {"strides": (0, 1)}, "strides must be >= 1"),
    ((1, 2, 8, 8), (4, 2, 3, 3), {"pads": (0, 0, -1, 0)}, "pads must be >= 0"),
    ((1, 1, 2, 2), (1, 1, 3, 3), {}, "larger than the padded input 2"),
    ((1, 1, 5, 5), (1, 1, 3, 3), {"dilations": (3, 1)}, "extent 7 is larger"),
    ((1, 4, 5, 5), (3, 2, 3, 3), {"groups": 2}, "3 output channels do not split"),
    ((1, 4, 5, 5), (4, 4, 3, 3), {"groups": 0}, "groups must be >= 1"),
    ((1, 2, 5, 5), (4, 2, 3), {}, "weight rank"),
    ((1, 2, 5, 5), (4, 2, 0, 3), {}, "kernel must not be empty"),
    ((2, 5), (4, 5), {}, "at least one spatial axis"),
])
def test_conv_errors(x, w, attrs, match):
    with pytest.raises(ShapeError, match=match):
        build("conv", [(DType.f32, x), (DType.f32, w)], **attrs)


@pytest.mark.parametrize("types, match", [
    ([(DType.f32, (1, 2, 5, 5)), (DType.f32, (4, 2, 3, 3)), (DType.f32, (3,))],
     r"bias must have shape \[4\]"),
    ([(DType.f32, (1, 2, 5, 5)), (DType.f16, (4, 2, 3, 3))], "one dtype"),
    ([(DType.i32, (1, 2, 5, 5)), (DType.i32, (4, 2, 3, 3))], "dtype i32"),
])
def test_conv_operand_errors(types, match):
    with pytest.raises(ShapeError, match=match):
        build("conv", types)


def torch_pads(pads):
    """ONNX pads (all begins, then all ends) as F.pad's list (last axis first)."""
    nd = len(pads) // 2
    return [p for i in reversed(range(nd)) for p in (pads[i], pads[nd + i])]


CONV_CASES = [
    # x shape, w shape, bias, strides, pads, dilations, groups
    ((2, 4, 11), (6, 2, 3), True, (2,), (1, 2), (2,), 2),
    ((2, 3, 9, 8), (5, 3, 3, 3), True, (2, 1), (0, 1, 2, 1), (1, 2), 1),
    ((1, 4, 7, 7), (4, 1, 3, 3), False, (1, 1), (1, 1, 1, 1), (1, 1), 4),
    ((1, 2, 8, 8), (3, 2, 1, 1), False, (), (), (), 1),
    ((1, 2, 5, 6, 7), (4, 1, 2, 3, 2), True, (1, 2, 1), (1, 0, 1, 0, 1, 1), (2, 1, 1), 2),
]


@pytest.mark.parametrize("xs, ws, has_bias, strides, pads, dilations, groups", CONV_CASES)
def test_conv_matches_torch(xs, ws, has_bias, strides, pads, dilations, groups):
    x, w = randn(*xs), randn(*ws)
    bias = randn(ws[0]) if has_bias else None
    out = run("conv", x, w, *([bias] if has_bias else []), strides=strides, pads=pads,
              dilations=dilations, groups=groups)
    conv = getattr(F, f"conv{len(xs) - 2}d")
    expected = conv(F.pad(T(x), torch_pads(pads)) if pads else T(x), T(w),
                    T(bias) if has_bias else None, stride=strides or 1,
                    dilation=dilations or 1, groups=groups)
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5, atol=1e-5)


# -- packed_conv -------------------------------------------------------------------------


def test_packed_conv_types_and_errors():
    assert result_type("packed_conv", (1, 4, 9, 9), (2, 36, 16), (32,), kernel_shape=(3, 3),
                       strides=(2, 2)) == "f32[1,32,4,4]"
    with pytest.raises(ShapeError, match="do not hold 4 channels of 3x3 taps"):
        build("packed_conv", [(DType.f32, (1, 4, 9, 9)), (DType.f32, (2, 35, 16))],
              kernel_shape=(3, 3))
    with pytest.raises(ShapeError, match=r"bias must have shape \[32\]"):
        build("packed_conv", [(DType.f32, (1, 4, 9, 9)), (DType.f32, (2, 4, 16)),
                              (DType.f32, (16,))], kernel_shape=(1, 1))
    with pytest.raises(ShapeError, match="larger than the padded input"):
        build("packed_conv", [(DType.f32, (1, 4, 2, 2)), (DType.f32, (1, 36, 16))],
              kernel_shape=(3, 3))


@pytest.mark.parametrize("lanes", [16, 32])
def test_packed_conv_matches_torch(lanes):
    x, w, bias = randn(2, 3, 9, 8), randn(32, 3, 3, 2), randn(32)
    packed = pack_conv_weights(w, lanes)
    assert packed.shape == (32 // lanes, 18, lanes)
    np.testing.assert_array_equal(unpack_conv_weights(packed, (3, 2)), w)
    out = run("packed_conv", x, packed, bias, kernel_shape=(3, 2), strides=(2, 1),
              dilations=(1, 2))
    expected = F.conv2d(T(x), T(w), T(bias), stride=(2, 1), dilation=(1, 2))
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5, atol=1e-5)


# -- grouped_conv ------------------------------------------------------------------------


def test_grouped_conv_types_and_errors():
    assert result_type("grouped_conv", (6, 4, 9, 9), (3, 5, 4, 3, 3), (3, 5), strides=(2, 2),
                       pads=(1, 1, 1, 1)) == "f32[6,5,5,5]"
    with pytest.raises(ShapeError, match="is not images of 4 groups of 4 channels"):
        build("grouped_conv", [(DType.f32, (6, 4, 9, 9)), (DType.f32, (4, 5, 4, 3, 3))])
    with pytest.raises(ShapeError, match="is not images of 3 groups of 2 channels"):
        build("grouped_conv", [(DType.f32, (6, 4, 9, 9)), (DType.f32, (3, 5, 2, 3, 3))])
    with pytest.raises(ShapeError, match=r"bias must have shape \[3, 5\]"):
        build("grouped_conv", [(DType.f32, (6, 4, 9, 9)), (DType.f32, (3, 5, 4, 3, 3)),
                               (DType.f32, (15,))])
    with pytest.raises(ShapeError, match=r"w \[G, M/G, C/G, KH, KW\]"):
        build("grouped_conv", [(DType.f32, (6, 4, 9, 9)), (DType.f32, (15, 4, 3, 3))])


def test_grouped_conv_is_a_conv_of_groups():
    """Two images of three groups: image b by the filter of group b % 3, laid out as
    torch's grouped conv of [2, 3 * 4] channels."""
    x, w, bias = randn(6, 4, 9, 8), randn(3, 5, 4, 3, 2), randn(3, 5)
    out = run("grouped_conv", x, w, bias, strides=(2, 1), pads=(1, 0, 1, 1),
              dilations=(1, 2))
    expected = F.conv2d(F.pad(T(x).reshape(2, 12, 9, 8), (0, 1, 1, 1)), T(w).reshape(15, 4, 3, 2),
                        T(bias).reshape(15), stride=(2, 1), dilation=(1, 2), groups=3)
    np.testing.assert_allclose(out, expected.reshape(6, 5, *expected.shape[2:]).numpy(),
                               rtol=1e-5, atol=1e-5)


# -- packed_matmul -----------------------------------------------------------------------


def test_packed_matmul_types_and_errors():
    assert result_type("packed_matmul", (2, 3, 5), (3, 5, 16), n=40) == "f32[2,3,40]"
    with pytest.raises(ShapeError, match=r"do not hold a \[5, 60\] matrix"):
        build("packed_matmul", [(DType.f32, (3, 5)), (DType.f32, (3, 5, 16))], n=60)
    with pytest.raises(ShapeError, match=r"do not hold a \[5, 30\] matrix"):
        build("packed_matmul", [(DType.f32, (3, 5)), (DType.f32, (3, 5, 16))], n=30)
    with pytest.raises(ShapeError, match="do not hold a"):
        build("packed_matmul", [(DType.f32, (3, 4)), (DType.f32, (3, 5, 16))], n=40)
    with pytest.raises(ShapeError, match="rank >= 2"):
        build("packed_matmul", [(DType.f32, (5,)), (DType.f32, (3, 5, 16))], n=40)


@pytest.mark.parametrize("lanes", [16, 32])
def test_packed_matmul_matches_numpy(lanes):
    x, w = randn(2, 3, 7), randn(7, 50)
    packed = pack_matmul_weights(w, lanes)
    assert packed.shape == (-(-50 // lanes), 7, lanes)
    assert not packed[-1, :, 50 % lanes:].any()  # zero past N
    np.testing.assert_array_equal(unpack_matmul_weights(packed, 50), w)
    np.testing.assert_allclose(run("packed_matmul", x, packed, n=50), x @ w, rtol=1e-5,
                               atol=1e-5)


# -- winograd_input and winograd_output --------------------------------------------------


def test_winograd_transform_types_and_errors():
    assert result_type("winograd_input", (2, 3, 10, 8)) == "f32[16,3,24]"  # 4 x 3 tiles
    assert result_type("winograd_input", (2, 3, 10, 8), pitch=27) == "f32[16,3,27]"
    with pytest.raises(ShapeError, match="pitch 20 is less than its 24 tiles"):
        build("winograd_input", [(DType.f32, (2, 3, 10, 8))], pitch=20)
    with pytest.raises(ShapeError, match=r"2TH \+ 2, 2TW \+ 2\] \(at least 4\)"):
        build("winograd_input", [(DType.f32, (1, 3, 9, 8))])
    with pytest.raises(ShapeError, match="at least 4"):
        build("winograd_input", [(DType.f32, (3, 10, 8))])
    assert result_type("winograd_input", (2, 3, 10, 14), tile=4) == "f32[36,3,12]"  # 2 x 3
    with pytest.raises(ShapeError, match=r"4TH \+ 2, 4TW \+ 2\] \(at least 6\)"):
        build("winograd_input", [(DType.f32, (2, 3, 10, 8))], tile=4)
    with pytest.raises(ShapeError, match=r"Winograd tiles are \[2, 4\] outputs a side, got 3"):
        build("winograd_input", [(DType.f32, (2, 3, 11, 11))], tile=3)
    assert result_type("winograd_output", (36, 5, 12), size=[7, 6], batch=2, tile=4) \
        == "f32[2,5,7,6]"
    with pytest.raises(ShapeError, match=r"m \[36, M, 8 or more\] for 2 output"):
        build("winograd_output", [(DType.f32, (16, 5, 24))], size=[7, 6], batch=2, tile=4)
    assert result_type("winograd_output", (16, 5, 24), size=[7, 6], batch=2) \
        == "f32[2,5,7,6]"
    assert result_type("winograd_output", (16, 5, 27), size=[7, 6]) == "f32[1,5,7,6]"
    with pytest.raises(ShapeError, match=r"m \[16, M, 24 or more\] for 2 output"):
        build("winograd_output", [(DType.f32, (16, 5, 20))], size=[7, 6], batch=2)
    with pytest.raises(ShapeError, match="size must be"):
        build("winograd_output", [(DType.f32, (16, 5, 20))], size=[7], batch=1)


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("size", [(6, 8), (7, 5), (1, 1), (9, 14)])
def test_winograd_transforms_compute_a_3x3_conv(size, tile):
    """winograd_output(U @ winograd_input(x padded to whole tiles)) is the 3x3 conv of x
    with padding 1, sizes that are not whole tiles (a last tile partly outside the output)
    included."""
    x, w = randn(2, 4, *size), randn(5, 4, 3, 3)
    tiles = [-(-d // tile) for d in size]
    padded = np.pad(x, ((0, 0), (0, 0), *[(1, tile * t + 1 - d) for t, d in zip(tiles, size)]))
    count = 2 * tiles[0] * tiles[1]
    points_per_tile = (tile + 2) ** 2
    want = F.conv2d(T(x), T(w), padding=1).numpy()
    for pitch in (0, count + 3):  # columns past the tiles: zero in, unread out
        points = run("winograd_input", padded, pitch=pitch, tile=tile)
        assert points.shape == (points_per_tile, 4, pitch or count)
        assert not points[:, :, count:].any()
        y = run("winograd_output", winograd_weights(w, tile) @ points, size=list(size),
                batch=2, tile=tile)
        # F(4x4)'s points carry sums of up to 100 times an input (B^T's coefficients reach
        # 5): its f32 rounding is up to 2.2e-5 here, on outputs of magnitude 10.
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 if tile == 2 else 5e-5)


# -- conv_transpose --------------------------------------------------------------------


def test_conv_transpose_types():
    assert result_type("conv_transpose", (1, 4, 5, 5), (4, 3, 3, 3)) == "f32[1,3,7,7]"
    assert result_type("conv_transpose", (2, 4, 5, 6), (4, 2, 3, 2), (4,), strides=(2, 3),
                       pads=(1, 0, 1, 2), dilations=(1, 2), output_padding=(1, 1),
                       groups=2) == "f32[2,4,10,17]"
    assert result_type("conv_transpose", (1, 2, 7), (2, 5, 4), strides=(2,),
                       pads=(1, 1)) == "f32[1,5,14]"


@pytest.mark.parametrize("x, w, attrs, match", [
    ((1, 3, 5, 5), (4, 2, 3, 3), {}, "x has 3 channels"),
    ((1, 3, 5, 5), (3, 2, 3, 3), {"groups": 2}, "3 input channels do not split"),
    ((1, 2, 5, 5), (2, 2, 3, 3), {"strides": (2, 2), "output_padding": (2, 0)},
     "output_padding .* must be smaller"),
    ((1, 2, 5, 5), (2, 2, 3, 3), {"output_padding": (0,)}, "output_padding must have 2"),
    ((1, 2, 5, 5), (2, 2, 3, 3), {"pads": (1, 1, 1)}, "pads must have 4 entries"),
    ((1, 1, 1, 1), (1, 1, 1, 1), {"pads": (1, 0, 0, 0)}, "output size 0"),
])
def test_conv_transpose_errors(x, w, attrs, match):
    with pytest.raises(ShapeError, match=match):
        build("conv_transpose", [(DType.f32, x), (DType.f32, w)], **attrs)


CONV_TRANSPOSE_CASES = [
    # x shape, w shape, bias, strides, pads, dilations, groups, output_padding
    ((2, 4, 7), (4, 3, 3), True, (2,), (1, 1), (1,), 1, (1,)),
    ((1, 4, 6), (4, 2, 4), False, (3,), (0, 2), (2,), 2, (2,)),
    ((2, 4, 5, 6), (4, 2, 3, 2), True, (2, 3), (1, 0, 1, 2), (1, 2), 2, (1, 1)),
    ((1, 3, 4, 4), (3, 5, 3, 3), False, (), (), (), 1, ()),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), True, (2, 1, 2), (0, 1, 0, 1, 0, 1), (1, 1, 2), 1,
     (1, 0, 0)),
]


@pytest.mark.parametrize("xs, ws, has_bias, strides, pads, dilations, groups, extra",
                         CONV_TRANSPOSE_CASES)
def test_conv_transpose_matches_torch(xs, ws, has_bias, strides, pads, dilations, groups,
                                      extra):
    x, w = randn(*xs), randn(*ws)
    bias = randn(ws[1] * groups) if has_bias else None
    out = run("conv_transpose", x, w, *([bias] if has_bias else []), strides=strides,
              pads=pads, dilations=dilations, groups=groups, output_padding=extra)
    nd = len(xs) - 2
    conv = getattr(F, f"conv_transpose{nd}d")
    full = conv(T(x), T(w), T(bias) if has_bias else None, stride=strides or 1,
                output_padding=extra or 0, dilation=dilations or 1, groups=groups)
    # torch pads symmetrically; crop the full result for ONNX's begin/end pads.
    pads = pads or (0,) * 2 * nd
    crop = tuple(slice(pads[i], full.shape[2 + i] - pads[nd + i]) for i in range(nd))
    np.testing.assert_allclose(out, full[(..., *crop)].numpy(), rtol=1e-5, atol=1e-5)


# -- text form -------------------------------------------------------------------------


@pytest.mark.parametrize("opname, types, attrs", [
    ("matmul", [(DType.f16, (2, 3)), (DType.f16, (3,))], {}),
    ("conv", [(DType.f32, (1, 4, 9, 9)), (DType.f32, (6, 2, 3, 3)), (DType.f32, (6,))],
     {"strides": (2, 1), "pads": (1, 0, 2, 1), "dilations": (1, 2), "groups": 2}),
    ("conv_transpose", [(DType.f64, (1, 4, 5)), (DType.f64, (4, 1, 3))],
     {"strides": (2,), "pads": (1, 0), "dilations": (2,), "groups": 2,
      "output_padding": (1,)}),
])
def test_round_trip(opname, types, attrs):
    graph = build(opname, types, **attrs)
    text = print_graph(graph)
    parsed = parse_graph(text)
    assert print_graph(parsed) == text
    assert parsed.body.ops[-1].attrs == graph.body.ops[-1].attrs
