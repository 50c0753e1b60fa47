"""Vector math: f32 exp, expm1, log, log1p, tanh and erf as inline LLVM IR.

Each function here emits, with an llvmlite IRBuilder, straight-line code for an f32 value:
arithmetic, integer bit manipulation and `select`, no calls and no branches, so that LLVM's
loop and SLP vectorizers widen a loop of them to 8 x f32 (AVX2) or wider; a call to libm's
`expf` would keep such a loop scalar. The same functions take a vector of f32 (`<8 x float>`)
and compute every lane, for code that builds vectors itself. Products and sums go through
`llvm.fmuladd`, fused where the target has FMA.

The method is Cephes/SLEEF's: reduce the argument to a small interval, evaluate a
polynomial there, undo the reduction.
- exp: x = n ln2 + r with n = round(x / ln2) (by adding 1.5 * 2^23) and a two-constant
  (Cody-Waite) ln2, e^r = 1 + r + r^2 P(r) for |r| <= ln2/2, times 2^n built in the
  exponent bits, in two factors 2^(n/2) so that overflow gives inf and results below
  2^-126 round once into the denormals (or by `llvm.ldexp`, one instruction on AVX-512:
  `scaling_by_ldexp`). x is clamped to [-104, 89] first: below, the result rounds to 0;
  above, to inf.
- expm1: the same reduction; (2^n e^r - 1) as 2^n (e^r - 1) + (2^n - 1), and e^r - 1 itself
  when n = 0, so that there is no cancellation near 0.
- log: x = m 2^e with m in [sqrt(1/2), sqrt(2)) from the bits (denormals scaled by 2^23
  first); log(m) = f - f^2/2 + f^3 P(f), f = m - 1; plus e ln2 in two parts.
- log1p: the same for u = 1 + x, with the rounding error of u, x - (u - 1), folded into
  f (f = x exactly when u is in [sqrt(1/2), sqrt(2))).
- tanh: x + x^3 P(x^2) for |x| < 0.9, else 1 - 2t / (1 + t) with t = e^(-2|x|).
- erf: x (2/sqrt(pi) + Q(x^2)) for |x| < 1, else 1 - e^(-x^2) G(|x|) with |x| clamped to 4,
  beyond which erf rounds to +-1.
Special values are exact: exp(-inf) = 0, exp(inf) = inf, log(0) = -inf, log(x < 0) = NaN,
log(inf) = inf, tanh(+-inf) = +-1, erf(+-inf) = +-1, f(-0) = -0 for the odd functions,
NaN in gives NaN out.

The polynomials are minimax fits for the error that matters at the end (relative, or
absolute against 1 for erf's tail) with coefficients rounded to f32 one at a time, each
remaining one refitted (Remez exchange). Maximum errors against NumPy in f64 (torch's f64
erf), measured over all 2^32 inputs on an x86-64 host with FMA; tests/codegen/test_vmath.py
checks them on 2^22 of those plus the special values and thresholds:

    exp    0.98 ulp at x ~ -5.8         log    0.81 ulp at x ~ 1.40 (near sqrt(2))
    expm1  1.44 ulp at x ~ 17 (n > 24)  log1p  1.39 ulp at x ~ 0.414 (u near sqrt(2))
    tanh   1.23 ulp at |x| ~ 0.90       erf    1.28 ulp at |x| ~ 0.97

Without FMA (x86-64-v2; on the 2^22-point sweep) erf reaches 1.97 ulp; the others do not grow.
f64 keeps the C library (`ember.codegen.scalar`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import numpy as np
from llvmlite import ir

from ember.codegen import CodegenError

F32, I32 = ir.FloatType(), ir.IntType(32)

# -- constants -------------------------------------------------------------------------------------

LOG2E = 1.4426950408889634
ROUND_MAGIC = 12582912.0  # 1.5 * 2^23: adding it rounds |v| < 2^22 to an integer, in the low bits
ROUND_MAGIC_BITS = 0x4B40_0000
# ln2 = LN2_HI + LN2_LO; LN2_HI has 15 significant bits, so n * LN2_HI is exact for |n| < 512.
LN2_HI = 0.693145751953125
LN2_LO = 1.4286068e-06
EXP_LO, EXP_HI = -104.0, 89.0  # e^x rounds to 0 below -103.98 and overflows above 88.73
EXPM1_LO = -18.0  # e^x - 1 rounds to -1 below -17.33
FLT_MIN = 2.0 ** -126  # the smallest normal f32
SQRT_HALF_BITS = 0x3F35_04F3  # sqrt(1/2) as f32 bits
TANH_SMALL = 0.9
ERF_SMALL, ERF_CLAMP = 1.0, 4.0
ERF_TAIL_CENTER = 2.5
TWO_OVER_SQRT_PI = 1.1283792  # rounded to f32; ERF_POLY starts with the rest of it

# Polynomial coefficients, lowest order first.
# e^r = 1 + r + r^2 EXP_POLY(r), |r| <= ln2/2: error 2^-31 relative.
EXP_POLY = (0.5, 0.16666648, 0.041666478, 0.008337783, 0.0013933836, 0.00017436294)
# log(1 + f) = f - f^2/2 + f^3 LOG_POLY(f), f in [sqrt(1/2) - 1, sqrt(2) - 1]: 2^-29 relative.
LOG_POLY = (0.33333313, -0.25000167, 0.20002224, -0.16659367, 0.14209557, -0.12549612,
            0.12108878, -0.10918139, 0.05342011)
# tanh(x) = x + x^3 TANH_POLY(x^2), |x| < 0.9: 2^-29.8 relative.
TANH_POLY = (-0.33333322, 0.13332981, -0.053929474, 0.021664092, -0.008265454, 0.0025834232,
             -0.0004557081)
# erf(x) = x (TWO_OVER_SQRT_PI + ERF_POLY(x^2)), |x| < 1: 2^-29 relative.
ERF_POLY = (-6.000418e-08, -0.37612626, 0.11283586, -0.026853837, 0.005188348, -0.0008010163,
            7.8531535e-05)
# erfc(a) e^(a^2) = ERF_TAIL_POLY(a - 2.5), a in [1, 4]: 2^-28 absolute on erf.
ERF_TAIL_POLY = (0.2108076, -0.07434219, 0.024914566, -0.008132381, 0.0023025041,
                 -0.0006608079, 0.00054372725, 0.00022527488, 0.00010688388)


# Whether the code being emitted is for a target whose LLVM backend turns `llvm.ldexp` on
# vectors into one instruction (x86's AVX-512 vscalefps); elsewhere it is a call per lane.
_VECTOR_LDEXP = contextvars.ContextVar("vector_ldexp", default=False)


@contextlib.contextmanager
def scaling_by_ldexp(enabled: bool):
    """Inside the block, exp (and tanh and erf, through it) scales e^r by 2^n with
    `llvm.ldexp` when `enabled`: one instruction, rounding once into the denormals as the
    two factors of the portable code do (`Target.vector_ldexp`)."""
    token = _VECTOR_LDEXP.set(enabled)
    try:
        yield
    finally:
        _VECTOR_LDEXP.reset(token)


# -- building blocks -------------------------------------------------------------------------------

class _Code:
    """Instructions on one builder for f32 values of one shape: a scalar or a vector, its i32
    twin for the bit manipulation, and constants splat to that shape."""

    def __init__(self, b: ir.IRBuilder, x: ir.Value, name: str):
        t = x.type
        lanes = t.count if isinstance(t, ir.VectorType) and t.element == F32 else None
        if t != F32 and lanes is None:
            raise CodegenError(f"vector math '{name}' takes f32 values or vectors of them,"
                               f" not {t}")
        self.b, self.float = b, t
        self.int = I32 if lanes is None else ir.VectorType(I32, lanes)
        self.suffix = "f32" if lanes is None else f"v{lanes}f32"  # intrinsic name mangling
        self.lanes = lanes

    def f(self, value: float) -> ir.Constant:
        v = float(np.float32(value))
        return ir.Constant(self.float, v if self.lanes is None else [v] * self.lanes)

    def i(self, value: int) -> ir.Constant:
        return ir.Constant(self.int, value if self.lanes is None else [value] * self.lanes)

    def intrinsic(self, name: str, *xs: ir.Value, suffix: str = "") -> ir.Value:
        """`llvm.<name>` on operands of this shape (fabs, copysign, fmuladd: floats) giving
        a float; `suffix` adds to the name's mangling (for an i32 operand)."""
        full = f"llvm.{name}.{self.suffix}{suffix}"
        fn = self.b.module.globals.get(full) or ir.Function(
            self.b.module, ir.FunctionType(self.float, [x.type for x in xs]), full)
        return self.b.call(fn, xs)

    def fma(self, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        """x * y + z, one rounding where the target has FMA."""
        return self.intrinsic("fmuladd", x, y, z)

    def poly(self, x: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
        """sum(coeffs[k] x^k) by Horner's rule."""
        acc = self.f(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, self.f(c))
        return acc

    def abs(self, x: ir.Value) -> ir.Value:
        return self.intrinsic("fabs", x)

    def copysign(self, magnitude: ir.Value, sign: ir.Value) -> ir.Value:
        return self.intrinsic("copysign", magnitude, sign)

    def below(self, x: ir.Value, bound: float) -> ir.Value:
        """x < bound (false for NaN)."""
        return self.b.fcmp_ordered("<", x, self.f(bound))

    def clamp(self, x: ir.Value, lo: float | None, hi: float | None) -> ir.Value:
        """x limited to [lo, hi]; NaN stays NaN (ordered compares are false for it)."""
        if hi is not None:
            x = self.b.select(self.b.fcmp_ordered(">", x, self.f(hi)), self.f(hi), x)
        if lo is not None:
            x = self.b.select(self.below(x, lo), self.f(lo), x)
        return x

    def ldexp(self, x: ir.Value, n: ir.Value) -> ir.Value:
        """x 2^n (n i32), rounded once."""
        return self.intrinsic("ldexp", x, n,
                              suffix=".i32" if self.lanes is None else f".v{self.lanes}i32")

    def pow2(self, n: ir.Value) -> ir.Value:
        """2^n as f32, for i32 n in [-126, 127]: n + 127 in the exponent field."""
        b = self.b
        return b.bitcast(b.shl(b.add(n, self.i(127)), self.i(23)), self.float)


# -- exp and expm1 ---------------------------------------------------------------------------------

def _exp_reduce(c: _Code, x: ir.Value, lo: float) -> tuple[ir.Value, ir.Value]:
    """x clamped to [lo, EXP_HI] as n ln2 + r: n (i32) and e^r - 1, |r| <= ln2/2."""
    b = c.b
    x = c.clamp(x, lo, EXP_HI)
    shifted = c.fma(x, c.f(LOG2E), c.f(ROUND_MAGIC))  # 1.5 * 2^23 + round(x / ln2)
    n = b.sub(b.bitcast(shifted, c.int), c.i(ROUND_MAGIC_BITS))
    n_float = b.fsub(shifted, c.f(ROUND_MAGIC))
    r = c.fma(n_float, c.f(-LN2_HI), x)  # exact: n LN2_HI is, and it is close to x
    r = c.fma(n_float, c.f(-LN2_LO), r)
    return n, c.fma(b.fmul(r, r), c.poly(r, EXP_POLY), r)


def _exp(c: _Code, x: ir.Value) -> ir.Value:
    b = c.b
    n, expm1_r = _exp_reduce(c, x, EXP_LO)
    if _VECTOR_LDEXP.get():  # exp's kernel 0.273 -> 0.225 ms on 1M floats (AVX-512)
        return c.ldexp(b.fadd(expm1_r, c.f(1.0)), n)
    half = b.ashr(n, c.i(1))  # 2^n as 2^half 2^(n - half): both normal for n in [-150, 128]
    scaled = b.fmul(b.fadd(expm1_r, c.f(1.0)), c.pow2(half))
    return b.fmul(scaled, c.pow2(b.sub(n, half)))  # the only rounding into denormals


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x."""
    return _exp(_Code(b, x, "exp"), x)


def expm1(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x - 1, accurate near 0."""
    c = _Code(b, x, "expm1")
    n, expm1_r = _exp_reduce(c, x, EXPM1_LO)
    # (2^n e^r - 1) / 2 = 2^(n-1) (e^r - 1) + (2^(n-1) - 1/2): 2^(n-1) is normal up to n = 128,
    # and doubling the half is exact (or overflows as the result should).
    s = c.pow2(b.sub(n, c.i(1)))
    half = c.fma(s, expm1_r, b.fsub(s, c.f(0.5)))
    y = b.select(b.icmp_signed("==", n, c.i(0)), expm1_r, b.fadd(half, half))
    return c.copysign(y, x)  # e^x - 1 has x's sign, -0 included


# -- log and log1p ---------------------------------------------------------------------------------

def _log_reduce(c: _Code, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """A finite normal x > 0 as 2^e m with m in [sqrt(1/2), sqrt(2)): m - 1 (exact) and e
    (i32), from the bits of x relative to those of sqrt(1/2)."""
    b = c.b
    rel = b.sub(b.bitcast(x, c.int), c.i(SQRT_HALF_BITS))
    m = b.bitcast(b.add(b.and_(rel, c.i(0x7F_FFFF)), c.i(SQRT_HALF_BITS)), c.float)
    return b.fsub(m, c.f(1.0)), b.ashr(rel, c.i(23))


def _log_poly(c: _Code, f: ir.Value, e: ir.Value) -> ir.Value:
    """log(1 + f) + e ln2 for f in [sqrt(1/2) - 1, sqrt(2) - 1] and an i32 e."""
    b = c.b
    e_float = b.sitofp(e, c.float)
    f2 = b.fmul(f, f)
    # Small terms first: e LN2_LO + f^3 P(f) - f^2/2, then f, then e LN2_HI (exact).
    y = c.fma(e_float, c.f(LN2_LO), b.fmul(b.fmul(f2, f), c.poly(f, LOG_POLY)))
    y = b.fadd(f, c.fma(f2, c.f(-0.5), y))
    return c.fma(e_float, c.f(LN2_HI), y)


def _log_specials(c: _Code, x: ir.Value, y: ir.Value, pole: float) -> ir.Value:
    """y where log's argument x is finite and above `pole`; inf, NaN, -inf and NaN at
    x = inf, x NaN, x = pole and x < pole."""
    b = c.b
    y = b.select(b.fcmp_unordered("==", x, c.f(math.inf)), x, y)
    y = b.select(b.fcmp_ordered("==", x, c.f(pole)), c.f(-math.inf), y)
    return b.select(c.below(x, pole), c.f(math.nan), y)


def log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The natural logarithm."""
    c = _Code(b, x, "log")
    tiny = c.below(x, FLT_MIN)  # denormals (and x <= 0): scale by 2^23
    f, e = _log_reduce(c, b.select(tiny, b.fmul(x, c.f(2.0 ** 23)), x))
    y = _log_poly(c, f, b.sub(e, b.select(tiny, c.i(23), c.i(0))))
    return _log_specials(c, x, y, 0.0)


def log1p(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1 + x), accurate near 0."""
    c = _Code(b, x, "log1p")
    u = b.fadd(x, c.f(1.0))  # normal for x > -1
    lost = b.fsub(x, b.fsub(u, c.f(1.0)))  # 1 + x - u, exact: what rounding u dropped
    f, e = _log_reduce(c, u)
    # 1 + x = 2^e (1 + f + lost 2^-e): fold lost into f. For e = 0 that gives x itself.
    # lost is 0 where e > 24, so clamping -e to a normal power of 2 changes nothing.
    minus_e = b.sub(c.i(0), e)
    minus_e = b.select(b.icmp_signed("<", minus_e, c.i(-126)), c.i(-126), minus_e)
    f = c.fma(lost, c.pow2(minus_e), f)
    return _log_specials(c, x, c.copysign(_log_poly(c, f, e), x), -1.0)  # log1p(-0) = -0


# -- tanh and erf ----------------------------------------------------------------------------------

def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The hyperbolic tangent."""
    c = _Code(b, x, "tanh")
    a = c.abs(x)
    a2 = b.fmul(a, a)
    small = c.fma(b.fmul(a, a2), c.poly(a2, TANH_POLY), a)
    t = _exp(c, b.fmul(a, c.f(-2.0)))  # in (0, 0.17]; 0 for large |x|, giving 1
    large = b.fsub(c.f(1.0), b.fdiv(b.fadd(t, t), b.fadd(c.f(1.0), t)))
    return c.copysign(b.select(c.below(a, TANH_SMALL), small, large), x)  # NaN: large, NaN


def erf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The error function."""
    c = _Code(b, x, "erf")
    a = c.abs(x)
    small = c.fma(a, c.f(TWO_OVER_SQRT_PI), b.fmul(a, c.poly(b.fmul(a, a), ERF_POLY)))
    clamped = c.clamp(a, None, ERF_CLAMP)
    erfc = b.fmul(_exp(c, b.fneg(b.fmul(clamped, clamped))),
                  c.poly(b.fsub(clamped, c.f(ERF_TAIL_CENTER)), ERF_TAIL_POLY))
    y = b.select(c.below(a, ERF_SMALL), small, b.fsub(c.f(1.0), erfc))
    return c.copysign(y, x)


# The functions by the loop-IR op they compute.
FUNCTIONS = {"exp": exp, "expm1": expm1, "log": log, "log1p": log1p, "tanh": tanh, "erf": erf}
