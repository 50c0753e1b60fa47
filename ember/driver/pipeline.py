"""The stages from a graph to running code, in one place. Each stage is named, timed and,
with EMBER_DUMP=dir, dumped; the caches skip them all when the same graph, signature and
config (its target included) were compiled before.

    stage          reads -> makes                    EMBER_DUMP writes
    graph passes   graph -> graph                    NN-<pass>.ir (the default pipeline,
                                                     the backend's layout passes, fusion)
    lowering       graph -> program (L2)             lowered.ir (tunable kernels take
                                                     their parameters from the Tuning
                                                     session: defaults, given back, or
                                                     searched through the backend)
    scheduling     program -> program                loops.ir; schedules.json (every
                                                     kernel's parameters, and its schedule
                                                     as primitives: derived from the target,
                                                     or given back)
    memory plan    program -> arena offsets          memory-plan.txt (copies into carried
                                                     and result buffers folded first)
    emission       program -> object code            llvm.ll, asm.s (the backend)
    loading        object code -> Executable         (the backend)

The target is resolved once, here (`resolve`): the levels are given it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ember.config import Config
from ember.driver.backend import Backend, backend_for
from ember.driver.keys import cache_key
from ember.driver.pass_manager import PassManager, write_reproducer
from ember.errors import CompileError, EmberError, ShapeError, UnsupportedOpError
from ember.graph.bind import graph_symbols, is_symbolic
from ember.graph.ir import Graph, clone_graph
from ember.graph.passes import DEFAULT_PIPELINE, GraphPass
from ember.graph.symbolic import SymbolicShapeError
from ember.runtime.cache import (
    CacheStats,
    DiskCache,
    MemoryCache,
    cache_dir,
    get_cached,
    get_or_build,
)
from ember.runtime.executable import Artifact, Executable
from ember.target import Target
from ember.util.files import write_atomically
from ember.util.memory import compiling

_MEMORY = MemoryCache()
stats = CacheStats()  # hits and builds of this process, for tests and explain
last_build: dict = {}  # timings and kernel count of the latest cold build, for the demo


def resolve(config: Config) -> Config:
    """`config` with its target as a Target (this machine's facts for None): the one place
    a compile's target is decided."""
    return config if isinstance(config.target, Target) else \
        dataclasses.replace(config, target=Target.get(config.target))


def this_machine() -> Target:
    """The machine this process runs on (for what measures it, like explain's roofline)."""
    return Target.host()


def signature(graph: Graph) -> tuple:
    return tuple((v.dtype.value, v.shape) for v in graph.inputs)


def graph_pipeline(config: Config, backend: Backend) -> list[str | GraphPass]:
    """The graph passes of a compile: attention before `decompose` splits its softmax, the
    default pipeline, the backend's layout passes, fusion (after the arrays that branches
    read are computed in them again), and dce (which drops what the layout passes
    replaced)."""
    return (["fuse_attention"] if config.fuse_attention else []) + DEFAULT_PIPELINE + \
        backend.graph_passes(config) + \
        (["sink_into_branches", "fuse"] if config.fusion else []) + ["dce"]


class _Stages:
    """Runs the stages of one compile: times each one and dumps its output."""

    def __init__(self, timings: dict[str, float]):
        self.timings = timings
        dump = os.environ.get("EMBER_DUMP")
        self.folder = Path(dump) if dump else None

    def run(self, name: str, stage: Callable[[], Any], dump: Callable[[Any, Path], None]
            | None = None) -> Any:
        start = time.perf_counter()
        result = stage()
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
        if self.folder is not None and dump is not None:
            dump(result, self.folder)
        return result


def _dump_text(file: str, text_of: Callable[[Any], str]) -> Callable[[Any, Path], None]:
    return lambda result, folder: write_atomically(folder / file, text_of(result))


def lower_to_program(graph: Graph, config: Config, timings: dict | None = None,
                     schedules: dict | None = None, every_size: bool = False):
    """The graph and loop-IR stages: passes (fusion included), lowering, the default
    schedule, verification and the memory plan. Returns (program, plan); JIT and AOT share
    it and differ only in what happens to the object code. `schedules`, when given, is
    filled with each tunable kernel's parameters (the model's schedules). A graph with
    symbolic sizes lowers to a program of every size when `every_size` (JIT code: the
    sizes are its entry's arguments); a stage that needs a size as a number raises
    SymbolicShapeError."""
    from ember.loops.lower import lower_graph
    from ember.loops.schedule import schedule_program
    from ember.loops.text import print_program
    from ember.loops.verify import verify_program
    from ember.runtime.memory_plan import check_fits, plan_memory

    if is_symbolic(graph) and not every_size:
        sizes = ", ".join(f"?{name}" for name in sorted(graph_symbols(graph)))
        raise ShapeError(f"graph @{graph.name} has sizes known only at call time ({sizes}):"
                         " ahead-of-time code is compiled for numbers (give them, as"
                         " input_shapes or with ember.graph.bind.specialize)")
    config = resolve(config)
    target, backend = config.target, backend_for(config.target)
    stages = _Stages({} if timings is None else timings)
    optimized = stages.run("graph passes", lambda: PassManager(
        graph_pipeline(config, backend)).run(clone_graph(graph)))
    def loop_ir(file: str) -> Callable[[Any, Path], None]:
        return _dump_text(file, lambda program: print_program(program, constants="elide"))

    with reproduced("lowering to loops", optimized, "python -m ember lower {input} -p ''"):
        tuning = tuning_session(config, backend)
        program = stages.run("lowering", lambda: lower_graph(optimized, target),
                             loop_ir("lowered.ir"))
        try:
            program = stages.run(
                "scheduling", lambda: verify_program(schedule_program(program, target, tuning)),
                loop_ir("loops.ir"))
        finally:
            tuning.close()
        if stages.folder is not None:
            write_atomically(stages.folder / "schedules.json", _schedules_text(tuning))
        if schedules is not None:
            schedules.update(tuning.chosen)
        plan = stages.run("memory plan", lambda: plan_memory(_coalesced(program)),
                          _dump_text("memory-plan.txt", lambda plan: plan.report() + "\n"))
    # (Sizes known at call time are checked at each binding; a GPU's memory is its own.)
    if target.kind == "cpu" and not program.sizes:
        check_fits(plan.arena_size + sum(b.nbytes for b in program.of_kind("output")),
                   f"graph @{graph.name}'s scratch arena and outputs")
    return program, plan


def _coalesced(program):
    """`program` with the copies that control flow lowers to folded into their writers."""
    from ember.runtime.copies import coalesce_copies

    coalesce_copies(program)
    return program


def tuning_session(config: Config, backend: Backend):
    """Which parameters each tunable kernel of a compile gets: a schedules file given back
    (`Config.schedules`: exactly those), a tuned compile's database (its winners, and a
    search for what it lacks, measured by the backend), else the defaults. The session
    notes every kernel's parameters (`Tuning.chosen`)."""
    from ember.codegen.cpu import default_num_threads
    from ember.loops.tune import ScheduleFile, Tuning, TuningDatabase

    if config.schedules:
        return Tuning(config.target, ScheduleFile(config.schedules), machine_in_keys=False)
    if not config.tune:
        return Tuning(config.target)
    return Tuning(config.target, TuningDatabase(config.tuning_db or cache_dir() / "tuning.json"),
                  backend.measure, search=True, budget_seconds=config.tune_budget,
                  threads=default_num_threads(), executor_name=config.tune_executor)


def _schedules_text(tuning) -> str:
    return json.dumps(tuning.chosen, indent=1, sort_keys=True) + "\n"


@contextlib.contextmanager
def reproduced(stage: str, graph: Graph, replay: str):
    """Run a stage after the graph passes; when it fails with anything but a user-facing
    error about the input (an unsupported op), write a reproducer and name it."""
    try:
        yield
    except (UnsupportedOpError, SymbolicShapeError):  # (a size needed as a number: the
        raise                                          # caller compiles per binding)
    except Exception as e:  # noqa: BLE001  (compiler bugs, LLVM errors: a reproducer each)
        from ember.graph.text import print_graph

        path = write_reproducer(stage, print_graph(graph), e, replay)
        what = str(e) if isinstance(e, EmberError) else f"internal error: {e!r}"
        raise CompileError(f"{stage} failed: {what}\n  reproducer: {path}") from e


def build(graph: Graph, config: Config) -> Artifact:
    """Every stage, from a graph to object code (the cold path)."""
    from ember.loops.analysis import copies_onto_itself
    from ember.loops.ir import Call

    config = resolve(config)
    backend = backend_for(config.target)
    timings: dict[str, float] = {}
    schedules: dict[str, dict] = {}
    program, plan = lower_to_program(graph, config, timings, schedules, every_size=True)
    stages = _Stages(timings)
    with reproduced("LLVM code generation", graph, "python -m ember ir {input} --stage asm"):
        artifact = stages.run("llvm", lambda: backend.emit(program, plan),
                              lambda _, folder: backend.dump(program, plan, folder))
    artifact.extra["timings"] = timings
    artifact.extra["kernels"] = len(program.kernels)
    artifact.extra["kernel_table"] = kernel_table(program)
    artifact.extra["schedules"] = schedules
    if all(isinstance(step, Call) for step in program.steps):  # straight-line: explain's
        run = [s for s in program.steps if not copies_onto_itself(program, s, plan.offsets)]
        artifact.extra["steps"] = [[s.kernel, list(s.args)] for s in run]
        artifact.extra["status"] = [b.name for b in program.of_kind("status")]
        called = {s.kernel for s in run}  # (a copy onto itself is no call: not a kernel)
        artifact.extra["kernel_table"] = [k for k in artifact.extra["kernel_table"]
                                          if k["name"] in called]
    last_build.clear()
    last_build.update(artifact.extra)
    return artifact


def kernel_table(program) -> list[dict]:
    """For each kernel: its name, the graph ops it computes, its parameters, the bytes they
    span (what one call reads and writes at least), its float operations and what may keep
    it from its roofline (`slowness_notes`), for explain."""
    from ember.loops.cost import flops, param_bytes, schedule_summary
    from ember.loops.diagnose import slowness_notes
    from ember.loops.ir import shared_code

    table = []
    every_size = bool(program.sizes)
    known: dict[tuple, dict] = {}  # by `shared_code`: a repeated block's copies alike
    for kernel in program.kernels:
        # A fused kernel's origin ends with its members, "[a, b]"; the op's own location
        # before them may quote a source line with brackets of its own.
        ops = kernel.origin.rsplit(" [", 1)[1].rstrip("]").split(", ") \
            if kernel.origin.endswith("]") and " [" in kernel.origin \
            else [kernel.origin.split(" ", 1)[0].removeprefix("graph.")]
        # A kernel of every size gives its sizes as text (`?b*512`), bytes too, and the
        # sizes it takes after its buffers; its flops, which depend on them, are not noted.
        sizes = kernel.sizes if every_size else ()
        shared = shared_code(kernel)
        if shared not in known:
            known[shared] = {
                "bytes": _json_size(param_bytes(kernel)),
                "flops": 0 if sizes else flops(kernel), "schedule": schedule_summary(kernel),
                "notes": slowness_notes(kernel),
                "params": [[p.dtype.value, [_json_size(d) for d in p.shape]]
                           for p in kernel.params], "sizes": list(sizes)}
        table.append({"name": kernel.name, "ops": ops, "origin": kernel.origin,
                      **known[shared]})
    return table


def _json_size(size) -> int | str:
    return size if isinstance(size, int) else str(size)


@compiling()
def compile_graph(graph: Graph, config: Config | None = None) -> Executable:
    """`graph` compiled for the config's target (default: this machine), from the caches
    when it was compiled before."""
    config = resolve(config or Config())
    backend = backend_for(config.target)
    key = cache_key(graph, signature(graph), config)
    disk = DiskCache() if config.disk_cache else None
    executable = get_or_build(key, lambda: build(graph, config), backend.load, memory=_MEMORY,
                              disk=disk, stats=stats)
    executable.cache_key = key  # what a module's fingerprint records (the warm path)
    return executable


def clear_memory_cache() -> None:
    """Forget this process's compiled executables (the disk cache stays): the next compile
    of a graph seen before loads it from disk, as a new process would."""
    global _MEMORY
    _MEMORY = MemoryCache()


@compiling()
def load_cached(key: str, config: Config | None = None) -> Executable | None:
    """The executable cached under `key`, from memory or disk, or None: no stage runs."""
    backend = backend_for(resolve(config or Config()).target)
    executable = get_cached(key, backend.load, memory=_MEMORY, disk=DiskCache(), stats=stats)
    if executable is not None:
        executable.cache_key = key
    return executable
