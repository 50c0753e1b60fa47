"""max_pool, avg_pool and resize: type inference, errors, and semantics against PyTorch
(and, for the Resize modes PyTorch lacks, the expected outputs of ONNX's backend tests)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import BadAttributeError, Builder, DType, ShapeError, interpret, parse_graph, print_graph
from ember.dtypes import from_numpy

RNG = np.random.default_rng(0)


def build(opname, types, **attrs):
    """A graph of one op whose operands are inputs of `types`, (dtype, shape) pairs."""
    b = Builder(opname)
    args = [b.input(f"x{i}", dtype, shape) for i, (dtype, shape) in enumerate(types)]
    b.output(getattr(b, opname)(*args, **attrs))
    return b.build()


def result_type(opname, shape, dtype=DType.f32, **attrs):
    return str(build(opname, [(dtype, shape)], **attrs).outputs[0].type)


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


def close(actual, expected):
    np.testing.assert_allclose(actual, np.asarray(expected), rtol=1e-5, atol=1e-5)


# -- max_pool / avg_pool -----------------------------------------------------------------


def test_pool_types():
    assert result_type("max_pool", (2, 3, 9, 9), kernel=(3, 3)) == "f32[2,3,7,7]"
    assert result_type("max_pool", (1, 2, 10), kernel=(3,), strides=(2,), pads=(1, 0),
                       dilations=(2,), dtype=DType.i32) == "i32[1,2,4]"
    # ceil_mode: 4 windows would fit, but the last would start in the right padding.
    assert result_type("max_pool", (1, 1, 5), kernel=(2,), strides=(2,), pads=(1, 1),
                       ceil_mode=True) == "f32[1,1,3]"
    assert result_type("avg_pool", (1, 1, 6, 7, 8), kernel=(2, 3, 2), strides=(2, 2, 3),
                       ceil_mode=True) == "f32[1,1,3,3,3]"
    assert result_type("avg_pool", (1, 4, 7, 7), kernel=(7, 7), dtype=DType.f16) == "f16[1,4,1,1]"


@pytest.mark.parametrize("opname, shape, attrs, match", [
    ("max_pool", (1, 1, 4, 4), {"kernel": (2,)}, "kernel must have 2 entries"),
    ("max_pool", (1, 1, 4, 4), {"kernel": ()}, "kernel must not be empty"),
    ("max_pool", (1, 1, 4, 4), {"kernel": (2, 0)}, "kernel must be >= 1"),
    ("max_pool", (1, 1, 4, 4), {"kernel": (2, 2), "pads": (1, 1)}, "pads must have 4"),
    ("max_pool", (1, 1, 4, 4), {"kernel": (5, 2)}, "larger than the padded input 4"),
    ("max_pool", (1, 1, 4, 4), {"kernel": (2, 2), "dilations": (4, 1)}, "extent 5"),
    ("max_pool", (4, 4), {"kernel": (2,)}, "at least one spatial axis"),
    ("avg_pool", (1, 1, 4, 4), {"kernel": (2, 2), "strides": (1, 0)}, "strides must be >= 1"),
    ("avg_pool", (1, 1, 4, 4), {"kernel": (2, 2), "pads": (0, 0, 0, -1)}, "pads must be >= 0"),
    ("avg_pool", (1, 1, 2, 2), {"kernel": (3, 3), "pads": (0, 0, 0, 1)},
     "larger than the padded input 2 on spatial axis 0"),
])
def test_pool_errors(opname, shape, attrs, match):
    with pytest.raises(ShapeError, match=match):
        build(opname, [(DType.f32, shape)], **attrs)


def test_pool_dtype_errors():
    with pytest.raises(ShapeError, match="dtype bool"):
        build("max_pool", [(DType.bool, (1, 1, 4))], kernel=(2,))
    with pytest.raises(ShapeError, match="dtype i32"):
        build("avg_pool", [(DType.i32, (1, 1, 4))], kernel=(2,))


POOL_CASES = [
    # x shape, kernel, strides, pad per axis (symmetric, as torch takes), dilation, ceil_mode
    ((2, 3, 11), (3,), (2,), (1,), (1,), False),
    ((2, 3, 11), (3,), (2,), (1,), (2,), True),
    ((1, 2, 9, 10), (3, 2), (2, 2), (1, 1), (1, 1), True),
    ((1, 2, 5, 5), (2, 2), (2, 2), (1, 1), (1, 1), True),  # last window dropped
    ((1, 2, 8, 7), (2, 3), (), (0, 1), (2, 1), False),
    ((1, 2, 5, 6, 7), (2, 3, 2), (2, 2, 3), (1, 1, 0), (1, 1, 1), True),
]


def onnx_pads(pad):
    return (*pad, *pad)


@pytest.mark.parametrize("shape, kernel, strides, pad, dilation, ceil_mode", POOL_CASES)
def test_max_pool_matches_torch(shape, kernel, strides, pad, dilation, ceil_mode):
    x = randn(*shape)
    out = run("max_pool", x, kernel=kernel, strides=strides, pads=onnx_pads(pad),
              dilations=dilation, ceil_mode=ceil_mode)
    pool = getattr(F, f"max_pool{len(kernel)}d")
    close(out, pool(T(x), kernel, strides or 1, pad, dilation, ceil_mode).numpy())


def test_max_pool_integers_ignore_padding():
    x = RNG.integers(-1000, -1, (1, 2, 7, 6)).astype(np.int32)  # all below the pad value 0
    out = run("max_pool", x, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=True)
    expected = F.max_pool2d(T(x).double(), 3, 2, 1, ceil_mode=True).numpy()
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, expected.astype(np.int32))


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("shape, kernel, strides, pad, dilation, ceil_mode",
                         [c for c in POOL_CASES if c[4] == (1,) * len(c[1])])
def test_avg_pool_matches_torch(shape, kernel, strides, pad, dilation, ceil_mode,
                                count_include_pad):
    x = randn(*shape)
    out = run("avg_pool", x, kernel=kernel, strides=strides, pads=onnx_pads(pad),
              ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    pool = getattr(F, f"avg_pool{len(kernel)}d")
    close(out, pool(T(x), kernel, strides or 1, pad, ceil_mode,
                    count_include_pad).numpy())


def test_avg_pool_asymmetric_pads():
    x = np.arange(1, 6, dtype=np.float32).reshape(1, 1, 5)
    # The windows are [pad, 1, 2], [2, 3, 4] and [4, 5, pad].
    out = run("avg_pool", x, kernel=(3,), strides=(2,), pads=(1, 1))
    close(out, [[[1.5, 3, 4.5]]])
    out = run("avg_pool", x, kernel=(3,), strides=(2,), pads=(1, 1), count_include_pad=True)
    close(out, [[[1, 3, 3]]])
    # ceil_mode: the last window [5, pad(end), overhang] divides by 2 with the pad counted.
    out = run("avg_pool", x, kernel=(3,), strides=(2,), pads=(0, 1), ceil_mode=True,
              count_include_pad=True)
    close(out, [[[2, 4, 2.5]]])


# -- resize ----------------------------------------------------------------------------


def test_resize_types():
    assert result_type("resize", (1, 3, 4, 4), sizes=(1, 3, 8, 6)) == "f32[1,3,8,6]"
    assert result_type("resize", (2, 5), sizes=(4, 5), mode="linear", scales=(2.0, 1.0),
                       dtype=DType.bf16) == "bf16[4,5]"


@pytest.mark.parametrize("shape, attrs, match", [
    ((1, 3, 4, 4), {"sizes": (1, 3, 8)}, "sizes must have 4 entries"),
    ((1, 3, 4, 4), {"sizes": (1, 3, 0, 4)}, "sizes must be >= 1"),
    ((1, 3, 4, 4), {"sizes": (1, 3, 8, 8), "scales": (2.0, 2.0)}, "scales must have 4"),
    ((1, 3, 4, 4), {"sizes": (1, 3, 8, 8), "scales": (1.0, 1.0, 0.0, 2.0)},
     "scales must be > 0"),
])
def test_resize_errors(shape, attrs, match):
    with pytest.raises(ShapeError, match=match):
        build("resize", [(DType.f32, shape)], **attrs)


def test_resize_dtype_and_mode_errors():
    with pytest.raises(ShapeError, match="dtype i32"):
        build("resize", [(DType.i32, (1, 4))], sizes=(1, 8))
    with pytest.raises(BadAttributeError, match="mode"):
        build("resize", [(DType.f32, (1, 4))], sizes=(1, 8), mode="area")


TORCH_LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


RESIZE_SHAPES = [((2, 3, 7), (12,)), ((1, 2, 5, 6), (11, 4)), ((1, 2, 9, 4), (3, 9)),
                 ((1, 1, 3, 4, 5), (6, 2, 7))]
RESIZE_MODES = ["nearest", "linear", "linear_align", "cubic", "cubic_align"]


@pytest.mark.parametrize("shape, size, mode", [
    (shape, size, mode) for shape, size in RESIZE_SHAPES for mode in RESIZE_MODES
    if len(size) == 2 or not mode.startswith("cubic")  # torch has bicubic only
])
def test_resize_matches_torch(shape, size, mode):
    nd = len(size)
    x = randn(*shape)
    if mode == "nearest":  # torch's nearest is asymmetric + floor
        attrs = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        expected = F.interpolate(T(x), size=size, mode="nearest")
    else:
        align = mode.endswith("_align")
        base = mode.removesuffix("_align")
        torch_mode = TORCH_LINEAR[nd] if base == "linear" else "bicubic"
        expected = F.interpolate(T(x), size=size, mode=torch_mode, align_corners=align)
        attrs = {"mode": base,
                 "coordinate_transformation_mode": "align_corners" if align else "half_pixel"}
    close(run("resize", x, sizes=(*shape[:2], *size), **attrs), expected.numpy())
    if mode == "linear":  # pytorch_half_pixel differs from half_pixel only for size 1
        close(run("resize", x, sizes=(*shape[:2], *size), mode="linear",
                  coordinate_transformation_mode="pytorch_half_pixel"), expected.numpy())


@pytest.mark.parametrize("mode, torch_mode, attrs", [
    ("nearest", "nearest", {"coordinate_transformation_mode": "asymmetric",
                            "nearest_mode": "floor"}),
    ("linear", "bilinear", {"coordinate_transformation_mode": "half_pixel"}),
    ("cubic", "bicubic", {"coordinate_transformation_mode": "half_pixel"}),
])
def test_resize_explicit_scales_match_torch(mode, torch_mode, attrs):
    # With scale_factor (and no recompute) torch maps coordinates by 1/scale, not in/out.
    x = randn(1, 2, 5, 7)
    kwargs = {} if mode == "nearest" else {"align_corners": False}
    expected = F.interpolate(T(x), scale_factor=(1.7, 0.6), mode=torch_mode, **kwargs)
    out = run("resize", x, sizes=(1, 2, 8, 4), scales=(1.0, 1.0, 1.7, 0.6), mode=mode,
              **attrs)
    close(out, expected.numpy())


D44 = np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
F32 = [float(np.float32(v)) for v in (0.6, 0.8, 2.3, 2.94)]  # ONNX scales are float32

# From ONNX's backend tests (onnx/backend/test/case/node/resize.py).
ONNX_CASES = [
    (D44, {"sizes": (1, 1, 3, 3), "scales": (1, 1, F32[1], F32[1]), "mode": "cubic",
           "cubic_coeff_a": -0.5, "exclude_outside": True},
     [[1.36812675, 2.6695014, 4.0133367], [6.57362535, 7.875, 9.2188353],
      [11.94896657, 13.25034122, 14.59417652]]),
    (D44[:, :, :1], {"sizes": (1, 1, 1, 2), "scales": (1, 1, 1, F32[0]), "mode": "linear",
                     "coordinate_transformation_mode": "half_pixel_symmetric"},
     [[1.6666667, 3.3333333]]),
    (np.array([[[[1, 2], [3, 4]]]]),
     {"sizes": (1, 1, 4, 5), "scales": (1, 1, F32[2], F32[3]), "mode": "linear",
      "coordinate_transformation_mode": "half_pixel_symmetric"},
     [[1, 1.15986395, 1.5, 1.84013605, 2], [1.56521738, 1.72508133, 2.06521738, 2.40535343,
                                            2.56521738],
      [2.43478262, 2.59464657, 2.93478262, 3.27491867, 3.43478262],
      [3, 3.15986395, 3.5, 3.84013605, 4]]),
    (D44[:, :, :2], {"sizes": (1, 1, 1, 2), "scales": (1, 1, F32[0], F32[0]),
                     "mode": "linear"}, [[2.6666665, 4.3333331]]),
    (D44, {"sizes": (1, 1, 3, 1), "mode": "linear",
           "coordinate_transformation_mode": "pytorch_half_pixel"}, [[1.6666666], [7],
                                                                    [12.333333]]),
    (D44, {"sizes": (1, 1, 8, 8), "coordinate_transformation_mode": "asymmetric",
           "nearest_mode": "round_prefer_ceil"},
     np.repeat([[1, 2, 2, 3, 3, 4, 4, 4]], 8, 0) + 4 * np.array([0, 1, 1, 2, 2, 3, 3, 3])[:, None]),
    (D44, {"sizes": (1, 1, 8, 8), "coordinate_transformation_mode": "align_corners",
           "nearest_mode": "floor"},
     np.repeat([[1, 1, 1, 2, 2, 3, 3, 4]], 8, 0) + 4 * np.array([0, 0, 0, 1, 1, 2, 2, 3])[:, None]),
    (D44[:, :, :1], {"sizes": (1, 1, 1, 8), "mode": "cubic",
                     "coordinate_transformation_mode": "asymmetric"},
     [[1, 1.40625, 2, 2.5, 3, 3.59375, 4, 4.09375]]),
]


@pytest.mark.parametrize("x, attrs, expected", ONNX_CASES)
def test_resize_matches_onnx(x, attrs, expected):
    x = np.ascontiguousarray(x, dtype=np.float32)
    close(run("resize", x, **attrs)[0, 0], expected)


def test_resize_f16_and_unchanged_axes():
    x = randn(2, 3, 4, dtype=np.float16)
    out = run("resize", x, sizes=(2, 3, 8), mode="linear")
    assert out.dtype == np.float16
    expected = F.interpolate(T(x).float(), size=8, mode="linear").half().numpy()
    np.testing.assert_allclose(out.astype(np.float32), expected.astype(np.float32),
                               rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(run("resize", x, sizes=(2, 3, 4), mode="cubic"), x)


# -- text form -------------------------------------------------------------------------


@pytest.mark.parametrize("opname, dtype, shape, attrs", [
    ("max_pool", DType.i8, (1, 2, 9, 9), {"kernel": (3, 2), "strides": (2, 1),
                                          "pads": (1, 0, 1, 1), "dilations": (1, 2),
                                          "ceil_mode": True}),
    ("avg_pool", DType.f32, (1, 2, 9), {"kernel": (3,), "strides": (2,), "pads": (1, 1),
                                        "ceil_mode": True, "count_include_pad": True}),
    ("resize", DType.f32, (1, 2, 4, 4), {"sizes": (1, 2, 9, 3), "scales": (1, 1, 2.3, 0.75),
                                         "mode": "cubic", "cubic_coeff_a": -0.5,
                                         "exclude_outside": True, "nearest_mode": "ceil",
                                         "coordinate_transformation_mode": "asymmetric"}),
])
def test_round_trip(opname, dtype, shape, attrs):
    graph = build(opname, [(dtype, shape)], **attrs)
    text = print_graph(graph)
    parsed = parse_graph(text)
    assert print_graph(parsed) == text
    assert parsed.body.ops[-1].attrs == graph.body.ops[-1].attrs
