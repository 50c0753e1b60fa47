"""`ember.explain(compiled)`: what the compiler made of a model, kernel by kernel.

    report = ember.explain(fast)      # fast = ember.compile(model) after one call
    print(report)                     # kernels sorted by time, with totals
    report.kernels[0].ops             # ['conv', 'add', 'max']
    report.flags                      # the slow kernels worth a look, with reasons

Each kernel row names the graph ops it computes (several when they were fused; `origin`
says where they came from), its schedule in brief (its parallel, unrolled and vectorized
loops), the bytes
its parameters span (what one call reads and writes at least) and its float operations
(ember/loops/cost.py). With `measure=True` (the default) each kernel is also timed and set
against the roofline of this machine (ember/runtime/machine.py): the time the kernel would
take at the FMA peak or at the copy bandwidth, whichever binds, over the time it took. 100%
is the roof. A kernel that takes over FLAG_SHARE of the time below FLAG_ROOFLINE of its
roof is flagged, with the reasons read off its loops at compile time
(ember/loops/diagnose.py) and a small kernel's fixed costs; a flag with no reason is a gap
in the compiler's knowledge, worth a look.

Kernels are timed in their places in the program: the whole program runs step by step on
its own buffers (its arena, its constants, random inputs), each step timed, so that what a
kernel meets in a real inference counts: an output planned in place of its input, data
that earlier kernels left in the caches, the values they computed. The kernel times then
add up to about one inference. (Timed alone on scratch buffers, BERT's in-place GELU took
0.3 ms where it took 3 in the model.) A program with control flow, whose steps are not a
straight line, has its kernels timed alone on scratch buffers; `Report.timing` says which.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.graph.bind import bind_shapes
from ember.graph.symbolic import evaluate, parse_dim
from ember.loops.ir import STATUS_DTYPE
from ember.runtime.executable import scratch_arrays


@dataclass(frozen=True)
class KernelInfo:
    name: str
    ops: list[str]  # graph op names, in program order
    origin: str  # the fused op (or op) and where it came from
    bytes: int
    flops: int = 0
    schedule: str = ""  # its loop kinds in brief, e.g. "parallel 384, vectorized 16"
    seconds: float | None = None  # one call, measured (None when not measured)
    bound_seconds: float | None = None  # the roofline's time for this kernel
    notes: tuple[str, ...] = ()  # what may keep it from its roofline (loops/diagnose.py)

    @property
    def gflops(self) -> float | None:
        return self.flops / self.seconds / 1e9 if self.seconds else None

    @property
    def gbs(self) -> float | None:
        return self.bytes / self.seconds / 1e9 if self.seconds else None

    @property
    def roofline(self) -> float | None:
        """The fraction of the roofline bound this kernel reaches (1.0: at the roof)."""
        if not self.seconds or self.bound_seconds is None:
            return None
        return self.bound_seconds / self.seconds


@dataclass(frozen=True)
class Flag:
    """A kernel that takes over FLAG_SHARE of the time below FLAG_ROOFLINE of its roofline,
    with the kernels like it (the same ops, schedule, bytes and flops: one per layer of a
    model), and the reasons it is slow (empty when none is known: a gap to look into)."""

    kernel: KernelInfo
    share: float  # of the kernels' time, its twins' included
    reasons: tuple[str, ...]
    twins: int = 0  # other kernels like it, flagged with it


FLAG_SHARE = 0.02
FLAG_ROOFLINE = 0.2
# A kernel this close to no work at the roof is slow for its call's fixed costs (a thread
# team's wake-up, loop set-up), which no schedule of its loops removes.
SMALL_SECONDS = 20e-6


@dataclass(frozen=True)
class Report:
    kernels: list[KernelInfo]
    timings: dict[str, float]  # seconds per compile stage, when this process built it
    machine: Any = None  # MachineLimits, when measured
    total_seconds: float | None = None  # one whole inference, measured
    timing: str = ""  # how kernels were timed: "in sequence" or "alone" (when measured)

    @property
    def flags(self) -> list[Flag]:
        """The kernels slow enough to look into, slowest first (none when not measured).
        Kernels alike (a model's layers) count together: twelve softmaxes of 0.6% each
        at 5% of their roofline are 7% of the time."""
        total = sum(k.seconds or 0 for k in self.kernels)
        alike: dict[tuple, list[KernelInfo]] = {}
        for k in self.kernels:
            if total and k.seconds is not None and k.roofline is not None:
                alike.setdefault((tuple(k.ops), k.schedule, k.bytes, k.flops), []).append(k)
        flags = []
        for group in alike.values():
            k = max(group, key=lambda g: g.seconds)
            seconds = sum(g.seconds for g in group)
            if seconds < FLAG_SHARE * total or \
                    sum(g.bound_seconds for g in group) >= FLAG_ROOFLINE * seconds:
                continue
            reasons = [n for n in k.notes if self.machine is None or self.machine.threads > 1
                       or not n.startswith("one thread")]
            if k.bound_seconds < SMALL_SECONDS:
                reasons.append(f"small: {1e6 * k.bound_seconds:.1f} us of work at the roof,"
                               " where a call's fixed costs dominate")
            flags.append(Flag(k, seconds / total, tuple(reasons), len(group) - 1))
        return sorted(flags, key=lambda f: -f.share)

    @property
    def total_bytes(self) -> int:
        return sum(k.bytes for k in self.kernels)

    @property
    def total_flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    def __str__(self) -> str:
        measured = all(k.seconds is not None for k in self.kernels) and self.kernels
        head = ["kernel", "graph ops", "schedule", "bytes", "GFLOP"]
        if measured:
            head += ["ms", "%", "GFLOP/s", "GB/s", "roofline"]
        total_time = sum(k.seconds or 0 for k in self.kernels)
        rows = []
        for k in self.kernels:
            ops = " + ".join(k.ops)
            row = [k.name, ops if len(ops) <= 50 else ops[:47] + "...", k.schedule,
                   _size(k.bytes), f"{k.flops / 1e9:.3f}"]
            if measured:
                row += [f"{1e3 * k.seconds:.3f}", f"{100 * k.seconds / total_time:.1f}",
                        f"{k.gflops:.1f}", f"{k.gbs:.1f}", f"{100 * k.roofline:.0f}%"]
            rows.append(row)
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

        def line(cells) -> str:
            return "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths)))

        out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
        fused = sum(1 for k in self.kernels if len(k.ops) > 1)
        ops = sum(len(k.ops) for k in self.kernels)
        out.append(f"{len(self.kernels)} kernels ({fused} fused) for {ops} graph ops;"
                   f" {_size(self.total_bytes)} moved at least,"
                   f" {self.total_flops / 1e9:.3f} GFLOP")
        if measured:
            m = self.machine
            whole = (f"; one inference {1e3 * self.total_seconds:.3f} ms"
                     if self.total_seconds else "")
            out.append(f"kernels {1e3 * total_time:.3f} ms in all ({self.timing}){whole}; roofs: "
                       f"{m.peak_gflops:.0f} GFLOP/s ({m.threads} threads),"
                       f" {m.bandwidth_gbs:.1f} GB/s copy")
            out += _flag_lines(self.flags)
        return "\n".join(out)


def _flag_lines(flags: list[Flag]) -> list[str]:
    if not flags:
        return [f"no kernel takes over {100 * FLAG_SHARE:.0f}% of the time below"
                f" {100 * FLAG_ROOFLINE:.0f}% of its roofline"]
    alike = " (with the kernels like them)" if any(f.twins for f in flags) else ""
    out = [f"flagged: {len(flags)} kernels{alike} take over {100 * FLAG_SHARE:.0f}% of the"
           f" time below {100 * FLAG_ROOFLINE:.0f}% of their roofline"]
    for f in flags:
        twins = f" and {f.twins} like it" if f.twins else ""
        out.append(f"  {f.kernel.name} ({' + '.join(f.kernel.ops)[:60]}){twins}:"
                   f" {100 * f.share:.1f}% of the time at {100 * f.kernel.roofline:.0f}% of"
                   " its roofline")
        out += [f"    - {r}" for r in f.reasons or ("no known reason",)]
    return out


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def explain(compiled: Any, measure: bool = True, budget_seconds: float = 0.2) -> Report:
    """The report of a compiled model: `ember.compile(...)`'s result (called at least once,
    so that it has specialized), or an Executable. With `measure`, each kernel runs on its
    own for about `budget_seconds` (at least once) and the report is sorted by time."""
    executable = _latest_executable(compiled)
    table = executable.notes.get("kernel_table")
    if table is None:
        raise EmberError("this executable carries no kernel table (built by an older Ember?)")
    table = _bound_table(executable, table)
    kernels = [KernelInfo(k["name"], list(k["ops"]), k["origin"], int(k["bytes"]),
                          int(k.get("flops", 0)), k.get("schedule", ""),
                          notes=tuple(k.get("notes", ()))) for k in table]
    report = Report(kernels, dict(executable.notes.get("timings", {})))
    if not measure:
        return report
    from ember.driver.pipeline import this_machine
    from ember.runtime.machine import measure as machine_limits

    limits = machine_limits(this_machine())
    steps = executable.notes.get("steps")
    in_sequence = _time_steps(executable, steps, budget_seconds * len(kernels), table) \
        if steps is not None else None
    timed = []
    for info, entry in zip(kernels, table):
        seconds = in_sequence.get(info.name) if in_sequence is not None else None
        if seconds is None:  # not in the steps (or no steps): alone, on scratch buffers
            seconds = _time_kernel(executable, info.name, entry["params"], budget_seconds,
                                   entry.get("size_values", []))
        bound = max(info.flops / (limits.peak_gflops * 1e9), info.bytes / (limits.bandwidth_gbs
                                                                           * 1e9))
        timed.append(replace(info, seconds=seconds, bound_seconds=bound))
    timed.sort(key=lambda k: -k.seconds)
    return Report(timed, report.timings, limits, _time_whole(executable, budget_seconds),
                  "in sequence" if in_sequence is not None else "alone")


def _sizes(executable: Any) -> dict[str, int]:
    """The sizes of the latest call of code compiled for every size (none for other code):
    what its report is of."""
    shapes = getattr(executable, "latest", None)
    if not executable.interface.sizes:
        return {}
    if shapes is None:
        raise EmberError("code compiled for every size is explained at the sizes of its"
                         " latest call: call it once first")
    return executable.env[shapes] if shapes in executable.env else \
        bind_shapes("explain", [b.name for b in executable.interface.inputs],
                    [b.shape for b in executable.interface.inputs], shapes, {})


def _bound(shape: list, env: dict[str, int]) -> list[int]:
    return [evaluate(parse_dim(d), env) if isinstance(d, str) else d for d in shape]


def _bound_table(executable: Any, table: list[dict]) -> list[dict]:
    """The kernel table at the sizes of the latest call (kernels of every size note their
    sizes as text), each kernel's size arguments' values added."""
    env = _sizes(executable)
    if not env:
        return table
    return [{**k, "bytes": _bound([k["bytes"]], env)[0],
             "params": [[t, _bound(shape, env)] for t, shape in k["params"]],
             "size_values": [env[n] for n in k.get("sizes", [])]} for k in table]


def _scratch_io(executable: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Scratch inputs and outputs for a whole run of `executable` (at its latest call's
    sizes)."""
    iface, env = executable.interface, _sizes(executable)
    return tuple(scratch_arrays([[b.dtype.value, _bound(list(map(_text, b.shape)), env)]
                                 for b in buffers])
                 for buffers in (iface.inputs, iface.outputs))


def _text(d: Any) -> Any:
    return d if isinstance(d, int) else str(d)


def _kernel_call(executable: Any, name: str, pointers: list, sizes: list[int]):
    """A kernel of `executable` as a function of no arguments: its buffers' `pointers`,
    then its size arguments."""
    import ctypes

    fn = executable.engine.function(name, None, *([ctypes.c_void_p] * len(pointers)),
                                    *([ctypes.c_int64] * len(sizes)))
    args = [*pointers, *(ctypes.c_int64(v) for v in sizes)]
    return lambda: fn(*args)


def _repeat(fn, budget: float) -> float:
    """The median seconds of `fn`, run for about `budget` seconds (at least 3 times)."""
    fn()
    times = []
    deadline = time.perf_counter() + budget
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 1000):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _time_kernel(executable: Any, name: str, params: list, budget: float,
                 sizes: list[int]) -> float:
    import ctypes

    arrays = scratch_arrays(params)
    return _repeat(_kernel_call(executable, name, [ctypes.c_void_p(a.ctypes.data)
                                                   for a in arrays], sizes), budget)


def _time_steps(executable: Any, steps: list, budget: float, table: list[dict]
                ) -> dict[str, float]:
    """Seconds per inference of each kernel, run in its place in the program on the
    program's own buffers: the median over rounds of the whole step sequence, for about
    `budget` seconds (at least 3 rounds), after one inference that fills the arena."""
    import ctypes

    inputs, outputs = _scratch_io(executable)
    executable(*inputs, out=outputs)
    address = executable.buffer_addresses(inputs, outputs)
    # The word the checking kernels write (the entry keeps its own on its stack).
    status = np.zeros((), STATUS_DTYPE.np)
    address |= dict.fromkeys(executable.notes.get("status", ()), status.ctypes.data)
    sizes = {k["name"]: k.get("size_values", []) for k in table}
    calls = [(name, _kernel_call(executable, name, [ctypes.c_void_p(address[a]) for a in args],
                                 sizes.get(name, []))) for name, args in steps]
    rounds: list[dict[str, float]] = []
    deadline = time.perf_counter() + budget
    with executable.arena_lock:  # no call may run on the arena meanwhile
        while len(rounds) < 3 or (time.perf_counter() < deadline and len(rounds) < 1000):
            spent: dict[str, float] = {}
            for name, call in calls:
                start = time.perf_counter()
                call()
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
            rounds.append(spent)
    return {name: sorted(r[name] for r in rounds)[len(rounds) // 2] for name in rounds[0]}


def _time_whole(executable: Any, budget: float) -> float:
    inputs, outputs = _scratch_io(executable)
    return _repeat(lambda: executable(*inputs, out=outputs), budget)


def _latest_executable(obj: Any) -> Any:
    from ember.runtime.executable import Executable

    seen = obj
    for _ in range(8):  # unwrap: module -> specialization -> runner -> executable
        if isinstance(obj, Executable):
            return obj
        if hasattr(obj, "specializations"):  # an ONNX EmberRep: newest first
            obj = obj.specializations[0].run if obj.specializations else None
        elif hasattr(obj, "cache") and hasattr(obj, "specialize"):  # a CompiledModule
            obj = next(reversed(obj.cache.values()), None)
        elif hasattr(obj, "graph_runner"):
            obj = obj.graph_runner
        elif hasattr(obj, "sizes") and hasattr(obj.sizes, "generic"):  # symbolic sizes
            sizes = obj.sizes
            obj = sizes.generic or next(reversed(sizes.runners.values()), None)
        elif hasattr(obj, "generic") and hasattr(obj, "runners"):  # a SizeSpecialized
            obj = obj.generic or next(reversed(obj.runners.values()), None)
        elif hasattr(obj, "run"):
            obj = obj.run
        else:
            obj = None
        if obj is None:
            break
    raise EmberError(f"nothing compiled to explain in {type(seen).__name__}: compile it with"
                     " the cpu executor and call it once (explain reports the newest"
                     " specialization)")
