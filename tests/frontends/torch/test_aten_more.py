"""Converters of aten_linalg.py, aten_math.py and aten_special.py, and the later additions
to the other converter modules (pooling indices, functional batch norm, negative eps,
strided views, searches, scans, empty and scalar edge cases): each ATen op recorded by
make_fx and imported directly, against eager PyTorch."""

from __future__ import annotations

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.api.torch_runner import GraphRunner
from ember.frontends.torch.fx_importer import import_fx

aten = torch.ops.aten


def compare(got, want, rtol=1e-5, atol=1e-5):
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m, i=i: f"output {i}: {m}")


def check(fn, *inputs, rtol=1e-5, atol=1e-5):
    """fn's ATen ops as make_fx records them, imported directly, against eager."""
    gm = make_fx(fn)(*inputs)
    want = list(torch.utils._pytree.tree_leaves(fn(*inputs)))
    compare(GraphRunner(import_fx(gm))(*inputs), want, rtol, atol)


def bound(fn, **fixed):
    """fn with keyword arguments fixed, as a function of its tensors only (make_fx traces
    every parameter, defaults included)."""
    return lambda *tensors: fn(*tensors, **fixed)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


SPECIALS = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, math.inf, -math.inf, math.nan, 7.0])


# -- norms and products ---------------------------------------------------------------------
@pytest.mark.parametrize("ord", [2, 1, 0, 3.5, math.inf, -math.inf])
def test_vector_norm(ord):
    x = randn(3, 4)
    check(lambda v: aten.linalg_vector_norm(v, ord, [1], True), x)
    check(lambda v: aten.linalg_vector_norm(v, ord), x)


def test_dist_and_addbmm():
    check(lambda a, b: aten.dist(a, b, 3), randn(2, 3), randn(3, seed=1))
    check(lambda c, a, b: aten.addbmm(c, a, b, beta=0.5, alpha=2), randn(3, 5),
          randn(4, 3, 2, seed=1), randn(4, 2, 5, seed=2), rtol=1e-4)


# -- pointwise math -------------------------------------------------------------------------
def test_sign_and_magnitude():
    x, y = SPECIALS, SPECIALS.flip(0)
    check(aten.copysign.Tensor, x, y)
    check(lambda v: aten.copysign.Scalar(v, -1.0), x)
    check(aten.signbit, x)
    check(aten.angle, x)
    check(aten.hypot, x, y)
    check(aten.hypot, torch.tensor([3e30, 1e-30]), torch.tensor([4e30, 0.0]))
    check(aten.ldexp.Tensor, randn(5), torch.tensor([0, 1, -2, 10, 3]))
    check(aten.nextafter, x, y)


@pytest.mark.parametrize("op", [aten.cummax, aten.cummin])
def test_running_extremes(op):
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, math.nan, 5.0], [-math.inf] * 6])
    check(lambda v: op(v, 1), x)
    check(lambda v: op(v, 0), randn(4, 3))
    check(lambda v: op(v, 0), torch.tensor([2, 1, 2, 5], dtype=torch.int32))


def test_logcumsumexp():
    x = torch.tensor([[0.0, 100.0, -math.inf, 3.0], [-math.inf, -math.inf, 1.0, 1.0]])
    check(lambda v: aten.logcumsumexp(v, 1), x)
    check(lambda v: aten.logcumsumexp(v, 0), randn(5, 2))


# -- special functions ----------------------------------------------------------------------
def test_special_unary():
    x = torch.tensor([-2.5, -1.0, 0.0, 0.3, 1.0, 4.5, 30.0])
    for op in (aten.lgamma, aten.digamma, aten.erfc, aten.special_erfcx):
        check(op, x)
    for op in (aten.erfinv, aten.special_ndtri):
        check(op, torch.tensor([-0.5, 0.0, 0.01, 0.4, 0.999, 1.0]))
    check(aten.lgamma, torch.tensor([1, 4, 7]))  # integers compute as floats
    for n in (0, 1, 3):
        check(bound(lambda v, n: aten.polygamma(n, v), n=n), torch.tensor([-1.5, 0.25, 2, 9]))
    check(aten.special_zeta, torch.tensor([[2.0], [3.5]]), torch.tensor([0.5, 1.0, 4.0]))


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "shifted_chebyshev_polynomial_w",
                                  "hermite_polynomial_h", "hermite_polynomial_he",
                                  "laguerre_polynomial_l", "legendre_polynomial_p"])
def test_orthogonal_polynomials(name):
    op = getattr(aten, f"special_{name}")
    x = torch.linspace(-1.2, 1.2, 7).reshape(-1, 1)
    check(op, x, torch.tensor([0.0, 1.0, 2.0, 5.0, 9.0]), rtol=1e-4, atol=1e-4)
    check(lambda v: op.n_scalar(v, 3), x.flatten())


# -- pooling indices, normalization -----------------------------------------------------------
def test_max_pool_indices():
    x = randn(2, 3, 7, 6)
    check(lambda v: aten.max_pool2d_with_indices(v, [3, 2], [2, 2], [1, 1], [1, 1], True), x)
    check(lambda v: aten.max_pool3d_with_indices(v, [2, 2, 2], [1, 2, 1]), randn(1, 2, 3, 4, 5))
    check(lambda v: aten.adaptive_max_pool2d(v, [3, 4]), x)
    check(lambda v: aten.adaptive_max_pool2d(v, [2, 2]), randn(3, 5, 5))  # unbatched
    ties = torch.tensor([[[[1.0, 1.0], [1.0, -math.inf]]]])
    check(lambda v: aten.max_pool2d_with_indices(v, [2, 2], [1, 1], [1, 1]), ties)


def test_batch_norm_functional():
    x, w, b = randn(4, 3, 5), randn(3, seed=1), randn(3, seed=2)
    mean, var = randn(3, seed=3), randn(3, seed=4).abs()
    for training in (True, False):
        check(bound(lambda x, w, b, m, v, t: aten._native_batch_norm_legit_functional(
            x, w, b, m, v, t, 0.1, 1e-5), t=training), x, w, b, mean, var)
    check(lambda x, w, b, m, v: aten._batch_norm_with_update_functional(
        x, w, b, m, v, 0.2, 1e-5)[::2], x, w, b, mean, var)


def test_norms_with_negative_eps():
    x = randn(2, 6, 3)
    check(lambda v, w: aten.native_layer_norm(v, [3], w, None, -0.5), x, randn(3, seed=1))
    check(lambda v, w: aten.native_group_norm(v, w, None, 2, 6, 3, 3, -0.5), x,
          randn(6, seed=1))


# -- views, copies, searches, scatters --------------------------------------------------------
def test_strided_views():
    x = randn(4, 5)
    check(lambda v: aten.as_strided(v, [3, 2], [2, 5], 1), x)
    check(lambda v: aten.as_strided_copy(v, [2, 2, 2], [1, 4, 8]), x)
    check(lambda v, s: aten.as_strided_scatter(v, s, [2, 3], [5, 1], 2), x, randn(2, 3, seed=1))
    check(lambda v, s: aten.diagonal_scatter(v, s, 1), x, randn(4, seed=1))
    check(lambda v, s: aten.diagonal_scatter(v, s, -1, 2, 0), randn(3, 2, 4),
          randn(2, 3, seed=1))


def test_copy_variants():
    x = randn(2, 3, 4)
    check(lambda v: aten.view_copy(v, [6, 4]), x)
    check(lambda v: aten.permute_copy(v, [2, 0, 1]), x)
    check(lambda v: aten.narrow_copy(v, 2, 1, 2), x)
    check(lambda v: aten.unbind_copy(v, 1), x)
    check(lambda v: aten._to_copy(v, memory_format=torch.channels_last), randn(1, 2, 3, 3))


def test_searches():
    seq = torch.tensor([1.0, 2.0, 2.0, 5.0])
    values = torch.tensor([[0.0, 2.0, 3.0], [5.0, 6.0, 2.0]])
    for right in (False, True):
        check(bound(lambda s, v, r: aten.searchsorted(s, v, right=r), r=right), seq, values)
        check(bound(lambda v, s, r: aten.bucketize(v, s, right=r, out_int32=True), r=right),
              values, seq)
    check(lambda s, v: aten.searchsorted(s, v, side="right"), seq.expand(2, 4), values)
    check(lambda s, v, o: aten.searchsorted(s, v, sorter=o), torch.tensor([5.0, 1.0, 2.0]),
          values, torch.tensor([1, 2, 0]))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(reduce):
    x, src = randn(5, 3), randn(4, 3, seed=1)
    index = torch.tensor([0, 2, 0, 4])
    for include_self in (True, False):
        check(bound(lambda v, i, s, inc: aten.index_reduce(v, 0, i, s, reduce,
                                                           include_self=inc),
                    inc=include_self), x, index, src)


def test_scalar_and_empty_edge_cases():
    s = torch.tensor(3.0)
    check(lambda v: aten.topk(v, 1), s)
    check(lambda v, i: aten.index_select(v, 0, i), s, torch.tensor([0]))
    check(lambda v, i: aten.gather(v, 0, i), randn(5), torch.zeros(2, 0, dtype=torch.long))
    check(lambda v, i, u: aten.scatter_add(v, 0, i, u), s, torch.tensor(0), torch.tensor(2.0))
    check(lambda v, i: aten.scatter(v, 0, i, 5.0), s, torch.tensor(0))
    check(lambda v, s2: aten.slice_scatter(v, s2, 1, 0, 0), torch.zeros(2, 0), torch.zeros(2, 0))
    check(lambda v: aten._softmax(v, 1, False), torch.zeros(3, 0))
    check(lambda v: aten._log_softmax(v, 0, False), torch.zeros(0, 2))


def test_fractional_and_negative_corrections():
    x = randn(3, 5)
    for correction in (1.3, -1, 7):
        check(bound(lambda v, c: aten.var.correction(v, [1], correction=c), c=correction), x)
        check(bound(lambda v, c: aten.var_mean.correction(v, [0], correction=c, keepdim=True),
                    c=correction), x)
