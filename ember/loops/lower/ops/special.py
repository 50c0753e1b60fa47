"""Lowerings of the special functions (ember/graph/ops/special.py): lgamma, digamma,
polygamma, zeta, erfc, erfcx, erfinv, ndtri and the orthogonal polynomials.

Each follows its op's reference (Cephes' algorithms, as ATen's Math.h) step by step, in the
same precision and with the same order of operations, so that the compiled code rounds
where the reference rounds:
- lgamma and erfc are loop-IR ops: the C library's f64 functions, rounded;
- digamma, trigamma and the polynomial recurrences compute in the operand's compute type;
- zeta (and polygamma of order >= 2), erfcx, erfinv and ndtri compute in f64, as their
  references do, and round at the store.
f16 and bf16 compute in f32 and round through it, as the interpreter runs them. What is
left between the compiled code and the reference is the difference between the C library's
log/sin/acos and NumPy's, which some of these carry or amplify (the bounds measured are in
tests/codegen/test_special_codegen.py).

An element is computed by statements over scalar locals (`Element`), in which the
reference's data-dependent loops become `for` loops of bounded or computed trip count whose
body an `if` guards; `Val` gives loop-IR expressions Python's operators, so that the code
below reads like the reference's scalar code and groups operations the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ember.dtypes import DType
from ember.graph.ops.special import POLYNOMIALS
from ember.loops.ir import (
    INDEX,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    If,
    Select,
    Stmt,
    Unary,
    Var,
    const,
)
from ember.loops.lower.core import LowerContext, lowering
from ember.loops.lower.ops.reduce import assign, read

F64 = DType.f64

# -- scalar code: expressions with operators, statements over locals --------------------------


class Val:
    """A loop-IR expression with Python's arithmetic, comparison (`eq`/`ne` as methods)
    and logical (`&`, `|`, `~`) operators; a Python number becomes a constant of the other
    operand's dtype."""

    __slots__ = ("e",)

    def __init__(self, e: Expr):
        self.e = e

    @property
    def dtype(self) -> DType:
        return self.e.dtype

    def _lift(self, other: Val | float) -> Expr:
        return other.e if isinstance(other, Val) else const(other, self.dtype)

    def _op(self, op: str, other: Val | float, swap: bool = False) -> Val:
        a, b = self.e, self._lift(other)
        return Val(Binary(op, b, a) if swap else Binary(op, a, b))

    def __add__(self, o): return self._op("add", o)
    def __radd__(self, o): return self._op("add", o, swap=True)
    def __sub__(self, o): return self._op("sub", o)
    def __rsub__(self, o): return self._op("sub", o, swap=True)
    def __mul__(self, o): return self._op("mul", o)
    def __rmul__(self, o): return self._op("mul", o, swap=True)
    def __truediv__(self, o): return self._op("div", o)
    def __rtruediv__(self, o): return self._op("div", o, swap=True)
    def __lt__(self, o): return self._op("lt", o)
    def __le__(self, o): return self._op("le", o)
    def __gt__(self, o): return self._op("gt", o)
    def __ge__(self, o): return self._op("ge", o)
    def __and__(self, o): return self._op("and", o)
    def __or__(self, o): return self._op("or", o)
    def __neg__(self): return Val(Unary("neg", self.e))
    def __invert__(self): return Val(Unary("not", self.e))
    def eq(self, o) -> Val: return self._op("eq", o)
    def ne(self, o) -> Val: return self._op("ne", o)

    def to(self, dtype: DType) -> Val:
        return self if dtype is self.dtype else Val(Cast(dtype, self.e))


def num(value: float, dtype: DType) -> Val:
    return Val(const(value, dtype))


def fn(op: str) -> Callable[[Val], Val]:
    return lambda x: Val(Unary(op, x.e))


log, exp, sqrt, sin, cos, tan, acos, erf, erfc = map(
    fn, ("log", "exp", "sqrt", "sin", "cos", "tan", "acos", "erf", "erfc"))
absolute, trunc, floor, isnan, isinf = map(fn, ("abs", "trunc", "floor", "isnan", "isinf"))


def power(a: Val, b: Val) -> Val:
    return Val(Binary("pow", a.e, b.e))


def fmod(a: Val, b: float) -> Val:
    return a._op("fmod", b)


def maximum(a: Val, b: float) -> Val:
    return a._op("max", b)


def minimum(a: Val, b: float) -> Val:
    return a._op("min", b)


def where(cond: Val, a: Val | float, b: Val | float) -> Val:
    """select(cond, a, b); a number takes the other branch's dtype."""
    if not isinstance(a, Val):
        a = num(a, b.dtype)
    return Val(Select(cond.e, a.e, a._lift(b)))


def horner(z: Val, coefficients: Sequence[float]) -> Val:
    """c0 z^(n-1) + ... + c(n-1), evaluated as `p = p * z + c` from p = c0."""
    p = num(coefficients[0], z.dtype)
    for c in coefficients[1:]:
        p = p * z + c
    return p


class Slot:
    """A scalar local: `.v` reads it, `.set(value)` is the statement that writes it."""

    def __init__(self, buffer: Buffer):
        self.buffer = buffer

    @property
    def v(self) -> Val:
        return Val(read(self.buffer))

    def set(self, value: Val | float | bool) -> Stmt:
        if not isinstance(value, Val):
            value = num(value, self.buffer.dtype)
        return assign(self.buffer, value.e)


class Element:
    """The statements computing one output element; `sub()` starts a nested block (the
    body of a loop or a branch) whose locals belong to the same kernel."""

    def __init__(self, ctx: LowerContext):
        self.ctx = ctx
        self.stmts: list[Stmt] = []

    def sub(self) -> Element:
        return Element(self.ctx)

    def emit(self, *stmts: Stmt) -> None:
        self.stmts.extend(stmts)

    def local(self, dtype: DType) -> Slot:
        return Slot(self.ctx.local(dtype))

    def slot(self, init: Val) -> Slot:
        """A new local holding `init`."""
        slot = self.local(init.dtype)
        self.emit(slot.set(init))
        return slot

    def let(self, value: Val) -> Val:
        """`value` computed once, into a local (codegen does not share common subtrees)."""
        return self.slot(value).v

    def flag(self) -> Slot:
        """A bool local starting false: a loop's early exit."""
        return self.slot(Val(Const(False, DType.bool)))

    def loop(self, start: int | Val, stop: int | Val, body: Callable[[Val], list[Stmt]],
             step: int = 1) -> None:
        var = self.ctx.var("k")
        bounds = [b.e if isinstance(b, Val) else Const(b) for b in (start, stop)]
        self.emit(For(var, *bounds, body(Val(var)), step))

    def cases(self, result: Slot, branches: Sequence[tuple[Val, Val | Element]],
              default: Val | Element) -> None:
        """result = the value of the first branch whose condition holds, else `default`:
        a chain of ifs, so that only the branch taken runs (its loops included)."""
        def block(branch: Val | Element) -> list[Stmt]:
            return branch.stmts if isinstance(branch, Element) else [result.set(branch)]

        stmts = block(default)
        for cond, branch in reversed(branches):
            stmts = [If(cond.e, block(branch), stmts)]
        self.emit(*stmts)


def elementwise(ctx: LowerContext, compute: Callable[[Element, list[Val]], Val]) -> list[Stmt]:
    """The kernel of an elementwise op: compute(element, operand values) at every index
    (operands broadcast, f16/bf16 widened to f32), rounded to the result's dtype (through
    f32 for f16/bf16, as the interpreter rounds)."""
    out = ctx.outputs[0]

    def body(index: list[Var]) -> list[Stmt]:
        el = Element(ctx)
        operands = [Val(ctx.load_broadcast(i, index)) for i in range(len(ctx.inputs))]
        value = compute(el, [el.let(x.to(x.dtype.compute)) for x in operands])
        return [*el.stmts, assign(out, value.to(out.dtype.compute).to(out.dtype).e, index)]

    return ctx.nest(out.shape, body)


# -- lgamma, erfc: the C library's, in f64 (ember/codegen/scalar.py) ---------------------------


@lowering("lgamma", "erfc")
def libm_unary(ctx: LowerContext):
    return ctx.store_each(lambda i: Unary(ctx.op.name, ctx.load(0, i)))


# -- digamma, trigamma, polygamma ----------------------------------------------------------

PSI_A = (8.33333333333333333333E-2, -2.10927960927960927961E-2, 7.57575757575757575758E-3,
         -4.16666666666666666667E-3, 3.96825396825396825397E-3, -8.33333333333333333333E-3,
         8.33333333333333333333E-2)
PSI_10 = 2.25175258906672110764  # digamma(10)


def digamma(el: Element, x: Val) -> Val:
    """Cephes' psi as ATen's calc_digamma: the recurrence up to 10, then the asymptotic
    series; negative x by reflection, its cotangent term in f64."""
    reflected = x < 0
    xs = el.slot(where(reflected, 1 - x, x))
    result = el.slot(num(0, x.dtype))
    # while x < 10: x > 0 here (or NaN, which takes no step), so 10 steps are enough.
    el.loop(0, 10, lambda _: [If((xs.v < 10).e, [result.set(result.v - 1 / xs.v),
                                                  xs.set(xs.v + 1)])])
    z = el.let(1 / (xs.v * xs.v))
    y = where(xs.v < 1e17, z * horner(z, PSI_A), 0)
    series = result.v + log(xs.v) - 0.5 / xs.v - y
    positive = el.let(where(xs.v.eq(10), result.v + PSI_10, series))
    x64 = x.to(F64)
    fraction = x64 - trunc(x64)  # math.modf(x)[0]
    cotangent = (math.pi / tan(math.pi * fraction)).to(x.dtype)
    value = where(reflected, positive - cotangent, positive)
    value = where(reflected & x.eq(trunc(x)), math.nan, value)
    return where(x.eq(0), -(1 / x), value)  # copysign(inf, -x)


def trigamma(el: Element, x: Val) -> Val:
    """ATen's trigamma: reflection below 1/2, six recurrence steps, the asymptotic series."""
    t = x.dtype
    reflected = x < 0.5
    s = el.let(sin(math.pi * x))
    result = el.slot(where(reflected, num(0, t) - math.pi * num(math.pi, t) / (s * s), 0))
    xs = el.slot(where(reflected, 1 - x, x))
    for _ in range(6):
        el.emit(result.set(result.v + 1 / (xs.v * xs.v)), xs.set(xs.v + 1))
    ixx = el.let(1 / (xs.v * xs.v))
    tail = (1 + 1 / (2 * xs.v) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / xs.v
    return where(reflected, num(-1, t), 1) * (result.v + tail)


def polygamma_scale(n: int) -> float:
    """(-1)**(n + 1) n!, as the reference computes it (exp(lgamma(n + 1)))."""
    sign = 1.0 if n % 2 else -1.0
    try:
        return sign * math.exp(math.lgamma(n + 1))
    except OverflowError:  # n > 170
        return sign * math.inf


@lowering("digamma")
def lower_digamma(ctx: LowerContext):
    return elementwise(ctx, lambda el, xs: digamma(el, xs[0]))


@lowering("polygamma")
def lower_polygamma(ctx: LowerContext):
    n = ctx.attrs["n"]

    def compute(el: Element, xs: list[Val]) -> Val:
        x = xs[0]
        if n == 0:
            return digamma(el, x)
        if n == 1:
            return trigamma(el, x)
        # zeta(n + 1, x) in f64, rounded to x's type; times n! in f64.
        s = zeta(el, num(n + 1, x.dtype).to(F64), x.to(F64))
        return polygamma_scale(n) * s.to(x.dtype).to(F64)

    return elementwise(ctx, compute)


# -- zeta ----------------------------------------------------------------------------------

ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
          7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
          -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18)
MACHEP = 1.11022302462515654042E-16


def zeta(el: Element, x: Val, q: Val) -> Val:
    """The Hurwitz zeta function in f64 (Cephes' zeta, as ATen): the direct sum while
    i < 9 or q + i <= 9, then the Euler-Maclaurin tail, each with its early exit."""
    bad_pole = (q <= 0) & (q.eq(floor(q)) | x.ne(floor(x)))
    regular = (x > 1) & ~isnan(q) & ~bad_pole
    s = el.slot(power(q, -x))
    a, b, done = el.slot(q), el.slot(num(0, F64)), el.flag()
    # The sum's trip count bounds the reference's `while i < 9 or a <= 9`, which the body
    # checks; zero for the special cases (a negative q may otherwise ask for many steps).
    trips = where(regular, maximum(floor(9 - q) + 2, 9), 0)

    def direct(i: Val) -> list[Stmt]:
        step = el.sub()
        step.emit(a.set(a.v + 1), b.set(power(a.v, -x)), s.set(s.v + b.v),
                  done.set((-MACHEP * s.v < b.v) & (b.v < MACHEP * s.v)))
        return [If((~done.v & ((i < 9) | (a.v <= 9))).e, step.stmts)]

    el.loop(0, Val(Cast(INDEX, trips.e)), direct)
    tail = el.sub()
    w = a.v
    tail.emit(s.set(s.v + b.v * w / (x - 1)), s.set(s.v - 0.5 * b.v))
    factor = tail.slot(num(1, F64))
    for j, coef in enumerate(ZETA_A):  # k = 2j, then 2j + 1
        term = tail.sub()
        term.emit(factor.set(factor.v * (x + 2 * j)), b.set(b.v / w))
        term_value = term.let(factor.v * b.v / coef)
        term.emit(s.set(s.v + term_value), done.set(absolute(term_value / s.v) < MACHEP),
                  factor.set(factor.v * (x + (2 * j + 1))), b.set(b.v / w))
        tail.emit(If((~done.v).e, term.stmts))
    el.emit(If((~done.v).e, tail.stmts))
    value = where((q <= 0) & x.ne(floor(x)), math.nan, s.v)
    value = where((q <= 0) & q.eq(floor(q)), math.inf, value)
    value = where(~(x >= 1) | isnan(q), math.nan, value)
    return where(x.eq(1), math.inf, value)


@lowering("zeta")
def lower_zeta(ctx: LowerContext):
    return elementwise(ctx, lambda el, xq: zeta(el, xq[0].to(F64), xq[1].to(F64)))


# -- erfcx, erfinv, ndtri (in f64) ---------------------------------------------------------


def erfcx(el: Element, x: Val) -> Val:
    """e**(x*x) erfc(x) below 26; above, the continued fraction of the asymptotic series,
    60 terms from the deepest up."""
    frac = el.slot(x)
    fraction = el.sub()
    fraction.loop(0, 60, lambda j: [frac.set(x + (60 - j).to(F64) / 2 / frac.v)])
    el.emit(If((x >= 26).e, fraction.stmts))
    direct = where(x < -26.7, math.inf, exp(x * x) * erfc(x))
    return where(x < 26, direct, 1 / (math.sqrt(math.pi) * frac.v))


GILES_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                 0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
GILES_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
              -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def erfinv(el: Element, y: Val) -> Val:
    """Giles' single-precision approximation, then four Newton steps on erf (on erfc where
    |y| > 1/2, which keeps the residual accurate near +-1), in f64."""
    w = el.let(-log((1 - y) * (1 + y)))
    p = where(w < 5, horner(w - 2.5, GILES_CENTRAL), horner(sqrt(w) - 3, GILES_TAIL))
    x = el.slot(p * y)
    r = el.slot(num(0, F64))
    near_one = absolute(y) > 0.5
    sign = where(y < 0, -1.0, num(1, F64))  # copysign(1, y), y != 0
    for _ in range(4):
        el.emit(If(near_one.e, [r.set(-(sign * (erfc(absolute(x.v)) - (1 - absolute(y)))))],
                   [r.set(erf(x.v) - y)]),
                x.set(x.v - r.v / (2 / math.sqrt(math.pi) * exp(-x.v * x.v))))
    value = where(y.eq(0), y, x.v)
    value = where(absolute(y).eq(1), where(y > 0, math.inf, num(-math.inf, F64)), value)
    return where(isnan(y) | (absolute(y) > 1), math.nan, value)


def ndtri(el: Element, p: Val) -> Val:
    """Newton's method on log(ndtr) (through erfc) from erfinv, or in the far tail from the
    leading term of the asymptotic expansion; the upper half by symmetry."""
    upper = p > 0.5
    lower = el.let(where(upper, 1 - p, p))
    start = where(lower > 1e-8, math.sqrt(2) * erfinv(el, 2 * lower - 1),
                  -sqrt(-2 * log(lower)))
    x, done = el.slot(start), el.flag()
    cdf, density = el.slot(num(0, F64)), el.slot(num(0, F64))

    def newton(_: Val) -> list[Stmt]:
        step = el.sub()
        dx = step.let((log(cdf.v) - log(lower)) * cdf.v / density.v)
        step.emit(x.set(x.v - dx), done.set(absolute(dx) <= 1e-16 * absolute(x.v)))
        return [If((~done.v).e, [
            cdf.set(0.5 * erfc(-x.v / math.sqrt(2))),
            density.set(exp(-0.5 * x.v * x.v) / math.sqrt(2 * math.pi)),
            If((cdf.v.eq(0) | density.v.eq(0)).e, [done.set(True)], step.stmts)])]

    el.loop(0, 10, newton)
    value = where(upper, -x.v, x.v)
    value = where(p.eq(1), math.inf, value)
    value = where(p.eq(0), num(-math.inf, F64), value)
    return where(isnan(p) | (p < 0) | (p > 1), math.nan, value)


@lowering("erfcx", "erfinv", "ndtri")
def lower_in_f64(ctx: LowerContext):
    compute = {"erfcx": erfcx, "erfinv": erfinv, "ndtri": ndtri}[ctx.op.name]
    return elementwise(ctx, lambda el, xs: compute(el, xs[0].to(F64)))


# -- orthogonal polynomials ----------------------------------------------------------------

HERMITE_LIMIT = {DType.f32: 128, DType.f64: 512}  # above: NaN (ATen's overflow guard)


class Degree:
    """The degree operand truncated to an integer, as the reference does: `n` (a float),
    `count` (i64, for trip counts) and `valid` (finite and >= 0; else the value is 0)."""

    def __init__(self, el: Element, n: Val):
        self.n = el.let(trunc(n))
        self.valid = ~isnan(n) & ~isinf(n) & (self.n >= 0)
        # Clamped so that count + 1 cannot overflow; a loop that long never ends anyway.
        self.count = Val(Cast(INDEX, minimum(self.n, 2.0 ** 62).e))
        self.even = fmod(self.n, 2).eq(0)


def recurrence(el: Element, first: Val, start: int, stop: Val,
               step: Callable[[Val, Val, Val], Val], every: int = 1) -> Val:
    """p_0 = 1, p_1 = first, p_k = step(k, p_{k-1}, p_{k-2}) for k in range(start, stop,
    every); the last value. (ATen stops at a NaN, which the steps would keep anyway.)"""
    p, q, nxt = el.slot(num(1, first.dtype)), el.slot(first), el.local(first.dtype)
    el.loop(start, stop, lambda k: [nxt.set(step(k, q.v, p.v)), p.set(q.v), q.set(nxt.v)],
            every)
    return q.v


def chebyshev(el: Element, result: Slot, kind: str, x: Val, d: Degree) -> None:
    """Chebyshev T, U, V, W: exact at +-1, the trigonometric form for large n inside
    (-1, 1), the recurrence otherwise."""
    n, t, one = d.n, x.dtype, num(1, x.dtype)
    positive = x > 0
    n1, odd_n = n + 1, n + n + 1  # t(n + 1), t(2n + 1): exact sums, rounded once
    at_one = {"t": where(positive | d.even, one, -one),
              "u": where(positive | d.even, n1, -n1),
              "v": where(positive, one, where(d.even, odd_n, -odd_n)),
              "w": where(positive, odd_n, where(d.even, one, -one))}[kind]
    trig = el.sub()
    theta = trig.let(acos(x))
    half = n + 0.5
    if kind == "t":
        value = cos(n * theta)
    elif kind == "u":
        s = sin(theta)
        value = where(s.ne(0), sin(n1 * theta) / s, n1 * cos(n1 * theta) / x)
    elif kind == "v":
        value = where(sin(theta / 2).ne(1), cos(half * theta) / cos(theta / 2),
                      where(d.even, odd_n, -odd_n))
    else:
        value = where(cos(theta / 2).ne(1), sin(half * theta) / sin(theta / 2), at_one)
    trig.emit(result.set(value))
    recur = el.sub()
    first = {"t": x, "u": x + x, "v": x + x - one, "w": x + x + one}[kind]
    recur.emit(result.set(recurrence(recur, first, 2, d.count + 1,
                                     lambda k, q, p: (x + x) * q - p)))
    large = (n > (6 if kind == "t" else 8)) & (absolute(x) < 1)
    el.cases(result, [(~d.valid, num(0, t)), (absolute(x).eq(1), at_one), (large, trig),
                      (n.eq(0), one)], recur)


def hermite(el: Element, result: Slot, physicists: bool, x: Val, d: Degree) -> None:
    """H_{k+1} = 2x H_k - 2k H_{k-1} (physicists'), He_{k+1} = x He_k - k He_{k-1}; NaN
    above ATen's degree limit."""
    t = x.dtype
    recur = el.sub()
    if physicists:
        value = recurrence(recur, x + x, 2, d.count + d.count,
                           lambda k, q, p: (x + x) * q - k.to(t) * p, every=2)
    elif t is DType.f32:
        # x * q fused with the subtraction, as ATen's compiled loop: x * q is exact in f64.
        value = recurrence(recur, x, 1, d.count, lambda k, q, p: (
            x.to(F64) * q.to(F64) - (k.to(t) * p).to(F64)).to(t))
    else:
        value = recurrence(recur, x, 1, d.count, lambda k, q, p: x * q - k.to(t) * p)
    recur.emit(result.set(value))
    el.cases(result, [(~d.valid, num(0, t)), (d.n.eq(0), num(1, t)),
                      (d.n > HERMITE_LIMIT[t], num(math.nan, t))], recur)


def laguerre(el: Element, result: Slot, x: Val, d: Degree) -> None:
    """L_{k+1} = ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1); 1 at x = 0."""
    t = x.dtype
    recur = el.sub()
    recur.emit(result.set(recurrence(recur, 1 - x, 1, d.count, lambda k, q, p: (
        ((k + k).to(t) + (1 - x)) * q - k.to(t) * p) / (k + 1).to(t))))
    el.cases(result, [(~d.valid, num(0, t)), (x.eq(0) | d.n.eq(0), num(1, t))], recur)


def legendre(el: Element, result: Slot, x: Val, d: Degree) -> None:
    """P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1); exact at +-1."""
    t = x.dtype
    one = num(1, t)
    recur = el.sub()
    recur.emit(result.set(recurrence(recur, x, 1, d.count, lambda k, q, p: (
        (k + k + 1).to(t) * x * q - k.to(t) * p) / (k + 1).to(t))))
    el.cases(result, [(~d.valid, num(0, t)),
                      (absolute(x).eq(1), where((x > 0) | d.even, one, -one)),
                      (d.n.eq(0), one)], recur)


@lowering("orthogonal_polynomial")
def lower_orthogonal_polynomial(ctx: LowerContext):
    kind = ctx.attrs["kind"]
    assert kind in POLYNOMIALS

    def compute(el: Element, xn: list[Val]) -> Val:
        x, d = xn[0], Degree(el, xn[1])
        result = el.slot(num(0, x.dtype))
        if kind.startswith("shifted_chebyshev_"):
            chebyshev(el, result, kind[-1], el.let(x + x - 1), d)
        elif kind.startswith("chebyshev_"):
            chebyshev(el, result, kind[-1], x, d)
        elif kind.startswith("hermite_"):
            hermite(el, result, kind == "hermite_h", x, d)
        elif kind == "laguerre_l":
            laguerre(el, result, x, d)
        else:
            legendre(el, result, x, d)
        return result.v

    return elementwise(ctx, compute)
