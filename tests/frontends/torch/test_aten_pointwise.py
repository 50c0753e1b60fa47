"""The pointwise, reduction and creation converters against eager PyTorch.

Each test compiles one module that applies a whole family of ops (one torch.export per
family keeps the file fast) with `ember.compile(strict=True)` and compares every output,
dtype and shape included. Overloads that the core ATen decompositions never leave (silu,
hardswish, fill, new_zeros, ...) are traced with make_fx and imported directly.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.api.torch_runner import GraphRunner
from ember.errors import UnsupportedOpError
from ember.frontends.torch.fx_importer import import_fx

aten = torch.ops.aten


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def compare(got, want, rtol=1e-5, atol=1e-5):
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m, i=i: f"output {i}: {m}")


def check(fn, *inputs, rtol=1e-5, atol=1e-5):
    """fn through torch.export and ember.compile, against eager."""
    compare(ember.compile(Fn(fn), strict=True)(*inputs), fn(*inputs), rtol, atol)


def check_aten(fn, *inputs, rtol=1e-5, atol=1e-5):
    """fn's ATen ops as make_fx records them (no decompositions), imported directly."""
    gm = make_fx(fn)(*inputs)
    compare(GraphRunner(import_fx(gm))(*inputs), list(torch.utils._pytree.tree_leaves(
        fn(*inputs))), rtol, atol)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


SPECIALS = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, math.inf, -math.inf, math.nan,
                         1e-30, 7.0, -7.0])


def test_float_arithmetic():
    x = torch.cat([randn(20), SPECIALS])
    y = torch.cat([randn(20, seed=1), SPECIALS.flip(0)])

    def fn(x, y):
        return (x + y, torch.add(x, y, alpha=0.5), x - 2.5, torch.sub(x, y, alpha=3), x * y,
                x * 0.1, x / y, x / 3, torch.div(x, y, rounding_mode="trunc"),
                torch.div(x, y, rounding_mode="floor"), torch.div(x, 0.1, rounding_mode="floor"),
                x.abs() ** y, x ** 2, x ** 3, x.abs() ** 0.5, x ** -1, x ** -2, x ** 2.5,
                x.abs() ** -0.5, 2.0 ** y, torch.remainder(x, y), torch.remainder(x, 0.7),
                torch.fmod(x, y), torch.fmod(x, -0.3), 3.5 % y, torch.maximum(x, y),
                torch.minimum(x, y), torch.fmax(x, y), torch.fmin(x, y), torch.atan2(x, y))

    check(fn, x, y)
    # atan2 on every pair of special values (signed zeros and infinities included)
    a, b = SPECIALS[:, None].expand(12, 12), SPECIALS[None, :].expand(12, 12)
    check(torch.atan2, a.contiguous(), b.contiguous())


def test_int_and_promotion():
    x = torch.tensor([-7, -3, -1, 0, 1, 2, 5, 9, 100], dtype=torch.int32)
    y = torch.tensor([2, -2, 3, -4, 7, 5, -3, 2, 9], dtype=torch.int64)
    u = torch.tensor([0, 1, 7, 200, 255], dtype=torch.uint8)

    def fn(x, y, u):
        return (x + y, x - 3, x * y, x / y, x // y, torch.div(x, y, rounding_mode="trunc"),
                x // 3, x % y, x % -3, torch.fmod(x, y), x ** 2, x * 1.5, x + 0.5, x > 0.5,
                -x, x.abs(), x.sign(), -u, u + u, u // 3, torch.maximum(x, y),
                torch.exp(x), torch.sqrt(y.abs()), x.floor(), x.round(), x.sum(), u.sum(),
                torch.clamp(x, -2, 3), torch.clamp(x, min=0.5), x.to(torch.float16))

    check(fn, x, y, u)


def test_bool_and_logic():
    b = torch.tensor([True, False, True, False])
    c = torch.tensor([True, True, False, False])
    x = torch.tensor([0.0, math.nan, -2.0, 0.5])

    def fn(b, c, x):
        return (b + c, b * c, b & c, b | c, b ^ c, ~b, b < c, b >= c, b == c, b.sum(),
                torch.logical_and(x, b), torch.logical_or(x, c), torch.logical_xor(x, c),
                torch.logical_not(x), torch.where(b, x, 1.0), b.to(torch.float32), b.int() * 2,
                torch.maximum(b, c), b.any(), b.all(), x.bool())

    check(fn, b, c, x)


def test_comparisons():
    x = torch.cat([randn(10), SPECIALS])
    y = torch.cat([x[:5], randn(17, seed=2)])
    i = torch.arange(-5, 5)

    def fn(x, y, i, f):
        return (x == y, x != y, x < y, x <= y, x > y, x >= y, x == 1.0, x != 2.5, x < 0,
                x <= -1.0, x > 0.5, x >= 7, i > 0.5, i == 2, i < f, i.to(torch.int8) > i)

    check(fn, x, y, i, randn(10) * 5)


def test_bitwise_and_shifts():
    x = torch.tensor([-100, -1, 0, 3, 77, 1000], dtype=torch.int32)
    n = torch.tensor([-1, 0, 3, 31, 32, 40], dtype=torch.int32)
    u = torch.tensor([200, 1, 255, 3, 128, 7], dtype=torch.uint8)

    def fn(x, n, u):
        return (x & 6, x | n, x ^ 5, ~x, x << 2, x >> 1, x << n, x >> n, u >> n.to(torch.uint8),
                u << n.to(torch.uint8), torch.bitwise_left_shift(x, n), ~u, u & u)

    check(fn, x, n, u)


def test_unary_math():
    x = torch.cat([randn(30), SPECIALS])
    p = randn(30, seed=3).abs() + 0.1
    s = torch.linspace(-0.9, 0.9, 11)

    def fn(x, p, s):
        return (torch.exp(x), torch.expm1(x), torch.exp2(x), torch.log(p), torch.log2(p),
                torch.log10(p), torch.log1p(p), torch.sqrt(p), torch.rsqrt(p), 1 / p,
                torch.reciprocal(x), torch.sin(x), torch.cos(x), torch.tan(s), torch.asin(s),
                torch.acos(s), torch.atan(x), torch.sinh(s), torch.cosh(s), torch.tanh(x),
                torch.asinh(x), torch.acosh(p + 1), torch.atanh(s), torch.erf(x),
                torch.sigmoid(x), torch.floor(x), torch.ceil(x), torch.round(x * 3),
                torch.round(x * 100, decimals=1), torch.round(x * 100, decimals=-1),
                torch.trunc(x), torch.frac(x), torch.sign(x), torch.abs(x), -x, torch.isnan(x),
                torch.isinf(x), torch.isfinite(x), torch.nan_to_num(x),
                torch.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-3.0))

    check(fn, x, p, s)


def test_clamp_where_masked_fill():
    x = torch.cat([randn(10), SPECIALS])
    lo, hi = randn(22, seed=4) - 1, randn(22, seed=5) + 1

    def fn(x, lo, hi, v):
        return (torch.clamp(x, -0.5, 0.5), torch.clamp(x, min=0.2), torch.clamp(x, max=-0.1),
                torch.clamp(x, 1.0, -1.0), torch.clamp(x, lo, hi), torch.clamp(x, min=lo),
                torch.clamp_min(x, 0.1), torch.clamp_max(x, hi), F.hardtanh(x), F.relu6(x),
                torch.where(x > 0, x, lo), torch.where(x > 0, x, 0.0),
                x.masked_fill(x < 0, -1.5), x.masked_fill(x > 1, v))

    check(fn, x, lo, hi, torch.tensor(0.25))


# F.gelu(inf) is NaN in PyTorch's CPU kernel and inf (its limit) in Ember: left out below.
ACTIVATIONS = [F.relu, F.leaky_relu, lambda x: F.leaky_relu(x, 0.2), F.elu,
               lambda x: F.elu(x, 0.5), F.selu, lambda x: F.celu(x, 1.5),
               lambda x: F.gelu(torch.where(x == math.inf, 0, x)),
               lambda x: F.gelu(x, approximate="tanh"), F.silu, F.mish, F.hardsigmoid,
               F.hardswish, F.softplus, lambda x: F.softplus(x, 2.0, 5.0), F.logsigmoid]


def test_activations():
    x = torch.cat([randn(40) * 4, SPECIALS, torch.tensor([30.0, -30.0, 100.0])])
    check(lambda x: tuple(f(x) for f in ACTIVATIONS), x)


def test_activation_overloads_without_decomposition():
    # make_fx keeps these whole; the core ATen decompositions split them up.
    x = torch.cat([randn(40) * 4, SPECIALS])

    def fn(x):
        return (aten.silu(x), aten.mish(x), aten.hardsigmoid(x), aten.hardswish(x),
                aten.softplus(x, 2, 10), aten.log_sigmoid_forward(x)[0],
                aten.elu(x, 1.0, 1.0507, 1.0), aten.sgn(x), aten.isfinite(x),
                aten.relu(x), aten.clamp(x, None, 0.5))

    check_aten(fn, x)


def test_copies_and_casts():
    x = torch.cat([randn(10) * 100, torch.tensor([0.0, -0.0, 2.5, -2.5, 1e5])])
    i = torch.tensor([-3, 0, 7, 300], dtype=torch.int64)

    def fn(x, i):
        return (x.to(torch.int32), x.to(torch.float16), x.to(torch.bfloat16), x.to(torch.bool),
                x.double(), i.float(), i.to(torch.int8), i.to(torch.uint8), x.clone(),
                x.detach(), x.contiguous() + 1, x.to(torch.float16).float())

    check(fn, x, i)
    check_aten(lambda x, y, k: (aten.copy(x, y), aten.copy(x, k), aten.lift_fresh_copy(x)),
               randn(2, 3), randn(3, seed=1), torch.tensor(4, dtype=torch.int64))


def test_reductions():
    x = randn(3, 4, 5)
    x_nan = x.clone()
    x_nan[1, 2, 3] = math.nan
    i = torch.randint(-9, 9, (3, 4), generator=torch.Generator().manual_seed(0))
    b = i > 0

    def fn(x, x_nan, i, b):
        return (x.sum(), x.sum(1), x.sum((0, 2), keepdim=True), x.sum(dtype=torch.float64),
                i.sum(0), b.sum(1), x.mean(), x.mean((1, 2)), x.mean(-1, keepdim=True),
                x.prod(), x.prod(1), i.prod(1), x.amax((0, 2)), x.amin(-1, keepdim=True),
                x_nan.amax(2), x.max(), i.min(), x.max(1), x.min(2, keepdim=True),
                x_nan.max(2), i.max(0), b.max(1), x.argmax(), x.argmin(1),
                x.argmax(2, keepdim=True), i.argmin(0), x.var(), x.var(1),
                x.var((0, 2), correction=0, keepdim=True), x.std(2, correction=2), x.std(),
                torch.var_mean(x, 1), x.any(), b.any(1), b.all(0), x_nan.gt(5).any(1),
                i.all(), x.cumsum(1), i.cumsum(0), b.cumsum(1), x.cumprod(2),
                torch.tensor(2.5).sum(0), i.float().mean(0))

    check(fn, x, x_nan, i, b)


def test_softmax():
    x = randn(2, 3, 4) * 3

    def fn(x, h):
        return (F.softmax(x, 1), F.softmax(x, -1), F.log_softmax(x, 0), F.log_softmax(x, 2),
                F.softmax(h, 1, dtype=torch.float32), F.softmax(h, -1))

    check(fn, x, x.half(), atol=1e-3)


def test_creation():
    x = randn(2, 3)

    def fn(x):
        return (torch.full((2, 3), 1.5), torch.full_like(x, 7), torch.zeros(4),
                torch.ones(2, 2, dtype=torch.int32), torch.ones_like(x), torch.zeros_like(x),
                torch.zeros_like(x, dtype=torch.int64), torch.ones(3, dtype=torch.bool),
                torch.scalar_tensor(3.0) + x, x.new_zeros(3), torch.arange(5),
                torch.arange(1, 2, 0.25), torch.arange(10, 0, -3), x + torch.empty(2, 3) * 0,
                torch.empty_like(x).shape[0] + x)

    check(fn, x)
    # empty's values are unspecified: Ember gives zeros; compare the types.
    out = GraphRunner(import_fx(make_fx(lambda x: (aten.empty_like(x), aten.empty.memory_format(
        [2, 5], dtype=torch.int8)))(x)))(x)
    assert [(o.dtype, tuple(o.shape)) for o in out] == [(torch.float32, (2, 3)),
                                                        (torch.int8, (2, 5))]
    check_aten(lambda x, v: (aten.fill(x, 2.5), aten.fill(x, v), aten.new_full(x, [4], 3),
                             aten.new_ones(x, [2], dtype=torch.int32),
                             # (new_empty's memory may hold a NaN, which times 0 stays)
                             aten.fill(aten.new_empty(x, [2]), 0.0),
                             aten.masked_fill(x, x > 0, v)), x, torch.tensor(9.0))


def test_half_precision():
    x = randn(4, 8, dtype=torch.float16)
    y = randn(4, 8, seed=1, dtype=torch.float16)

    def fn(x, y):
        return (x + y, x + 0.1, x * 0.1, x / 3, torch.add(x, y, alpha=0.1), x * y, x ** 2.5,
                F.gelu(x), F.silu(x), torch.exp(x), x.sum(1), x.mean(), F.softmax(x, 1),
                torch.clamp(x, -0.3, 0.3), torch.div(x, y, rounding_mode="floor"), x > 0.1,
                x.to(torch.float32), x.bfloat16() * 2)

    check(fn, x, y, rtol=1e-3, atol=1e-3)


def test_torch_compile_backend():
    torch._dynamo.reset()

    def fn(x, i):
        return (torch.add(x, 1.5, alpha=2) * x, torch.div(x, 0.3, rounding_mode="floor"),
                F.gelu(x).sum(1), F.softmax(x, -1), (i >> 1) & 3, x.max(1), torch.clamp(x, 0, 1),
                x.to(torch.int32), torch.where(x > 0, x, torch.zeros_like(x)), x.var(0))

    x, i = randn(4, 6), torch.arange(24).reshape(4, 6)
    compiled = torch.compile(fn, backend="ember", fullgraph=True, dynamic=False,
                             options={"strict": True})
    compare(compiled(x, i), fn(x, i))


@pytest.mark.parametrize("fn", [torch.special.bessel_j0, torch.rand_like],
                         ids=["bessel_j0", "rand_like"])
def test_unsupported_ops_raise(fn):
    with pytest.raises(UnsupportedOpError):
        ember.compile(Fn(fn), strict=True)(torch.rand(3) - 0.5)
