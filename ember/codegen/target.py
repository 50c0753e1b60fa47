"""Targets for ahead-of-time code: the host, or AArch64 Linux by cross-compilation.

    target = get_target("aarch64-linux-gnu")
    objects = target.emit_objects(program_modules(program, plan.offsets, 4))   # PIC objects

A target names an LLVM triple, a CPU and its features, and the C compiler that links its
shared libraries. Object code for a library is position independent; the JIT keeps its own
target machine (ember.codegen.cpu).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

from ember.codegen import CodegenError, vmath


@dataclass(frozen=True)
class Target:
    name: str  # what users write: "host", "aarch64-linux-gnu"
    triple: str
    cpu: str
    features: str
    cc: str  # the C compiler (and linker driver) for this target
    vector_bits: int  # the width of its SIMD registers, for schedules

    @property
    def vector_ldexp(self) -> bool:
        """Whether LLVM computes `llvm.ldexp` on vectors in one instruction here (x86 with
        AVX-512's vscalefps; elsewhere it calls the C library's per lane)."""
        return self.triple.startswith("x86_64") and "+avx512f" in self.features.split(",")

    def machine(self, opt: int = 3) -> llvm.TargetMachine:
        from ember.codegen.cpu import _initialize

        _initialize()
        if self.name != "host":
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
        try:
            target = llvm.Target.from_triple(self.triple)
        except RuntimeError as error:
            raise CodegenError(f"LLVM cannot generate code for {self.triple}: {error}") from None
        return target.create_target_machine(cpu=self.cpu, features=self.features, opt=opt,
                                            reloc="pic", codemodel="default")

    def emit_objects(self, modules: Iterable[ir.Module | str], opt: int = 3) -> list[bytes]:
        """Optimized, position-independent object code for modules that together make one
        program, compiled on all cores (`cpu.compile_objects`); modules generated lazily
        are emitted for this target's instructions (`vmath.scaling_by_ldexp`)."""
        from ember.codegen.cpu import compile_objects

        with vmath.scaling_by_ldexp(self.vector_ldexp):
            return compile_objects(modules, opt, lambda: self.machine(opt),
                                   check_externals=False)

    def compiler(self) -> str:
        """The path of this target's C compiler; a clear error when it is not installed."""
        path = shutil.which(self.cc)
        if path is None:
            hint = (" (Debian: apt-get install gcc-aarch64-linux-gnu)"
                    if "aarch64" in self.cc else "")
            raise CodegenError(f"linking for {self.name} needs the C compiler '{self.cc}',"
                               f" which is not installed{hint}")
        return path


def host_target() -> Target:
    from ember.codegen.cpu import _initialize

    _initialize()
    features = llvm.get_host_cpu_features().flatten()
    vector_bits = 512 if "+avx512f" in features else 256 if "+avx" in features else 128
    return Target("host", llvm.get_process_triple(), llvm.get_host_cpu_name(), features, "cc",
                  vector_bits)


# AArch64 with NEON (every ARMv8-A core has it): the seed's Cortex-A class CPUs.
AARCH64 = Target("aarch64-linux-gnu", "aarch64-unknown-linux-gnu", "generic", "+neon",
                 "aarch64-linux-gnu-gcc", 128)
TARGETS = ("host", AARCH64.name)


def get_target(name: str) -> Target:
    if name in ("host", "native", ""):
        return host_target()
    if name in (AARCH64.name, "aarch64", "arm64"):
        return AARCH64
    raise CodegenError(f"unknown target '{name}' (known: {', '.join(TARGETS)})")
