"""Loop IR -> PTX for NVIDIA GPUs, through LLVM's NVPTX target.

A kernel scheduled for the GPU (`ember/loops/schedules/gpu.py`) is a list of launches: each
`threads` loop is one, of a thread per iteration in blocks of BLOCK_THREADS (thread t of
block b runs iteration b * BLOCK_THREADS + t; those past the loop's end do nothing), and
each run of other statements is one of a single thread. Each launch becomes a function of
the `ptx_kernel` calling convention taking the kernel's buffers, one pointer each (the
runtime passes device addresses); its body is the kernel emitter's (`KernelEmitter`), with
every other loop serial and the locals private to each thread (LLVM keeps them in
registers, or local memory where they are arrays).

The GPU has no C library. Functions that CPU code calls there (`expf`, `lgamma`), and the
LLVM intrinsics that NVPTX would lower to them (`llvm.exp.f32` aborts the process there),
are libdevice's (`__nv_expf`), linked in from the CUDA toolkit's bitcode; a module whose
PTX still calls an undefined function is refused, as is one calling an intrinsic outside
NVPTX_INTRINSICS. `ptxas` assembles PTX for a given architecture (`assemble`): the tests
check every kernel with it, and AOT export ships its cubin.

    ptx, plan = program_ptx(program, target)   # PTX text, and the launches of each kernel
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llvmlite import binding as llvm
from llvmlite import ir

from ember.codegen import CodegenError, scalar
from ember.codegen.llvm import VOID, KernelEmitter
from ember.codegen.scalar import I32, I64, PTR
from ember.graph.symbolic import SymbolicShapeError
from ember.loops.analysis import launches
from ember.loops.ir import (
    Call,
    For,
    Kernel,
    Prefetch,
    Program,
    ProgramIf,
    ProgramLoop,
    ProgramStep,
    expr_dim,
)
from ember.loops.text import kernel_structure
from ember.target import Target

TRIPLE = "nvptx64-nvidia-cuda"
# Threads per block of a launch: enough warps for the scheduler to hide memory latency,
# few enough that small launches still fill the machine's multiprocessors.
BLOCK_THREADS = 256
# The grid's x dimension is at most 2**31 - 1 blocks.
MAX_BLOCKS = (1 << 31) - 1

# The LLVM intrinsics NVPTX selects instructions for (those the scalar tables call); any
# other is refused before LLVM sees it: some (`llvm.exp.f32`) end the process there.
NVPTX_INTRINSICS = (
    "fabs", "sqrt", "floor", "ceil", "trunc", "roundeven", "rint", "nearbyint", "round",
    "fma", "fmuladd", "maximum", "minimum", "maxnum", "minnum", "copysign",
    "fptosi.sat", "fptoui.sat", "smax", "smin", "umax", "umin", "abs", "ctpop", "ctlz",
    "cttz", "memset", "memcpy", "memmove", "is.fpclass", "nvvm.",
)
# Intrinsics that NVPTX lowers to C library calls: libdevice's functions instead.
_LIBDEVICE_INTRINSICS = ("exp", "exp2", "exp10", "log", "log2", "log10", "sin", "cos",
                         "tan", "pow", "ldexp")


def device_function(name: str) -> str:
    """What GPU code calls for the external function `name`: libdevice's function for a C
    library one (`expf` -> `__nv_expf`) or for an intrinsic that would become one
    (`llvm.exp.f32` -> `__nv_expf`), else `name`."""
    if not name.startswith("llvm."):
        return "__nv_" + name
    base, _, suffix = name[len("llvm."):].rpartition(".")
    if base in _LIBDEVICE_INTRINSICS and suffix in ("f32", "f64"):
        return f"__nv_{base}{'f' if suffix == 'f32' else ''}"
    return name


# -- tools of the CUDA toolkit: ptxas and libdevice ---------------------------------------------

def _toolkit_roots() -> list[Path]:
    """Where the CUDA toolkit's files may be: the pip wheels (nvidia-cuda-nvcc,
    nvidia-nvvm: `nvidia/cu*/`), $CUDA_HOME, /usr/local/cuda*."""
    roots = []
    try:
        import nvidia  # the namespace package of NVIDIA's wheels

        for base in nvidia.__path__:
            roots += sorted(Path(base).glob("cu*"), reverse=True)
    except ImportError:
        pass
    if os.environ.get("CUDA_HOME"):
        roots.append(Path(os.environ["CUDA_HOME"]))
    roots += [Path(p) for p in sorted(glob.glob("/usr/local/cuda*"), reverse=True)]
    return roots


@functools.cache
def ptxas_path() -> str | None:
    """The `ptxas` to assemble PTX with (PATH first, then the toolkit's), or None."""
    found = shutil.which("ptxas")
    if found:
        return found
    return next((str(root / "bin" / "ptxas") for root in _toolkit_roots()
                 if (root / "bin" / "ptxas").is_file()), None)


@functools.cache
def libdevice_path() -> Path | None:
    """libdevice's bitcode (the GPU's math library), or None when no toolkit has it."""
    return next((root / "nvvm" / "libdevice" / "libdevice.10.bc" for root in _toolkit_roots()
                 if (root / "nvvm" / "libdevice" / "libdevice.10.bc").is_file()), None)


@dataclass(frozen=True)
class Assembled:
    """What ptxas made of a module: its cubin, and each function's registers, spilled
    bytes and static shared memory (from `ptxas -v`)."""

    cubin: bytes
    registers: dict[str, int]
    spills: dict[str, int]
    shared: dict[str, int]


def assemble(ptx: str, arch: str) -> Assembled:
    """`ptx` assembled by ptxas for `arch` (`sm_90`); CodegenError when ptxas refuses it
    or is missing."""
    tool = ptxas_path()
    if tool is None:
        raise CodegenError("assembling PTX needs ptxas: pip install nvidia-cuda-nvcc (the"
                           " 'gpu' extra), or put the CUDA toolkit on PATH")
    with tempfile.TemporaryDirectory() as folder:
        source, cubin = Path(folder) / "module.ptx", Path(folder) / "module.cubin"
        source.write_text(ptx)
        done = subprocess.run([tool, f"-arch={arch}", "-v", "-o", str(cubin), str(source)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise CodegenError(f"ptxas -arch={arch} refused the PTX:\n{done.stderr.strip()}")
        data = cubin.read_bytes()
    registers, spills, shared = {}, {}, {}
    function = None
    for line in done.stderr.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            function = m.group(1)
        elif function and (m := re.search(r"(\d+) bytes spill stores", line)):
            spills[function] = int(m.group(1))
        elif function and (m := re.search(r"Used (\d+) registers", line)):
            registers[function] = int(m.group(1))
            m = re.search(r"(\d+) bytes smem", line)
            shared[function] = int(m.group(1)) if m else 0
    return Assembled(data, registers, spills, shared)


# -- kernels ------------------------------------------------------------------------------------

class GpuKernelEmitter(KernelEmitter):
    """One launch's function: its `threads` loop spread over the grid, every other loop
    serial (a CPU's parallel, vector and unrolled kinds mean nothing here)."""

    def loop_of_kind(self, s: For) -> None:
        if s.kind == "threads":
            self.threads(s)
        else:
            self.loop(s, self.index(s.start), self.index(s.stop))

    def loop(self, s: For, start: ir.Value, stop: ir.Value) -> None:
        self.serial_loop(s, start, stop)  # (no streaming stores: a CPU's cache bypass)

    def prefetch(self, s: Prefetch) -> None:
        """Nothing: a CPU schedule's hint (NVPTX has no `llvm.prefetch`)."""

    STMT = {**KernelEmitter.STMT, Prefetch: prefetch}

    def threads(self, s: For) -> None:
        """Iteration ctaid.x * ntid.x + tid.x (from the loop's start) in each thread, if the
        loop has it."""
        b = self.b
        block, width, thread = (b.zext(b.call(_special_register(b.module, name), []), I64)
                                for name in ("ctaid.x", "ntid.x", "tid.x"))
        value = b.add(self.index(s.start), b.add(b.mul(block, width), thread))
        slot = self.allocas.alloca(I64, name=s.var.name)
        b.store(value, slot)
        with b.if_then(b.icmp_signed("<", value, self.index(s.stop))), \
                self.binding(s.var.name, slot):
            self.stmts(s.body)


def _special_register(module: ir.Module, name: str) -> ir.Function:
    symbol = f"llvm.nvvm.read.ptx.sreg.{name}"
    found = module.globals.get(symbol)
    return found if found is not None else \
        ir.Function(module, ir.FunctionType(I32, []), symbol)


@dataclass(frozen=True)
class Launch:
    """One launch of a kernel's call: its function, its grid and its blocks (in threads)."""

    function: str
    blocks: int
    threads: int


def _threads_launch(group: Sequence, kernel: Kernel) -> tuple[int, int]:
    """(blocks, threads per block) of a launch: a block of BLOCK_THREADS per that many
    iterations of its threads loop, or one thread for a run of other statements."""
    s = group[0]
    if not (isinstance(s, For) and s.kind == "threads"):
        return 1, 1
    start, stop = expr_dim(s.start), expr_dim(s.stop)
    if not isinstance(start, int) or not isinstance(stop, int):
        raise CodegenError(f"kernel @{kernel.name}: threads loop %{s.var.name} has no constant"
                           " bounds (GPU code is compiled for one shape)")
    count = max(0, stop - start)
    blocks = max(1, -(-count // BLOCK_THREADS))
    if blocks > MAX_BLOCKS:
        raise CodegenError(f"kernel @{kernel.name}: {count} threads exceed the grid's"
                           f" {MAX_BLOCKS} blocks of {BLOCK_THREADS}")
    return blocks, min(BLOCK_THREADS, max(count, 1))


def _ptx_name(name: str, taken: set[str]) -> str:
    """`name` as a PTX identifier (letters, digits, `_`), distinct from those `taken`."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not re.match(r"[A-Za-z_]", base):
        base = "k" + base
    candidate, n = base, 1
    while candidate in taken:
        candidate, n = f"{base}_{n}", n + 1
    taken.add(candidate)
    return candidate


def program_module(program: Program) -> tuple[ir.Module, dict[str, list[Launch]]]:
    """The LLVM module of `program`'s kernels for the GPU (one function per launch), and
    each kernel's launches, in order. Identical kernels (a model's repeated blocks) share
    their functions."""
    if program.sizes:  # (the driver then compiles per binding of the sizes)
        raise SymbolicShapeError("GPU code is compiled for one shape: its sizes (?"
                                 + ", ?".join(program.sizes) + ") must be numbers")
    module = ir.Module(name=program.name)
    module.triple = TRIPLE
    plan: dict[str, list[Launch]] = {}
    first: dict[str, str] = {}
    taken: set[str] = set()
    annotations = module.add_named_metadata("nvvm.annotations")
    with scalar.external_names(device_function):
        for kernel in program.kernels:
            structure = kernel_structure(kernel)
            if structure in first:
                plan[kernel.name] = plan[first[structure]]
                continue
            first[structure] = kernel.name
            plan[kernel.name] = []
            for group in launches(kernel):
                blocks, threads = _threads_launch(group, kernel)
                name = _ptx_name(kernel.name, taken)
                part = Kernel(name, kernel.params, list(group), kernel.locals, kernel.origin)
                fn = ir.Function(module, ir.FunctionType(VOID, [PTR] * len(kernel.params)),
                                 name)
                fn.calling_convention = "ptx_kernel"
                fn.attributes.add("nounwind")
                for arg, param in zip(fn.args, kernel.params):
                    arg.name = param.name
                GpuKernelEmitter(fn, part).emit()
                # The most threads a block of it has: ptxas budgets registers by it.
                annotations.add(module.add_metadata([fn, "maxntidx", ir.Constant(I32,
                                                                                 threads)]))
                plan[kernel.name].append(Launch(name, blocks, threads))
    _check_intrinsics(module)
    return module, plan


def _check_intrinsics(module: ir.Module) -> None:
    for fn in module.functions:
        name = fn.name
        if fn.is_declaration and name.startswith("llvm.") and \
                not name[len("llvm."):].startswith(NVPTX_INTRINSICS):
            raise CodegenError(f"GPU code would call '{name}', which NVPTX cannot compile")


# -- PTX ------------------------------------------------------------------------------------------

def target_machine(target: Target) -> llvm.TargetMachine:
    from ember.codegen.cpu import new_target_machine

    if target.triple != TRIPLE:
        raise CodegenError(f"{target.name} is not an NVIDIA GPU target")
    return new_target_machine(target, 3, jit=False)


def _link_libdevice(ref: llvm.ModuleRef) -> None:
    """Define the `__nv_*` functions `ref` calls from libdevice, as internal functions
    (so that those it does not call go away)."""
    wanted = {fn.name for fn in ref.functions if fn.is_declaration
              and fn.name.startswith("__nv_")}
    if not wanted:
        return
    path = libdevice_path()
    if path is None:
        raise CodegenError("GPU code for " + ", ".join(sorted(wanted)) + " needs libdevice:"
                           " pip install nvidia-nvvm (the 'gpu' extra), or set CUDA_HOME")
    library = llvm.parse_bitcode(path.read_bytes())
    library.triple, library.data_layout = ref.triple, ref.data_layout
    ref.link_in(library)
    for fn in ref.functions:
        if fn.name.startswith("__nv_") and not fn.is_declaration:
            fn.linkage = "internal"


def module_ptx(module: ir.Module | str, target: Target) -> str:
    """PTX for the GPU `target` of an LLVM module of launch functions: verified, libdevice
    linked where needed, optimized at O3. CodegenError when the PTX would call a function
    nothing defines."""
    from ember.codegen.cpu import optimize, parse

    tm = target_machine(target)
    ref = parse(module, tm)
    _link_libdevice(ref)
    optimize(ref, tm, 3)
    ptx = tm.emit_assembly(ref)
    undefined = re.findall(r"\.extern \.func[^\n]*?(\w+)\s*\(", ptx)
    if undefined:
        raise CodegenError("GPU code calls functions that nothing defines: "
                           + ", ".join(sorted(set(undefined))))
    return ptx


def program_ptx(program: Program, target: Target) -> tuple[str, dict[str, list[Launch]]]:
    """`program`'s PTX for `target`, and each kernel's launches."""
    if program.of_kind("status"):
        raise CodegenError(f"program @{program.name} checks values (a status buffer): the"
                           " GPU's programs do not (its backend runs no `check_values`)")
    module, plan = program_module(program)
    return module_ptx(module, target), plan


def steps_json(steps: Sequence[ProgramStep]) -> list:
    """The program's steps as JSON for the runtime (["call", kernel, [buffers]], ["if",
    cond, then, else], ["loop", trip count, cond, counter, body])."""
    out: list = []
    for s in steps:
        if isinstance(s, Call):
            out.append(["call", s.kernel, list(s.args)])
        elif isinstance(s, ProgramIf):
            out.append(["if", s.cond, steps_json(s.then), steps_json(s.orelse)])
        elif isinstance(s, ProgramLoop):
            out.append(["loop", s.trip_count, s.cond, s.counter, steps_json(s.body)])
        else:
            raise CodegenError(f"unknown program step {type(s).__name__}")
    return out


def launch_table(plan: dict[str, list[Launch]]) -> dict[str, list[list]]:
    """Each kernel's launches as JSON: [[function, blocks, threads per block], ...]."""
    return {kernel: [[x.function, x.blocks, x.threads] for x in launches_]
            for kernel, launches_ in plan.items()}

