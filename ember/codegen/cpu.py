"""The host CPU target: LLVM's O3 pipeline, the in-process JIT (MCJIT), object code, dumps.

    module = program_module(program, plan)          # ember.codegen.llvm
    jit = compile_module(module)                    # O3 + machine code, in this process
    run = jit.entry(program.name)                   # ctypes: run(inputs, outputs, constants, arena)

`emit_object` and `load_object` let a cache keep the machine code: the object bytes load
into a fresh engine without LLVM compiling anything again.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import llvmlite.binding as llvm
from llvmlite import ir

from ember.codegen import CodegenError
from ember.codegen.llvm import entry_name

ENTRY_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p)
_PROCESS = ctypes.CDLL(None)


@functools.cache
def _initialize() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()


def new_host_target_machine(opt: int = 3) -> llvm.TargetMachine:
    """A target machine for this CPU: its triple, its name (e.g. znver3) and its features
    (AVX2, FMA, ...), so that LLVM may use every instruction the host has."""
    _initialize()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=opt, reloc="default", codemodel="jitdefault")


@functools.cache
def host_target_machine(opt: int = 3) -> llvm.TargetMachine:
    """The shared host target machine, for optimizing and emitting code. An execution engine
    takes ownership of (and frees) its target machine, so each gets a new one."""
    return new_host_target_machine(opt)


def host_features() -> set[str]:
    """The host's enabled CPU features, without the '+' (e.g. {'avx2', 'fma', ...})."""
    _initialize()
    return {name for name, on in llvm.get_host_cpu_features().items() if on}


def parse(module: ir.Module | str, tm: llvm.TargetMachine | None = None) -> llvm.ModuleRef:
    """An llvmlite IR module (or its text) as a verified LLVM module for target `tm`."""
    tm = tm or host_target_machine()
    if isinstance(module, ir.Module):
        module.triple = tm.triple
        module.data_layout = str(tm.target_data)
    ref = llvm.parse_assembly(str(module))
    ref.triple = tm.triple
    ref.data_layout = str(tm.target_data)
    try:
        ref.verify()
    except RuntimeError as error:
        raise CodegenError(f"generated LLVM IR does not verify: {error}") from None
    return ref


def optimize(ref: llvm.ModuleRef, tm: llvm.TargetMachine | None = None, level: int = 3) -> None:
    """Run LLVM's O`level` module pipeline (new pass manager) on `ref`, in place."""
    tm = tm or host_target_machine()
    options = llvm.create_pipeline_tuning_options(speed_level=level)
    builder = llvm.create_pass_builder(tm, options)
    builder.getModulePassManager().run(ref, builder)


def compile_ir(module: ir.Module | str, opt: int = 3) -> llvm.ModuleRef:
    """Parse, verify and optimize; the result is ready for the JIT or for object code."""
    tm = host_target_machine()
    ref = parse(module, tm)
    if opt:
        optimize(ref, tm, opt)
    return ref


def _check_externals(ref: llvm.ModuleRef) -> None:
    """Every function the module calls but does not define must exist in this process:
    MCJIT resolves a missing symbol to address 0, so calling it would crash."""
    for fn in ref.functions:
        if fn.is_declaration and not fn.name.startswith("llvm.") and \
                not hasattr(_PROCESS, fn.name):
            raise CodegenError(f"generated code calls '{fn.name}', which this process lacks")


class JitModule:
    """Machine code loaded in this process. It owns the execution engine: the code lives as
    long as this object, so keep it alive while its functions may run."""

    def __init__(self, engine: llvm.ExecutionEngine, ref: llvm.ModuleRef | None = None):
        self.engine = engine
        self.module = ref  # the optimized module (None when loaded from object code)

    def address(self, symbol: str) -> int:
        address = self.engine.get_function_address(symbol)
        if not address:
            raise CodegenError(f"no function '{symbol}' in the compiled module")
        return address

    def function(self, symbol: str, restype, *argtypes) -> ctypes._CFuncPtr:
        fn = ctypes.CFUNCTYPE(restype, *argtypes)(self.address(symbol))
        fn._ember_owner = self  # a callable keeps its code alive
        return fn

    def kernel(self, name: str, nparams: int) -> ctypes._CFuncPtr:
        """A kernel as a ctypes function of `nparams` buffer pointers."""
        return self.function(name, None, *([ctypes.c_void_p] * nparams))

    def entry(self, program_name: str) -> ctypes._CFuncPtr:
        """The entry of program `program_name`: fn(inputs, outputs, constants, arena), the
        first three arrays of buffer pointers (see `pointer_array`)."""
        fn = ENTRY_TYPE(self.address(entry_name(program_name)))
        fn._ember_owner = self
        return fn


def _engine(ref: llvm.ModuleRef) -> llvm.ExecutionEngine:
    engine = llvm.create_mcjit_compiler(ref, new_host_target_machine())
    engine.finalize_object()
    engine.run_static_constructors()
    return engine


def jit(ref: llvm.ModuleRef) -> JitModule:
    """Machine code for an optimized module (from `compile_ir`), in this process."""
    _check_externals(ref)
    return JitModule(_engine(ref), ref)


def compile_module(module: ir.Module | str, opt: int = 3) -> JitModule:
    """Optimize and JIT-compile an llvmlite module (or LLVM IR text)."""
    return jit(compile_ir(module, opt))


def emit_object(module: ir.Module | str | llvm.ModuleRef, opt: int = 3) -> bytes:
    """Host object code for a module; `load_object` runs it. An `llvm.ModuleRef` is taken as
    already optimized."""
    ref = module if isinstance(module, llvm.ModuleRef) else compile_ir(module, opt)
    _check_externals(ref)
    return host_target_machine().emit_object(ref)


def load_object(data: bytes) -> JitModule:
    """Load object code from `emit_object` into a fresh engine (no LLVM compile)."""
    tm = new_host_target_machine()
    empty = llvm.parse_assembly(f'target triple = "{tm.triple}"\n')
    engine = llvm.create_mcjit_compiler(empty, tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(data))
    engine.finalize_object()
    return JitModule(engine)


def llvm_ir_text(module: ir.Module | str, optimized: bool = True) -> str:
    """The LLVM IR of a module, after O3 unless `optimized` is false."""
    return str(compile_ir(module, 3 if optimized else 0))


def assembly_text(module: ir.Module | str | llvm.ModuleRef, opt: int = 3) -> str:
    """Host assembly for a module (an `llvm.ModuleRef` is taken as already optimized)."""
    ref = module if isinstance(module, llvm.ModuleRef) else compile_ir(module, opt)
    return host_target_machine().emit_assembly(ref)


def pointer_array(addresses: Sequence[int]) -> ctypes.Array:
    """A C array of pointers, as the entry function takes for inputs/outputs/constants.
    Keep it alive for the duration of the call."""
    return (ctypes.c_void_p * max(len(addresses), 1))(*addresses)
