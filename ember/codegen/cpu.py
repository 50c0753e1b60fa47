"""The host CPU target: LLVM's O3 pipeline, the in-process JIT (MCJIT), object code, dumps.

    module = program_module(program, plan)          # ember.codegen.llvm
    jit = compile_module(module)                    # O3 + machine code, in this process
    run = jit.entry(program.name)                   # ctypes: run(inputs, outputs, constants, arena)

`emit_object` and `load_object` let a cache keep the machine code: the object bytes load
into a fresh engine without LLVM compiling anything again. A large program is compiled as
several modules on all cores (`compile_objects`, `load_objects`).

Code with parallel loops calls libgomp, which is loaded into the process (RTLD_GLOBAL) the
first time such code is loaded. Its team size is a global of the module that `JitModule`
sets when the program's entry is looked up: `EMBER_NUM_THREADS`, else the cores this
process may run on (`default_num_threads`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir
from llvmlite.binding import ffi

from ember.codegen import CodegenError, helpers, vmath
from ember.codegen.llvm import entry_name
from ember.codegen.parallel import OPENMP_SYMBOLS, num_threads_symbol
from ember.target import Target, usable_cores

ENTRY_TYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_void_p)
_PROCESS = ctypes.CDLL(None)


@functools.cache
def _initialize() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()


@functools.cache
def _initialize_all() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


def new_target_machine(target: Target, opt: int = 3, jit: bool = True) -> llvm.TargetMachine:
    """A target machine for `target`: its triple, CPU and features, so that LLVM may use
    every instruction it has. JIT code (`jit`) runs in this process; other code is
    position independent, for object files and shared libraries."""
    _initialize()
    if not target.runs_here():
        _initialize_all()
    try:
        found = llvm.Target.from_triple(target.triple)
    except RuntimeError as error:
        raise CodegenError(f"LLVM cannot generate code for {target.triple}: {error}") from None
    return found.create_target_machine(cpu=target.cpu, features=target.feature_string,
                                       opt=opt, reloc="default" if jit else "pic",
                                       codemodel="jitdefault" if jit else "default")


@functools.cache
def target_machine(target: Target, opt: int = 3) -> llvm.TargetMachine:
    """The shared JIT target machine of `target`, for optimizing and emitting code. An
    execution engine takes ownership of (and frees) its target machine, so each gets a
    new one (`new_target_machine`)."""
    return new_target_machine(target, opt)


def parse(module: ir.Module | str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    """An llvmlite IR module (or its text) as a verified LLVM module for target `tm`."""
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


def optimize(ref: llvm.ModuleRef, tm: llvm.TargetMachine, level: int = 3,
             unroll: bool = True) -> None:
    """Run LLVM's O`level` module pipeline (new pass manager) on `ref`, in place; its loop
    unroller only with `unroll` (`pipeline_options`)."""
    builder = llvm.create_pass_builder(tm, pipeline_options(level, unroll))
    builder.getModulePassManager().run(ref, builder)


def pipeline_options(level: int, unroll: bool) -> llvm.PipelineTuningOptions:
    """LLVM's O`level` pipeline options; its loop unroller off unless `unroll` (CPU code:
    off). A CPU schedule unrolls where that pays (register tiles, a vector loop's copies);
    LLVM's unroller, on the loops the schedule leaves serial, multiplies code that no
    measurement found faster and much of LLVM's time (docs/benchmarks.md, stop 41)."""
    options = llvm.create_pipeline_tuning_options(speed_level=level)
    options.loop_unrolling = unroll
    return options


def compile_ir(module: ir.Module | str, target: Target, opt: int = 3) -> llvm.ModuleRef:
    """Parse, verify and optimize for `target`; the result is ready for the JIT or for
    object code."""
    tm = target_machine(target)
    ref = parse(module, tm)
    if opt:
        optimize(ref, tm, opt, unroll=False)
    return ref


# -- the OpenMP runtime and the thread count -----------------------------------------------------

def _libgomp_candidates() -> list[str]:
    """Where libgomp may be: the system's (by soname, which also finds a copy that torch
    already loaded, so the process keeps one OpenMP runtime), then the one torch ships."""
    found = [name] if (name := ctypes.util.find_library("gomp")) else []
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found += sorted(str(p) for p in (Path(folder) / "lib").glob("libgomp*.so*"))
    return found


@functools.cache
def load_openmp() -> str:
    """Make libgomp's symbols visible to the JIT (loaded permanently, RTLD_GLOBAL); returns
    where they come from. Raises CodegenError when no libgomp can be found."""
    if all(hasattr(_PROCESS, name) for name in OPENMP_SYMBOLS):
        return "the process"
    tried = []
    for candidate in _libgomp_candidates():
        try:
            llvm.load_library_permanently(candidate)
        except RuntimeError as error:
            tried.append(f"{candidate} ({error})")
            continue
        if all(hasattr(_PROCESS, name) for name in OPENMP_SYMBOLS):
            return candidate
        tried.append(f"{candidate} (lacks {', '.join(OPENMP_SYMBOLS)})")
    raise CodegenError("parallel loops need the OpenMP runtime, libgomp, which was not found"
                       f" (tried: {'; '.join(tried) or 'nothing found'}); install it (e.g."
                       " apt-get install libgomp1) or emit the loops as serial")


def default_num_threads() -> int:
    """The team size of parallel loops: EMBER_NUM_THREADS, else the number of cores this
    process may run on."""
    value = os.environ.get("EMBER_NUM_THREADS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise CodegenError(f"EMBER_NUM_THREADS must be a positive integer, not '{value}'")
        return int(value)
    return usable_cores()


def _declared(ref: llvm.ModuleRef) -> list[str]:
    """The functions `ref` calls but does not define (LLVM's intrinsics aside)."""
    return [fn.name for fn in ref.functions
            if fn.is_declaration and not fn.name.startswith("llvm.")]


def _check_externals(declared: Iterable[str]) -> None:
    """Every function the code calls but does not define must exist in this process:
    MCJIT resolves a missing symbol to address 0, so calling it would crash."""
    declared = list(declared)
    if any(name in OPENMP_SYMBOLS for name in declared):
        load_openmp()
    for name in declared:
        if not hasattr(_PROCESS, name):
            raise CodegenError(f"generated code calls '{name}', which this process lacks")


class JitModule:
    """Machine code loaded in this process. It owns the execution engine: the code lives as
    long as this object, so keep it alive while its functions may run.

    The first lookup of a program's entry (`entry`, or `address` of the entry symbol, which
    is how the runtime finds it) sets the program's thread count to `default_num_threads()`
    unless `set_num_threads` set it before."""

    def __init__(self, engine: llvm.ExecutionEngine, ref: llvm.ModuleRef | None = None):
        self.engine = engine
        self.module = ref  # the optimized module (None when loaded from object code)
        self.threads: dict[str, int] = {}  # module name -> the team size set for it

    def address(self, symbol: str) -> int:
        address = self.engine.get_function_address(symbol)
        if not address:
            raise CodegenError(f"no function '{symbol}' in the compiled module")
        program = symbol.removesuffix(entry_name(""))
        if program != symbol and program not in self.threads:
            self.set_num_threads(program)  # a program's entry: size its team before it runs
        return address

    def set_num_threads(self, module_name: str, count: int | None = None) -> bool:
        """Run the parallel loops of module `module_name` (a program's name, or the name
        given to `kernel_module`) on `count` threads (default: `default_num_threads()`).
        Returns False when the module has no parallel loop, so nothing to set."""
        count = default_num_threads() if count is None else count
        if count < 1:
            raise CodegenError(f"a thread count must be at least 1, not {count}")
        self.threads[module_name] = count
        symbol = num_threads_symbol(module_name)
        if self.module is not None and symbol not in {g.name for g in self.module.global_variables}:
            return False
        address = self.engine.get_global_value_address(symbol)
        if not address:
            return False
        ctypes.c_int32.from_address(address).value = count  # an aligned i32: a single store
        return True

    def function(self, symbol: str, restype, *argtypes) -> ctypes._CFuncPtr:
        fn = ctypes.CFUNCTYPE(restype, *argtypes)(self.address(symbol))
        fn._ember_owner = self  # a callable keeps its code alive
        return fn

    def kernel(self, name: str, nparams: int) -> ctypes._CFuncPtr:
        """A kernel as a ctypes function of `nparams` buffer pointers."""
        return self.function(name, None, *([ctypes.c_void_p] * nparams))

    def entry(self, program_name: str) -> ctypes._CFuncPtr:
        """The entry of program `program_name`: fn(inputs, outputs, constants, arena), the
        first three arrays of buffer pointers (see `pointer_array`); it returns the status
        (0, or which check failed: `ember.runtime.executable.Interface.failure`)."""
        fn = ENTRY_TYPE(self.address(entry_name(program_name)))
        fn._ember_owner = self
        return fn


def _engine(ref: llvm.ModuleRef, target: Target) -> llvm.ExecutionEngine:
    engine = llvm.create_mcjit_compiler(ref, new_target_machine(target))
    engine.finalize_object()
    engine.run_static_constructors()
    return engine


def jit(ref: llvm.ModuleRef, target: Target) -> JitModule:
    """Machine code for an optimized module (from `compile_ir`), in this process."""
    _check_runnable(target)
    _check_externals(_declared(ref))
    return JitModule(_engine(ref, target), ref)


def compile_module(module: ir.Module | str, target: Target, opt: int = 3) -> JitModule:
    """Optimize and JIT-compile an llvmlite module (or LLVM IR text) for `target`, which
    must be this process's machine or one whose instructions it has."""
    return jit(compile_ir(module, target, opt), target)


def emit_object(module: ir.Module | str | llvm.ModuleRef, target: Target, opt: int = 3) -> bytes:
    """Object code of `target` for a module; `load_object` runs it. An `llvm.ModuleRef` is
    taken as already optimized."""
    ref = module if isinstance(module, llvm.ModuleRef) else compile_ir(module, target, opt)
    _check_externals(_declared(ref))
    return target_machine(target).emit_object(ref)


def load_object(data: bytes, target: Target) -> JitModule:
    """Load object code from `emit_object` into a fresh engine (no LLVM compile)."""
    return load_objects([data], target)


def _check_runnable(target: Target) -> None:
    """Code for `target` runs in this process only on the same architecture (a cross
    target's code is exported, `ember.export`, not loaded)."""
    if not target.runs_here():
        raise CodegenError(f"code for {target.name} ({target.triple}) cannot run in this"
                           " process; export it with ember.export(..., target=...)")


def load_objects(objects: Sequence[bytes], target: Target) -> JitModule:
    """Load object files that together make one program (from `compile_objects`) into one
    fresh engine, which links their symbols to each other; no LLVM compile runs."""
    # The linker would abort the process on a symbol it cannot resolve: load libgomp first
    # if an object names it (its string table holds the names of the symbols it calls).
    if any(name.encode() + b"\0" in data for data in objects for name in OPENMP_SYMBOLS):
        load_openmp()
    _check_runnable(target)
    tm = new_target_machine(target)
    empty = llvm.parse_assembly(f'target triple = "{tm.triple}"\n')
    engine = llvm.create_mcjit_compiler(empty, tm)
    for data in objects:
        engine.add_object_file(llvm.ObjectFileRef.from_data(data))
    engine.finalize_object()
    return JitModule(engine)


# -- compiling modules on all cores ----------------------------------------------------------
#
# llvmlite runs every call into LLVM under one process-wide lock, because two threads may not
# touch modules of LLVM's global context at once. A module parsed into a context of its own
# and compiled by a target machine of its own shares nothing with other threads (LLVM's rule
# for concurrent compilation), so the three calls that take nearly all of the time (parse,
# the O3 pipeline, code generation) go to LLVM without the lock; ctypes releases the GIL
# while they run, so they run on all cores.

def _unlocked(function: str) -> Callable:
    return getattr(ffi.lib, function)._cfn


def _compile_alone(text: str, opt: int, machine: Callable[[], llvm.TargetMachine]
                   ) -> tuple[bytes, set[str], set[str]]:
    """Object code for LLVM IR text, compiled in its own context; with the functions the
    object defines and those it only declares."""
    tm = machine()
    context = llvm.create_context()
    ref = builder = None
    try:
        with ffi.OutputString() as error:
            handle = _unlocked("LLVMPY_ParseAssembly")(context, ctypes.c_char_p(text.encode()),
                                                        error)
            if error:
                raise CodegenError(f"generated LLVM IR does not parse: {error}")
        ref = llvm.ModuleRef(handle, context)
        ref.triple = tm.triple
        ref.data_layout = str(tm.target_data)
        with ffi.OutputString() as error:
            if _unlocked("LLVMPY_VerifyModule")(ref, error):
                raise CodegenError(f"generated LLVM IR does not verify: {error}")
        if opt:
            builder = llvm.create_pass_builder(tm, pipeline_options(opt, unroll=False))
            _unlocked("LLVMPY_RunNewModulePassManager")(builder.getModulePassManager(), ref,
                                                         builder)
        with ffi.OutputString() as error:
            buffer = _unlocked("LLVMPY_TargetMachineEmitToMemory")(tm, ref, 1, error)
            if not buffer:
                raise CodegenError(f"LLVM code generation failed: {error}")
        try:
            data = ctypes.string_at(ffi.lib.LLVMPY_GetBufferStart(buffer),
                                    ffi.lib.LLVMPY_GetBufferSize(buffer))
        finally:
            ffi.lib.LLVMPY_DisposeMemoryBuffer(buffer)
        defined = {fn.name for fn in ref.functions if not fn.is_declaration}
        return data, defined, set(_declared(ref))
    finally:
        if builder is not None:
            builder.close()
        if ref is not None:
            ref.close()
        context.close()


def compile_objects(modules: Iterable[ir.Module | str], target: Target, opt: int = 3,
                    jit: bool = True) -> list[bytes]:
    """Object code of `target` for modules that together make one program
    (`llvm.program_modules`), compiled on all cores: each module is optimized and compiled
    while the next is still being built (`modules` may be a generator); one target machine
    per module. Code for this process (`jit`) is checked: raises CodegenError when the
    objects call a function that none defines and the process lacks; other code is
    position independent, for shared libraries."""

    def compile_one(text: str) -> tuple[bytes, set[str], set[str]]:
        # (A long-running process goes on in helper processes: ember/codegen/helpers.py;
        # where none can start, here.)
        if not helpers.POOL.in_process():
            try:
                return helpers.POOL.compile(text, opt, target, jit)
            except OSError:
                pass
        return _compile_alone(text, opt, lambda: new_target_machine(target, opt, jit))

    with ThreadPoolExecutor(max_workers=usable_cores()) as pool, \
            vmath.scaling_by_ldexp(target.vector_ldexp):
        jobs = [pool.submit(compile_one, str(module)) for module in modules]
        results = [job.result() for job in jobs]
    if jit:
        defined = set().union(*(r[1] for r in results))
        _check_externals(set().union(*(r[2] for r in results)) - defined)
    return [data for data, _, _ in results]


def llvm_ir_text(module: ir.Module | str, target: Target, optimized: bool = True) -> str:
    """The LLVM IR of a module for `target`, after O3 unless `optimized` is false."""
    return str(compile_ir(module, target, 3 if optimized else 0))


def assembly_text(module: ir.Module | str | llvm.ModuleRef, target: Target, opt: int = 3) -> str:
    """`target`'s assembly for a module (an `llvm.ModuleRef` is taken as already
    optimized)."""
    ref = module if isinstance(module, llvm.ModuleRef) else compile_ir(module, target, opt)
    return target_machine(target).emit_assembly(ref)


def pointer_array(addresses: Sequence[int]) -> ctypes.Array:
    """A C array of pointers, as the entry function takes for inputs/outputs/constants.
    Keep it alive for the duration of the call."""
    return (ctypes.c_void_p * max(len(addresses), 1))(*addresses)
