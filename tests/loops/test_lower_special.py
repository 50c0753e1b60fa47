"""Lowering of the special functions (lgamma, digamma, polygamma, zeta, erfc, erfcx, erfinv,
ndtri, orthogonal_polynomial) to loops, through the loop interpreter, at their special values:
poles, negative non-integers, signed zeros, infinities, NaN, large arguments, domain edges."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, DType
from ember.graph.ops import all_opdefs
from ember.graph.ops.special import POLYNOMIALS
from ember.loops.ir import Store, Unary, walk_expr
from ember.loops.lower import find_lowering, lower_graph
from ember.loops.text import parse_kernel, print_program
from ember.loops.verify import verify_kernel
from ember.target import Target
from tests.loops.lowering_check import check_lowering

HOST = Target.host()

INF, NAN = np.inf, np.nan
# The loop interpreter runs the lowering on the reference's own primitives (NumPy, math),
# in the same order: bit for bit, but where it calls NumPy's exp or power for the
# reference's math.exp or math.pow (an ulp). One ulp of each type, relative.
TOLERANCE = {DType.f32: dict(rtol=1.2e-7, atol=0), DType.f64: dict(rtol=2.3e-16, atol=0),
             DType.f16: dict(rtol=1e-3, atol=0), DType.bf16: dict(rtol=8e-3, atol=0)}

WIDE = [-INF, -1e10, -30.5, -3.0, -2.5, -1.0, -0.7, -1e-8, -0.0, 0.0, 1e-30, 1e-8, 0.3, 1.0,
        1.4616321, 2.0, 2.5, 9.0, 9.999, 10.0, 10.5, 30.0, 171.5, 1e6, 1e20, INF, NAN]
UNIT = [-INF, -1.5, -1.0, -0.9999999, -0.99, -0.5, -0.3, -0.0, 0.0, 1e-20, 0.2, 0.5, 0.51,
        0.97, 0.999999, 1.0, 1.0000001, 7.0, INF, NAN]
PROBABILITY = [-0.1, 0.0, 1e-300, 1e-30, 1e-9, 1e-8, 2e-8, 1e-5, 0.02, 0.2, 0.5, 0.5000001,
               0.7, 0.97, 0.999999, 1.0, 1.1, INF, NAN]
ERFCX = [-INF, -27.0, -26.6, -5.0, -0.5, -0.0, 0.0, 0.5, 3.0, 25.99, 26.0, 30.0, 1e5, 1e30,
         INF, NAN]

UNARY = {
    # name, attrs: inputs
    ("lgamma", ()): WIDE,
    ("erfc", ()): WIDE,
    ("digamma", ()): WIDE,
    ("polygamma", (("n", 0),)): WIDE,
    ("polygamma", (("n", 1),)): WIDE,
    ("polygamma", (("n", 2),)): [v for v in WIDE if v != -INF],  # the reference fails there
    ("polygamma", (("n", 5),)): [-2.5, -0.7, 0.3, 1.0, 2.5, 10.0, 1e6, INF, NAN],
    ("erfcx", ()): ERFCX,
    ("erfinv", ()): UNIT,
    ("ndtri", ()): PROBABILITY,
}


def unary_graph(name: str, dtype: DType, size: int, **attrs):
    b = Builder("g")
    b.output(getattr(b, name)(b.input("x", dtype, (size,)), **attrs))
    return b.build()


def binary_graph(name: str, dtype: DType, shapes, **attrs):
    b = Builder("g")
    x, y = (b.input(n, dtype, s) for n, s in zip("xy", shapes))
    b.output(getattr(b, name)(x, y, **attrs))
    return b.build()


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
@pytest.mark.parametrize("name,attrs", list(UNARY), ids=[f"{n}{dict(a).get('n', '')}"
                                                          for n, a in UNARY])
def test_unary_special_values(name, attrs, dtype) -> None:
    x = np.array(UNARY[name, attrs], dtype.np)
    check_lowering(unary_graph(name, dtype, len(x), **dict(attrs)), [x], **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
@pytest.mark.parametrize("name,attrs", [("lgamma", {}), ("digamma", {}), ("polygamma", {"n": 3}),
                                        ("erfinv", {}), ("ndtri", {})])
def test_half_precision_computes_in_f32(name, attrs, dtype) -> None:
    values = {"erfinv": UNIT, "ndtri": PROBABILITY}.get(name, [-2.5, -0.5, 0.25, 1.0, 3.5, 40.0])
    x = np.array(values, np.float32).astype(dtype.np)
    check_lowering(unary_graph(name, dtype, len(x), **attrs), [x], **TOLERANCE[dtype])


def test_zeta_special_values_and_broadcasting() -> None:
    # x == 1, x < 1, NaNs, q at poles (0, negative integers), negative non-integer q with an
    # integer x (a long direct sum) or not (NaN), q = inf, tiny and huge q. (The reference
    # fails on q = -inf: test_special_codegen checks it.)
    x = [1.0, 0.5, NAN, 2.0, 2.0, 3.0, 2.0, 2.5, 4.0, 2.0, 1.5, 2.0, 2.0, 12.0, 1.0001, INF]
    q = [1.0, 1.0, 1.0, NAN, 0.0, -2.0, -1e300, -2.5, -20.5, INF, 1e-3, 1e5, 1.0, 0.5, 2.0, 2.0]
    check_lowering(binary_graph("zeta", DType.f64, [(16,), (16,)]),
                   [np.array(x), np.array(q)], **TOLERANCE[DType.f64])
    xs = np.array([[1.5], [2.0], [7.0]], np.float32)
    qs = np.array([0.25, 1.0, 3.5, 9.5], np.float32)
    check_lowering(binary_graph("zeta", DType.f32, [(3, 1), (4,)]), [xs, qs],
                   **TOLERANCE[DType.f32])


# x: the edges +-1, zero of both signs, inside, outside, NaN; n: negative, 0, 1, fractional
# (truncated), NaN and infinite (value 0), large enough for Chebyshev's trigonometric form,
# past the Hermite limit (f32: 128).
POLY_X = [-1.0, 1.0, -0.0, 0.0, 0.3, -0.55, 0.999, 1.7, -2.5, NAN, 0.8, -0.2, 0.5, 0.9, 0.1,
          -1.0, 0.3, 0.62, -0.4, -0.73]
POLY_N = [5.0, 4.0, 3.0, 2.0, -1.0, 0.0, 1.0, 6.9, 9.0, 2.0, NAN, INF, 30.0, 200.0, -0.5, 7.0,
          7.0, 8.0, 9.0, 6.0]


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
@pytest.mark.parametrize("kind", POLYNOMIALS)
def test_orthogonal_polynomials(kind, dtype) -> None:
    x, n = np.array(POLY_X, dtype.np), np.array(POLY_N, dtype.np)
    if kind.startswith("shifted_"):
        x = (x + 1) / 2  # the same edge cases, on [0, 1]
    check_lowering(binary_graph("orthogonal_polynomial", dtype, [x.shape, n.shape], kind=kind),
                   [x, n], **TOLERANCE[dtype])


def test_every_special_op_lowers() -> None:
    names = [d.name for d in all_opdefs() if d.family == "special"]
    assert len(names) >= 9 and [n for n in names if find_lowering(n) is None] == []


def test_a_special_kernel_prints_parses_and_verifies() -> None:
    program = lower_graph(binary_graph("orthogonal_polynomial", DType.f32, [(4,), (4,)],
                                       kind="legendre_p"), target=HOST)
    assert "for %k" in print_program(program)  # the recurrence, with its computed trip count
    lgamma = lower_graph(unary_graph("lgamma", DType.f16, 3), target=HOST).kernels[0]
    assert any(isinstance(e, Unary) and e.op == "lgamma" for e in _exprs(lgamma))
    text = ("kernel @k(%x: f32[2], %y: f32[2]) {\n"
            "  for %i = 0 to 2 { %y[%i] = add(lgamma(%x[%i]), erfc(%x[%i])) }\n}")
    verify_kernel(parse_kernel(text))


def _exprs(kernel):
    for s in kernel.walk():
        if isinstance(s, Store):
            yield from walk_expr(s.value)
