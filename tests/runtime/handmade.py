"""A hand-written native entry for runtime tests that must not depend on codegen.

The program: input %x: f32[N], constant %c: f32[N], temp %t: f32[N] (in the arena),
outputs %y: f32[N] = x + c (through t) and %info: i64[3] = the addresses the entry saw
(x, arena, c), so tests can check what was passed by pointer.
"""

from __future__ import annotations

import llvmlite.binding as llvm

from ember.loops.ir import Program
from ember.loops.text import parse_program
from ember.runtime.memory_plan import MemoryPlan, plan_memory

N = 8
ENTRY = "handmade_entry"


def program(n: int = N) -> Program:
    return parse_program(f"""
kernel @k(%x: f32[{n}], %c: f32[{n}], %t: f32[{n}], %y: f32[{n}], %info: i64[3]) {{
}}
program @handmade {{
  input %x: f32[{n}]
  output %y: f32[{n}]
  output %info: i64[3]
  constant %c: f32[{n}]
  temp %t: f32[{n}]
  call @k(%x, %c, %t, %y, %info)
}}
""")


def ir_text(plan: MemoryPlan, n: int = N) -> str:
    t = plan.offsets["t"]
    return f"""
define i32 @{ENTRY}(ptr %inputs, ptr %outputs, ptr %constants, ptr %arena) {{
entry:
  %x = load ptr, ptr %inputs
  %y = load ptr, ptr %outputs
  %infop = getelementptr ptr, ptr %outputs, i64 1
  %info = load ptr, ptr %infop
  %c = load ptr, ptr %constants
  %tmp = getelementptr i8, ptr %arena, i64 {t}
  %xi = ptrtoint ptr %x to i64
  %ai = ptrtoint ptr %arena to i64
  %ci = ptrtoint ptr %c to i64
  store i64 %xi, ptr %info
  %info1 = getelementptr i64, ptr %info, i64 1
  store i64 %ai, ptr %info1
  %info2 = getelementptr i64, ptr %info, i64 2
  store i64 %ci, ptr %info2
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %xp = getelementptr float, ptr %x, i64 %i
  %cp = getelementptr float, ptr %c, i64 %i
  %tp = getelementptr float, ptr %tmp, i64 %i
  %yp = getelementptr float, ptr %y, i64 %i
  %xv = load float, ptr %xp
  %cv = load float, ptr %cp
  %s = fadd float %xv, %cv
  store float %s, ptr %tp
  %tv = load float, ptr %tp
  store float %tv, ptr %yp
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, {n}
  br i1 %done, label %exit, label %loop
exit:
  ret i32 0
}}
"""


def target_machine() -> llvm.TargetMachine:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
        reloc="pic", codemodel="default")


def object_code(plan: MemoryPlan, n: int = N) -> bytes:
    module = llvm.parse_assembly(ir_text(plan, n))
    module.triple = llvm.get_process_triple()
    return target_machine().emit_object(module)


def load_object(code: bytes) -> tuple[llvm.ExecutionEngine, int]:
    """A fresh engine holding `code`, and the entry's address."""
    tm = target_machine()
    empty = llvm.parse_assembly("")
    empty.triple = llvm.get_process_triple()
    engine = llvm.create_mcjit_compiler(empty, tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(code))
    engine.finalize_object()
    return engine, engine.get_function_address(ENTRY)


def build(n: int = N):
    """(program, plan, engine, entry address) of the handmade program."""
    prog = program(n)
    plan = plan_memory(prog)
    engine, address = load_object(object_code(plan, n))
    return prog, plan, engine, address
