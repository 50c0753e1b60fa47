"""Converters of ATen linear algebra beyond matrix products (those are in aten_nn.py):
vector norms (which linalg.norm, normalize, cosine_similarity, renorm and the distance
losses reach), the fused weight norm, `dist` and batched sums of products. The matrix
decompositions and solvers (_linalg_svd, linalg_inv_ex, ...) need IR ops of their own and
are not here yet.
"""

from __future__ import annotations

import math

from ember.frontends.torch.aten_pointwise import require
from ember.frontends.torch.aten_reduce import _axes
from ember.frontends.torch.context import ConvertContext, aten
from ember.graph.ir import Value


# -- norms ----------------------------------------------------------------------------------
def vector_norm(ctx: ConvertContext, x: Value, ord, axes, keepdim: bool) -> Value:
    """The `ord`-norm of x over `axes`: max |x| (inf), min |x| (-inf), the count of
    non-zeros (0), sum |x| (1), sqrt(sum x*x) (2), else sum(|x|**p)**(1/p)."""
    b, keep = ctx.b, bool(keepdim)
    ord = float(ord)
    if ord == 0:
        nonzero = b.cast(b.ne(x, ctx.constant(0, x.dtype)), to=x.dtype)
        return b.reduce_sum(nonzero, axes=axes, keepdims=keep)
    if math.isinf(ord):
        reducer = b.reduce_max if ord > 0 else b.reduce_min
        return reducer(b.abs(x), axes=axes, keepdims=keep)
    if ord == 1:
        return b.reduce_sum(b.abs(x), axes=axes, keepdims=keep)
    if ord == 2:
        return b.sqrt(b.reduce_sum(b.mul(x, x), axes=axes, keepdims=keep))
    p = ctx.constant(ord, x.dtype)
    total = b.reduce_sum(b.pow(b.abs(x), p), axes=axes, keepdims=keep)
    return b.pow(total, ctx.constant(1 / ord, x.dtype))


@aten("linalg_vector_norm.default")
def linalg_vector_norm(ctx: ConvertContext, x, ord=2, dim=None, keepdim=False, dtype=None):
    out = ctx.result_type().dtype
    require(ctx, out.is_float, f"a norm of {out}")
    x = ctx.as_value(x, out)  # dtype= casts the input first
    return vector_norm(ctx, x, ord, _axes(ctx, x, dim), keepdim)


@aten("_weight_norm_interface.default")
def weight_norm(ctx: ConvertContext, v, g, dim=0):
    """(v * (g / |v|), |v|), the 2-norm over every axis of v but `dim` (kept, size 1): the
    fused weight norm, which PyTorch calls for `dim` the first or the last axis."""
    v = ctx.as_value(v, v.dtype)
    rank = v.type.rank
    require(ctx, rank > 0 and -rank <= dim < rank, f"a weight norm over axis {dim} of {v.type}")
    norm = vector_norm(ctx, v, 2, tuple(a for a in range(rank) if a != dim % rank), True)
    return ctx.b.mul(v, ctx.b.div(ctx.as_value(g, v.dtype), norm)), norm


@aten("dist.default")
def dist(ctx: ConvertContext, x, y, p=2):
    out = ctx.result_type().dtype
    d = ctx.b.sub(ctx.as_value(x, out), ctx.as_value(y, out))
    return vector_norm(ctx, d, p, tuple(range(d.type.rank)), False)


# -- products -------------------------------------------------------------------------------
@aten("addbmm.default")
def addbmm(ctx: ConvertContext, bias, batch1, batch2, beta=1, alpha=1):
    """beta * bias + alpha * sum_i batch1[i] @ batch2[i]."""
    if batch1.type.rank != 3 or batch1.shape[0] == 0:
        raise ctx.unsupported(f"addbmm of {batch1.type}")
    products = ctx.b.matmul(batch1, batch2)
    total = ctx.b.reduce_sum(products, axes=(0,))
    return _add_scaled(ctx, bias, total, beta, alpha)


def _add_scaled(ctx: ConvertContext, bias, product: Value, beta, alpha) -> Value:
    if alpha != 1:
        product = ctx.b.mul(product, ctx.constant(alpha, product.dtype))
    if beta == 0:  # PyTorch ignores the bias then, NaNs included
        return product
    bias = ctx.as_value(bias, product.dtype)
    if beta != 1:
        bias = ctx.b.mul(bias, ctx.constant(beta, product.dtype))
    return ctx.b.add(product, bias)

