"""Converters of ATen's special functions: the gamma family (lgamma, digamma, polygamma,
mvlgamma's pieces), the Hurwitz zeta function, erfc and its scaled and inverse forms,
and the orthogonal polynomials, onto the IR ops of ember/graph/ops/special.py. The
operands compute in the result's dtype (integers become floats), f16/bf16 in f32.
"""

from __future__ import annotations

from ember.frontends.torch.aten_pointwise import _opmath, op_name
from ember.frontends.torch.context import ConvertContext, aten
from ember.graph.ops.special import POLYNOMIALS

_UNARY = {"lgamma": "lgamma", "digamma": "digamma", "erfc": "erfc", "erfinv": "erfinv",
          "special_erfcx": "erfcx", "special_ndtri": "ndtri"}


@aten(*(f"{name}.default" for name in _UNARY))
def special_unary(ctx: ConvertContext, x):
    op = _UNARY[op_name(ctx)]
    return _opmath(ctx, lambda v: getattr(ctx.b, op)(v), x)


@aten("polygamma.default")
def polygamma(ctx: ConvertContext, n, x):
    if n < 0:
        raise ctx.unsupported(f"polygamma of order {n}")
    return _opmath(ctx, lambda v: ctx.b.polygamma(v, n=int(n)), x)


@aten("special_zeta.default", "special_zeta.self_scalar", "special_zeta.other_scalar")
def zeta(ctx: ConvertContext, x, q):
    return _opmath(ctx, ctx.b.zeta, x, q)


_POLY_OVERLOADS = [f"special_{kind}_polynomial_{letter}.{overload}"
                   for kind, _, letter in (p.rpartition("_") for p in POLYNOMIALS)
                   for overload in ("default", "x_scalar", "n_scalar")]


@aten(*_POLY_OVERLOADS)
def orthogonal_polynomial(ctx: ConvertContext, x, n):
    name = op_name(ctx)  # special_chebyshev_polynomial_t -> chebyshev_t
    kind = name.removeprefix("special_").replace("_polynomial", "")
    return _opmath(ctx, lambda a, d: ctx.b.orthogonal_polynomial(a, d, kind=kind), x, n)
