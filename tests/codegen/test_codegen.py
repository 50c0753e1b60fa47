"""LLVM code generation and the JIT: loop IR compiled for the host and run on NumPy arrays.

Every op of the loop IR over every dtype it applies to is checked against the graph IR's
NumPy reference (f16/bf16 computed in f32 and rounded, as the interpreter does); then casts,
loop structure, locals, programs with temps in an arena, program-level if/loop, integer
division by zero, object code round trips and the host's vector ISA.
"""

from __future__ import annotations

import functools
import re

import ml_dtypes
import numpy as np
import pytest

from ember.codegen import CodegenError, cpu
from ember.codegen.llvm import kernel_module, program_module, program_modules
from ember.dtypes import DType
from ember.graph.ops.elementwise import BINARY_OPS as GRAPH_BINARY
from ember.graph.ops.elementwise import UNARY_OPS as GRAPH_UNARY
from ember.graph.ops.elementwise import _cast_reference
from ember.graph.ops.registry import get_opdef
from ember.loops.ir import BINARY_OPS, COMPARISONS, PREDICATE_UNARY, UNARY_OPS
from ember.loops.text import parse_kernel, parse_program
from ember.target import Target

HOST = Target.host()

N = 64
DTYPES = [DType.f32, DType.f64, DType.f16, DType.bf16, DType.i8, DType.i32, DType.i64,
          DType.u8, DType.bool]
HALF = (DType.f16, DType.bf16)
# Loop-IR ops that are the graph special ops of those names (f64, rounded once; floats only).
SPECIAL_UNARY = {"lgamma", "erfc"}
TOLERANCE = {DType.f32: (1e-5, 1e-6), DType.f64: (1e-12, 1e-14), DType.f16: (2e-3, 1e-3),
             DType.bf16: (1e-2, 1e-2)}


# -- helpers ----------------------------------------------------------------------------------

def ptr(a: np.ndarray) -> int:
    assert a.flags.c_contiguous
    return a.ctypes.data


def run_kernel(jit: cpu.JitModule, name: str, *arrays: np.ndarray) -> None:
    jit.kernel(name, len(arrays))(*(ptr(a) for a in arrays))


def compile_kernels(*texts: str) -> cpu.JitModule:
    return cpu.compile_module(kernel_module([parse_kernel(t) for t in texts]), target=HOST)


def run_program(program, plan, inputs=(), outputs=(), constants=(), arena_bytes=256):
    jit = cpu.compile_module(program_module(program, plan), target=HOST)
    arena = np.zeros(arena_bytes, np.uint8)
    jit.entry(program.name)(cpu.pointer_array([ptr(a) for a in inputs]),
                            cpu.pointer_array([ptr(a) for a in outputs]),
                            cpu.pointer_array([ptr(a) for a in constants]), ptr(arena))
    return arena


def assert_same(got: np.ndarray, want: np.ndarray, dtype: DType) -> None:
    if dtype.is_float:
        rtol, atol = TOLERANCE[dtype]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


# -- every op on every dtype it applies to --------------------------------------------------------

FLOAT_SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, np.inf, -np.inf, np.nan,
                  1e-3, 100.0]


def data(t: DType, seed: int, op: str = "") -> np.ndarray:
    rng = np.random.default_rng(seed)
    if t is DType.bool:
        return rng.integers(0, 2, N).astype(bool)
    if t.is_float:
        values = np.concatenate([FLOAT_SPECIALS, rng.standard_normal(N - len(FLOAT_SPECIALS)) * 3])
        return rng.permutation(values).astype(t.np)
    info = np.iinfo(t.np)
    if op == "pow":  # small enough that the f64 result fits every type (0 ** -1 is inf)
        return rng.integers(0 if info.min == 0 or seed == 2 else -3, 4, N).astype(t.np)
    if op in ("shl", "shr") and seed == 2:  # shift amounts in range; out-of-range is tested apart
        return rng.integers(0, 8 * t.itemsize, N).astype(t.np)
    specials = [info.min, info.max, 0, 1, 2, 3, 7] + ([-1, -2, -7] if info.min else [])
    values = rng.integers(info.min, info.max, N - len(specials), dtype=t.np, endpoint=True)
    return rng.permutation(np.concatenate([np.array(specials, t.np), values]))


def reference(op: str, t: DType, *xs: np.ndarray) -> np.ndarray:
    if op in SPECIAL_UNARY:
        return get_opdef(op).reference(xs[0].astype(np.float64)).astype(t.np)
    fn = np.floor_divide if op == "floordiv" else (
        GRAPH_UNARY[op][0] if len(xs) == 1 else GRAPH_BINARY[op][0])
    if t in HALF:
        xs = tuple(x.astype(np.float32) for x in xs)
    with np.errstate(all="ignore"):
        return np.asarray(fn(*xs)).astype(result_dtype(op, t).np)


def applies(op: str, t: DType) -> bool:
    if op == "floordiv":
        return t.is_float or t.is_int
    if op in SPECIAL_UNARY:
        return t.is_float
    table = GRAPH_UNARY if op in UNARY_OPS else GRAPH_BINARY
    allowed = table[op][1]
    return t in allowed


def result_dtype(op: str, t: DType) -> DType:
    return DType.bool if op in PREDICATE_UNARY or op in COMPARISONS else t


def op_kernel(op: str, t: DType) -> str:
    r = result_dtype(op, t)
    if op in UNARY_OPS:
        return (f"kernel @{op}_{t}(%x: {t}[{N}], %out: {r}[{N}]) {{\n"
                f"  for %i = 0 to {N} {{ %out[%i] = {op}(%x[%i]) }}\n}}")
    return (f"kernel @{op}_{t}(%x: {t}[{N}], %y: {t}[{N}], %out: {r}[{N}]) {{\n"
            f"  for %i = 0 to {N} {{ %out[%i] = {op}(%x[%i], %y[%i]) }}\n}}")


def ops_for(t: DType) -> list[str]:
    return sorted(op for op in UNARY_OPS | BINARY_OPS if applies(op, t))


@functools.cache
def ops_module(t: DType) -> cpu.JitModule:
    """One compiled module per dtype, one kernel per op."""
    return compile_kernels(*(op_kernel(op, t) for op in ops_for(t)))


OP_CASES = [(op, t) for t in DTYPES for op in ops_for(t)]


@pytest.mark.parametrize("op,t", OP_CASES, ids=[f"{op}-{t}" for op, t in OP_CASES])
def test_op_matches_numpy(op: str, t: DType) -> None:
    xs = [data(t, 1, op)] if op in UNARY_OPS else [data(t, 1, op), data(t, 2, op)]
    r = result_dtype(op, t)
    out = np.zeros(N, r.np)
    run_kernel(ops_module(t), f"{op}_{t}", *xs, out)
    assert_same(out, reference(op, t, *xs), r)


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
def test_max_and_min_propagate_nan_and_leave_the_sign_of_zero_open(kind: str) -> None:
    """NaN from either operand, in scalar and vector code; which zero max(-0, +0) gives is
    left to the target (`nsz`, three fewer x86 instructions a vector)."""
    text = ("kernel @k(%x: f32[16], %y: f32[16], %hi: f32[16], %lo: f32[16]) {\n"
            f"  for %i = 0 to 16 {kind} {{\n"
            "    %hi[%i] = max(%x[%i], %y[%i])\n    %lo[%i] = min(%x[%i], %y[%i])\n  }\n}")
    module = kernel_module([parse_kernel(text)])
    assert re.search(r"call nsz <?(16 x )?float>? @\"?llvm\.maximum", str(module))
    x = np.array([np.nan, 1, np.nan, -np.inf, 2, 0, -0.0, 5] * 2, np.float32)
    y = np.array([1, np.nan, np.nan, 3, -np.inf, -0.0, 0, 5] * 2, np.float32)
    hi, lo = np.zeros(16, np.float32), np.zeros(16, np.float32)
    cpu.compile_module(module, target=HOST).kernel("k", 4)(x.ctypes.data, y.ctypes.data,
                                                           hi.ctypes.data, lo.ctypes.data)
    np.testing.assert_array_equal(hi, np.maximum(x, y))  # (-0 == +0 here)
    np.testing.assert_array_equal(lo, np.minimum(x, y))


def test_every_op_is_covered() -> None:
    covered = {op for op, _ in OP_CASES}
    assert covered == UNARY_OPS | BINARY_OPS


def padded(values, t: DType) -> np.ndarray:
    """`values` at the front of an N-element array (the op kernels run over N elements)."""
    out = np.ones(N, t.np)
    out[:len(values)] = np.array(values).astype(t.np)
    return out


@pytest.mark.parametrize("t", [DType.i8, DType.i32, DType.i64, DType.u8])
def test_integer_division_by_zero_and_overflow_do_not_trap(t: DType) -> None:
    info = np.iinfo(t.np)
    x = padded([info.min, info.min, 7, 9, 0, info.max, -7 if info.min else 5], t)
    y = padded([-1 if info.min else 1, 0, 0, 0, 0, 0, 0], t)
    for op in ("div", "floordiv", "mod", "fmod"):
        out = np.full(N, 99, t.np)
        run_kernel(ops_module(t), f"{op}_{t}", x, y, out)
        np.testing.assert_array_equal(out, reference(op, t, x, y), err_msg=op)
        assert (out[1:7] == 0).all()  # x / 0 and x % 0 give 0


@pytest.mark.parametrize("t", [DType.i8, DType.i32, DType.u8, DType.i64])
def test_shifts_out_of_range_match_numpy(t: DType) -> None:
    width = 8 * t.itemsize
    amounts = [0, 1, width - 1, width, width + 3, 200 if t is DType.u8 else -1]
    pairs = [(a, s) for a in (5, -8 if t.is_signed else 250, 1) for s in amounts]
    x, y = padded([a for a, _ in pairs], t), padded([s for _, s in pairs], t)
    for op in ("shl", "shr"):
        out = np.zeros(N, t.np)
        run_kernel(ops_module(t), f"{op}_{t}", x, y, out)
        np.testing.assert_array_equal(out, reference(op, t, x, y), err_msg=op)


# -- casts -------------------------------------------------------------------------------------

CAST_PAIRS = [(s, d) for s in DTYPES for d in DTYPES]


def cast_source(src: DType, dst: DType) -> np.ndarray:
    """Values of `src` whose conversion to `dst` NumPy defines (no float -> int overflow)."""
    rng = np.random.default_rng(3)
    if src.is_float:
        values = np.concatenate([[0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 2.75, 100.75, -100.75],
                                 rng.uniform(-120, 120, N - 9)])
        if dst.is_int and not dst.is_signed:
            values = np.abs(values)
        if not dst.is_int:
            values[-3:] = [np.nan, np.inf, -np.inf]
        return values.astype(src.np)
    return data(src, 3)


@functools.cache
def casts_module() -> cpu.JitModule:
    return compile_kernels(*(
        f"kernel @cast_{s}_{d}(%x: {s}[{N}], %out: {d}[{N}]) {{\n"
        f"  for %i = 0 to {N} {{ %out[%i] = {d}(%x[%i]) }}\n}}" for s, d in CAST_PAIRS))


@pytest.mark.parametrize("src,dst", CAST_PAIRS, ids=[f"{s}-{d}" for s, d in CAST_PAIRS])
def test_cast_matches_numpy(src: DType, dst: DType) -> None:
    x = cast_source(src, dst)
    out = np.zeros(N, dst.np)
    run_kernel(casts_module(), f"cast_{src}_{dst}", x, out)
    assert_same(out, np.asarray(_cast_reference(x, dst)).astype(dst.np), dst)


def test_float_to_int_goes_through_i32_and_wraps() -> None:
    # As PyTorch, NumPy and ONNX Runtime on x86-64: truncated into i32, outside it (or NaN)
    # its minimum, then wrapped to the target (ember.graph.ops.elementwise.float_to_int).
    x = padded([1000.0, -1000.0, np.nan, np.inf, -np.inf, 127.9, -128.9, 3e9], DType.f32)
    out = np.zeros(N, np.int8)
    run_kernel(casts_module(), "cast_f32_i8", x, out)
    assert out[:8].tolist() == [-24, 24, 0, 0, 0, 127, -128, 0]
    out = np.zeros(N, np.uint8)
    run_kernel(casts_module(), "cast_f32_u8", x, out)
    assert out[:8].tolist() == [232, 24, 0, 0, 0, 127, 128, 0]
    out = np.zeros(N, np.int32)
    run_kernel(casts_module(), "cast_f32_i32", x, out)
    assert out[:8].tolist() == [1000, -1000, -2**31, -2**31, -2**31, 127, -128, -2**31]


def test_f64_to_f16_rounds_once() -> None:
    # Just above a tie between two f16 values: rounding through f32 would land on the tie
    # and round to even, the wrong way.
    values = [1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 1 + 3 * 2**-11 - 2**-40,
              65519.99, 65520.0, 2**-25 + 2**-60, 6e-8]
    x = padded(values, DType.f64)
    out = np.zeros(N, np.float16)
    run_kernel(casts_module(), "cast_f64_f16", x, out)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))


def test_f32_to_bf16_rounds_to_nearest_even_bit_exact() -> None:
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    x[np.isnan(x)] = 1.0
    x[:4] = [np.float32(1 + 2**-8), np.float32(1 + 3 * 2**-8), np.float32(3.4e38), 0.0]
    out = np.zeros(N, ml_dtypes.bfloat16)
    run_kernel(casts_module(), "cast_f32_bf16", x, out)
    np.testing.assert_array_equal(out.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_half_expressions_compute_in_f32_and_round_where_stored() -> None:
    # 2048 + 1 + 1 is 2050 in f32, but 2048 in f16 if rounded after each add.
    jit = compile_kernels("""kernel @k(%x: f16[2], %out: f16[2]) {
      %out[0] = add(add(%x[0], %x[1]), %x[1])
      %out[1] = add(f16(add(%x[0], %x[1])), %x[1])
    }""")
    x = np.array([2048, 1], np.float16)
    out = np.zeros(2, np.float16)
    run_kernel(jit, "k", x, out)
    assert out.tolist() == [2050.0, 2048.0]


# -- loops, ifs and locals ------------------------------------------------------------------------

def test_loops_with_steps_bounds_from_outer_loops_and_negative_steps() -> None:
    jit = compile_kernels("""kernel @k(%a: i64[10], %b: i64[10], %tri: i64[6,6]) {
      for %i = 1 to 10 step 3 { %a[%i] = mul(%i, 10) }
      for %i = 9 to -1 step -2 {
        for %j = 0 to 2 { %b[%i] = add(%b[%i], add(%i, %j)) }
      }
      for %i = 0 to 6 {
        for %j = %i to 6 step 2 { %tri[%i, %j] = add(mul(%i, 10), %j) }
      }
    }""")
    a, b, tri = np.zeros(10, np.int64), np.zeros(10, np.int64), np.zeros((6, 6), np.int64)
    run_kernel(jit, "k", a, b, tri)
    assert a.tolist() == [0, 10, 0, 0, 40, 0, 0, 70, 0, 0]
    assert b.tolist() == [0, 3, 0, 7, 0, 11, 0, 15, 0, 19]
    want = np.zeros((6, 6), np.int64)
    for i in range(6):
        for j in range(i, 6, 2):
            want[i, j] = 10 * i + j
    np.testing.assert_array_equal(tri, want)


def test_if_with_and_without_else() -> None:
    jit = compile_kernels("""kernel @k(%x: f32[16], %out: f32[16], %flags: bool[16]) {
      for %i = 0 to 16 {
        if lt(%x[%i], 0.0:f32) { %out[%i] = neg(%x[%i]) } else { %out[%i] = mul(%x[%i], 2.0:f32) }
        if ge(%i, 8) { %flags[%i] = true }
      }
    }""")
    x = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    out, flags = np.zeros(16, np.float32), np.zeros(16, bool)
    run_kernel(jit, "k", x, out, flags)
    np.testing.assert_array_equal(out, np.where(x < 0, -x, 2 * x))
    assert flags.tolist() == [False] * 8 + [True] * 8


def test_local_accumulators_row_sum_and_matmul() -> None:
    jit = compile_kernels("""kernel @row_sum(%x: f32[5,7], %out: f32[5]) {
      local %acc: f32[1]
      for %i = 0 to 5 {
        %acc[0] = 0.0:f32
        for %j = 0 to 7 { %acc[0] = add(%acc[0], %x[%i, %j]) }
        %out[%i] = %acc[0]
      }
    }""", """kernel @matmul(%a: f64[5,7], %b: f64[7,3], %c: f64[5,3]) {
      local %acc: f64[3]
      for %i = 0 to 5 {
        for %j = 0 to 3 { %acc[%j] = 0.0:f64 }
        for %k = 0 to 7 {
          for %j = 0 to 3 { %acc[%j] = add(%acc[%j], mul(%a[%i, %k], %b[%k, %j])) }
        }
        for %j = 0 to 3 { %c[%i, %j] = %acc[%j] }
      }
    }""")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    out = np.zeros(5, np.float32)
    run_kernel(jit, "row_sum", x, out)
    np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-5, atol=1e-6)
    a, b, c = rng.standard_normal((5, 7)), rng.standard_normal((7, 3)), np.zeros((5, 3))
    run_kernel(jit, "matmul", a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-12)


def test_select_and_index_expressions_from_loaded_integers() -> None:
    # A gather: the index comes from an i32 buffer, cast to i64.
    jit = compile_kernels("""kernel @gather(%x: f32[8], %idx: i32[5], %out: f32[5]) {
      for %i = 0 to 5 {
        %out[%i] = select(ge(%idx[%i], 4:i32), %x[i64(%idx[%i])], 0.0:f32)
      }
    }""")
    x = np.arange(8, dtype=np.float32) * 1.5
    idx = np.array([7, 0, 4, 3, 5], np.int32)
    out = np.zeros(5, np.float32)
    run_kernel(jit, "gather", x, idx, out)
    np.testing.assert_array_equal(out, np.where(idx >= 4, x[idx], 0))


# -- programs: kernels, temps in the arena, if and loop steps -----------------------------------

TWO_KERNELS = """
kernel @add_bias(%x: f32[4,8], %b: f32[8], %out: f32[4,8]) {
  for %i = 0 to 4 parallel {
    for %j = 0 to 8 vectorized { %out[%i, %j] = add(%x[%i, %j], %b[%j]) }
  }
}
kernel @relu_scale(%x: f32[4,8], %s: f32[], %out: f32[4,8]) {
  for %i = 0 to 4 {
    for %j = 0 to 8 { %out[%i, %j] = mul(max(%x[%i, %j], 0.0:f32), %s[]) }
  }
}
program @two {
  input %x: f32[4,8]
  output %y: f32[4,8]
  constant %b: f32[8]
  constant %s: f32[]
  temp %t: f32[4,8]
  call @add_bias(%x, %b, %t)
  call @relu_scale(%t, %s, %y)
}
"""


def test_program_with_two_kernels_and_a_temp_in_the_arena() -> None:
    program = parse_program(TWO_KERNELS)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    s = np.array(3.0, np.float32)
    y = np.zeros((4, 8), np.float32)
    arena = run_program(program, {"t": 64}, [x], [y], [b, s], arena_bytes=64 + 128 + 64)
    np.testing.assert_allclose(y, np.maximum(x + b, 0) * 3, rtol=1e-6)
    np.testing.assert_array_equal(arena[64:192].view(np.float32).reshape(4, 8), x + b)
    assert not arena[:64].any() and not arena[192:].any()  # nothing outside the temp


IF_PROGRAM = """
kernel @fill(%v: f32[], %out: f32[3]) { for %i = 0 to 3 { %out[%i] = %v[] } }
kernel @iota(%out: f32[3]) { for %i = 0 to 3 { %out[%i] = f32(%i) } }
program @branch {
  input %c: bool[]
  input %v: f32[]
  output %y: f32[3]
  if %c { call @fill(%v, %y) } else { call @iota(%y) }
}
"""


@pytest.mark.parametrize("cond", [True, False])
def test_program_if(cond: bool) -> None:
    y = np.full(3, -1, np.float32)
    run_program(parse_program(IF_PROGRAM), {}, [np.array(cond), np.array(7, np.float32)], [y])
    assert y.tolist() == ([7.0] * 3 if cond else [0.0, 1.0, 2.0])


LOOP_PROGRAM = """
kernel @init(%acc: f32[], %go: bool[]) { %acc[] = 0.0:f32
  %go[] = true }
kernel @step(%i: i64[], %acc: f32[], %limit: f32[], %go: bool[]) {
  %acc[] = add(%acc[], add(f32(%i[]), 1.0:f32))
  %go[] = lt(%acc[], %limit[])
}
program @sum_to {
  input %n: i64[]
  input %limit: f32[]
  output %acc: f32[]
  output %count: i64[]
  temp %go: bool[]
  call @init(%acc, %go)
  loop %n, %go, %count { call @step(%count, %acc, %limit, %go) }
}
"""


@pytest.mark.parametrize("n,limit,acc,count", [(10, 1e9, 55.0, 10), (10, 10.0, 10.0, 4),
                                               (0, 1e9, 0.0, 0)])
def test_program_loop_stops_at_trip_count_or_condition(n, limit, acc, count) -> None:
    out_acc, out_count = np.array(-1, np.float32), np.array(-1, np.int64)
    run_program(parse_program(LOOP_PROGRAM), {"go": 8},
                [np.array(n, np.int64), np.array(limit, np.float32)], [out_acc, out_count])
    assert (float(out_acc), int(out_count)) == (acc, count)


# -- object code, dumps, the host ISA, errors ---------------------------------------------------

def test_object_code_loads_into_a_fresh_engine() -> None:
    program = parse_program(TWO_KERNELS)
    data_bytes = cpu.emit_object(program_module(program, {"t": 0}), target=HOST)
    assert isinstance(data_bytes, bytes) and len(data_bytes) > 0
    jit = cpu.load_object(data_bytes, target=HOST)
    x = np.ones((4, 8), np.float32)
    b, s, y = np.full(8, 1, np.float32), np.array(2, np.float32), np.zeros((4, 8), np.float32)
    arena = np.zeros(128, np.uint8)
    jit.entry("two")(cpu.pointer_array([ptr(x)]), cpu.pointer_array([ptr(y)]),
                     cpu.pointer_array([ptr(b), ptr(s)]), ptr(arena))
    assert (y == 4).all()
    assert jit.address("add_bias")  # kernels stay callable on their own


SHARDED = TWO_KERNELS.replace("program @two {", """
kernel @add_bias_again(%x: f32[4,8], %b: f32[8], %out: f32[4,8]) {
  for %i = 0 to 4 parallel {
    for %j = 0 to 8 vectorized { %out[%i, %j] = add(%x[%i, %j], %b[%j]) }
  }
}
program @two {""").replace("call @relu_scale(%t, %s, %y)", """call @relu_scale(%t, %s, %y)
  call @add_bias_again(%y, %b, %t)
  call @relu_scale(%t, %s, %y)""")


def test_a_program_compiled_as_several_modules_on_all_cores() -> None:
    program = parse_program(SHARDED)
    modules = list(program_modules(program, {"t": 0}, shards=3))
    assert len(modules) == 2  # two distinct bodies: a copy stays with its first
    defined = [{f.name for f in m.functions if not f.is_declaration} for m in modules]
    assert any({"add_bias", "add_bias_again"} <= names for names in defined)
    assert "two_entry" in defined[0]
    texts = [str(m) for m in modules]
    assert sum('@"two_num_threads" = global' in t for t in texts) == 1  # one definition
    assert all('@"two_num_threads" = external global' in t
               for t in texts if "two_num_threads" in t and "= global" not in t)

    jit = cpu.load_objects(cpu.compile_objects(iter(modules), HOST), HOST)
    assert jit.set_num_threads("two", 2)
    x = np.ones((4, 8), np.float32)
    b, s, y = np.full(8, 1, np.float32), np.array(2, np.float32), np.zeros((4, 8), np.float32)
    arena = np.zeros(128, np.uint8)
    jit.entry("two")(cpu.pointer_array([ptr(x)]), cpu.pointer_array([ptr(y)]),
                     cpu.pointer_array([ptr(b), ptr(s)]), ptr(arena))
    assert (y == 10).all()  # ((1 + 1) * 2 + 1) * 2


def test_compiling_modules_reports_bad_ir_and_missing_functions() -> None:
    with pytest.raises(CodegenError, match="does not parse"):
        cpu.compile_objects(["define void @f() { ret i32 }"], target=HOST)
    with pytest.raises(CodegenError, match="'ember_nowhere', which this process lacks"):
        cpu.compile_objects(["declare void @ember_nowhere()\n"
                             "define void @f() { call void @ember_nowhere() ret void }"],
                            target=HOST)
    # defined by another module of the same program: found
    cpu.compile_objects(["declare void @g()\ndefine void @f() { call void @g() ret void }",
                         "define void @g() { ret void }"], target=HOST)


def test_dumps() -> None:
    module = program_module(parse_program(TWO_KERNELS), {"t": 0})
    unoptimized = cpu.llvm_ir_text(module, optimized=False, target=HOST)
    assert "define void @add_bias(ptr" in unoptimized and "@two_entry(" in unoptimized
    assert "target triple" in cpu.llvm_ir_text(module, target=HOST)
    assert "two_entry:" in cpu.assembly_text(module, target=HOST)


def test_host_target_uses_avx2_and_fma() -> None:
    features = set(HOST.features)
    if "avx2" not in features:
        pytest.skip("the host has no AVX2")
    assert "fma" in features
    module = kernel_module([parse_kernel("""kernel @axpy(%a: f32[1024], %x: f32[1024],
                                                          %y: f32[1024], %out: f32[1024]) {
      for %i = 0 to 1024 { %out[%i] = add(mul(%a[%i], %x[%i]), %y[%i]) }
    }""")])
    asm = cpu.assembly_text(module, target=HOST)
    assert re.search(r"%[yz]mm\d+", asm), "the loop was not vectorized with AVX registers"


@pytest.mark.parametrize("text,message", [
    ("kernel @k(%x: f32[2], %y: f64[2]) { %y[0] = %x[0] }", "storing a f32 value"),
    ("kernel @k(%x: f32[2], %y: f64[2]) { %y[0] = add(f64(%x[0]), 1.0:f32) }",
     "add of f64 and f32"),
    ("kernel @k(%x: u8[2]) { %x[0] = exp(%x[1]) }", "no code for unary 'exp' on u8"),
    ("kernel @k(%x: f32[2]) { for %i = 0 to 2 step 0 { %x[%i] = 0.0:f32 } }", "step 0"),
    ("kernel @tanhf(%x: f32[2]) { %x[0] = 0.0:f32 }", "reserved"),
])
def test_codegen_errors_name_the_kernel(text: str, message: str) -> None:
    with pytest.raises(CodegenError, match=re.escape(message)):
        kernel_module([parse_kernel(text)])


def test_temp_without_a_planned_offset_is_an_error() -> None:
    with pytest.raises(CodegenError, match="no offset for temp %t"):
        program_module(parse_program(TWO_KERNELS), {})


PREFETCHED = """kernel @k(%x: f32[4,64], %y: f32[4,64]) {
  for %i = 0 to 4 {
    prefetch %x[min(add(%i, 1), 3), 0]
    for %j = 0 to 64 {
      %y[%i, %j] = mul(%x[%i, %j], 2.0:f32)
    }
  }
}"""


def test_a_prefetch_is_a_hint_that_changes_no_value() -> None:
    """`prefetch` (a packed matmul's next weight panel) prints and parses, runs as nothing
    in the interpreter and as LLVM's `llvm.prefetch` (x86: prefetcht1) when compiled."""
    from ember.loops.interp import LoopInterpreter
    from ember.loops.ir import Program
    from ember.loops.text import print_kernel

    kernel = parse_kernel(PREFETCHED)
    assert print_kernel(parse_kernel(print_kernel(kernel))) == print_kernel(kernel)
    x = np.arange(256, dtype=np.float32).reshape(4, 64)
    for run in ("interpreter", "compiled"):
        y = np.zeros_like(x)
        if run == "interpreter":
            LoopInterpreter(Program("p", [], [kernel], [])).call(kernel, [x, y])
        else:
            run_kernel(compile_kernels(PREFETCHED), "k", x, y)
        np.testing.assert_array_equal(y, x * 2)
    module = kernel_module([kernel])
    assert "@\"llvm.prefetch.p0\"" in str(module)
    if HOST.arch == "x86_64":
        assert "prefetcht1" in cpu.assembly_text(module, target=HOST)
