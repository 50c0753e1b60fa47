"""Special functions with no exact composition of primitives: log-gamma, digamma and
polygamma, the Hurwitz zeta function, erfc and its scaled and inverse forms, and the
classical orthogonal polynomials.

The references follow PyTorch's CPU kernels (ATen's Math.h, from Cephes): where those
compute in the operand's precision (digamma, trigamma, zeta, the polynomial recurrences),
so does the reference, element by element in NumPy scalars of that dtype; where ATen calls
the C library (lgamma, erfc), the reference calls Python's `math` in double precision
(math.erfc is the C library's; math.lgamma is CPython's own, within about 8 ulps of
max(|y|, 1), the C library's within 2). erfcx, erfinv and ndtri have no C library function:
their references are computed in f64 to within a few ulps (see each function) and rounded.

Their loop lowerings (ember/loops/lower/ops/special.py) follow these references step by
step: lgamma and erfc call the C library in f64, the others repeat the same arithmetic in
the same precision, so the compiled CPU path matches the interpreter to the bit or within
the few ulps by which the C library's lgamma/log/sin/acos differ from CPython's and NumPy's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ember.dtypes import FLOAT_TYPES
from ember.errors import ShapeError
from ember.graph.ir import TensorType
from ember.graph.ops.common import broadcast_shapes, require_dtype, same_dtype
from ember.graph.ops.registry import Attr, define


def elementwise(fn: Callable, *arrays: np.ndarray) -> np.ndarray:
    """fn applied to each element (broadcast) as NumPy scalars of the operands' dtype."""
    dtype = arrays[0].dtype
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    flat = [np.broadcast_to(a, shape).ravel() for a in arrays]
    out = np.empty(len(flat[0]), dtype)
    with np.errstate(all="ignore"):
        for i, args in enumerate(zip(*flat)):
            out[i] = fn(*args)
    return out.reshape(shape)


# -- gamma family ---------------------------------------------------------------------------
def _lgamma(x) -> float:
    """log|gamma(x)|; inf at the poles (0 and the negative integers), as C's lgamma."""
    x = float(x)
    if math.isnan(x):
        return x
    if math.isinf(x):
        return math.inf
    if x <= 0 and x == math.floor(x):
        return math.inf
    return math.lgamma(x)


_PSI_A = (8.33333333333333333333E-2, -2.10927960927960927961E-2, 7.57575757575757575758E-3,
          -4.16666666666666666667E-3, 3.96825396825396825397E-3, -8.33333333333333333333E-3,
          8.33333333333333333333E-2)
_PSI_10 = 2.25175258906672110764


def _digamma(x):
    """ATen's calc_digamma (Cephes psi), in x's own precision."""
    t = type(x)
    if x == 0:
        return t(math.copysign(math.inf, -float(x)))
    if x < 0:
        if x == np.trunc(x):
            return t(math.nan)
        r = math.modf(float(x))[0]
        return _digamma(t(1) - x) - t(math.pi / math.tan(math.pi * r))
    if np.isnan(x):
        return x
    result = t(0)
    while x < 10:
        result -= t(1) / x
        x += t(1)
    if x == 10:
        return result + t(_PSI_10)
    y = t(0)
    if x < 1e17:
        z = t(1) / (x * x)
        poly = t(0)
        for a in _PSI_A:
            poly = poly * z + t(a)
        y = z * poly
    return result + t(np.log(x)) - t(0.5) / x - y


def _trigamma(x):
    """ATen's trigamma, in x's own precision."""
    t = type(x)
    sign, result = t(1), t(0)
    if x < 0.5:
        sign = t(-1)
        s = np.sin(t(math.pi) * x)
        result -= t(math.pi) * t(math.pi) / (s * s)
        x = t(1) - x
    for _ in range(6):
        result += t(1) / (x * x)
        x += t(1)
    ixx = t(1) / (x * x)
    result += (t(1) + t(1) / (t(2) * x) + ixx * (t(1 / 6) - ixx * (t(1 / 30) - ixx * t(1 / 42)))
               ) / x
    return sign * result


_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
           7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
           -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18)
_MACHEP = 1.11022302462515654042E-16


def _zeta(x, q):
    """The Hurwitz zeta function sum_k (k + q)**-x (ATen's zeta, Cephes), accumulated in
    f64 as ATen's accumulate type for f32 and f64 on CPU."""
    t = type(x)
    x, q = float(x), float(q)
    if x == 1:
        return t(math.inf)
    if x < 1 or math.isnan(x) or math.isnan(q):
        return t(math.nan)
    if q <= 0:  # np.floor: math.floor raises on an infinite q or x
        if q == np.floor(q):
            return t(math.inf)
        if x != np.floor(x):
            return t(math.nan)
    s = _pow(q, -x)
    a, i, b = q, 0, 0.0
    while i < 9 or a <= 9:
        i += 1
        a += 1
        b = _pow(a, -x)
        s += b
        if -_MACHEP * s < b < _MACHEP * s:
            return t(s)
    w = a
    s += b * w / (x - 1)
    s -= 0.5 * b
    a, k = 1.0, 0.0
    for coef in _ZETA_A:
        a *= x + k
        b /= w
        term = a * b / coef
        s += term
        if abs(term / s) < _MACHEP:
            return t(s)
        k += 1
        a *= x + k
        b /= w
        k += 1
    return t(s)


def _pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except (OverflowError, ValueError):
        return float(np.power(a, b))


def _polygamma(x, n: int):
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    t = type(x)
    sign = 1.0 if n % 2 else -1.0
    return t(sign * math.exp(math.lgamma(n + 1)) * float(_zeta(t(n + 1), x)))


# -- error functions ------------------------------------------------------------------------
def _erfc(x) -> float:
    return math.erfc(float(x))


def _erfcx(x) -> float:
    """e**(x*x) * erfc(x): directly while e**(x*x) is finite, else by the continued
    fraction of erfc's asymptotic series (relative error below 1e-15 for x > 26)."""
    x = float(x)
    if math.isnan(x):
        return x
    if x < 26:
        try:
            return math.exp(x * x) * math.erfc(x)
        except OverflowError:  # e**(x*x) beyond f64, x < -26.64: so is the product
            return math.inf
    # erfcx(x) = 1 / sqrt(pi) * 1 / (x + 1/2 / (x + 1 / (x + 3/2 / (x + ...)))
    frac = x
    for k in range(60, 0, -1):
        frac = x + (k / 2) / frac
    return 1 / (math.sqrt(math.pi) * frac)


def _erfinv(y) -> float:
    """The inverse of erf, by Newton's method on math.erf from Giles' single-precision
    approximation; the steps stop at double precision (a relative error near 1e-16)."""
    y = float(y)
    if math.isnan(y) or abs(y) > 1:
        return math.nan
    if abs(y) == 1:
        return math.copysign(math.inf, y)
    if y == 0:
        return y
    w = -math.log((1 - y) * (1 + y))
    if w < 5:
        w -= 2.5
        p = 2.81022636e-08
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941):
            p = c + p * w
    else:
        w = math.sqrt(w) - 3
        p = -0.000200214257
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                  -0.0076224613, 0.00943887047, 1.00167406, 2.83297682):
            p = c + p * w
    x = p * y
    for _ in range(4):  # Newton: f = erf(x) - y, f' = 2/sqrt(pi) e**(-x*x)
        if abs(y) > 0.5:  # erfc keeps the residual accurate near +-1
            r = math.copysign(1, y) * (math.erfc(abs(x)) - (1 - abs(y)))
            r = -r
        else:
            r = math.erf(x) - y
        x -= r / (2 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def _ndtri(p) -> float:
    """The inverse of the standard normal CDF, by Newton's method on log(ndtr) (through
    erfc, which keeps small tails accurate), to about 1e-15 relative."""
    p = float(p)
    if math.isnan(p) or p < 0 or p > 1:
        return math.nan
    if p == 0:
        return -math.inf
    if p == 1:
        return math.inf
    if p > 0.5:
        return -_ndtri(1 - p)
    # Start from erfinv, or in the far tail (where 2p - 1 rounds to -1) from the leading
    # term of the asymptotic expansion; Newton on log(ndtr(x)) - log(p), which is nearly
    # quadratic in the tail, converges in a few steps.
    x = math.sqrt(2) * _erfinv(2 * p - 1) if p > 1e-8 else -math.sqrt(-2 * math.log(p))
    for _ in range(10):
        cdf = 0.5 * math.erfc(-x / math.sqrt(2))
        density = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        if cdf == 0 or density == 0:
            break
        step = (math.log(cdf) - math.log(p)) * cdf / density
        x -= step
        if abs(step) <= 1e-16 * abs(x):
            break
    return x


_UNARY = {
    # name: (scalar function, summary)
    "lgamma": (_lgamma, "log |gamma(x)|; inf at 0 and the negative integers"),
    "digamma": (_digamma, "the logarithmic derivative of gamma; -+inf at -+0, NaN at the"
                          " negative integers"),
    "erfc": (_erfc, "1 - erf(x), accurate where erf(x) is near 1"),
    "erfcx": (_erfcx, "e**(x*x) * erfc(x), the scaled complementary error function"),
    "erfinv": (_erfinv, "the inverse of erf on [-1, 1] (NaN outside)"),
    "ndtri": (_ndtri, "the inverse of the standard normal CDF on [0, 1] (NaN outside)"),
}


def _float_unary_infer(types, attrs):
    require_dtype(types[0], FLOAT_TYPES)
    return types[0]


def _unary_reference(fn: Callable) -> Callable:
    return lambda x: elementwise(fn, x)



for _name, (_fn, _summary) in _UNARY.items():
    define(_name, arity=1, infer=_float_unary_infer, reference=_unary_reference(_fn),
           traits=("elementwise", "pure"), summary=_summary + ".",
           family="special")


def _polygamma_infer(types, attrs):
    if attrs["n"] < 0:
        raise ShapeError(f"n must be >= 0, got {attrs['n']}")
    return _float_unary_infer(types, attrs)


define("polygamma", arity=1, infer=_polygamma_infer, attrs={"n": Attr("int")},
       reference=lambda x, n: elementwise(lambda v: _polygamma(v, n), x),
       traits=("elementwise", "pure"), family="special",
       summary="the n-th derivative of digamma (n = 0: digamma).")


def _binary_float_infer(types, attrs):
    same_dtype(types)
    require_dtype(types[0], FLOAT_TYPES)
    return TensorType(types[0].dtype, broadcast_shapes(types[0].shape, types[1].shape))


define("zeta", arity=2, infer=_binary_float_infer, reference=lambda x, q: elementwise(_zeta, x, q),
       traits=("elementwise", "pure"), family="special",
       summary="the Hurwitz zeta function sum_k (k + q)**-x, x > 1; broadcasting.")


# -- orthogonal polynomials -----------------------------------------------------------------
def _recurrence(x, n: int, first, step, start: int = 2, last: int | None = None):
    """p_n by a three-term recurrence: p_0 = 1, p_1 = first, p_k = step(k, p_{k-1},
    p_{k-2}) for k = start .. last (ATen stops early once a value is NaN)."""
    t = type(x)
    p, q = t(1), first
    r = q
    for k in range(start, (n if last is None else last) + 1):
        if np.isnan(q):
            break
        r = step(k, q, p)
        p, q = q, r
    return r


def _chebyshev(kind: str, x, n: int):
    """Chebyshev T, U, V, W of degree n as ATen computes them: exact values at +-1, the
    trigonometric form for large n inside (-1, 1), the recurrence otherwise."""
    t = type(x)
    one = t(1)
    if n < 0:
        return t(0)
    if abs(x) == one:
        if kind == "t":
            return one if x > 0 or n % 2 == 0 else -one
        if kind == "u":
            return t(n + 1) if x > 0 or n % 2 == 0 else t(-(n + 1))
        if kind == "v":
            return one if x > 0 else t(2 * n + 1) if n % 2 == 0 else t(-(2 * n + 1))
        return t(2 * n + 1) if x > 0 else one if n % 2 == 0 else -one
    if n > (6 if kind == "t" else 8) and abs(x) < one:
        theta = np.arccos(x)
        if kind == "t":
            return np.cos(t(n) * theta)
        if kind == "u":
            if np.sin(theta) != 0:
                return np.sin(t(n + 1) * theta) / np.sin(theta)
            return t(n + 1) * np.cos(t(n + 1) * theta) / x
        if kind == "v":
            if np.sin(theta / t(2)) != one:
                return np.cos((t(n) + t(0.5)) * theta) / np.cos(theta / t(2))
            return t(2 * n + 1) if n % 2 == 0 else t(-(2 * n + 1))
        if np.cos(theta / t(2)) != one:
            return np.sin((t(n) + t(0.5)) * theta) / np.sin(theta / t(2))
        return t(2 * n + 1) if x > 0 else one if n % 2 == 0 else -one
    first = {"t": x, "u": x + x, "v": x + x - one, "w": x + x + one}[kind]
    if n == 0:
        return one
    return _recurrence(x, n, first, lambda k, q, p: (x + x) * q - p)


_HERMITE_LIMIT = {np.float32: 128, np.float64: 512}


def _polynomial(kind: str, x, n):
    """The degree-n polynomial of `kind` at x; n is truncated to an integer as ATen does
    (a NaN or infinite degree counts as -1 for Hermite, whose value is then 0)."""
    t = type(x)
    one = t(1)
    if kind in ("hermite_h", "hermite_he") and not np.isfinite(n):
        n = -1
    n = int(n) if np.isfinite(n) else np.iinfo(np.int64).min
    if kind.startswith("shifted_chebyshev_"):
        return _chebyshev(kind[-1], x + x - one, n)
    if kind.startswith("chebyshev_"):
        return _chebyshev(kind[-1], x, n)
    if n < 0:
        return t(0)
    if kind in ("hermite_h", "hermite_he"):
        physicists = kind == "hermite_h"
        if n == 0:
            return one
        if n == 1:
            return x + x if physicists else x
        if n > _HERMITE_LIMIT.get(t, 128):
            return t(math.nan)
        if physicists:  # H_{k+1} = 2x H_k - 2k H_{k-1}, stepping the even k of ATen's loop
            p, q = one, x + x
            for k in range(2, 2 * n, 2):
                p, q = q, (x + x) * q - t(k) * p
            return q
        p, q = one, x
        for k in range(1, n):  # x * q fused with the subtraction, as ATen's compiled loop
            p, q = q, _fused_sub(x, q, t(k) * p)
        return q
    if kind == "laguerre_l":
        if abs(x) == 0 or n == 0:
            return one
        if n == 1:
            return one - x
        return _recurrence(x, n - 1, one - x, lambda k, q, p: (
            (t(k + k) + (one - x)) * q - t(k) * p) / t(k + 1), start=1)
    # Legendre
    if abs(x) == one:
        return one if x > 0 or n % 2 == 0 else -one
    if n == 0:
        return one
    if n == 1:
        return x
    return _recurrence(x, n - 1, x, lambda k, q, p: (t(k + k + 1) * x * q - t(k) * p)
                       / t(k + 1), start=1)


def _fused_sub(a, b, c):
    """a * b - c rounded once (a fused multiply-add): a * b is exact in f64 for f32."""
    t = type(a)
    if t is not np.float32:
        return a * b - c
    return t(np.float64(a) * np.float64(b) - np.float64(c))


POLYNOMIALS = ("chebyshev_t", "chebyshev_u", "chebyshev_v", "chebyshev_w",
               "shifted_chebyshev_t", "shifted_chebyshev_u", "shifted_chebyshev_v",
               "shifted_chebyshev_w", "hermite_h", "hermite_he", "laguerre_l", "legendre_p")

define("orthogonal_polynomial", arity=2, infer=_binary_float_infer,
       attrs={"kind": Attr("str", choices=POLYNOMIALS)},
       reference=lambda x, n, kind: elementwise(lambda a, d: _polynomial(kind, a, d), x, n),
       traits=("elementwise", "pure"), family="special",
       summary="the orthogonal polynomial `kind` of degree n (truncated to an integer;"
               " 0 for n < 0) at x, as PyTorch's special.*_polynomial_*.")
