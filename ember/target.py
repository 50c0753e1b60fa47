"""`ember.Target`: the one description of the machine that code is compiled for.

    Target.host()                  # this machine, described from its ISA features
    Target.named("sapphirerapids") # a preset (see PRESETS), e.g. for cross-compiling
    Target.get("aarch64-linux-gnu")  # a name or a Target; "host" (or None) is the host

Schedules read their facts from it (vector lanes per dtype, vector registers, FMA units and
latency, cache sizes, cores); code generation reads the triple, CPU and features; the caches
and the tuning database key on it. No other module asks what the host is: the driver
resolves a config's target once (`ember.driver.pipeline.resolve`) and passes it down.

The host is described from what its processor reports, never from its name (LLVM names
some machines after a sibling): features decide the vector width and registers, the
probes measure the FMA latency and units (features do not tell them: Xeons of one ISA
have one or two units, Zen 2 a longer latency than Zen 3; kept in the cache folder), and the
kernel's cache and CPU lists give cache sizes and cores.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from ember.dtypes import DType
from ember.errors import EmberError


class TargetError(EmberError):
    """An unknown target name, or a target that cannot serve what was asked of it."""


@dataclass(frozen=True)
class Target:
    name: str  # what users write: "host", a preset's name, or a cross triple's short name
    triple: str  # LLVM's target triple
    cpu: str  # LLVM's CPU name, for instruction selection and scheduling
    features: tuple[str, ...]  # ISA features without '+', sorted ("avx2", "fma", "neon")
    vector_bits: int  # the SIMD register width that kernels are shaped for
    vector_registers: int  # architectural SIMD registers (what a register tile may hold)
    fma_units: int  # vector FMAs issued per cycle at vector_bits
    fma_latency: int  # cycles from an FMA's inputs to its result
    l1d_bytes: int  # per core
    l2_bytes: int  # per core
    l3_bytes: int  # shared
    cores: int
    kind: str = "cpu"  # "cpu", or "gpu" (phase 10: sm_80, sm_90)
    # Features the CPU name implies but this machine lacks (a VM may hide some): off for LLVM.
    disabled: tuple[str, ...] = ()
    l1d_ways: int = 8  # L1's associativity: lines of one set (addresses 4 KiB apart) it holds
    cc: str = field(default="cc", compare=False)  # the C compiler that links its libraries

    # -- facts that schedules read -----------------------------------------------------------
    def lanes(self, dtype: DType = DType.f32) -> int:
        """Elements of `dtype` per vector register."""
        return max(1, self.vector_bits // (8 * dtype.itemsize))

    @property
    def vector_bytes(self) -> int:
        return self.vector_bits // 8

    def has(self, feature: str) -> bool:
        return feature.lstrip("+") in self.features

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0]

    @property
    def vector_ldexp(self) -> bool:
        """Whether LLVM computes `llvm.ldexp` on vectors in one instruction here (x86's
        AVX-512 vscalefps); elsewhere it calls the C library once per lane."""
        return self.arch == "x86_64" and self.has("avx512f")

    @property
    def feature_string(self) -> str:
        """The features as LLVM's target machine takes them ("+avx2,+fma")."""
        return ",".join([*(f"+{f}" for f in self.features), *(f"-{f}" for f in self.disabled)])

    def key(self) -> str:
        """A short identity for cache and tuning-database keys: every field that can
        change generated code or its speed."""
        text = "|".join(str(getattr(self, f)) for f in (
            "triple", "cpu", "features", "vector_bits", "vector_registers", "fma_units",
            "fma_latency", "l1d_bytes", "l1d_ways", "l2_bytes", "l3_bytes", "cores", "kind",
            "disabled"))
        return f"{self.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    def runs_here(self) -> bool:
        """Whether code for this target can run in this process (a CPU of this process's
        architecture; its features are the caller's promise)."""
        return self.kind == "cpu" and self.arch == _process_arch()

    def compiler(self) -> str:
        """The path of this target's C compiler; a clear error when it is not installed."""
        path = shutil.which(self.cc)
        if path is None:
            hint = (" (Debian: apt-get install gcc-aarch64-linux-gnu)"
                    if "aarch64" in self.cc else "")
            raise TargetError(f"linking for {self.name} needs the C compiler '{self.cc}',"
                              f" which is not installed{hint}")
        return path

    def __str__(self) -> str:
        return (f"{self.name} ({self.triple}, {self.cpu}, {self.vector_bits}-bit vectors x"
                f" {self.vector_registers}, {self.fma_units} FMA x {self.fma_latency} cycles,"
                f" L1 {self.l1d_bytes >> 10} KiB {self.l1d_ways}-way, L2 {self.l2_bytes >> 10} KiB,"
                f" {self.cores} cores)")

    # -- where targets come from -------------------------------------------------------------
    @staticmethod
    def host() -> Target:
        return _host()

    @staticmethod
    def named(name: str) -> Target:
        if name not in PRESETS:
            raise TargetError(f"unknown target '{name}' (known: host, {', '.join(PRESETS)})")
        return PRESETS[name]

    @staticmethod
    def get(spec: Target | str | None) -> Target:
        """`spec` as a Target: itself, the host for None/"host"/"native", else a preset or
        an alias of one."""
        if isinstance(spec, Target):
            return spec
        if is_host(spec):
            return _host()
        return Target.named(ALIASES.get(spec, spec))

    def with_(self, **changes) -> Target:
        """A copy with some facts changed (a synthetic target for tests and studies)."""
        return replace(self, **changes)


def host_key() -> str:
    """The key of the machine this process runs on: what a tuning worker on a cluster
    tells the compile that sends it work (`ember/loops/tune/executor.py`)."""
    return _host().key()


def is_host(spec: Target | str | None) -> bool:
    """Whether `spec` names this machine rather than a preset."""
    return spec in (None, "", "host", "native")


_X86 = "x86_64-unknown-linux-gnu"
_AARCH64 = "aarch64-unknown-linux-gnu"
_AVX2 = ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "popcnt", "sse4.2")
_AVX512 = _AVX2 + ("avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl", "avx512vnni",
                   "avx512bf16")

PRESETS: dict[str, Target] = {t.name: t for t in (
    # AMD Zen 3: AVX2, two 256-bit FMA pipes.
    Target("znver3", _X86, "znver3", tuple(sorted(_AVX2)), 256, 16, 2, 4,
           32 << 10, 512 << 10, 32 << 20, 8),
    # AMD Zen 4: AVX-512 on 256-bit pipes, one 512-bit FMA per cycle.
    Target("znver4", _X86, "znver4", tuple(sorted(_AVX512)), 512, 32, 1, 4,
           32 << 10, 1 << 20, 32 << 20, 8),
    # Intel Xeon Sapphire Rapids: AVX-512 with two 512-bit FMA ports, AMX.
    Target("sapphirerapids", _X86, "sapphirerapids",
           tuple(sorted(_AVX512 + ("avx512fp16", "amx-tile", "amx-int8", "amx-bf16"))),
           512, 32, 2, 4, 48 << 10, 2 << 20, 105 << 20, 8, l1d_ways=12),
    # Arm Neoverse N1 (Graviton 2, Ampere Altra): 128-bit NEON, two FMA pipes.
    Target("neoverse-n1", _AARCH64, "neoverse-n1", ("neon",), 128, 32, 2, 4,
           64 << 10, 1 << 20, 32 << 20, 8, l1d_ways=4, cc="aarch64-linux-gnu-gcc"),
    # Any ARMv8-A core (the seed's Cortex-A class): NEON is always there.
    Target("aarch64-linux-gnu", _AARCH64, "generic", ("neon",), 128, 32, 1, 4,
           32 << 10, 512 << 10, 0, 4, l1d_ways=4, cc="aarch64-linux-gnu-gcc"),
    # NVIDIA GPUs (ember/codegen/nvptx.py): PTX of that architecture.
    Target("sm_80", "nvptx64-nvidia-cuda", "sm_80", ("ptx70",), 32, 255, 1, 4,
           192 << 10, 40 << 20, 0, 108, kind="gpu"),
    Target("sm_90", "nvptx64-nvidia-cuda", "sm_90", ("ptx80",), 32, 255, 1, 4,
           256 << 10, 50 << 20, 0, 132, kind="gpu"),
)}
# "cuda": sm_80's PTX, which the driver compiles for every NVIDIA GPU since Ampere (A100,
# H100, H200); name sm_90 for code ptxas assembles for Hopper alone.
ALIASES = {"aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu", "cuda": "sm_80"}


def _data_caches() -> dict[int, tuple[int, int]]:
    """(bytes, ways) of the data caches by level as the kernel lists them for cpu0 (empty
    elsewhere)."""
    caches: dict[int, tuple[int, int]] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip().upper()
            ways = int((index / "ways_of_associativity").read_text() or 0)
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        caches[level] = (int(text.rstrip("KMG") or 0) * scale, ways)
    return caches


def usable_cores() -> int:
    """The cores this process may run on (compiling uses them all, and they are the
    default team size of parallel loops)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def nearest_preset(triple: str, features: set[str]) -> Target | None:
    """The preset of the same architecture whose features the host has, with the most
    features: what the host's features say about facts they do not encode."""
    arch = triple.split("-", 1)[0]
    fitting = [t for t in PRESETS.values() if t.kind == "cpu" and t.arch == arch
               and set(t.features) <= features]
    return max(fitting, key=lambda t: len(t.features), default=None)


@functools.cache
def _process_arch() -> str:
    import llvmlite.binding as llvm

    return llvm.get_process_triple().split("-", 1)[0]


@functools.cache
def _host() -> Target:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    triple = llvm.get_process_triple()
    reported = llvm.get_host_cpu_features()
    features = {name for name, on in reported.items() if on}
    arch = triple.split("-", 1)[0]
    if arch == "x86_64":
        bits = 512 if "avx512f" in features else 256 if "avx" in features else 128
        registers = 32 if "avx512f" in features else 16
    else:  # AArch64's NEON (SVE's longer vectors are not used yet)
        bits, registers = 128, 32
    near = nearest_preset(triple, features)
    cpu = llvm.get_host_cpu_name()
    fma_units, fma_latency = _fma_facts(
        triple, cpu, features, bits, registers,
        near.fma_units if near and near.vector_bits == bits else 1,
        near.fma_latency if near else 4)
    data = _data_caches()
    caches = {level: size for level, (size, _) in data.items()}
    ways = data.get(1, (0, 0))[1] or (near.l1d_ways if near else 8)
    return Target("host", triple, cpu, tuple(sorted(features)), bits,
                  registers, fma_units, fma_latency,
                  caches.get(1, near.l1d_bytes if near else 32 << 10),
                  caches.get(2, near.l2_bytes if near else 512 << 10),
                  caches.get(3, near.l3_bytes if near else 0), usable_cores(),
                  disabled=tuple(sorted(name for name, on in reported.items() if not on)),
                  l1d_ways=ways)


# The probe's FMAs per loop iteration: one chain of this many, or this many chains of one
# (enough chains to keep four FMA units of latency four busy), fewer where the vector
# registers cannot hold them all and the constant (spilled accumulators measure the
# stack, not the FMA units: 16 chains on AVX2's 16 registers read as one unit on Zen 3).
_PROBE_CHAINS = 16


def probe_chains(registers: int) -> int:
    """The independent FMA chains the probe runs on a machine with `registers` vector
    registers: all in registers, with one left for the constant and one spare."""
    return max(2, min(_PROBE_CHAINS, registers - 2))


def _fma_facts(triple: str, cpu: str, features: set[str], bits: int, registers: int,
               units: int, latency: int) -> tuple[int, int]:
    """The host's vector FMA units and latency in cycles, which its features do not tell (a
    Xeon has one or two 512-bit units by model; Zen 2 waits five cycles, Zen 3 four):
    the latency is a dependent FMA's time over a dependent integer add's (one cycle
    everywhere), the units the FMAs in flight over it. Measured once per machine and kept
    in the cache folder, so that every process (and so every cache key) sees the same
    figures; `units` and `latency` (the nearest preset's) where they cannot be measured."""
    import json

    from ember.util.files import cache_dir, write_atomically

    chains = probe_chains(registers)
    key = [triple, cpu, bits, sorted(features), chains, "register adds"]
    path = cache_dir() / "host-target.json"
    try:
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return int(saved["fma_units"]), int(saved["fma_latency"])
    except (OSError, ValueError, TypeError, KeyError):
        pass
    try:
        in_flight, cycles = _fma_timing(triple, bits, chains)
    except Exception:  # noqa: BLE001  (no JIT here: what the features suggest)
        return units, latency
    latency = max(1, round(cycles))
    units = max(1, round(in_flight / latency))
    try:
        write_atomically(path, json.dumps({
            "key": key, "fma_in_flight": round(in_flight, 2), "fma_cycles": round(cycles, 2),
            "fma_units": units, "fma_latency": latency}))
    except OSError:
        pass
    return units, latency


# The integer adds of the clock probe per iteration, each waiting for the one before.
_CLOCK_ADDS = 64


def _fma_timing(triple: str, bits: int, chains: int) -> tuple[float, float]:
    """(FMAs in flight, cycles of one FMA): the time per FMA of one dependent chain over
    that of `chains` independent ones (units x latency, up to `chains`), and over that of
    one dependent integer add (a cycle); the clock cancels in both."""
    import ctypes
    import time

    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_triple(triple).create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2)
    engine = llvm.create_mcjit_compiler(
        llvm.parse_assembly(str(fma_probe_module(triple, bits, chains))), machine)
    engine.finalize_object()
    kind = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)
    runs = {name: kind(engine.get_function_address(name)) for name in ("chain", "wide")}
    runs["adds"] = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(
        engine.get_function_address("adds"))
    # Each run about half a millisecond: long enough that the call and the timer vanish
    # (the wide loop, with `chains` times the throughput, runs that many times as long).
    iterations = {"chain": 10_000, "wide": 10_000 * chains // 2, "adds": 10_000}
    per = {"chain": chains, "wide": chains, "adds": _CLOCK_ADDS}  # operations an iteration
    best = dict.fromkeys(runs, float("inf"))
    runs["chain"](iterations["chain"])  # the clock up to speed
    for _ in range(30):  # interleaved, best of each: what a quiet core does
        for name, run in runs.items():
            begin = time.perf_counter()
            run(iterations[name])
            best[name] = min(best[name], (time.perf_counter() - begin)
                             / (iterations[name] * per[name]))
    return best["chain"] / best["wide"], best["chain"] / best["adds"]


def fma_probe_module(triple: str, bits: int, chains: int):
    """The probe's llvmlite module: `chain` (one chain `chains` FMAs deep) and `wide`
    (`chains` independent chains of one), the same FMAs an iteration."""
    from llvmlite import ir

    module = ir.Module("fma_probe")
    module.triple = triple
    for name, count in (("chain", 1), ("wide", chains)):
        fma_loop(module, name, bits // 32, count, chains // count)
    _add_chain(module, "adds", _CLOCK_ADDS)
    return module


def _add_chain(module, name: str, depth: int) -> None:
    """Add `i64 name(i64 n)`: n iterations of `depth` integer adds, each waiting for the
    one before: a cycle each. Each adds a register (n), not a constant: Golden Cove cores
    (Sapphire Rapids) fold chains of adds of small constants at rename, several a cycle,
    which made the FMA's latency look 24 cycles there. An empty inline asm between them
    hides the chain from the optimizer, which would fold it into one add, and costs no
    instruction."""
    from llvmlite import ir

    i64 = ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(i64, [i64]), name)
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    count, value = b.phi(i64), b.phi(i64)
    count.add_incoming(ir.Constant(i64, 0), entry)
    value.add_incoming(fn.args[0], entry)
    barrier = ir.InlineAsm(ir.FunctionType(i64, [i64]), "", "=r,0", side_effect=False)
    x = value
    for _ in range(depth):
        x = b.call(barrier, [b.add(x, fn.args[0])])
    value.add_incoming(x, loop)
    step = b.add(count, ir.Constant(i64, 1))
    count.add_incoming(step, loop)
    b.cbranch(b.icmp_signed("<", step, fn.args[0]), loop, done)
    b.position_at_end(done)
    b.ret(x)


def fma_loop(module, name: str, lanes: int, chains: int, depth: int) -> None:
    """Add `float name(i64 n)` to llvmlite `module`: n iterations, each `depth` dependent
    vector FMAs of `lanes` f32 in each of `chains` independent accumulators (the machine's
    FMA probes: this module's units, ember/runtime/machine.py's peak)."""
    from llvmlite import ir

    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, lanes)
    fma = module.globals.get(f"llvm.fma.v{lanes}f32") or ir.Function(
        module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{lanes}f32")
    fn = ir.Function(module, ir.FunctionType(f32, [i64]), name)
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    c = ir.Constant(vec, [ir.Constant(f32, 0.001)] * lanes)
    b.branch(loop)
    b.position_at_end(loop)
    count = b.phi(i64)
    count.add_incoming(ir.Constant(i64, 0), entry)
    accs, ends = [b.phi(vec) for _ in range(chains)], []
    for k, acc in enumerate(accs):
        acc.add_incoming(ir.Constant(vec, [ir.Constant(f32, 0.5 + k)] * lanes), entry)
        value = acc
        for _ in range(depth):
            value = b.call(fma, [value, c, c])
        ends.append(value)
    for acc, value in zip(accs, ends):
        acc.add_incoming(value, loop)
    step = b.add(count, ir.Constant(i64, 1))
    count.add_incoming(step, loop)
    b.cbranch(b.icmp_signed("<", step, fn.args[0]), loop, done)
    b.position_at_end(done)
    total = ends[0]
    for value in ends[1:]:
        total = b.fadd(total, value)
    b.ret(b.extract_element(total, ir.Constant(ir.IntType(32), 0)))
