"""The special functions compiled for the host (`executor="cpu"`) against the reference
interpreter, within measured bounds in ulps of max(|y|, 1) (relative error, or absolute
near the zeros of a function), with NaN and infinities where the reference has them.

Where the lowering and the reference compute with the same primitives (f64 arithmetic and
the C library, as lgamma's f32 path, erfc, erfcx, erfinv, ndtri, zeta, polygamma n >= 2,
Hermite, Laguerre, Legendre) they agree to the bit; elsewhere the reference's NumPy
log/sin/arccos differ from the C library's by an ulp or so, which the algorithm carries
(digamma near its zero) or amplifies (Chebyshev's cos(n acos x): about n**2 ulps).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember import Builder, Config, DType, interpret
from ember.graph.ops.special import POLYNOMIALS

INF, NAN = np.inf, np.nan
RNG = np.random.default_rng(17)
N = 400


def run_both(graph, inputs):
    """(compiled outputs, reference outputs)."""
    compiled = ember.compile(graph, config=Config(executor="cpu")).run(*inputs)
    return compiled, interpret(graph, inputs)


def ulps_of_scale(got: np.ndarray, want: np.ndarray, dtype: DType) -> np.ndarray:
    """|got - want| in ulps of max(|want|, 1) of `dtype`; 0 where both are the same
    non-finite value. NaN/inf placement is asserted, not measured."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w)), "NaNs differ"
    finite = np.isfinite(w)
    assert np.array_equal(g[~finite & ~np.isnan(w)], w[~finite & ~np.isnan(w)]), "infs differ"
    assert np.all(np.isfinite(g[finite])), "a finite value became infinite"
    scale = np.maximum(np.abs(np.where(finite, w, 1)), 1).astype(np.float32 if dtype in (
        DType.f16, DType.bf16) else dtype.np)
    spacing = np.spacing(scale).astype(np.float64)
    if dtype in (DType.f16, DType.bf16):
        spacing = spacing * 2.0 ** (23 - (10 if dtype is DType.f16 else 7))
    with np.errstate(invalid="ignore"):
        return np.where(finite, np.abs(g - w) / spacing, 0)


# -- unary functions: one compiled graph per dtype --------------------------------------------

WIDE = [-INF, -1e10, -30.5, -3.0, -2.5, -1.0, -0.7, -1e-8, -0.0, 0.0, 1e-30, 1e-8, 0.3, 1.0,
        1.4616321, 2.0, 2.5, 9.0, 10.0, 10.5, 171.5, 1e6, 1e20, INF, NAN]
UNIT = [-1.5, -1.0, -0.9999999, -0.5, -0.0, 0.0, 1e-20, 0.5, 0.51, 0.999999, 1.0, 7.0, NAN]
PROBABILITY = [-0.1, 0.0, 1e-300, 1e-30, 1e-9, 2e-8, 0.2, 0.5, 0.7, 0.999999, 1.0, 1.1, NAN]
ERFCX = [-27.0, -26.6, -0.0, 0.0, 25.99, 26.0, 30.0, 1e5, 1e30, INF, NAN]


def inputs(dtype: DType):
    def pad(specials, random):
        values = np.concatenate([specials, random])[:N]
        return values.astype(dtype.np)

    wide = pad(WIDE, np.concatenate([RNG.uniform(-30, 30, N // 2), RNG.uniform(-5, 5, N)]))
    unit = pad(UNIT, np.concatenate([RNG.uniform(-1, 1, N // 2),
                                     1 - 10 ** RNG.uniform(-15, -1, N // 2)]))
    low = -300 if dtype is DType.f64 else -37
    probability = pad(PROBABILITY, np.concatenate([RNG.uniform(0, 1, N // 2),
                                                   10 ** RNG.uniform(low, -1, N // 2)]))
    erfcx = pad(ERFCX, np.concatenate([RNG.uniform(-26, 40, N // 2), RNG.uniform(-5, 5, N)]))
    return [wide, unit, probability, erfcx]


# output: (graph builder call, bound in ulps of max(|y|, 1) for f32, for f64). Measured over
# 20k points: digamma 4 / 2 (NumPy's log near the zero at 1.4616), trigamma 5 / 0 (NumPy's
# f32 sin in the reflection), lgamma 0 / 9.5 (the reference's math.lgamma is CPython's
# Lanczos sum, not the C library's), everything else 0.
UNARY = {
    "lgamma": (lambda b, w, u, p, e: b.lgamma(w), 1, 16),
    "erfc": (lambda b, w, u, p, e: b.erfc(w), 1, 1),
    "digamma": (lambda b, w, u, p, e: b.digamma(w), 8, 4),
    "trigamma": (lambda b, w, u, p, e: b.polygamma(w, n=1), 8, 2),
    "polygamma3": (lambda b, w, u, p, e: b.polygamma(w, n=3), 1, 1),
    "erfcx": (lambda b, w, u, p, e: b.erfcx(e), 1, 1),
    "erfinv": (lambda b, w, u, p, e: b.erfinv(u), 1, 1),
    "ndtri": (lambda b, w, u, p, e: b.ndtri(p), 1, 1),
}


def unary_graph(dtype: DType):
    b = Builder("special")
    xs = [b.input(name, dtype, (N,)) for name in ("wide", "unit", "probability", "erfcx")]
    b.output(*(build(b, *xs) for build, _, _ in UNARY.values()))
    return b.build()


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
def test_unary_functions_match_the_reference(dtype) -> None:
    data = inputs(dtype)
    data[0] = np.where(data[0] == -INF, -1e30, data[0]).astype(dtype.np)  # polygamma's
    # reference fails at -inf (its zeta calls math.floor): see the test after the next
    got, want = run_both(unary_graph(dtype), data)
    for (name, (_, bound32, bound64)), g, w in zip(UNARY.items(), got, want):
        worst = ulps_of_scale(g, w, dtype).max()
        assert worst <= (bound32 if dtype is DType.f32 else bound64), (name, worst)


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
def test_half_precision_rounds_like_the_reference(dtype) -> None:
    # Within f16's range: -inf is where polygamma's reference fails (see above).
    data = [np.clip(a, -6e4, 6e4).astype(dtype.np) for a in inputs(DType.f32)]
    got, want = run_both(unary_graph(dtype), data)
    for name, g, w in zip(UNARY, got, want):
        assert ulps_of_scale(g, w, dtype).max() <= 1, name


def test_values_where_the_reference_fails_follow_aten() -> None:
    # zeta(x, -inf) and polygamma(n >= 2, -inf): the reference's math.floor(-inf) raises;
    # erfcx just above -26.7: the reference's exp(x * x) overflows. ATen gives these.
    b = Builder("edges")
    x, q, e = (b.input(n, DType.f64, (3,)) for n in "xqe")
    b.output(b.zeta(x, q), b.polygamma(q, n=2), b.erfcx(e))
    zeta = np.array([2.0, 3.0, 2.0]), np.array([-INF, -INF, INF])
    erfcx = np.array([-26.7, -26.65, -26.6])
    got = ember.compile(b.build(), config=Config(executor="cpu")).run(*zeta, erfcx)
    t = [torch.from_numpy(a) for a in (*zeta, erfcx)]
    want = [torch.special.zeta(t[0], t[1]), torch.polygamma(2, t[1]), torch.special.erfcx(t[2])]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, equal_nan=True)


# -- zeta --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
def test_zeta_matches_the_reference(dtype) -> None:
    x = np.concatenate([[1.0, 0.5, NAN, 2.0, 2.0, 3.0, 2.5, 4.0, 2.0, 2.0, 1.0001, INF],
                        RNG.uniform(1, 14, N - 12)]).astype(dtype.np)
    q = np.concatenate([[1.0, 1.0, 1.0, NAN, 0.0, -2.0, -2.5, -40.5, INF, 1e-3, 2.0, 2.0],
                        RNG.uniform(-10, 30, N - 12)]).astype(dtype.np)
    x = np.where(q < 0, np.round(x), x).astype(dtype.np)  # a real value, mostly
    b = Builder("zeta")
    b.output(b.zeta(b.input("x", dtype, (N,)), b.input("q", dtype, (N,))))
    (got,), (want,) = run_both(b.build(), [x, q])
    assert ulps_of_scale(got, want, dtype).max() <= 1


# -- orthogonal polynomials: the 12 kinds in one graph per dtype ----------------------------


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
def test_orthogonal_polynomials_match_the_reference(dtype) -> None:
    x = np.concatenate([[-1.0, 1.0, -0.0, 0.0, NAN, 0.999, 1.7, -2.5, 0.5, 0.5, 0.5, 0.2],
                        RNG.uniform(-1.2, 1.2, N - 12)]).astype(dtype.np)
    n = np.concatenate([[5.0, 4.0, 3.0, 2.0, 3.0, 9.0, 6.5, 7.0, NAN, -INF, 200.0, 600.0],
                        RNG.integers(-2, 40, N - 12)]).astype(dtype.np)
    b = Builder("poly")
    xv, nv = b.input("x", dtype, (N,)), b.input("n", dtype, (N,))
    b.output(*(b.orthogonal_polynomial(xv, nv, kind=kind) for kind in POLYNOMIALS))
    shifted = (x + 1) / 2  # the shifted kinds see the same cases on [0, 1]
    got, want = run_both(b.build(), [x, n])
    got_shifted, want_shifted = run_both(b.build(), [shifted.astype(dtype.np), n])
    for k, kind in enumerate(POLYNOMIALS):
        g, w, at = ((got_shifted[k], want_shifted[k], shifted) if kind.startswith("shifted")
                    else (got[k], want[k], x))
        worst = ulps_of_scale(g, w, dtype)
        if "chebyshev" in kind:
            # cos(n acos x) and friends (n > 6 or 8 inside (-1, 1)): the reference's NumPy
            # arccos differs from the C library's by an ulp, amplified by about n**2.
            trig = (n > 6) & (np.abs(2 * at - 1 if kind.startswith("shifted") else at) < 1)
            assert np.all(worst[trig] <= (n[trig] + 1) ** 2), kind
            worst = worst[~trig]
        assert worst.max() <= 1, kind
