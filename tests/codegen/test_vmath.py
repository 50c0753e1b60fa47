"""Vector math (`ember.codegen.vmath`): f32 exp, expm1, log, log1p, tanh and erf, compiled
for the host, against NumPy in f64 (the C library's erf for erf) over the whole f32 range.

The sweep takes every 1021st bit pattern of the 2^32 (about 4.2M points: every binade, both
signs, denormals, infinities, NaNs), plus the special values and the thresholds where a
result overflows, underflows or saturates. The error is |got - exact| in units of the last
place of the exact value rounded to f32 (2^-149 below 2^-126); a result in the wrong class
(NaN, inf, finite) counts as an infinite error. The bounds are those measured (see the
module docstring of vmath and docs/loop-ir.md), so a less accurate change fails here.
"""

from __future__ import annotations

import functools
import math
import re

import ml_dtypes
import numpy as np
import pytest
from llvmlite import ir

from ember.codegen import CodegenError, cpu, vmath
from ember.codegen.llvm import kernel_module
from ember.loops.text import parse_kernel
from ember.target import Target

HOST = Target.host()

_erf = np.frompyfunc(math.erf, 1, 1)
REFERENCE = {
    "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "tanh": np.tanh,
    "erf": lambda x: np.asarray(_erf(x), np.float64),
}
# Bounds in ulps, just above the maximum over all 2^32 inputs (exp 0.98, expm1 1.44, log 0.81,
# log1p 1.39, tanh 1.23, erf 1.28); the issue asks <= 4 for exp and log.
MAX_ULP = {"exp": 1.0, "expm1": 1.5, "log": 1.0, "log1p": 1.5, "tanh": 1.25, "erf": 1.3}
FLT_MIN, FLT_TRUE_MIN, FLT_MAX = 2.0 ** -126, 2.0 ** -149, float(np.finfo(np.float32).max)
SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, FLT_MIN, -FLT_MIN,
            FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_MAX, -FLT_MAX, 1e-30, -1e-30, 2.0 ** -24, 0.5]
# Where exp overflows (88.72), rounds to 0 (-103.97), leaves the normals (-87.34), where
# expm1 saturates (-17.33), tanh (9.01) and erf (3.92) round to 1, and the branch points.
THRESHOLDS = [88.72283, 88.72284, -87.33654, -87.33655, -103.27893, -103.97208, -103.97209,
              -17.32868, 9.010913, 3.919206, 0.34657359, 0.9, 1.0, 4.0, 0.70710677, 1.4142135,
              -0.29289323, 0.41421357, -0.9999999, 16777216.0, 33554432.0]


def edges() -> np.ndarray:
    """The special values and thresholds with their neighbours, both signs."""
    x = np.array(SPECIALS + THRESHOLDS, np.float32)
    x = np.concatenate([x, -x])
    with np.errstate(over="ignore"):
        return np.concatenate([x, np.nextafter(x, np.float32(np.inf)),
                               np.nextafter(x, np.float32(-np.inf))])


def sweep(stride: int = 1021) -> np.ndarray:
    bits = np.arange(0, 2 ** 32, stride, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits.view(np.float32), edges()])


def ulp_error(got: np.ndarray, exact: np.ndarray, np_type=np.float32) -> np.ndarray:
    """|got - exact| in ulps of `exact` rounded to `np_type` (f32, f16 or bf16); inf where
    got is NaN/inf/finite and the rounded exact value is not. An infinite `got` next to a
    finite exact value counts as one ulp beyond the type's largest finite value."""
    info = ml_dtypes.finfo(np_type)
    with np.errstate(over="ignore", invalid="ignore"):  # signalling NaNs warn
        expected = exact.astype(np_type)
        got = got.astype(np.float64)
    err = np.zeros(got.shape)
    nan, inf = np.isnan(expected), np.isinf(expected)
    err[np.isnan(got) != nan] = np.inf
    err[inf & (got != expected.astype(np.float64))] = np.inf
    finite = ~nan & ~inf & ~np.isnan(got)
    beyond = 2.0 ** (info.maxexp)
    g = np.clip(got[finite], -beyond, beyond)
    _, e = np.frexp(exact[finite])
    ulp = np.ldexp(1.0, np.maximum(e - 1, info.minexp) - info.nmant)
    err[finite] = np.abs(g - exact[finite]) / ulp
    return err


# -- compiled kernels ----------------------------------------------------------------------------

def unary_kernel(op: str, n: int, dtype: str = "f32") -> str:
    return (f"kernel @k_{op}(%x: {dtype}[{n}], %y: {dtype}[{n}]) {{\n"
            f"  for %i = 0 to {n} {{ %y[%i] = {op}(%x[%i]) }}\n}}")


def run(text: str, name: str, x: np.ndarray, out_dtype=None) -> np.ndarray:
    jit = cpu.compile_module(kernel_module([parse_kernel(text)]), target=HOST)
    out = np.zeros(x.shape, out_dtype or x.dtype)
    jit.kernel(name, 2)(x.ctypes.data, out.ctypes.data)
    return out


def run_unary(op: str, x: np.ndarray, dtype: str = "f32") -> np.ndarray:
    return run(unary_kernel(op, x.size, dtype), f"k_{op}", np.ascontiguousarray(x))


@functools.cache
def measured(op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, got, ulp error) over the sweep."""
    x = sweep()
    got = run_unary(op, x)
    with np.errstate(all="ignore"):
        exact = REFERENCE[op](x.astype(np.float64))
    return x, got, ulp_error(got, exact)


# -- accuracy ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(vmath.FUNCTIONS))
def test_error_over_the_whole_f32_range_is_within_the_documented_bound(op: str) -> None:
    x, got, err = measured(op)
    worst = int(np.argmax(err))
    assert err[worst] <= MAX_ULP[op], (
        f"{op}({x[worst]!r}) = {got[worst]!r}: {err[worst]:.3f} ulp > {MAX_ULP[op]}")


def test_the_acceptance_bound_for_exp_and_log() -> None:
    for op in ("exp", "log"):
        assert np.max(measured(op)[2]) <= 4


NAN, INF = np.nan, np.inf
EXACT = {
    "exp": [(-INF, 0.0), (INF, INF), (NAN, NAN), (0.0, 1.0), (-0.0, 1.0), (-104.0, 0.0),
            (-1000.0, 0.0), (89.0, INF), (1000.0, INF), (FLT_MAX, INF), (-FLT_MAX, 0.0)],
    "expm1": [(-INF, -1.0), (INF, INF), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (-20.0, -1.0),
              (100.0, INF), (FLT_TRUE_MIN, FLT_TRUE_MIN), (-FLT_TRUE_MIN, -FLT_TRUE_MIN)],
    "log": [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (-FLT_TRUE_MIN, NAN),
            (INF, INF), (NAN, NAN), (1.0, 0.0)],
    "log1p": [(-1.0, -INF), (-2.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN), (0.0, 0.0),
              (-0.0, -0.0), (FLT_TRUE_MIN, FLT_TRUE_MIN), (-FLT_TRUE_MIN, -FLT_TRUE_MIN)],
    "tanh": [(INF, 1.0), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (20.0, 1.0),
             (-20.0, -1.0), (FLT_MAX, 1.0), (FLT_TRUE_MIN, FLT_TRUE_MIN)],
    "erf": [(INF, 1.0), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (5.0, 1.0),
            (-5.0, -1.0), (FLT_MAX, 1.0)],
}
EXACT_CASES = [(op, x, y) for op, cases in EXACT.items() for x, y in cases]


@pytest.mark.parametrize("op,x,want", EXACT_CASES,
                         ids=[f"{op}({x})" for op, x, _ in EXACT_CASES])
def test_special_values_are_exact(op: str, x: float, want: float) -> None:
    got = run_unary(op, np.array([x] * 16, np.float32))  # 16: through the vector loop too
    if math.isnan(want):
        assert np.all(np.isnan(got)), f"{op}({x}) = {got[0]}"
    else:
        assert np.all(got == np.float32(want)), f"{op}({x}) = {got[0]}, not {want}"
        assert np.all(np.signbit(got) == (math.copysign(1, want) < 0)), f"{op}({x}): sign of 0"


def test_exp_underflows_gradually_into_the_denormals() -> None:
    x = np.linspace(-103.9, -87.4, 20001, dtype=np.float32)
    got = run_unary("exp", x)
    err = ulp_error(got, np.exp(x.astype(np.float64)))
    assert np.all((got > 0) & (got < FLT_MIN)) and np.max(err) <= MAX_ULP["exp"]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("op", sorted(vmath.FUNCTIONS))
def test_half_types_compute_in_f32_and_round(op: str, dtype: str) -> None:
    """Every f16/bf16 input: the f32 result rounded to the type is within half an ulp of the
    exact value, plus the f32 error (a few 2^-13 ulps of f16)."""
    np_type = np.float16 if dtype == "f16" else ml_dtypes.bfloat16
    x = np.arange(2 ** 16, dtype=np.uint16).view(np_type)
    got = run_unary(op, x, dtype)
    with np.errstate(all="ignore"):
        exact = REFERENCE[op](x.astype(np.float64))
    err = ulp_error(got, exact, np_type)
    worst = int(np.argmax(err))
    bound = 0.5 + 2 * MAX_ULP[op] * 2.0 ** (ml_dtypes.finfo(np_type).nmant - 23)
    assert err[worst] <= bound, f"{op}({x[worst]}) = {got[worst]}: {err[worst]:.4f} ulp"


def test_sigmoid_as_lowered_is_accurate_and_flushes_only_below_the_normals() -> None:
    """The lowering's sigmoid, 1 / (1 + exp(-x)): 2.08 ulps at most, at x ~ -16.7 where
    1 + e^-x rounds (libm's expf gives the same). e^-x overflows to inf below x = -88.72,
    giving 0 where the exact value is a denormal."""
    text = """kernel @sigmoid(%x: f32[N], %y: f32[N]) {
      for %i = 0 to N { %y[%i] = div(1.0:f32, add(1.0:f32, exp(neg(%x[%i])))) }
    }"""
    x = sweep()
    got = run(text.replace("N", str(x.size)), "sigmoid", x)
    with np.errstate(all="ignore"):
        exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    normal = ~(np.abs(exact) < FLT_MIN)
    assert np.max(ulp_error(got[normal], exact[normal])) <= 2.5
    assert np.all(np.abs(got[~normal] - exact[~normal]) < FLT_MIN)


# -- the code ----------------------------------------------------------------------------------

def called(llvm_ir: str) -> set[str]:
    return set(re.findall(r'call [^@]*@"?([\w.]+)', llvm_ir))


@pytest.mark.parametrize("op", sorted(vmath.FUNCTIONS))
def test_loops_vectorize_without_calls_or_branches(op: str) -> None:
    module = kernel_module([parse_kernel(unary_kernel(op, 1024))])
    plain = str(kernel_module([parse_kernel(unary_kernel("neg", 1024))]))
    raw = str(module)
    assert all(name.startswith("llvm.") for name in called(raw)), called(raw)
    assert raw.count(" br ") == plain.count(" br "), "vmath emitted a branch"
    optimized = cpu.llvm_ir_text(module, target=HOST)
    assert re.search(r"<(8|16) x float>", optimized), "the loop was not vectorized"
    assert all(name.startswith("llvm.") for name in called(optimized)), called(optimized)
    if "avx2" in set(HOST.features):
        assert re.search(r"%[yz]mm\d+", cpu.assembly_text(module, target=HOST))


@pytest.mark.parametrize("op", ["exp", "tanh", "erf"])
def test_scaling_by_ldexp_gives_the_same_bits(op: str) -> None:
    """exp's 2^n by `llvm.ldexp` (AVX-512 targets) rounds once into the denormals, as the
    two factors do: the same bits over the sweep and the edges (and over every 97th f32,
    checked once by hand), so the documented errors hold for both."""
    x = np.concatenate([sweep(), edges()])
    with vmath.scaling_by_ldexp(True):
        scaled = run_unary(op, x)
    plain = run_unary(op, x)
    same = (scaled.view(np.uint32) == plain.view(np.uint32)) | (np.isnan(scaled) &
                                                               np.isnan(plain))
    assert np.all(same), f"{op}({x[~same][:4]}) = {scaled[~same][:4]}, not {plain[~same][:4]}"


def test_ldexp_is_one_instruction_with_avx512() -> None:
    if "avx512f" not in set(HOST.features):
        pytest.skip("the host has no AVX-512")
    with vmath.scaling_by_ldexp(True):
        asm = cpu.assembly_text(kernel_module([parse_kernel(unary_kernel("exp", 1024))]), HOST)
    assert "vscalefps" in asm and "ldexp" not in asm


def test_f64_keeps_the_c_library() -> None:
    for op, symbol in [("exp", "llvm.exp.f64"), ("log", "llvm.log.f64"), ("tanh", "tanh"),
                       ("erf", "erf"), ("expm1", "expm1"), ("log1p", "log1p")]:
        assert called(str(kernel_module([parse_kernel(unary_kernel(op, 8, "f64"))]))) == {
            symbol}


def test_vmath_takes_f32_only() -> None:
    fn = ir.Function(ir.Module(), ir.FunctionType(ir.DoubleType(), [ir.DoubleType()]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    with pytest.raises(CodegenError, match="vector math 'exp' takes f32"):
        vmath.exp(b, fn.args[0])


@pytest.mark.parametrize("op", sorted(vmath.FUNCTIONS))
def test_vectors_give_the_scalar_results_in_every_lane(op: str) -> None:
    """`<8 x float>` in, 8 lanes out, bit for bit what the scalar code gives."""
    lanes = 8
    vec = ir.VectorType(ir.FloatType(), lanes)
    module = ir.Module(name="vmath_vectors")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()] * 2), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    b.store(vmath.FUNCTIONS[op](b, b.load(fn.args[0], typ=vec, align=4)), fn.args[1], align=4)
    b.ret_void()
    assert f'@"llvm.fmuladd.v{lanes}f32"' in str(module)
    jit = cpu.compile_module(module, target=HOST)
    x = edges()
    x = np.concatenate([x, np.zeros((-x.size) % lanes, np.float32)])
    got = np.zeros_like(x)
    f = jit.kernel("f", 2)
    for k in range(0, x.size, lanes):
        f(x[k:].ctypes.data, got[k:].ctypes.data)
    want = run_unary(op, x)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert np.all(same), f"{op}({x[~same][:4]}) = {got[~same][:4]}, scalar {want[~same][:4]}"
