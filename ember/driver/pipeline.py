"""The compiled CPU path, stage by stage: graph passes, lowering to loops, memory plan,
LLVM code generation, JIT. One function strings the stages together; the caches skip
them when the same graph, signature, config and target were compiled before.

    graph (L1) --passes--> graph (L1) --lower--> program (L2) --plan, codegen--> object code
                                                                  --load--> Executable

EMBER_DUMP=dir writes every stage: the input and optimized graph (by the pass manager),
the loop IR, the LLVM IR and the assembly.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from ember.config import Config
from ember.driver.pass_manager import PassManager, write_reproducer
from ember.errors import CompileError, EmberError, UnsupportedOpError
from ember.graph.ir import Graph, clone_graph
from ember.graph.passes import DEFAULT_PIPELINE
from ember.runtime.cache import (
    CacheStats,
    DiskCache,
    MemoryCache,
    cache_key,
    get_cached,
    get_or_build,
)
from ember.runtime.executable import Artifact, Executable, build_artifact, load_artifact
from ember.util.files import write_atomically

_MEMORY = MemoryCache()
stats = CacheStats()  # hits and builds of this process, for tests and explain
last_build: dict = {}  # timings and kernel count of the latest cold build, for the demo


def signature(graph: Graph) -> tuple:
    return tuple((v.dtype.value, v.shape) for v in graph.inputs)


def lower_to_program(graph: Graph, config: Config, timings: dict | None = None):
    """The graph and loop-IR stages: passes (fusion included), lowering, the default
    schedule, verification and the memory plan. Returns (program, plan); JIT and AOT share
    it and differ only in what happens to the object code."""
    from ember.loops.lower import lower_graph
    from ember.loops.schedule import schedule_program
    from ember.loops.verify import verify_program
    from ember.runtime.memory_plan import plan_memory

    timings = {} if timings is None else timings
    start = time.perf_counter()
    # Lowering decisions around the default pipeline: attention before `decompose` splits
    # its softmax, explicit conv padding after `canonicalize` absorbs pads into convs, and
    # packed conv weights once the convs have no padding, and packed matmul weights (dce
    # drops the unpacked ones). Winograd's convs come first: they pad their input to whole
    # tiles themselves.
    passes = (["fuse_attention"] if config.fuse_attention else []) + DEFAULT_PIPELINE + \
        (["winograd_convs"] if config.winograd else []) + \
        ["pad_convs", "pack_convs", "pack_matmuls"] + (["fuse"] if config.fusion else []) + ["dce"]
    optimized = PassManager(passes).run(clone_graph(graph))
    timings["graph passes"] = time.perf_counter() - start
    start = time.perf_counter()
    with reproduced("lowering to loops", optimized, "python -m ember lower {input} -p ''"), \
            _tuning(config):
        program = verify_program(schedule_program(lower_graph(optimized)))
        plan = plan_memory(program)
    timings["lowering"] = time.perf_counter() - start
    return program, plan


def _tuning(config: Config):
    """The tuning database's winners (and the search for new shapes) in a tuned compile."""
    if not config.tune:
        return contextlib.nullcontext()
    from ember.loops.tune import TuningDatabase, using_database

    return using_database(TuningDatabase(), tune=True, budget_seconds=config.tune_budget)


@contextlib.contextmanager
def reproduced(stage: str, graph: Graph, replay: str):
    """Run a stage after the graph passes; when it fails with anything but a user-facing
    error about the input (an unsupported op), write a reproducer and name it."""
    try:
        yield
    except UnsupportedOpError:
        raise
    except Exception as e:  # noqa: BLE001  (compiler bugs, LLVM errors: a reproducer each)
        from ember.graph.text import print_graph

        path = write_reproducer(stage, print_graph(graph), e, replay)
        what = str(e) if isinstance(e, EmberError) else f"internal error: {e!r}"
        raise CompileError(f"{stage} failed: {what}\n  reproducer: {path}") from e


def build(graph: Graph, config: Config) -> Artifact:
    """Every stage, from a graph to object code (the cold path)."""
    from ember.codegen.cpu import assembly_text, llvm_ir_text
    from ember.codegen.llvm import program_module
    from ember.loops.ir import Call
    from ember.loops.text import print_program

    timings: dict[str, float] = {}
    program, plan = lower_to_program(graph, config, timings)
    start = time.perf_counter()
    with reproduced("LLVM code generation", graph, "python -m ember ir {input} --stage asm"):
        artifact = build_artifact(program, plan)
    timings["llvm"] = time.perf_counter() - start
    artifact.extra["timings"] = timings
    artifact.extra["kernels"] = len(program.kernels)
    artifact.extra["kernel_table"] = kernel_table(program)
    if all(isinstance(step, Call) for step in program.steps):  # straight-line: explain's
        artifact.extra["steps"] = [[s.kernel, list(s.args)] for s in program.steps]
    last_build.clear()
    last_build.update(artifact.extra)
    dump = os.environ.get("EMBER_DUMP")
    if dump:
        folder = Path(dump)
        write_atomically(folder / "loops.ir", print_program(program, constants="elide"))
        module = program_module(program, plan.offsets)
        write_atomically(folder / "llvm.ll", llvm_ir_text(module))
        write_atomically(folder / "asm.s", assembly_text(module))
    return artifact


def kernel_table(program) -> list[dict]:
    """For each kernel: its name, the graph ops it computes, its parameters, the bytes they
    span (what one call reads and writes at least) and its float operations, for explain."""
    from ember.loops.cost import flops, param_bytes, schedule_summary

    table = []
    for kernel in program.kernels:
        # A fused kernel's origin ends with its members, "[a, b]"; the op's own location
        # before them may quote a source line with brackets of its own.
        ops = kernel.origin.rsplit(" [", 1)[1].rstrip("]").split(", ") \
            if kernel.origin.endswith("]") and " [" in kernel.origin \
            else [kernel.origin.split(" ", 1)[0].removeprefix("graph.")]
        table.append({"name": kernel.name, "ops": ops, "origin": kernel.origin,
                      "bytes": param_bytes(kernel), "flops": flops(kernel),
                      "schedule": schedule_summary(kernel),
                      "params": [[p.dtype.value, list(p.shape)] for p in kernel.params]})
    return table


def compile_graph(graph: Graph, config: Config | None = None) -> Executable:
    """`graph` compiled for the host, from the caches when it was compiled before."""
    config = config or Config()
    key = cache_key(graph, signature(graph), config)
    disk = DiskCache() if config.disk_cache else None
    executable = get_or_build(key, lambda: build(graph, config), load_artifact, memory=_MEMORY,
                              disk=disk, stats=stats)
    executable.cache_key = key  # what a module's fingerprint records (the warm path)
    return executable


def clear_memory_cache() -> None:
    """Forget this process's compiled executables (the disk cache stays): the next compile
    of a graph seen before loads it from disk, as a new process would."""
    global _MEMORY
    _MEMORY = MemoryCache()


def load_cached(key: str) -> Executable | None:
    """The executable cached under `key`, from memory or disk, or None: no stage runs."""
    executable = get_cached(key, load_artifact, memory=_MEMORY, disk=DiskCache(), stats=stats)
    if executable is not None:
        executable.cache_key = key
    return executable
