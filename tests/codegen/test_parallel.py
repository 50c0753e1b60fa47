"""Parallel loops on the OpenMP runtime: results equal the serial loop's and NumPy's for any
team size, every iteration runs exactly once, locals are private to each thread, only the
outermost parallel loop forks, the thread count lives in a global that the runtime sets (so
the code does not depend on it), object code from the disk cache runs in a new process, and
the verifier enforces the locals rule.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ember.codegen import CodegenError, cpu
from ember.codegen.llvm import LOCAL_ALIGN, kernel_module, program_module
from ember.errors import VerificationError
from ember.loops.text import parse_kernel, parse_program
from ember.loops.verify import verify_kernel, verify_program
from ember.target import Target

HOST = Target.host()

REPO = Path(__file__).resolve().parents[2]
TEAMS = [1, 2, 4]


def ptr(a: np.ndarray) -> int:
    assert a.flags.c_contiguous
    return a.ctypes.data


def serial(text: str) -> str:
    return re.sub(r"\bparallel\b", "", text)


@functools.cache
def compiled(text: str) -> cpu.JitModule:
    return cpu.compile_module(kernel_module([verify_kernel(parse_kernel(text))]), target=HOST)


def run(text: str, team: int | None, *arrays: np.ndarray) -> list[np.ndarray]:
    """Run the kernel of `text` on copies of `arrays` with a team of `team` threads (None:
    its serial twin); returns the copies."""
    jit = compiled(text if team else serial(text))
    if team:
        assert jit.set_num_threads("kernels", team)
    copies = [a.copy() for a in arrays]
    name = parse_kernel(text).name
    jit.kernel(name, len(copies))(*(ptr(a) for a in copies))
    return copies


def check_team_sizes(text: str, want: list[np.ndarray], *arrays: np.ndarray,
                     atol: float = 1e-6) -> None:
    """The serial loop gives NumPy's results (`want`: the last arrays), and each team size
    gives exactly the serial loop's."""
    reference = run(text, None, *arrays)
    for ref, wanted in zip(reference[-len(want):], want):
        np.testing.assert_allclose(ref, wanted, rtol=1e-5, atol=atol)
    for team in TEAMS:
        got = run(text, team, *arrays)
        for g, r in zip(got, reference):
            np.testing.assert_array_equal(g, r, err_msg=f"{team} threads")


# -- results --------------------------------------------------------------------------------

ELEMENTWISE = """kernel @axpb(%x: f32[1001], %y: f32[1001]) {
  for %i = 0 to 1001 parallel { %y[%i] = add(mul(%x[%i], 3.0:f32), 1.0:f32) }
}"""


def test_elementwise() -> None:
    x = np.random.default_rng(0).standard_normal(1001).astype(np.float32)
    check_team_sizes(ELEMENTWISE, [x * 3 + 1], x, np.zeros_like(x))


ROW_SUM = """kernel @row_sum(%x: f32[67,3001], %y: f32[67]) {
  local %acc: f32[]
  for %i = 0 to 67 parallel {
    %acc[] = 0.0:f32
    for %j = 0 to 3001 { %acc[] = add(%acc[], %x[%i, %j]) }
    %y[%i] = %acc[]
  }
}"""


def function_text(ir: str, name: str) -> str:
    match = re.search(rf"define [^@]*@\"?{re.escape(name)}\"?\(.*?\n}}", ir, re.S)
    assert match, f"no function @{name}"
    return match.group(0)


def test_row_sum_with_a_private_accumulator() -> None:
    x = np.random.default_rng(1).standard_normal((67, 3001)).astype(np.float32)
    check_team_sizes(ROW_SUM, [x.astype(np.float64).sum(axis=1)], x, np.zeros(67, np.float32),
                     atol=1e-3)
    # Each thread has its own accumulator: an alloca of the outlined body, not of the kernel.
    ir = cpu.llvm_ir_text(kernel_module([parse_kernel(ROW_SUM)]), optimized=False, target=HOST)
    assert re.search(r"%acc = alloca", function_text(ir, "row_sum.parallel0"))
    assert function_text(ir, "row_sum").count("%acc") == 1  # its own alloca, unused


def test_locals_start_on_a_cache_line_in_kernels_and_outlined_bodies() -> None:
    """A local is a vector's home (a packed panel read one vector per row): one that
    straddles two cache lines costs two loads."""
    ir = cpu.llvm_ir_text(kernel_module([parse_kernel(ROW_SUM)]), optimized=False, target=HOST)
    for name in ("row_sum", "row_sum.parallel0"):
        allocas = re.findall(r"%acc = alloca [^\n]*", function_text(ir, name))
        assert allocas and all(a.endswith(f"align {LOCAL_ALIGN}") for a in allocas), allocas


MATMUL = """kernel @matmul(%a: f64[13,7], %b: f64[7,5], %c: f64[13,5]) {
  local %acc: f64[5]
  for %i = 0 to 13 parallel {
    for %j = 0 to 5 { %acc[%j] = 0.0:f64 }
    for %k = 0 to 7 {
      for %j = 0 to 5 { %acc[%j] = add(%acc[%j], mul(%a[%i, %k], %b[%k, %j])) }
    }
    for %j = 0 to 5 { %c[%i, %j] = %acc[%j] }
  }
}"""


def test_matmul_with_a_private_row_of_accumulators() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((13, 7)), rng.standard_normal((7, 5))
    check_team_sizes(MATMUL, [a @ b], a, b, np.zeros((13, 5)))


# (start, stop, step): empty, fewer iterations than threads, odd counts above, strides.
RANGES = [(0, 0, 1), (9, 3, 1), (0, 1, 1), (0, 3, 1), (0, 13, 1), (0, 63, 1), (5, 60, 3),
          (62, 1, -5), (63, -1, -1)]


@functools.cache
def hits_module() -> cpu.JitModule:
    kernels = [parse_kernel(f"""kernel @hits{n}(%hits: i32[64]) {{
      for %i = {start} to {stop} step {step} parallel {{
        %hits[%i] = add(%hits[%i], 1:i32)
      }}
    }}""") for n, (start, stop, step) in enumerate(RANGES)]
    return cpu.compile_module(kernel_module(kernels), target=HOST)


@pytest.mark.parametrize("team", [1, 2, 3, 4, 8])
def test_every_iteration_runs_once(team: int) -> None:
    """Static chunks cover the range exactly, for any trip count and team size (a team
    larger than the trip count leaves threads with nothing to do)."""
    jit = hits_module()
    assert jit.set_num_threads("kernels", team)
    for n, (start, stop, step) in enumerate(RANGES):
        hits = np.zeros(64, np.int32)
        jit.kernel(f"hits{n}", 1)(ptr(hits))
        want = np.zeros(64, np.int32)
        want[list(range(start, stop, step))] = 1
        np.testing.assert_array_equal(hits, want, err_msg=f"range({start}, {stop}, {step})")


# The parallel loop runs once per %t: it captures %t's value.
IN_SERIAL = """kernel @weighted(%x: f32[5,37], %y: f32[37]) {
  for %t = 0 to 5 {
    for %i = 0 to 37 parallel { %y[%i] = add(%y[%i], mul(%x[%t, %i], f32(add(%t, 1)))) }
  }
}"""


def test_parallel_loop_nested_in_a_serial_loop() -> None:
    x = np.random.default_rng(3).standard_normal((5, 37)).astype(np.float32)
    want = (x * np.arange(1, 6, dtype=np.float32)[:, None]).sum(axis=0)
    check_team_sizes(IN_SERIAL, [want], x, np.zeros(37, np.float32))


# Bounds that depend on outer variables, counting up and down.
TRIANGLE = """kernel @triangle(%x: f32[9,17], %up: f32[9,17], %down: f32[9,17]) {
  for %r = 0 to 9 {
    for %c = %r to add(%r, 8) parallel { %up[%r, %c] = mul(%x[%r, %c], 2.0:f32) }
    for %c = add(%r, 8) to %r step -3 parallel { %down[%r, %c] = neg(%x[%r, %c]) }
  }
}"""


def test_parallel_bounds_use_an_outer_variable() -> None:
    x = np.random.default_rng(4).standard_normal((9, 17)).astype(np.float32)
    up, down = np.zeros_like(x), np.zeros_like(x)
    for r in range(9):
        up[r, r:r + 8] = 2 * x[r, r:r + 8]
        cols = list(range(r + 8, r, -3))
        down[r, cols] = -x[r, cols]
    check_team_sizes(TRIANGLE, [up, down], x, np.zeros_like(x), np.zeros_like(x))


NESTED = """kernel @nested(%x: f32[6,11], %y: f32[6,11]) {
  for %i = 0 to 6 parallel {
    for %j = 0 to 11 parallel { %y[%i, %j] = mul(%x[%i, %j], %x[%i, %j]) }
  }
}"""


def test_only_the_outermost_parallel_loop_forks() -> None:
    ir = cpu.llvm_ir_text(kernel_module([parse_kernel(NESTED)]), optimized=False, target=HOST)
    assert len(re.findall(r"call void @\"?GOMP_parallel", ir)) == 1
    x = np.random.default_rng(5).standard_normal((6, 11)).astype(np.float32)
    check_team_sizes(NESTED, [x * x], x, np.zeros_like(x))


# -- the generated code and the thread count ---------------------------------------------------

def test_llvm_ir_outlines_the_body_and_calls_gomp_parallel(monkeypatch) -> None:
    def optimized_ir(threads: str) -> str:
        monkeypatch.setenv("EMBER_NUM_THREADS", threads)
        return cpu.llvm_ir_text(kernel_module([parse_kernel(ROW_SUM)]), target=HOST)

    ir = cpu.llvm_ir_text(kernel_module([parse_kernel(ROW_SUM)]), optimized=False, target=HOST)
    assert re.search(r"define internal void @row_sum\.parallel0\(ptr", ir)
    assert re.search(r"call void @GOMP_parallel\(ptr @row_sum\.parallel0, ptr", ir)
    # A team of one runs the body itself, without the runtime's fork and join.
    assert re.search(r"icmp eq i32 %num_threads, 1", ir)
    assert re.search(r"call void @row_sum\.parallel0\(ptr", ir)
    ir = optimized_ir("1")
    assert re.search(r"call void @GOMP_parallel\(ptr nonnull @row_sum\.parallel0, ptr", ir)
    # The team size is read from the global at each call, never a constant in the code.
    assert re.search(r"load i32, ptr @kernels_num_threads", ir)
    assert re.search(r"@kernels_num_threads = [a-z_ ]*global i32 0", ir)
    assert optimized_ir("2") == ir
    assert "GOMP_parallel" not in cpu.llvm_ir_text(kernel_module([parse_kernel(
        serial(ROW_SUM))]), target=HOST)


PROGRAM = ELEMENTWISE + """
program @scale {
  input %x: f32[1001]
  output %y: f32[1001]
  call @axpb(%x, %y)
}
"""


def thread_global(jit: cpu.JitModule, program: str) -> int:
    address = jit.engine.get_global_value_address(f"{program}_num_threads")
    return ctypes.c_int32.from_address(address).value


@pytest.mark.parametrize("threads", ["1", "2"])
def test_the_entry_takes_the_thread_count_from_ember_num_threads(monkeypatch, threads) -> None:
    monkeypatch.setenv("EMBER_NUM_THREADS", threads)
    jit = cpu.compile_module(program_module(verify_program(parse_program(PROGRAM)), {}),
                             target=HOST)
    assert thread_global(jit, "scale") == 0  # until the runtime looks the entry up
    entry = jit.entry("scale")
    assert thread_global(jit, "scale") == int(threads)
    x = np.arange(1001, dtype=np.float32)
    y = np.zeros_like(x)
    entry(cpu.pointer_array([ptr(x)]), cpu.pointer_array([ptr(y)]), cpu.pointer_array([]), 0)
    np.testing.assert_array_equal(y, x * 3 + 1)
    assert jit.set_num_threads("scale", 3) and thread_global(jit, "scale") == 3
    jit.entry("scale")  # a second lookup keeps what was set
    assert thread_global(jit, "scale") == 3
    assert not jit.set_num_threads("other")  # no such module: nothing to set


def test_default_thread_count(monkeypatch) -> None:
    monkeypatch.delenv("EMBER_NUM_THREADS", raising=False)
    assert cpu.default_num_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("EMBER_NUM_THREADS", "5")
    assert cpu.default_num_threads() == 5
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("EMBER_NUM_THREADS", bad)
        with pytest.raises(CodegenError, match="EMBER_NUM_THREADS must be a positive integer"):
            cpu.default_num_threads()


DISK_CHILD = """
import ctypes, json, sys
import numpy as np
from ember.runtime.cache import DiskCache
from ember.runtime.executable import load_artifact
from ember.target import Target

exe = load_artifact(DiskCache().load(sys.argv[1]), Target.host())
address = exe.engine.engine.get_global_value_address("scale_num_threads")
x = np.arange(1001, dtype=np.float32)
print(json.dumps({"ok": bool((exe(x)[0] == x * 3 + 1).all()),
                  "threads": ctypes.c_int32.from_address(address).value}))
"""


def test_object_code_from_the_disk_cache_runs_in_a_new_process(tmp_path) -> None:
    """The cache's object code calls libgomp, which a fresh process has not loaded: loading
    the object loads it, and the entry lookup sets the team size."""
    from ember.runtime.cache import DiskCache
    from ember.runtime.executable import build_artifact

    key = "ab" * 32
    DiskCache(tmp_path).store(key, build_artifact(parse_program(PROGRAM), target=HOST))
    for threads in ("1", "2"):
        env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO),
               "EMBER_NUM_THREADS": threads}
        done = subprocess.run([sys.executable, "-c", DISK_CHILD, key], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1]) == {
            "ok": True, "threads": int(threads)}


def test_missing_libgomp_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(cpu, "_PROCESS", object())  # nothing resolves
    monkeypatch.setattr(cpu, "_libgomp_candidates", lambda: [])
    with pytest.raises(CodegenError, match="parallel loops need the OpenMP runtime, libgomp"):
        cpu.load_openmp.__wrapped__()


@pytest.mark.parametrize("name", ["GOMP_parallel", "omp_get_thread_num", "kernels_num_threads"])
def test_openmp_symbols_are_reserved(name: str) -> None:
    with pytest.raises(CodegenError, match="reserved"):
        kernel_module([parse_kernel(f"kernel @{name}(%x: f32[2]) {{ %x[0] = 0.0:f32 }}")])


# -- the verifier's rule for locals -----------------------------------------------------------

def kernel_with(body: str) -> str:
    return f"""kernel @k(%x: f32[8,4], %y: f32[8]) {{
      local %acc: f32[]
      local %row: f32[4]
      {body}
    }}"""


ACCEPTED = {
    "written first": ROW_SUM,
    "written element by element in a constant loop": MATMUL,
    "written in both branches": """for %i = 0 to 8 parallel {
        if lt(%x[%i, 0], 0.0:f32) { %acc[] = 1.0:f32 } else { %acc[] = 2.0:f32 }
        %y[%i] = %acc[]
      }""",
    "rewritten after the parallel loop": """for %i = 0 to 8 parallel { %acc[] = %x[%i, 0]
        %y[%i] = %acc[] }
      %acc[] = 0.0:f32
      %y[0] = %acc[]""",
    "serial code around a parallel loop that does not use it": """%acc[] = 1.0:f32
      for %i = 0 to 8 parallel { %y[%i] = %x[%i, 0] }
      %y[0] = %acc[]""",
}
REJECTED = {
    "read before written": ("""for %i = 0 to 8 parallel {
        %acc[] = add(%acc[], %x[%i, 0])
        %y[%i] = %acc[] }""", "%acc is read in parallel loop %i before the iteration"),
    "initialized outside": ("""%acc[] = 0.0:f32
      for %i = 0 to 8 parallel { %y[%i] = %acc[] }""", "%acc is read in parallel loop %i"),
    "written in one branch": ("""for %i = 0 to 8 parallel {
        if lt(%x[%i, 0], 0.0:f32) { %acc[] = 1.0:f32 }
        %y[%i] = %acc[] }""", "%acc is read in parallel loop %i"),
    "written in a loop that may not run": ("""for %i = 0 to 8 parallel {
        for %j = 0 to %i { %row[%j] = 0.0:f32 }
        %y[%i] = %row[0] }""", "%row is read in parallel loop %i"),
    "read after the loop": ("""for %i = 0 to 8 parallel { %acc[] = %x[%i, 0]
        %y[%i] = %acc[] }
      %y[0] = %acc[]""", "%acc is read after parallel loop %i before it is written again"),
    "read in the next iteration of a serial loop": ("""%acc[] = 0.0:f32
      for %t = 0 to 3 {
        %y[%t] = %acc[]
        for %i = 0 to 8 parallel { %acc[] = %x[%i, 0]
          %y[%i] = %acc[] }
      }""", "%acc is read after parallel loop %i"),
    "inner parallel loop reads the outer iteration's local": ("""for %i = 0 to 8 parallel {
        %acc[] = 0.0:f32
        for %j = 0 to 4 parallel { %y[%i] = %acc[] }
      }""", "%acc is read in parallel loop %j"),
}


@pytest.mark.parametrize("name", ACCEPTED)
def test_verifier_accepts_locals_written_before_read(name: str) -> None:
    text = ACCEPTED[name]
    verify_kernel(parse_kernel(text if text.startswith("kernel") else kernel_with(text)))


@pytest.mark.parametrize("name", REJECTED)
def test_verifier_rejects_values_crossing_a_parallel_loop_through_a_local(name: str) -> None:
    body, message = REJECTED[name]
    with pytest.raises(VerificationError, match=re.escape(message)):
        verify_kernel(parse_kernel(kernel_with(body)))
