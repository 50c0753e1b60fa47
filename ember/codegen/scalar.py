"""Scalar code: the LLVM types of Ember's dtypes, constants, loads and stores, casts, and one
table per operand kind (float, integer, bool) from each loop-IR op to the instructions that
compute it.

Values live in registers in their compute type: bool is i1, f16 and bf16 are f32 (widened on
load, rounded on store and on a cast to them), every other dtype is itself. In memory a bool
is an i8 holding 0 or 1, an f16 is a `half`, and a bf16 is its i16 bit pattern, converted by
integer arithmetic so that no compiler-rt helper (`__truncsfbf2`) is needed.

Semantics follow the graph IR's reference (NumPy) where NumPy defines them:
- integer `div`/`floordiv`/`mod`/`fmod` by zero give 0, and a signed division by -1 wraps
  (no SIGFPE on INT_MIN / -1);
- shifts by an amount outside [0, width) give 0, or the sign fill for a signed `shr`;
- float -> integer truncates toward zero into i32 or i64, a value outside it or NaN giving
  its minimum, then wraps to the target's width: what PyTorch, NumPy and ONNX Runtime give
  on x86-64 (C leaves it undefined), on every target (`float_to_int`);
- integer `pow` is exact and wraps on overflow, as repeated multiplication does (ATen's);
  a negative exponent gives 1 for a base of 1, +-1 for -1 and 0 for any other base;
- f64 -> f16 rounds once (round-to-odd to f32 first), f64 -> bf16 goes through f32 as
  ml_dtypes does.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator

import numpy as np
from llvmlite import ir

from ember.codegen import CodegenError, vmath
from ember.dtypes import DType

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()


def value_type(t: DType) -> ir.Type:
    """The register type of a value of dtype `t`."""
    if t is DType.bool:
        return I1
    if t.is_float:
        return F64 if t is DType.f64 else F32
    return ir.IntType(8 * t.itemsize)


def storage_type(t: DType) -> ir.Type:
    """The in-memory element type of dtype `t`."""
    return {DType.bool: I8, DType.f16: F16, DType.bf16: I16}.get(t) or value_type(t)


def constant(value: int | float | bool, t: DType) -> ir.Constant:
    """`value` as a constant of `t`'s register type, rounded to `t` first."""
    if t is DType.bool:
        return ir.Constant(I1, int(bool(value)))
    if t.is_float:
        with np.errstate(over="ignore", invalid="ignore"):
            rounded = float(np.array(value, np.float64).astype(t.np))
        return ir.Constant(value_type(t), rounded)
    bits = 8 * t.itemsize
    v = int(value) & ((1 << bits) - 1)  # two's complement, the form LLVM's text accepts
    return ir.Constant(value_type(t), v - (1 << bits) if v >= 1 << (bits - 1) else v)


def _const_like(x: ir.Value, v: int | float) -> ir.Constant:
    return ir.Constant(x.type, v)


# -- external functions: intrinsics by full name, libm by C name ----------------------------------

# How the target names the external functions that code calls (None: as the tables do). A
# GPU has no C library: its code calls libdevice's functions instead (`ember.codegen.nvptx`).
_EXTERNAL_NAMES: contextvars.ContextVar[Callable[[str], str] | None] = \
    contextvars.ContextVar("external_names", default=None)


@contextlib.contextmanager
def external_names(rename: Callable[[str], str]) -> Iterator[None]:
    """Within the block, code that calls the external function `name` calls `rename(name)`
    (a C library function, or an intrinsic that the target lowers to one)."""
    token = _EXTERNAL_NAMES.set(rename)
    try:
        yield
    finally:
        _EXTERNAL_NAMES.reset(token)


def declare(b: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The module's declaration of `name` (as the target names it), added on first use."""
    rename = _EXTERNAL_NAMES.get()
    if rename is not None:
        name = rename(name)
    fnty = ir.FunctionType(ret, args)
    existing = b.module.globals.get(name)
    if existing is None:
        return ir.Function(b.module, fnty, name)
    if not isinstance(existing, ir.Function) or existing.function_type != fnty:
        raise CodegenError(f"the symbol '{name}' that generated code calls is taken by a"
                           " kernel of the same name")
    return existing


def _suffix(ty: ir.Type) -> str:
    return "f32" if ty == F32 else "f64"


def call_intrinsic(b: ir.IRBuilder, base: str, *xs: ir.Value,
                   fastmath: tuple[str, ...] = ()) -> ir.Value:
    """`llvm.<base>.f32/f64` (or on vectors of them) on float operands of one type."""
    ty = xs[0].type
    suffix = f"v{ty.count}{_suffix(ty.element)}" if isinstance(ty, ir.VectorType) else \
        _suffix(ty)
    return b.call(declare(b, f"{base}.{suffix}", ty, [x.type for x in xs]), xs,
                  fastmath=fastmath)


def float_extremum(base: str) -> Emit:
    """max (`llvm.maximum`) or min (`llvm.minimum`): NaN if either operand is NaN, as in
    NumPy and PyTorch. Which of -0 and +0 it gives for the two is left open (`nsz`; NumPy's
    depends on the operands' order): ordering the zeros took x86 three more instructions
    per vector. reduce_max over 256x4096 went 0.100 -> 0.057 ms, ResNet's max pool
    0.221 -> 0.169."""
    return lambda b, t, x, y: call_intrinsic(b, base, x, y, fastmath=("nsz",))


def libm_name(base: str, ty: ir.Type) -> str:
    return base + "f" if ty == F32 else base


def call_libm(b: ir.IRBuilder, base: str, *xs: ir.Value) -> ir.Value:
    """The C library's `<base>f` (f32) or `<base>` (f64); the JIT finds it in the process."""
    ty = xs[0].type
    return b.call(declare(b, libm_name(base, ty), ty, [ty] * len(xs)), xs)


# Names the tables below call through libm, directly or by LLVM lowering an intrinsic. For f32
# (and f16/bf16, which compute in f32) exp, expm1, log, log1p, tanh and erf are inline
# polynomials instead (`ember.codegen.vmath`); f64 keeps the C library.
LIBM_FUNCTIONS = ("expm1", "log1p", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                  "asinh", "acosh", "atanh", "erf")
LOWERED_TO_LIBM = ("exp", "log", "sin", "cos", "pow", "fmod", "floor", "ceil", "trunc",
                   "roundeven", "sqrt", "fmaximum", "fminimum")
# The graph special ops whose reference is a double-precision function: every float type
# calls the C library's f64 one and rounds to its compute type (lgammaf would miss the
# reference by ulps; f16/bf16 round again when stored, as in the reference interpreter).
# lgamma also writes the global `signgam`: a benign race in parallel loops (none reads it).
LIBM_F64_FUNCTIONS = ("lgamma", "erfc")


def reserved_symbols() -> set[str]:
    """Symbols that generated code may call: no kernel may take one of these names."""
    names = {*LIBM_FUNCTIONS, *LOWERED_TO_LIBM, *LIBM_F64_FUNCTIONS}
    return names | {n + "f" for n in names} | {"memset", "memcpy", "memmove"}  # loop idioms


# -- loads and stores -----------------------------------------------------------------------------

def _bf16_round_bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The f32 `x` rounded to bf16 (nearest even; NaN stays a quiet NaN), as i32 bits whose
    low half is zero."""
    bits = b.bitcast(x, I32)
    lsb = b.and_(b.lshr(bits, _const_like(bits, 16)), _const_like(bits, 1))
    rounded = b.add(bits, b.add(_const_like(bits, 0x7FFF), lsb))
    quiet = b.or_(bits, _const_like(bits, 0x0040_0000))
    chosen = b.select(b.fcmp_unordered("uno", x, x), quiet, rounded)
    return b.and_(chosen, _const_like(bits, -65536))  # 0xffff0000


def from_storage(b: ir.IRBuilder, raw: ir.Value, t: DType) -> ir.Value:
    """A loaded element as a register value."""
    if t is DType.bool:
        return b.icmp_unsigned("!=", raw, _const_like(raw, 0))
    if t is DType.f16:
        return b.fpext(raw, F32)
    if t is DType.bf16:
        return b.bitcast(b.shl(b.zext(raw, I32), ir.Constant(I32, 16)), F32)
    return raw


def to_storage(b: ir.IRBuilder, v: ir.Value, t: DType) -> ir.Value:
    """A register value as the element to store (rounding f16/bf16)."""
    if t is DType.bool:
        return b.zext(v, I8)
    if t is DType.f16:
        return b.fptrunc(v, F16)
    if t is DType.bf16:
        return b.trunc(b.lshr(_bf16_round_bits(b, v), ir.Constant(I32, 16)), I16)
    return v


# -- casts -----------------------------------------------------------------------------------------

def _f64_to_f32_round_to_odd(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """f64 -> f32 rounding toward zero with the sticky bit in the last place, so that a
    second rounding (to f16) rounds as if once."""
    t = b.fptrunc(x, F32)
    back = b.fpext(t, F64)
    exact = b.fcmp_unordered("==", back, x)  # NaN counts as exact: keep it
    bits = b.bitcast(t, I32)
    away = b.fcmp_ordered(">", call_intrinsic(b, "llvm.fabs", back),
                          call_intrinsic(b, "llvm.fabs", x))
    toward_zero = b.select(away, b.sub(bits, ir.Constant(I32, 1)), bits)
    odd = b.or_(toward_zero, ir.Constant(I32, 1))
    return b.bitcast(b.select(exact, bits, odd), F32)


def _round_to(b: ir.IRBuilder, x: ir.Value, dst: DType) -> ir.Value:
    """A float register value rounded to f16/bf16, as an f32 register value."""
    if dst is DType.f16:
        if x.type == F64:
            x = _f64_to_f32_round_to_odd(b, x)
        return b.fpext(b.fptrunc(x, F16), F32)
    if x.type == F64:
        x = b.fptrunc(x, F32)
    return b.bitcast(_bf16_round_bits(b, x), F32)


def _fp_to_int(b: ir.IRBuilder, x: ir.Value, ity: ir.IntType, signed: bool) -> ir.Value:
    base = "llvm.fptosi.sat" if signed else "llvm.fptoui.sat"
    return b.call(declare(b, f"{base}.i{ity.width}.{_suffix(x.type)}", ity, [x.type]), [x])


def float_to_int(b: ir.IRBuilder, x: ir.Value, dst: DType) -> ir.Value:
    """As `ember.graph.ops.elementwise.float_to_int` defines it: through i32 or i64, a value
    outside it or NaN giving its minimum, then wrapped to `dst`'s width."""
    ity = value_type(dst)
    wide = I32 if dst.itemsize < 4 or dst is DType.i32 else I64
    t = call_intrinsic(b, "llvm.trunc", x)
    bound = 1 << (wide.width - 1)
    inside = b.and_(b.fcmp_ordered(">=", t, _const_like(x, -float(bound))),
                    b.fcmp_ordered("<", t, high := _const_like(x, float(bound))))
    out = b.select(inside, _fp_to_int(b, t, wide, True), ir.Constant(wide, -bound))
    if dst is DType.u64:
        top = b.and_(b.fcmp_ordered(">=", t, high),
                     b.fcmp_ordered("<", t, _const_like(x, 2.0 ** wide.width)))
        out = b.select(top, _fp_to_int(b, t, wide, False), out)
    return b.trunc(out, ity) if ity.width < wide.width else out


def cast(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """Convert register value `x` of dtype `src` to `dst`."""
    if dst is DType.bool:
        if src is DType.bool:
            return x
        if src.is_float:
            return b.fcmp_unordered("!=", x, _const_like(x, 0.0))
        return b.icmp_unsigned("!=", x, _const_like(x, 0))
    dty = value_type(dst)
    if src is DType.bool:
        return b.uitofp(x, dty) if dst.is_float else b.zext(x, dty)
    if src.is_float and dst.is_float:
        if dst in (DType.f16, DType.bf16):
            return _round_to(b, x, dst)
        if x.type == dty:
            return x
        return b.fpext(x, dty) if dty == F64 else b.fptrunc(x, dty)
    if src.is_int and dst.is_float:
        f = b.sitofp(x, dty) if src.is_signed else b.uitofp(x, dty)
        return _round_to(b, f, dst) if dst in (DType.f16, DType.bf16) else f
    if src.is_float:
        return float_to_int(b, x, dst)
    if dty.width < x.type.width:
        return b.trunc(x, dty)
    if dty.width > x.type.width:
        return b.sext(x, dty) if src.is_signed else b.zext(x, dty)
    return x


# -- op tables: (builder, operand dtype, operand values...) -> value ------------------------------

Emit = Callable[..., ir.Value]


def _intrinsic(base: str) -> Emit:
    return lambda b, t, *xs: call_intrinsic(b, base, *xs)


def _libm(base: str) -> Emit:
    return lambda b, t, *xs: call_libm(b, base, *xs)


def _libm_in_f64(base: str) -> Emit:
    def emit(b, t, x):
        if x.type == F64:
            return call_libm(b, base, x)
        return b.fptrunc(call_libm(b, base, b.fpext(x, F64)), x.type)
    return emit


def _float_sign(b, t, x):
    zero, one = _const_like(x, 0.0), _const_like(x, 1.0)
    zero_or_nan = b.select(b.fcmp_ordered("==", x, zero), zero, x)
    negative = b.select(b.fcmp_ordered("<", x, zero), _const_like(x, -1.0), zero_or_nan)
    return b.select(b.fcmp_ordered(">", x, zero), one, negative)


# The C library's versions of the functions that vmath has: f64 uses them, and swapping them
# into FLOAT_UNARY compares vmath with libm (speed, results).
LIBM_UNARY: dict[str, Emit] = {
    "exp": _intrinsic("llvm.exp"),
    "log": _intrinsic("llvm.log"),
    **{op: _libm(op) for op in ("expm1", "log1p", "tanh", "erf")},
}


def _vector_math(op: str) -> Emit:
    """vmath's inline f32 code for `op` (vectorizable: no call), libm's for f64."""
    inline, libm = vmath.FUNCTIONS[op], LIBM_UNARY[op]
    return lambda b, t, x: inline(b, x) if x.type == F32 else libm(b, t, x)


FLOAT_UNARY: dict[str, Emit] = {
    "neg": lambda b, t, x: b.fneg(x),
    "abs": _intrinsic("llvm.fabs"),
    "sin": _intrinsic("llvm.sin"),
    "cos": _intrinsic("llvm.cos"),
    "sqrt": _intrinsic("llvm.sqrt"),
    "rsqrt": lambda b, t, x: b.fdiv(_const_like(x, 1.0), call_intrinsic(b, "llvm.sqrt", x)),
    "floor": _intrinsic("llvm.floor"),
    "ceil": _intrinsic("llvm.ceil"),
    "trunc": _intrinsic("llvm.trunc"),
    "round": _intrinsic("llvm.roundeven"),
    **{op: _libm(op) for op in LIBM_FUNCTIONS if op not in vmath.FUNCTIONS},
    **{op: _vector_math(op) for op in vmath.FUNCTIONS},
    **{op: _libm_in_f64(op) for op in LIBM_F64_FUNCTIONS},
    "sign": _float_sign,
    "isnan": lambda b, t, x: b.fcmp_unordered("uno", x, x),
    "isinf": lambda b, t, x: b.fcmp_ordered("==", call_intrinsic(b, "llvm.fabs", x),
                                            _const_like(x, math.inf)),
}


def _int_sign(b, t, x):
    zero = _const_like(x, 0)
    if not t.is_signed:
        return b.zext(b.icmp_unsigned("!=", x, zero), x.type)
    positive = b.zext(b.icmp_signed(">", x, zero), x.type)
    return b.sub(positive, b.zext(b.icmp_signed("<", x, zero), x.type))


INT_UNARY: dict[str, Emit] = {
    "neg": lambda b, t, x: b.neg(x),
    "abs": lambda b, t, x: b.select(b.icmp_signed("<", x, _const_like(x, 0)), b.neg(x), x)
    if t.is_signed else x,
    "bitwise_not": lambda b, t, x: b.not_(x),
    "sign": _int_sign,
}

BOOL_UNARY: dict[str, Emit] = {
    "not": lambda b, t, x: b.not_(x),
    "bitwise_not": lambda b, t, x: b.not_(x),
}


def _float_wrong_sign_remainder(b, y, m):
    """The truncated remainder `m` is nonzero (or NaN) and its sign differs from y's."""
    zero = _const_like(m, 0.0)
    nonzero = b.fcmp_unordered("!=", m, zero)
    differ = b.xor(b.fcmp_ordered("<", y, zero), b.fcmp_ordered("<", m, zero))
    return nonzero, b.and_(nonzero, differ)


def _float_mod(b, t, x, y):
    """NumPy's float remainder: the sign of y; +-0 takes y's sign."""
    m = b.frem(x, y)
    nonzero, adjust = _float_wrong_sign_remainder(b, y, m)
    fixed = b.select(adjust, b.fadd(m, y), m)
    signed_zero = call_intrinsic(b, "llvm.copysign", _const_like(m, 0.0), y)
    return b.select(nonzero, fixed, signed_zero)


def _float_floordiv(b, t, x, y):
    """NumPy's float floor division (npy_divmod): exact where floor(x / y) is not."""
    zero, one = _const_like(x, 0.0), _const_like(x, 1.0)
    m = b.frem(x, y)
    div = b.fdiv(b.fsub(x, m), y)
    _, adjust = _float_wrong_sign_remainder(b, y, m)
    div = b.select(adjust, b.fsub(div, one), div)
    fl = call_intrinsic(b, "llvm.floor", div)
    fl = b.select(b.fcmp_ordered(">", b.fsub(div, fl), _const_like(x, 0.5)), b.fadd(fl, one), fl)
    quotient = b.fdiv(x, y)
    result = b.select(b.fcmp_unordered("!=", div, zero), fl,
                      call_intrinsic(b, "llvm.copysign", zero, quotient))
    return b.select(b.fcmp_ordered("==", y, zero), quotient, result)


def _fcmp(cmp: str) -> Emit:
    return lambda b, t, x, y: b.fcmp_ordered(cmp, x, y)  # false when either is NaN


FLOAT_COMPARE = {"eq": "==", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

FLOAT_BINARY: dict[str, Emit] = {
    "add": lambda b, t, x, y: b.fadd(x, y),
    "sub": lambda b, t, x, y: b.fsub(x, y),
    "mul": lambda b, t, x, y: b.fmul(x, y),
    "div": lambda b, t, x, y: b.fdiv(x, y),
    "floordiv": _float_floordiv,
    "mod": _float_mod,
    "fmod": lambda b, t, x, y: b.frem(x, y),
    "pow": _intrinsic("llvm.pow"),
    "max": float_extremum("llvm.maximum"),
    "min": float_extremum("llvm.minimum"),
    "ne": lambda b, t, x, y: b.fcmp_unordered("!=", x, y),  # NaN != anything
    **{op: _fcmp(cmp) for op, cmp in FLOAT_COMPARE.items()},
}


def _safe_divisor(b, t, y):
    """y with the divisors that trap (0, and -1 for signed types) replaced by 1, plus the
    flags y == 0 and y == -1 (None for unsigned types)."""
    is_zero = b.icmp_unsigned("==", y, _const_like(y, 0))
    traps, is_minus_one = is_zero, None
    if t.is_signed:
        is_minus_one = b.icmp_signed("==", y, _const_like(y, -1))
        traps = b.or_(is_zero, is_minus_one)
    return b.select(traps, _const_like(y, 1), y), is_zero, is_minus_one


def _int_div(b, t, x, y):
    """Division truncating toward zero; x / 0 gives 0, x / -1 wraps."""
    safe, is_zero, is_minus_one = _safe_divisor(b, t, y)
    if t.is_signed:
        q = b.select(is_minus_one, b.neg(x), b.sdiv(x, safe))
    else:
        q = b.udiv(x, safe)
    return b.select(is_zero, _const_like(x, 0), q)


def _int_fmod(b, t, x, y):
    """Remainder with the sign of x; 0 for y in {0, -1} (x % 1 == 0)."""
    safe, _, _ = _safe_divisor(b, t, y)
    return b.srem(x, safe) if t.is_signed else b.urem(x, safe)


def _floor_adjust(b, x, r, y):
    """Truncated remainder r is nonzero and has the sign opposite to y."""
    zero = _const_like(x, 0)
    return b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, y), zero))


def _int_mod(b, t, x, y):
    r = _int_fmod(b, t, x, y)
    if not t.is_signed:
        return r
    return b.select(_floor_adjust(b, x, r, y), b.add(r, y), r)


def _int_floordiv(b, t, x, y):
    q = _int_div(b, t, x, y)
    if not t.is_signed:
        return q
    r = _int_fmod(b, t, x, y)
    return b.select(_floor_adjust(b, x, r, y), b.sub(q, _const_like(x, 1)), q)


def _int_pow(b, t, x, y):
    """x ** y by squaring, one step per bit of the exponent (no branches), wrapping as the
    multiplies do; a negative y gives 1 for x = 1, +-1 for x = -1 and 0 otherwise."""
    one, zero = _const_like(x, 1), _const_like(x, 0)
    negative = b.icmp_signed("<", y, zero) if t.is_signed else None
    exponent = y if negative is None else b.select(negative, zero, y)
    result, base = one, x
    for _ in range(x.type.width - t.is_signed):
        result = b.select(b.trunc(exponent, I1), b.mul(result, base), result)
        base = b.mul(base, base)
        exponent = b.lshr(exponent, one)
    if negative is None:
        return result
    odd = b.trunc(y, I1)
    minus_one = b.select(odd, _const_like(x, -1), one)
    tiny = b.select(b.icmp_signed("==", x, one), one,
                    b.select(b.icmp_signed("==", x, _const_like(x, -1)), minus_one, zero))
    return b.select(negative, tiny, result)


def _shl(b, t, x, y):
    width = _const_like(y, x.type.width)
    shifted = b.shl(x, b.and_(y, _const_like(y, x.type.width - 1)))
    return b.select(b.icmp_unsigned("<", y, width), shifted, _const_like(x, 0))


def _shr(b, t, x, y):
    in_range = b.icmp_unsigned("<", y, _const_like(y, x.type.width))
    if t.is_signed:
        return b.ashr(x, b.select(in_range, y, _const_like(y, x.type.width - 1)))
    shifted = b.lshr(x, b.and_(y, _const_like(y, x.type.width - 1)))
    return b.select(in_range, shifted, _const_like(x, 0))


def _icmp(cmp: str) -> Emit:
    def emit(b, t, x, y):
        return (b.icmp_signed if t.is_signed else b.icmp_unsigned)(cmp, x, y)
    return emit


def _pick(cmp: str) -> Emit:
    """max/min as compare and select."""
    def emit(b, t, x, y):
        return b.select(_icmp(cmp)(b, t, x, y), x, y)
    return emit


INT_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
BITWISE = {
    "bitwise_and": lambda b, t, x, y: b.and_(x, y),
    "bitwise_or": lambda b, t, x, y: b.or_(x, y),
    "bitwise_xor": lambda b, t, x, y: b.xor(x, y),
}
COMPARE = {op: _icmp(cmp) for op, cmp in INT_COMPARE.items()}

INT_BINARY: dict[str, Emit] = {
    "add": lambda b, t, x, y: b.add(x, y),
    "sub": lambda b, t, x, y: b.sub(x, y),
    "mul": lambda b, t, x, y: b.mul(x, y),
    "div": _int_div,
    "floordiv": _int_floordiv,
    "mod": _int_mod,
    "fmod": _int_fmod,
    "pow": _int_pow,
    "max": _pick(">"),
    "min": _pick("<"),
    "shl": _shl,
    "shr": _shr,
    **BITWISE,
    **COMPARE,
}

# bool is unsigned for comparisons (false < true); max is `or`, min is `and`.
BOOL_BINARY: dict[str, Emit] = {
    "and": BITWISE["bitwise_and"],
    "or": BITWISE["bitwise_or"],
    "xor": BITWISE["bitwise_xor"],
    "max": BITWISE["bitwise_or"],
    "min": BITWISE["bitwise_and"],
    **BITWISE,
    **COMPARE,
}


def _table(tables: tuple[dict[str, Emit], dict[str, Emit], dict[str, Emit]], t: DType):
    bool_table, float_table, int_table = tables
    return bool_table if t is DType.bool else float_table if t.is_float else int_table


def unary(b: ir.IRBuilder, op: str, t: DType, x: ir.Value) -> ir.Value:
    emit = _table((BOOL_UNARY, FLOAT_UNARY, INT_UNARY), t).get(op)
    if emit is None:
        raise CodegenError(f"no code for unary '{op}' on {t}")
    return emit(b, t, x)


def binary(b: ir.IRBuilder, op: str, t: DType, x: ir.Value, y: ir.Value) -> ir.Value:
    emit = _table((BOOL_BINARY, FLOAT_BINARY, INT_BINARY), t).get(op)
    if emit is None:
        raise CodegenError(f"no code for binary '{op}' on {t}")
    return emit(b, t, x, y)
