"""How vector code reaches memory (ember/codegen/vector.py) and how a program's kernels
become functions (ember/codegen/llvm.py):

- merged dimensions: an access [.., floordiv(e, D), mod(e, D)] of a buffer whose last
  extent is D is contiguous in e (`flatten_index`), so a conv's output written by its flat
  position is one vector store;
- gathers whose index has vector code compute their lane offsets on vectors (one vector
  GEP), others each lane's index apart; both give the serial loop's values;
- streaming stores: a large elementwise loop peels to a cache line, stores aligned
  non-temporal vectors, and finishes serially, for any alignment of the output;
- identical kernels are emitted once, the copies calling the first;
- reductions: a local accumulated in a vectorized loop is combined across the lanes;
- a split's vectorized loop stores its whole vectors without a mask, the last one with;
- locals and the buffers a kernel is given are told apart by scoped alias metadata.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest

from ember.codegen import cpu
from ember.codegen.llvm import kernel_module, program_module
from ember.codegen.vector import STREAMING_BYTES
from ember.errors import VerificationError
from ember.loops.analysis import VectorPlan, flatten_index, plan_vector
from ember.loops.ir import Binary, Const, Var
from ember.loops.text import parse_kernel, parse_program
from ember.loops.verify import verify_kernel
from ember.target import Target

HOST = Target.host()

RNG = np.random.default_rng(5)
X86 = platform.machine() in ("x86_64", "AMD64")


def run(text: str, *arrays: np.ndarray) -> cpu.JitModule:
    kernel = verify_kernel(parse_kernel(text))
    jit = cpu.compile_module(kernel_module([kernel]), target=HOST)
    jit.kernel(kernel.name, len(arrays))(*(a.ctypes.data for a in arrays))
    return jit


# -- merged dimensions ---------------------------------------------------------------------------

def test_flatten_index_merges_quotient_and_remainder() -> None:
    e = Var("p") + 3
    assert flatten_index([Var("n"), Binary("floordiv", e, Const(7)),
                          Binary("mod", e, Const(7))], (2, 5, 7)) == [Var("n"), e]
    # (k // 9, (k // 3) % 3, k % 3) over extents (c, 3, 3): one index, k.
    k = Var("k")
    index = [Binary("floordiv", k, Const(9)),
             Binary("mod", Binary("floordiv", k, Const(3)), Const(3)), Binary("mod", k, Const(3))]
    assert flatten_index(index, (4, 3, 3)) == [k]
    # A block's first row plus the rows its lanes pass (a 1x1 conv's column block starting
    # at row 4t): row-major, that is position 4t * 7 + e.
    t = Var("t")
    shifted = [Binary("add", Binary("mul", t, Const(4)), Binary("floordiv", e, Const(7))),
               Binary("mod", e, Const(7))]
    assert flatten_index(shifted, (8, 7)) == [Binary("add", Binary("mul", Binary(
        "mul", t, Const(4)), Const(7)), e)]
    assert flatten_index([Binary("add", Const(1), shifted[0]), shifted[1]], (9, 7)) == [
        Binary("add", Binary("mul", Binary("add", Binary("mul", t, Const(4)), Const(1)),
                             Const(7)), e)]
    # A divisor that is not the extent of the dimension below is not a row-major split.
    kept = [Binary("floordiv", e, Const(7)), Binary("mod", e, Const(7))]
    assert flatten_index(kept, (5, 8)) == kept


def test_scalar_access_by_flat_position_needs_no_division() -> None:
    """A scalar load at (k // 9, k // 3 % 3, k % 3) is addressed by k (a conv's weight read
    in place by the GEMM's micro-kernel): no division is emitted, and it reads the same."""
    text = """kernel @k(%w: f32[4,3,3], %y: f32[36]) {
  for %k = 0 to 36 {
    %y[%k] = %w[floordiv(%k, 9), mod(floordiv(%k, 3), 3), mod(%k, 3)]
  }
}"""
    kernel = verify_kernel(parse_kernel(text))
    ir_text = cpu.llvm_ir_text(kernel_module([kernel]), optimized=False, target=HOST)
    assert not any(op in ir_text for op in ("sdiv", "udiv", "srem", "urem"))
    w, y = RNG.standard_normal((4, 3, 3)).astype(np.float32), np.zeros(36, np.float32)
    run(text, w, y)
    np.testing.assert_array_equal(y, w.reshape(-1))


def test_store_by_flat_position_is_one_vector_store() -> None:
    text = """kernel @k(%x: f32[2,21], %y: f32[2,3,7]) {
  for %n = 0 to 2 {
    for %b = 0 to 2 {
      for %j = 0 to min(16, sub(21, mul(%b, 16))) vectorized {
        %y[%n, floordiv(add(mul(%b, 16), %j), 7), mod(add(mul(%b, 16), %j), 7)] =
            mul(%x[%n, add(mul(%b, 16), %j)], 2.0:f32)
      }
    }
  }
}"""
    kernel = parse_kernel(text)
    loop = kernel.body[0].body[0].body[0]
    assert isinstance(plan_vector(loop, set(), {"x": (2, 21), "y": (2, 3, 7)}), VectorPlan)
    x, y = RNG.standard_normal((2, 21)).astype(np.float32), np.zeros((2, 3, 7), np.float32)
    run(text, x, y)
    np.testing.assert_array_equal(y, (2 * x).reshape(2, 3, 7))


# -- gathers -------------------------------------------------------------------------------------

def _before_a_guard_page(count: int):
    """`count` f32s that end where a page nobody may read begins (keep the mmap alive)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 2 * page)
    base = np.frombuffer(region, np.float32)
    if ctypes.CDLL(None).mprotect(ctypes.c_void_p(base.ctypes.data + page), page, 0):
        pytest.skip("mprotect failed")
    return region, base[page // 4 - count:page // 4]


@pytest.mark.parametrize("kind", ["vectorized", "serial"])
@pytest.mark.parametrize("index", ["add(%j, 16)", "mul(%j, 2)", "mul(%j, 5)"])
# (contiguous, strided, gather)
def test_a_select_around_a_load_reads_only_its_lanes(index: str, kind: str) -> None:
    """select(c, load, other) loads only where c holds, as the interpreter's select
    evaluates only the side it picks: vector code masks the load (a masked load or gather),
    scalar code branches around it. The other lanes' addresses lie past the end of %x, on a
    page that faults when read."""
    region, x = _before_a_guard_page(20)
    x[:] = RNG.standard_normal(20).astype(np.float32)
    y = np.zeros(16, np.float32)
    text = f"""kernel @k(%x: f32[20], %y: f32[16]) {{
  for %j = 0 to 16 {kind} {{
    %y[%j] = select(lt({index}, 20), %x[{index}], -1.0:f32)
  }}
}}"""
    run(text, x, y)
    step = int(index[-2]) if index.startswith("mul") else 1
    want = [x[j * step + (16 if step == 1 else 0)] if j * step + (16 if step == 1 else 0) < 20
            else -1.0 for j in range(16)]
    np.testing.assert_array_equal(y, np.array(want, np.float32))
    assert not region.closed  # the guard page stays mapped until the views are gone


@pytest.mark.parametrize("stride,count", [(2, 16), (3, 11), (4, 16)])
def test_strided_loads_read_their_lanes_elements_only(stride: int, count: int) -> None:
    """Lanes `stride` elements apart are one masked load of their span and a shuffle, not
    a gather. The span's elements past the last lane's, and those of lanes past the loop's
    stop, are not read: here they lie on a page that faults."""
    n = stride * (count - 1) + 1
    region, x = _before_a_guard_page(n)
    x[:] = RNG.standard_normal(n).astype(np.float32)
    y = np.zeros(16, np.float32)
    text = f"""kernel @k(%x: f32[{n}], %y: f32[16]) {{
  for %j = 0 to min(16, {count}) vectorized {{
    %y[%j] = %x[mul(%j, {stride})]
  }}
}}"""
    ir_text = cpu.llvm_ir_text(kernel_module([verify_kernel(parse_kernel(text))]),
                               optimized=False, target=HOST)
    assert "masked.load" in ir_text and "gather" not in ir_text
    run(text, x, y)
    np.testing.assert_array_equal(y[:count], x[::stride])
    assert not region.closed


def test_a_select_whose_loads_are_in_bounds_stays_a_select() -> None:
    """Loads that the loop ranges keep inside their buffers are computed on both sides,
    for one select instruction (no branch in the loop)."""
    text = """kernel @k(%c: bool[8], %a: f32[8], %b: f32[8], %y: f32[8]) {
  for %j = 0 to 8 { %y[%j] = select(%c[%j], %a[%j], %b[sub(7, %j)]) }
}"""
    ir_text = cpu.llvm_ir_text(kernel_module([verify_kernel(parse_kernel(text))]),
                               optimized=False, target=HOST)
    assert " select " in ir_text and "phi float" not in ir_text


def test_gather_with_clamped_vector_index() -> None:
    # A window read at clamped columns with zeros outside (what conv packing does): the
    # index is selects and adds, which have vector code.
    text = """kernel @k(%x: f32[3,10], %y: f32[3,16]) {
  for %r = 0 to 3 {
    for %j = 0 to 16 vectorized {
      %y[%r, %j] = select(and(ge(sub(%j, 2), 0), lt(sub(%j, 2), 10)),
                          %x[%r, select(lt(sub(%j, 2), 0), 0,
                                        select(ge(sub(%j, 2), 10), 9, sub(%j, 2)))],
                          0.0:f32)
    }
  }
}"""
    x, y = RNG.standard_normal((3, 10)).astype(np.float32), np.full((3, 16), 7, np.float32)
    run(text, x, y)
    want = np.zeros((3, 16), np.float32)
    want[:, 2:12] = x
    np.testing.assert_array_equal(y, want)


def test_gather_whose_index_has_no_vector_code() -> None:
    # floordiv on lanes has no vector code: each lane's address is computed apart.
    text = """kernel @k(%x: f32[40], %y: f32[16]) {
  for %j = 0 to 16 vectorized {
    %y[%j] = %x[add(floordiv(mul(%j, 5), 2), 1)]
  }
}"""
    x, y = RNG.standard_normal(40).astype(np.float32), np.zeros(16, np.float32)
    run(text, x, y)
    np.testing.assert_array_equal(y, x[np.arange(16) * 5 // 2 + 1])


# -- streaming stores ----------------------------------------------------------------------------

STREAM = STREAMING_BYTES // 4 + 5  # floats: past the threshold, not a multiple of a line


def stream_text(n: int) -> str:
    return f"""kernel @relu(%x: f32[{n}], %y: f32[{n}]) {{
  for %i = 0 to {n} parallel {{
    %y[%i] = max(%x[%i], 0.0:f32)
  }}
}}"""


@pytest.mark.parametrize("offset", [0, 1, 3, 15])
def test_streaming_stores_at_any_alignment(offset: int) -> None:
    x = RNG.standard_normal(STREAM).astype(np.float32)
    base = np.full(STREAM + 32, -1, np.float32)
    start = (-(base.ctypes.data // 4)) % 16 + offset  # `offset` floats past a line's start
    y = base[start:start + STREAM]
    assert y.size == STREAM
    run(stream_text(STREAM), x, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert (base[:start] == -1).all() and (base[start + STREAM:] == -1).all()


@pytest.mark.skipif(not X86, reason="non-temporal vector stores are an x86 instruction here")
def test_streaming_stores_only_for_large_outputs() -> None:
    def assembly(n: int) -> str:
        return cpu.assembly_text(kernel_module([parse_kernel(stream_text(n))]), target=HOST)

    assert "vmovntps" in assembly(STREAM)
    assert "vmovntps" not in assembly(1 << 16)


# -- identical kernels ---------------------------------------------------------------------------

TWINS = """
kernel @first(%x: f32[64], %y: f32[64]) {
  for %i = 0 to 64 { %y[%i] = exp(%x[%i]) }
}
kernel @second(%x: f32[64], %y: f32[64]) loc("another origin") {
  for %i = 0 to 64 { %y[%i] = exp(%x[%i]) }
}
program @twins {
  input %a: f32[64]
  output %b: f32[64]
  temp %t: f32[64]
  call @first(%a, %t)
  call @second(%t, %b)
}
"""


def test_identical_kernels_are_emitted_once() -> None:
    program = parse_program(TWINS)
    module = program_module(program, {"t": 0})
    second = str(module.get_global("second"))
    assert "call void @\"first\"" in second or "call void @first" in second
    assert "exp" not in second.replace("@first", "")  # no body of its own
    jit = cpu.compile_module(module, target=HOST)
    a, b = RNG.standard_normal(64).astype(np.float32) / 4, np.zeros(64, np.float32)
    arena = np.zeros(256, np.uint8)
    jit.entry("twins")(cpu.pointer_array([a.ctypes.data]), cpu.pointer_array([b.ctypes.data]),
                       cpu.pointer_array([]), arena.ctypes.data)
    np.testing.assert_allclose(b, np.exp(np.exp(a)), rtol=1e-6)
    # Each kernel is still its own symbol (explain times them one by one).
    out = np.zeros(64, np.float32)
    jit.kernel("second", 2)(a.ctypes.data, out.ctypes.data)
    np.testing.assert_allclose(out, np.exp(a), rtol=1e-6)


# -- scatters ------------------------------------------------------------------------------------

def test_store_to_distinct_elements_is_a_masked_scatter() -> None:
    # A packed conv's write-back: lanes are output channels, one plane (7 elements) apart;
    # the last block's lanes past 12 are masked off.
    text = """kernel @k(%x: f32[12,7], %y: f32[12,7]) {
  for %p = 0 to 7 {
    for %b = 0 to 2 {
      for %j = 0 to min(8, sub(12, mul(%b, 8))) vectorized {
        %y[add(mul(%b, 8), %j), %p] = add(%x[add(mul(%b, 8), %j), %p], 1.0:f32)
      }
    }
  }
}"""
    loop = parse_kernel(text).body[0].body[0].body[0]
    assert isinstance(plan_vector(loop, set(), {"x": (12, 7), "y": (12, 7)}), VectorPlan)
    ir_text = cpu.llvm_ir_text(kernel_module([verify_kernel(parse_kernel(text))]),
                               optimized=False, target=HOST)
    assert "llvm.masked.scatter" in ir_text
    x, y = RNG.standard_normal((12, 7)).astype(np.float32), np.zeros((12, 7), np.float32)
    run(text, x, y)
    np.testing.assert_array_equal(y, x + 1)


@pytest.mark.parametrize("index", ["floordiv(%j, 2)", "mul(%j, 0)"])
def test_store_that_lanes_could_share_is_refused(index: str) -> None:
    """Two lanes writing one element would race in a scatter: the verifier refuses the
    loop, with the reason."""
    text = f"""kernel @k(%x: f32[8], %y: f32[8]) {{
  for %j = 0 to 8 vectorized {{ %y[{index}] = %x[%j] }}
}}"""
    why = plan_vector(parse_kernel(text).body[0], set(), {"x": (8,), "y": (8,)})
    assert isinstance(why, str) and "scatter to distinct elements" in why
    with pytest.raises(VerificationError, match="loop %j cannot run on lanes: a store to %y"):
        verify_kernel(parse_kernel(text))


# Stores to one buffer at several indices: the lanes store one index, then the next, which
# is the serial loop's result when no two lanes of the stores meet (Winograd's transforms).
SEVERAL_STORES = {
    # rows of [4, 8] apart: offsets 0 and 8 + j, lanes 0..7 never meet
    "rows": ("f32[4,8]", "%y[0, %j]", "%y[1, %j]", True),
    # a stride-2 scatter's even and odd elements
    "parity": ("f32[16]", "%y[mul(%j, 2)]", "%y[add(mul(%j, 2), 1)]", True),
    # lane j's second store is lane j + 1's first: the serial loop leaves the first store's
    # value there except at the end, the lanes the second's
    "overlap": ("f32[16]", "%y[%j]", "%y[add(%j, 1)]", False),
    "stride-2 overlap": ("f32[16]", "%y[mul(%j, 2)]", "%y[add(mul(%j, 2), 2)]", False),
}


@pytest.mark.parametrize("case", SEVERAL_STORES)
def test_several_stores_to_a_buffer_run_on_lanes_when_no_lanes_meet(case: str) -> None:
    shape, first, second, apart = SEVERAL_STORES[case]
    text = f"""kernel @k(%x: f32[8], %y: {shape}) {{
  for %j = 0 to 7 vectorized {{
    {first} = %x[%j]
    {second} = mul(%x[%j], 2.0:f32)
  }}
}}"""
    dims = tuple(int(d) for d in shape[4:-1].split(","))
    why = plan_vector(parse_kernel(text).body[0], set(), {"x": (8,), "y": dims})
    if not apart:
        assert isinstance(why, str) and "lanes may meet" in why
        return
    assert isinstance(why, VectorPlan)
    x = RNG.standard_normal(8).astype(np.float32)
    y = np.zeros(dims, np.float32)
    run(text, x, y)
    want = np.zeros(dims, np.float32)
    flat = want.reshape(-1)
    for j in range(7):  # the serial loop
        if case == "rows":
            want[0, j], want[1, j] = x[j], 2 * x[j]
        else:
            flat[2 * j], flat[2 * j + 1] = x[j], 2 * x[j]
    np.testing.assert_array_equal(y, want)


def test_scatter_of_a_uniform_half_value_stores_it_rounded() -> None:
    # The value is the same in every lane: rounded to bf16 once, then scattered.
    text = """kernel @k(%x: f32[1], %y: bf16[12,7]) {
  for %p = 0 to 7 {
    for %j = 0 to 12 vectorized { %y[%j, %p] = bf16(%x[0]) }
  }
}"""
    import ml_dtypes

    x, y = np.array([1.5], np.float32), np.zeros((12, 7), ml_dtypes.bfloat16)
    run(text, x, y)
    assert (y.astype(np.float32) == 1.5).all()


# -- reductions ----------------------------------------------------------------------------------

def reduction_text(dtype: str, op: str, n: int, width: int, first: str) -> str:
    """Each row's `op` over n elements, in blocks of `width` lanes (a masked last block
    when width does not divide n)."""
    blocks = -(-n // width)
    return f"""kernel @k(%x: {dtype}[3,{n}], %y: {dtype}[3]) {{
  local %acc: {dtype}[]
  for %r = 0 to 3 {{
    %acc[] = {first}:{dtype}
    for %b = 0 to {blocks} {{
      for %j = 0 to min({width}, sub({n}, mul(%b, {width}))) vectorized {{
        %acc[] = {op}(%acc[], %x[%r, add(mul(%b, {width}), %j)])
      }}
    }}
    %y[%r] = %acc[]
  }}
}}"""


REDUCTIONS = {"add": ("0", np.sum), "max": ("-inf", np.max), "min": ("inf", np.min)}


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64"])
@pytest.mark.parametrize("op", sorted(REDUCTIONS))
@pytest.mark.parametrize("n, width", [(64, 16), (37, 16), (36, 12), (5, 64)])
def test_vectorized_reductions_reduce_across_lanes(dtype, op, n, width) -> None:
    """A local accumulated in a vectorized loop is reduced across the lanes (padded to a
    power of two, masked lanes holding the identity): the serial loop's value, a float
    sum to rounding."""
    first, reference = REDUCTIONS[op]
    if dtype[0] == "i":
        first = {"add": "0", "max": "-1000000", "min": "1000000"}[op]
    text = reduction_text(dtype, op, n, width, first)
    kernel = parse_kernel(text)
    loop = kernel.body[0].body[1].body[0]
    plan = plan_vector(loop, {"acc"}, reductions=True)
    assert isinstance(plan, VectorPlan) and plan.reductions == {"acc"}
    assert isinstance(plan_vector(loop, {"acc"}), str)  # only when asked for
    assert "shufflevector" in cpu.llvm_ir_text(kernel_module([kernel]), HOST, optimized=False)
    np_type = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}[dtype]
    x = (RNG.standard_normal((3, n)) * 100).astype(np_type)
    y = np.zeros(3, np_type)
    run(text, x, y)
    want = reference(x.astype(np.float64), axis=1)
    if dtype[0] == "f" and op == "add":
        np.testing.assert_allclose(y, want, rtol=1e-5 if dtype == "f32" else 1e-12)
    else:
        np.testing.assert_array_equal(y, want.astype(np_type))


@pytest.mark.parametrize("op", ["max", "min"])
def test_vectorized_max_and_min_propagate_nan(op) -> None:
    text = reduction_text("f32", op, 40, 16, REDUCTIONS[op][0])
    x = RNG.standard_normal((3, 40)).astype(np.float32)
    x[0, 3], x[1, 39] = np.nan, np.nan  # in a whole block, in the masked one
    y = np.zeros(3, np.float32)
    run(text, x, y)
    assert np.isnan(y[:2]).all() and y[2] == REDUCTIONS[op][1](x[2])


def test_an_accumulator_read_elsewhere_in_the_body_is_refused() -> None:
    """A body that reads the accumulator other than to combine it (a running value stored
    per lane) has no reduction: the lanes cannot run it, and the verifier says so."""
    text = """kernel @k(%x: f32[20], %y: f32[20]) {
  local %acc: f32[]
  %acc[] = 0.0:f32
  for %j = 0 to 20 vectorized {
    %acc[] = add(%acc[], %x[%j])
    %y[%j] = %acc[]
  }
}"""
    kernel = parse_kernel(text)
    assert "read while the lanes reduce" in plan_vector(kernel.body[1], {"acc"}, reductions=True)
    with pytest.raises(VerificationError, match="read while the lanes reduce"):
        verify_kernel(kernel)


def test_an_accumulator_also_reset_in_the_body_is_refused() -> None:
    """Reset, summed into and stored each iteration (a reduction over an axis of one
    element): no reduction across the lanes, and a refusal, not a crash."""
    text = """kernel @k(%x: f32[3], %y: f32[3]) {
  local %acc: f32[]
  for %j = 0 to 3 {
    %acc[] = 0.0:f32
    %acc[] = add(%acc[], %x[%j])
    %y[%j] = %acc[]
  }
}"""
    why = plan_vector(parse_kernel(text).body[0], {"acc"}, {"x": (3,), "y": (3,)},
                      reductions=True)
    assert isinstance(why, str) and "stored otherwise too" in why


def test_vector_tables_are_the_legality_analysis_ops() -> None:
    """The legality analysis (ember/loops/analysis.py) names the ops with vector code; the
    emitter's tables implement exactly those, so that a planned loop always renders."""
    from ember.codegen import vector, vmath
    from ember.loops.analysis import VECTOR_BINARY, VECTOR_MATH, VECTOR_UNARY

    assert set(vector._UNARY) == VECTOR_UNARY
    assert set(vector._BINARY) == VECTOR_BINARY
    assert set(vmath.FUNCTIONS) == VECTOR_MATH


CASTS = ["bool", "i8", "i32", "i64", "f32", "f64"]
NUMPY = {"bool": np.bool_, "i8": np.int8, "i32": np.int32, "i64": np.int64, "f32": np.float32,
         "f64": np.float64}


@pytest.mark.parametrize("src,dst", [(s, d) for s in CASTS for d in CASTS
                                     if s != d and not (s[0] == "f" and d[0] == "i")])
def test_vector_casts_between_bools_ints_and_floats(src, dst) -> None:
    """The casts among bool, integers and floats (not float to integer) are vector code,
    and give what the scalar cast gives: nonzero (NaN too) is true, bool is 0 or 1,
    integers wrap, sign- or zero-extend by the source."""
    text = f"""kernel @c(%x: {src}[37], %y: {dst}[37]) {{
  for %i = 0 to 37 vectorized {{ %y[%i] = {dst}(%x[%i]) }}
}}"""
    kernel = verify_kernel(parse_kernel(text))  # plan_vector accepts it
    values = RNG.standard_normal(37) * 300
    values[:4] = [0.0, -0.0, np.nan if src[0] == "f" else 1, 255]
    x = values.astype(NUMPY[src]) if src[0] != "i" else values.astype(np.int64).astype(NUMPY[src])
    y = np.zeros(37, NUMPY[dst])
    jit = cpu.compile_module(kernel_module([kernel], name="c"), target=HOST)
    jit.kernel("c", 2)(x.ctypes.data, y.ctypes.data)
    with np.errstate(invalid="ignore"):
        want = (x != 0) if dst == "bool" else x.astype(NUMPY[dst])
    np.testing.assert_array_equal(y, want)


# -- whole vectors and alias scopes ---------------------------------------------------------

def test_a_splits_whole_vectors_store_without_a_mask() -> None:
    """`min(8, 49 - 8 * o)` lanes: the blocks that have all 8 store plain vectors (a masked
    store is microcode on AMD's cores), the last block its one lane under a mask."""
    text = """kernel @k(%x: f32[49], %y: f32[49]) {
  for %o = 0 to 7 {
    for %j = 0 to min(8, sub(49, mul(%o, 8))) vectorized {
      %y[add(mul(%o, 8), %j)] = mul(%x[add(mul(%o, 8), %j)], 2.0:f32)
    }
  }
}"""
    ir_text = cpu.llvm_ir_text(kernel_module([verify_kernel(parse_kernel(text))]),
                               optimized=False, target=HOST)
    assert "masked.store" in ir_text and "store <8 x float>" in ir_text
    x, y = RNG.standard_normal(49).astype(np.float32), np.zeros(49, np.float32)
    run(text, x, y)
    np.testing.assert_array_equal(y, x * 2)


def test_locals_are_scoped_apart_from_the_buffers_given() -> None:
    """Every access to a local carries the locals' scope and every access through a
    parameter says it is not in it: LLVM then keeps a local register tile in registers
    however many uses its alloca has (past 100 it stopped following them, and stored the
    tile at every step)."""
    text = """kernel @k(%x: f32[4,8], %y: f32[8]) {
  local %acc: f32[8]
  for %j = 0 to 8 { %acc[%j] = 0.0:f32 }
  for %d = 0 to 4 {
    for %j = 0 to 8 vectorized { %acc[%j] = add(%acc[%j], %x[%d, %j]) }
  }
  for %j = 0 to 8 { %y[%j] = %acc[%j] }
}"""
    ir_text = cpu.llvm_ir_text(kernel_module([verify_kernel(parse_kernel(text))]),
                               optimized=False, target=HOST)
    accesses = [line for line in ir_text.splitlines()
                if " load " in line or line.lstrip().startswith("store ")]
    floats = [line for line in accesses if "float" in line]
    # acc: its zeroing, the load and store of each step, the final read; x and y once each.
    assert sum("!alias.scope" in line for line in floats) == 4
    assert sum("!noalias" in line for line in floats) == 2
    assert not [line for line in accesses if "i64" in line and "!" in line]  # counters
    x, y = RNG.standard_normal((4, 8)).astype(np.float32), np.zeros(8, np.float32)
    run(text, x, y)
    np.testing.assert_allclose(y, x.sum(0), rtol=1e-6)
