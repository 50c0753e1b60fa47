"""Special-function ops (ops/special.py): type inference, semantics vs PyTorch, text round
trip."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ember import Builder, DType, ShapeError, interpret, parse_graph, print_graph
from ember.graph.ops.special import POLYNOMIALS

RNG = np.random.default_rng(3)


def run(build, *inputs: np.ndarray):
    """Build a graph over the inputs, check its text round trip, and interpret it."""
    b = Builder("t")
    values = [b.input(f"x{i}", DType.f32 if a.dtype == np.float32 else DType.f64, a.shape)
              for i, a in enumerate(inputs)]
    b.output(build(b, *values))
    graph = b.build()
    text = print_graph(graph)
    assert print_graph(parse_graph(text)) == text
    return interpret(graph, list(inputs))[0]


def close(got, want, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(got, want.numpy(), rtol=rtol, atol=atol, equal_nan=True)


# name: (torch function, input)
UNARY = {
    "lgamma": (torch.lgamma, np.array([-2.5, -1.0, 0.0, 0.3, 1.0, 4.5, 30.0, np.nan])),
    "digamma": (torch.digamma, np.array([-2.5, -1.0, -0.0, 0.0, 0.3, 1.4616, 10.0, 25.0])),
    "erfc": (torch.erfc, np.array([-3.0, -0.5, 0.0, 0.5, 3.0, 9.0, np.inf])),
    "erfcx": (torch.special.erfcx, np.array([-5.0, -0.5, 0.0, 0.5, 3.0, 30.0, 1e5])),
    "erfinv": (torch.erfinv, np.array([-1.0, -0.999, -0.5, 0.0, 0.3, 0.9999, 1.0, 1.5])),
    "ndtri": (torch.special.ndtri, np.array([0.0, 1e-30, 1e-5, 0.2, 0.5, 0.97, 1.0, -0.1])),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_matches_torch(name, dtype):
    fn, x = UNARY[name]
    x = x.astype(dtype)
    got = run(lambda b, v: getattr(b, name)(v), x)
    assert got.dtype == dtype
    close(got, fn(torch.from_numpy(x)), rtol=2e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("n", [0, 1, 2, 4])
def test_polygamma_matches_torch(n):
    x = np.array([-1.5, 0.25, 1.0, 2.5, 7.0, 40.0], np.float32)
    got = run(lambda b, v: b.polygamma(v, n=n), x)
    close(got, torch.polygamma(n, torch.from_numpy(x)), rtol=1e-5)


def test_zeta_broadcasts_and_matches_torch():
    x = np.array([[1.0], [1.5], [2.0], [4.0], [0.5]])
    q = np.array([-2.0, -1.5, 0.5, 1.0, 3.0])
    got = run(lambda b, u, v: b.zeta(u, v), x, q)
    assert got.shape == (5, 5)
    close(got, torch.special.zeta(torch.from_numpy(x), torch.from_numpy(q)), rtol=1e-12)


_TORCH_POLY = {kind: getattr(torch.special, kind.rsplit("_", 1)[0] + "_polynomial_"
                             + kind.rsplit("_", 1)[1]) for kind in POLYNOMIALS}


@pytest.mark.parametrize("kind", POLYNOMIALS)
def test_polynomials_match_torch(kind):
    x = np.concatenate([RNG.uniform(-1.5, 1.5, 10), [-1.0, 0.0, 1.0, 0.5]]).astype(np.float32)
    x = x.reshape(-1, 1)
    n = np.array([-1, 0, 1, 2, 5, 7, 10, 12], np.float32)
    got = run(lambda b, u, v: b.orthogonal_polynomial(u, v, kind=kind), x, n)
    want = _TORCH_POLY[kind](torch.from_numpy(x), torch.from_numpy(n))
    close(got, want, rtol=1e-5, atol=1e-4)


def test_type_inference_and_errors():
    b = Builder("t")
    x = b.input("x", DType.f16, (2, 3))
    assert b.lgamma(x).type == x.type
    assert b.zeta(b.input("a", DType.f32, (4, 1)), b.input("q", DType.f32, (3,))).shape == (4, 3)
    with pytest.raises(ShapeError, match="dtype"):
        b.digamma(b.input("i", DType.i32, (2,)))
    with pytest.raises(ShapeError, match="n must be >= 0"):
        b.polygamma(x, n=-1)
    with pytest.raises(ShapeError, match="one dtype"):
        b.orthogonal_polynomial(x, b.input("n", DType.f32, (3,)), kind="hermite_h")
    with pytest.raises(ShapeError, match="do not broadcast"):
        b.zeta(b.input("u", DType.f32, (2,)), b.input("v", DType.f32, (3,)))


def test_half_inputs_compute_in_f32():
    x = np.array([0.5, 2.0, 5.0], np.float16)
    b = Builder("t")
    v = b.input("x", DType.f16, (3,))
    b.output(b.lgamma(v))
    got = interpret(b.build(), [x])[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), [math.lgamma(v) for v in (0.5, 2, 5)],
                               rtol=1e-3)
