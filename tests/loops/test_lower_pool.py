"""Lowering of max_pool, avg_pool and resize to loops."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, DType
from ember.target import Target
from tests.loops.lowering_check import check_lowering

HOST = Target.host()

RNG = np.random.default_rng(7)


def data(shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def run(opname, x_shape, dtype=DType.f32, rtol=1e-6, atol=1e-6, **attrs):
    b = Builder("g")
    x = b.input("x", dtype, x_shape)
    b.output(getattr(b, opname)(x, **attrs))
    check_lowering(b.build(), [data(x_shape, dtype.np)], rtol=rtol, atol=atol)


POOL_CASES = [
    ((1, 2, 7), {"kernel": (3,)}),
    ((1, 1, 7), {"kernel": (3,), "strides": (2,), "pads": (1, 1)}),
    ((1, 1, 8), {"kernel": (3,), "strides": (2,), "pads": (2, 1), "ceil_mode": True}),
    ((2, 1, 5, 6), {"kernel": (2, 3), "strides": (2, 2), "pads": (1, 0, 0, 2)}),
    ((1, 2, 5, 5), {"kernel": (3, 2), "strides": (2, 3), "pads": (1, 1, 1, 0),
                    "ceil_mode": True}),
    ((1, 1, 3, 4, 4), {"kernel": (2, 2, 3), "strides": (2, 1, 2), "pads": (1, 0, 1, 0, 1, 1),
                       "ceil_mode": True}),
]


@pytest.mark.parametrize("x_shape, attrs", POOL_CASES)
def test_max_pool(x_shape, attrs) -> None:
    run("max_pool", x_shape, **attrs)


@pytest.mark.parametrize("x_shape, attrs", [
    ((1, 1, 9), {"kernel": (3,), "dilations": (2,), "pads": (2, 1), "ceil_mode": True,
                 "strides": (2,)}),
    ((1, 1, 6, 6), {"kernel": (2, 2), "dilations": (2, 3), "pads": (1, 1, 1, 1)}),
])
def test_max_pool_dilations(x_shape, attrs) -> None:
    run("max_pool", x_shape, **attrs)


@pytest.mark.parametrize("dtype", [DType.i8, DType.u8, DType.i32, DType.f16])
def test_max_pool_dtypes(dtype) -> None:
    # Padding never wins, even over the smallest value of the type.
    run("max_pool", (1, 2, 4, 5), dtype, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
        ceil_mode=True)


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("x_shape, attrs", POOL_CASES)
def test_avg_pool(x_shape, attrs, include) -> None:
    run("avg_pool", x_shape, count_include_pad=include, rtol=1e-5, atol=1e-6, **attrs)


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16, DType.f64])
def test_avg_pool_dtypes(dtype) -> None:
    tol = {DType.f16: 2e-3, DType.bf16: 1e-2, DType.f64: 1e-12}[dtype]
    run("avg_pool", (1, 2, 5, 4), dtype, kernel=(2, 3), strides=(2, 1), pads=(1, 1, 1, 1),
        ceil_mode=True, count_include_pad=True, rtol=tol, atol=tol)


COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                    "align_corners", "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@pytest.mark.parametrize("coord", COORDINATE_MODES)
@pytest.mark.parametrize("nearest", NEAREST_MODES)
def test_resize_nearest(coord, nearest) -> None:
    run("resize", (1, 2, 3, 4), sizes=(1, 2, 7, 3), mode="nearest",
        coordinate_transformation_mode=coord, nearest_mode=nearest)


@pytest.mark.parametrize("coord", COORDINATE_MODES)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_interpolating(coord, mode) -> None:
    run("resize", (1, 1, 4, 3), sizes=(1, 1, 6, 2), mode=mode,
        coordinate_transformation_mode=coord, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_scales_and_exclude_outside(mode) -> None:
    # Scales that are not sizes / input (2.6 * 3 -> 7), a single output, and exclude_outside.
    for coord in ("half_pixel", "half_pixel_symmetric", "asymmetric", "pytorch_half_pixel"):
        run("resize", (1, 3, 3, 4), sizes=(1, 3, 7, 1), scales=(1.0, 1.0, 2.6, 0.3),
            mode=mode, coordinate_transformation_mode=coord, exclude_outside=True,
            cubic_coeff_a=-0.5, rtol=1e-5, atol=1e-5)


def test_resize_every_axis_and_halves() -> None:
    run("resize", (2, 3, 2), sizes=(3, 2, 4), mode="linear", rtol=1e-5, atol=1e-5)
    run("resize", (1, 1, 3, 3), DType.f16, sizes=(1, 1, 5, 4), mode="cubic",
        rtol=1e-2, atol=1e-2)
    run("resize", (1, 1, 3, 3), DType.bf16, sizes=(1, 1, 2, 5), mode="linear",
        coordinate_transformation_mode="align_corners", rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("x_shape, attrs", [
    ((1, 64, 24, 40), {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ((2, 3, 17, 35), {"kernel": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}),
    ((1, 2, 11, 21), {"kernel": (2, 3), "strides": (3, 2), "pads": (0, 1, 1, 2),
                      "ceil_mode": True}),
    ((1, 2, 12, 19), {"kernel": (3, 2), "dilations": (2, 2), "pads": (2, 1, 1, 0)}),
])
def test_vector_max_pools_match_the_interpreter(x_shape, attrs) -> None:
    """The vectorized 2-D f32 max pool (groups of rows, strided loads, padding and
    ceil_mode overhangs as selects): compiled, it gives the interpreter's values, NaN and
    -inf included."""
    x = data(x_shape)
    x.flat[::97] = np.nan
    x.flat[5::89] = -np.inf
    got, want = vector_pool("max_pool", x, attrs)
    np.testing.assert_array_equal(got, want)


def vector_pool(op: str, x: np.ndarray, attrs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(compiled, interpreted) results of a 2-D f32 pool, checked to be scheduled as vectors
    (its plain nest found by the pool step)."""
    import ember
    from ember.loops.ir import For
    from ember.loops.lower import lower_graph
    from ember.loops.schedule import default_kernel_schedule, schedule_kernel
    from ember.loops.simplify import simplify_kernel

    b = Builder("g")
    b.output(getattr(b, op)(b.input("x", DType.f32, x.shape), **attrs))
    graph = b.build()
    (kernel,) = lower_graph(graph, target=HOST).kernels
    steps = default_kernel_schedule(simplify_kernel(kernel), HOST).steps
    assert steps[0].name == "pool", steps
    scheduled = schedule_kernel(kernel, HOST)
    assert any(s.kind == "vectorized" for s in scheduled.walk() if isinstance(s, For))
    got = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))(x)[0]
    return got, ember.interpret(graph, [x])[0]


@pytest.mark.parametrize("x_shape, attrs", [
    ((1, 64, 24, 40), {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ((2, 3, 17, 35), {"kernel": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1),
                      "count_include_pad": True}),
    ((1, 2, 11, 21), {"kernel": (2, 3), "strides": (3, 2), "pads": (0, 1, 1, 2),
                      "ceil_mode": True}),
    ((1, 2, 11, 21), {"kernel": (2, 3), "strides": (3, 2), "pads": (0, 1, 1, 2),
                      "ceil_mode": True, "count_include_pad": True}),
    ((1, 5, 7, 7), {"kernel": (7, 7)}),  # a global average
])
def test_vector_avg_pools_match_the_interpreter(x_shape, attrs) -> None:
    """The vectorized 2-D f32 average pool: padding adds nothing, and each lane divides by
    its own window's count (count_include_pad, ceil_mode overhangs)."""
    got, want = vector_pool("avg_pool", data(x_shape), attrs)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


PLAIN_POOL = """kernel @k(%x0: f32[1,2,9,10], %b: f32[5], %y0: f32[1,2,5,5]) {
  local %t0: f32[]
  for %i0 = 0 to 1 {
    for %i1 = 0 to 2 {
      for %i2 = 0 to 5 {
        for %i3 = 0 to 5 {
          %t0[] = -inf:f32
          for %i4 = 0 to 3 {
            for %i5 = 0 to 3 {
              if GUARD {
                %t0[] = max(%t0[], VALUE)
              }
            }
          }
          %y0[%i0, %i1, %i2, %i3] = %t0[]
        }
      }
    }
  }
}
"""
GUARD = ("and(and(ge(sub(add(mul(%i2, 2), %i4), 1), 0), lt(sub(add(mul(%i2, 2), %i4), 1), 9)),"
         " ge(sub(add(mul(%i3, 2), %i5), 1), 0))")
VALUE = "%x0[%i0, %i1, sub(add(mul(%i2, 2), %i4), 1), sub(add(mul(%i3, 2), %i5), 1)]"


@pytest.mark.parametrize("guard, value, found", [
    (GUARD, VALUE, True),
    # the geometry read from the taps: stride 2, pad 1 (the window check, as the lowering
    # writes it, must be the nest's whole `if`)
    (GUARD.replace(", 9)", ", 8)"), VALUE, False),
    # the output column read elsewhere than at the window: lanes past OW would read %b
    # out of bounds, so the pool step does not take it
    (GUARD, f"add({VALUE}, %b[%i3])", False),
    # two reads of x at different windows
    (GUARD, f"add({VALUE}, {VALUE.replace('mul(%i3, 2)', 'mul(%i3, 3)')})", False),
])
def test_the_pool_step_takes_only_plain_window_nests(guard, value, found) -> None:
    from ember.loops.schedules import pool
    from ember.loops.text import parse_kernel

    kernel = parse_kernel(PLAIN_POOL.replace("GUARD", guard).replace("VALUE", value))
    nests = pool.nests(kernel)
    assert bool(nests) == found
    if found:
        (loop, nest), = nests
        assert loop == "i0" and nest.strides == (2, 2) and nest.pads_begin == (1, 1)
        assert nest.in_sizes == (9, 10) and nest.combine == "max"


def test_a_nest_of_stores_is_no_window_nest() -> None:
    """Four loops around three stores (no reduction loop: a resize's shape) are not taken,
    and do not trip the matcher."""
    from ember.loops.schedules.window_nest import window_nests
    from ember.loops.text import parse_kernel

    kernel = parse_kernel("""kernel @k(%x0: f32[1,1,2,2], %y0: f32[1,1,2,2]) {
  local %t0: f32[]
  for %i0 = 0 to 1 {
    for %i1 = 0 to 1 {
      for %i2 = 0 to 2 {
        for %i3 = 0 to 2 {
          %t0[] = 0.0:f32
          %t0[] = add(%t0[], %x0[%i0, %i1, %i2, %i3])
          %y0[%i0, %i1, %i2, %i3] = %t0[]
        }
      }
    }
  }
}
""")
    assert window_nests(kernel, 2) == [] and window_nests(kernel, 3) == []


def test_the_pool_step_refuses_other_loops_and_empty_vectors() -> None:
    from ember.errors import ScheduleError
    from ember.loops.schedules import pool
    from ember.loops.text import parse_kernel

    kernel = parse_kernel(PLAIN_POOL.replace("GUARD", GUARD).replace("VALUE", VALUE))
    with pytest.raises(ScheduleError, match=r"%i1 is not the outermost loop of a plain 2-D"):
        pool.pool(kernel, "i1", 16, 8)
    with pytest.raises(ScheduleError, match=r"pool %i0: lanes must be positive"):
        pool.pool(kernel, "i0", 0, 8)
    scheduled = pool.pool(kernel, "i0", 8, 1)  # 5 columns: one vector of 5, one row
    assert [b.shape for b in scheduled.locals] == [(1, 5)]


@pytest.mark.parametrize("kind", ["max_pool", "avg_pool"])
@pytest.mark.parametrize("size, kernel, stride, pad", [
    (1, 2, 2, 0), (2, 3, 2, 0), (2, 7, 3, 2), (1, 4, 3, 1), (3, 5, 3, 0)])
def test_ceil_mode_windows_longer_than_the_input(kind, size, kernel, stride, pad) -> None:
    """With ceil_mode a window may hang over the end, even one longer than the padded input,
    as long as it starts in it (PyTorch's and ONNX's rule: a 2-wide window at stride 2 over
    one element gives one output); compiled and interpreted, against PyTorch."""
    import torch

    import ember

    x = data((1, 3, size, size + 1))
    attrs = {"kernel": (kernel, kernel), "strides": (stride, stride),
             "pads": (pad,) * 4, "ceil_mode": True}
    if kind == "avg_pool":
        attrs["count_include_pad"] = True
        want = torch.nn.functional.avg_pool2d(torch.from_numpy(x), kernel, stride, pad,
                                              ceil_mode=True, count_include_pad=True)
    else:
        want = torch.nn.functional.max_pool2d(torch.from_numpy(x), kernel, stride, pad,
                                              ceil_mode=True)
    b = Builder("g")
    b.output(getattr(b, kind)(b.input("x", DType.f32, x.shape), **attrs))
    graph = b.build()
    for executor in ("cpu", "interp"):
        (got,) = ember.compile(graph, config=ember.Config(executor=executor,
                                                          disk_cache=False))(x)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)
    check_lowering(graph, [x])


def test_a_window_no_output_can_start_in_is_refused() -> None:
    from ember.errors import ShapeError

    b = Builder("g")
    with pytest.raises(ShapeError, match="window extent 7 is larger than the padded input 4"):
        b.avg_pool(b.input("x", DType.f32, (1, 1, 4, 4)), kernel=(7, 7), strides=(2, 2),
                   ceil_mode=False)
