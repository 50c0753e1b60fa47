"""Backends: what the driver asks of a target's last stages. One interface, after Triton's
`BaseBackend`; the CPU (x86-64 and AArch64 through LLVM) is the first implementation, and
a GPU is another (phase 10) without edits to the levels above.

    backend = backend_for(target)
    passes = backend.graph_passes(config)      # the target's layout passes
    artifact = backend.emit(program, plan)     # object code
    run = backend.load(artifact)               # an Executable
    seconds = backend.measure(kernel_text, 1)  # time one kernel (the tuner's measure)
"""

from __future__ import annotations

import functools
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from ember.config import Config
from ember.errors import CompileError
from ember.graph.passes import GraphPass, get_pass
from ember.loops.ir import Call, Program, ProgramBuffer
from ember.runtime.executable import Artifact, Executable
from ember.runtime.memory_plan import MemoryPlan
from ember.target import Target

MEASURE_SECONDS = 0.05  # calls of a kernel, after the first, for about this long


class Backend(ABC):
    target: Target

    @abstractmethod
    def graph_passes(self, config: Config) -> list[GraphPass]:
        """The target's own graph passes, run after the default pipeline, before fusion
        (layouts its kernels read, configured with its facts)."""

    def configure(self, graph_pass: GraphPass) -> GraphPass:
        """`graph_pass` with the options this target gives it (itself when none)."""
        return graph_pass

    @abstractmethod
    def emit(self, program: Program, plan: MemoryPlan) -> Artifact:
        """Object code for a scheduled program and its memory plan."""

    @abstractmethod
    def load(self, artifact: Artifact) -> Executable:
        """An artifact made runnable in this process."""

    @abstractmethod
    def measure(self, kernel_text: str, outputs: int) -> float:
        """Seconds per call of the kernel in loop-IR `kernel_text` (its last `outputs`
        parameters its results) on scratch buffers. Runs in the tuner's worker process,
        so a backend must pickle."""

    @abstractmethod
    def dump(self, program: Program, plan: MemoryPlan, folder: Path) -> None:
        """Write what this backend makes of `program` (its IR, its assembly) to `folder`."""


@dataclass(frozen=True)
class CpuBackend(Backend):
    """LLVM for a CPU: in-process JIT where the target runs here, objects for export."""

    target: Target

    def graph_passes(self, config: Config) -> list[GraphPass]:
        # 1-D convs as 2-D ones (the fast conv kernels are 2-D), grouped convs' groups as
        # images (an implicit GEMM per image), explicit conv padding
        # after `canonicalize` absorbs pads into convs, packed conv weights once the convs
        # have no padding, and packed matmul weights (dce drops the unpacked ones).
        # Winograd's convs come before the padding (they pad their input themselves) and
        # the groups as images (grouped 3x3 convs are Winograd's too).
        # Indices and integer divisors are checked at run time (the entry returns a status).
        names = ["check_values", "convs_2d"] + \
            (["winograd_convs"] if config.winograd else []) + \
            ["group_convs", "pad_convs", "pack_convs", "pack_matmuls"]
        return [self.configure(get_pass(name)) for name in names]

    def configure(self, graph_pass: GraphPass) -> GraphPass:
        if graph_pass.name == "pack_matmuls":
            return graph_pass.configured(panel_width=functools.partial(_panel_width,
                                                                       self.target))
        if graph_pass.name == "pack_convs":
            from ember.loops.schedules.gemm import conv_tile
            from ember.loops.schedules.packed_conv import panel_lanes

            return graph_pass.configured(
                panel_width=functools.partial(panel_lanes, self.target),
                gemm_lanes=conv_tile(self.target)[1])
        return graph_pass

    def emit(self, program: Program, plan: MemoryPlan) -> Artifact:
        from ember.runtime.executable import build_artifact

        return build_artifact(program, self.target, plan)

    def load(self, artifact: Artifact) -> Executable:
        from ember.runtime.executable import load_artifact

        return load_artifact(artifact, self.target)

    def measure(self, kernel_text: str, outputs: int, repeat: int = 5) -> float:
        """The fastest of at least `repeat` calls after a first, for about
        MEASURE_SECONDS."""
        from ember.loops.text import parse_kernel
        from ember.loops.verify import verify_kernel
        from ember.runtime.executable import compile_program, scratch_arrays

        kernel = verify_kernel(parse_kernel(kernel_text))
        inputs = len(kernel.params) - outputs
        program = Program("tune", [ProgramBuffer(p, "input" if i < inputs else "output")
                                   for i, p in enumerate(kernel.params)], [kernel],
                          [Call(kernel.name, [p.name for p in kernel.params])])
        arrays = scratch_arrays([[p.dtype.value, list(p.shape)] for p in kernel.params])
        run = compile_program(program, self.target)
        run(*arrays[:inputs], out=arrays[inputs:])
        times: list[float] = []
        deadline = time.perf_counter() + MEASURE_SECONDS
        while len(times) < repeat or time.perf_counter() < deadline:
            start = time.perf_counter()
            run(*arrays[:inputs], out=arrays[inputs:])
            times.append(time.perf_counter() - start)
        return min(times)

    def dump(self, program: Program, plan: MemoryPlan, folder: Path) -> None:
        from ember.codegen import vmath
        from ember.codegen.cpu import assembly_text, llvm_ir_text
        from ember.codegen.llvm import program_module
        from ember.util.files import write_atomically

        with vmath.scaling_by_ldexp(self.target.vector_ldexp):  # as `emit` compiles it
            module = program_module(program, plan.offsets)
        write_atomically(folder / "llvm.ll", llvm_ir_text(module, self.target))
        write_atomically(folder / "asm.s", assembly_text(module, self.target))


@dataclass(frozen=True)
class GpuBackend(Backend):
    """LLVM's NVPTX target: PTX for an NVIDIA GPU, run through the CUDA driver
    (`ember/runtime/cuda.py`); it compiles without a GPU, and says at the first call when
    none is present."""

    target: Target

    def graph_passes(self, config: Config) -> list[GraphPass]:
        return []  # (the CPU's packed layouts are shaped for its vector registers)

    def emit(self, program: Program, plan: MemoryPlan) -> Artifact:
        from ember.codegen.nvptx import launch_table, program_ptx, steps_json
        from ember.runtime.executable import Interface

        ptx, launches = program_ptx(program, self.target)
        gpu = {"arch": self.target.cpu, "launches": launch_table(launches),
               "steps": steps_json(program.steps)}
        return Artifact([ptx.encode()], Interface.of(program), plan, dict(program.constants),
                        {"gpu": gpu})

    def load(self, artifact: Artifact) -> Executable:
        from ember.runtime.cuda import CudaExecutable

        return CudaExecutable(artifact, self.target)

    def measure(self, kernel_text: str, outputs: int) -> float:
        raise CompileError("tuning for the GPU is not built yet: its schedules are the"
                           " defaults (ember/loops/schedules/gpu.py)")

    def dump(self, program: Program, plan: MemoryPlan, folder: Path) -> None:
        from ember.codegen.nvptx import module_ptx, program_module
        from ember.util.files import write_atomically

        module, _ = program_module(program)
        write_atomically(folder / "llvm.ll", str(module))
        write_atomically(folder / "kernels.ptx", module_ptx(module, self.target))


def _panel_width(target: Target, x_shape: tuple[int, ...], n: int) -> int:
    """The columns of the register tile that the matmul schedule gives x [..., M, K] times
    a matrix of `n` columns on `target` (a batch of x makes one batched matmul)."""
    from ember.loops.schedules.gemm import default_tile

    return default_tile(x_shape[-2], len(x_shape) > 2, n, target).nr


def backend_for(target: Target) -> Backend:
    """The backend that compiles for `target`."""
    if target.kind == "cpu":
        return CpuBackend(target)
    if target.kind == "gpu":
        return GpuBackend(target)
    raise CompileError(f"no backend compiles for {target.name} ({target.triple}) yet")
