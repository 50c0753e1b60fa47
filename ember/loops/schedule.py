"""Schedule primitives on the loop IR, and the default schedule that every compile applies.

A primitive rewrites a kernel's loop nest without changing what it computes. Here is
`parallelize`: it marks a loop `parallel` (the CPU backend runs its iterations on a thread
team) after checking that its iterations are independent; the others (split, reorder,
tile, cache_read, ...) are in `ember/loops/primitives.py`. Every compile first simplifies
each kernel's indices by its loops' ranges (`simplify_kernel`), then the default schedule
parallelizes, in each top-level nest of a kernel, the outermost loop that is legal and has
enough work to pay for a fork (a few microseconds); it looks past a loop it cannot
parallelize only when that loop has at most MAX_FORKS iterations (a fork per iteration);
then it vectorizes inner loops whose bodies have vector code (`vectorize_inner_loops`).
Before both, nests that transpose (the store contiguous along one loop, a load along
another) are tiled into square blocks (`block_transposes`).

Independence is `ember.loops.analysis.independent`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from ember.dtypes import DType
from ember.errors import ScheduleError, VerificationError
from ember.graph.symbolic import definitely
from ember.loops import primitives
from ember.loops.analysis import access_kind, independent, lanes_compute, stored_buffers
from ember.loops.cost import trip_count, weighted
from ember.loops.ir import (
    Const,
    For,
    If,
    Kernel,
    Load,
    Program,
    Stmt,
    Store,
    expr_dim,
    loads_in,
    walk_expr,
    walk_stmts,
)
from ember.loops.primitives import Schedule, Step, _split
from ember.loops.schedules import attention as attention_schedules
from ember.loops.schedules import conv as conv_schedules
from ember.loops.schedules import depthwise as depthwise_schedules
from ember.loops.schedules import gemm as gemm_schedules
from ember.loops.schedules import gpu as gpu_schedules
from ember.loops.schedules import packed_conv as packed_conv_schedules
from ember.loops.schedules import pool as pool_schedules
from ember.loops.schedules.params import Parameters
from ember.loops.schedules.window_nest import Windows, window_nests
from ember.loops.simplify import simplify_kernel
from ember.loops.text import kernel_structure, print_kernel
from ember.loops.tune.context import Tuning, chosen_gemm_schedule
from ember.loops.tune.gemm import key_of
from ember.loops.tune.knobs import kernel_key, search_texts, value_sets
from ember.loops.verify import verify_kernel
from ember.target import Target

# About the work of one fork on this class of machine: below it, a team costs more than it
# saves (a fork and join measured ~8 us on 2 threads; a simple iteration is ~1 ns).
MIN_PARALLEL_WORK = 1 << 15
MAX_FORKS = 8  # most iterations of a serial loop around a parallel one


def _constant_bounds(s: For) -> bool:
    """Bounds that are constants, or sizes known at call time (the same for every
    iteration of the loops around it)."""
    return expr_dim(s.start) is not None and expr_dim(s.stop) is not None


def work(stmts: list[Stmt]) -> int:
    """About how many statement executions `stmts` cost (unknown trip counts count 1; a
    rough figure, for deciding whether a nest is worth a thread team)."""
    return weighted(stmts, lambda s: 1, budget=0)


def parallelize(kernel: Kernel, loop: For) -> Kernel:
    """`kernel` with `loop` (one of its loops) marked parallel; raises VerificationError
    when its iterations may depend on each other."""
    why = independent(loop, kernel)
    if why is not None:
        raise VerificationError(f"kernel @{kernel.name}: cannot parallelize %{loop.var.name}:"
                                f" {why}")

    def mark(stmts: list[Stmt]) -> list[Stmt]:
        out = []
        for s in stmts:
            if s is loop:
                out.append(replace(s, kind="parallel"))
            elif isinstance(s, For):
                out.append(replace(s, body=mark(s.body)))
            elif isinstance(s, If):
                out.append(replace(s, then=mark(s.then), orelse=mark(s.orelse)))
            else:
                out.append(s)
        return out

    scheduled = replace(kernel, body=mark(kernel.body))
    verify_kernel(scheduled)  # the private-locals rule
    return scheduled


def _with_inner_loop(scheduling: _Scheduling, loop: For) -> str:
    """The loop to make parallel for `loop`: itself, or, when it runs to a size known at
    call time that may leave a team idle (a batch of 1), it fused with the loop of constant
    bounds it holds (a batch's heads), so that the team shares both; not with an innermost
    loop, which would lose its vectors."""
    stop = expr_dim(loop.stop)
    inner = loop.body[0] if len(loop.body) == 1 else None
    if isinstance(stop, int) or definitely(operator.ge, stop, MAX_FORKS) or \
            not isinstance(inner, For) or not _constant_loop(inner) or \
            trip_count(inner) < 2 or not any(isinstance(s, For) for s in inner.body):
        return loop.var.name
    names = {s.var.name for s in scheduling.kernel.walk() if isinstance(s, For)}
    try:
        scheduling.apply("fuse", loop.var.name, inner.var.name)
    except ScheduleError:
        return loop.var.name
    new = [s.var.name for s in scheduling.kernel.walk() if isinstance(s, For)
           and s.var.name not in names]
    return new[0]  # (fuse makes one loop, of a fresh name)


def _constant_loop(s: For) -> bool:
    return isinstance(s.start, Const) and isinstance(s.stop, Const)


def _candidates(s: For):
    """The loops of the perfect-ish nest headed by `s`, outermost first."""
    while True:
        yield s
        inner = [t for t in s.body if isinstance(t, For)]
        if len(s.body) != 1 or len(inner) != 1:
            return
        s = inner[0]


def default_schedule(kernel: Kernel, min_work: int = MIN_PARALLEL_WORK) -> Kernel:
    """Parallelize the outermost legal loop of each top-level nest with enough work (and
    at least two iterations)."""
    scheduling = _Scheduling(kernel)
    _parallelize_nests(scheduling, min_work)
    return scheduling.kernel


def _parallelize_nests(scheduling: _Scheduling, min_work: int) -> None:
    for position in range(len(scheduling.kernel.body)):
        top = scheduling.kernel.body[position]  # from the kernel as scheduled so far
        if not isinstance(top, For) or work([top]) < min_work:
            continue
        for loop in _candidates(top):
            if trip_count(loop) < 2 or not _constant_bounds(loop):
                continue
            name = _with_inner_loop(scheduling, loop)
            try:
                scheduling.apply("parallel", name)
            except ScheduleError:
                # A team per iteration of this loop would pay a fork each time: look
                # further in only past a loop of a few iterations.
                if trip_count(loop) > MAX_FORKS:
                    break
                continue
            break


def _block_matmuls(scheduling: _Scheduling, target: Target, matmuls: list) -> None:
    """Block each f32 matmul nest by its GemmSchedule (`_matmul_schedules`)."""
    for loop, g, chosen in matmuls:
        name, args = gemm_schedules.gemm_step(loop, gemm_schedules.fit_schedule(g, chosen,
                                                                                target))
        scheduling.apply(name, *args)


def _matmul_schedules(kernel: Kernel, target: Target, tuning: Tuning | None) -> list:
    """(outer loop, Gemm, GemmSchedule) of each f32 matmul nest of `kernel`: the session's
    schedule (given back, or found by a search), else the target's default
    (ember/loops/schedules/gemm.py); each noted in `tuning.chosen` under its shape's key
    (to edit, or to tune)."""
    found = []
    for loop, g in gemm_schedules.matmul_nests(kernel):
        chosen = chosen_gemm_schedule(g, tuning) or \
            gemm_schedules.default_gemm_schedule(g, target)
        if tuning is not None:
            tuning.chosen[key_of(g)] = {"schedule": asdict(chosen)}
        found.append((loop, g, chosen))
    return found


@dataclass(frozen=True)
class NestClass:
    """A class of plain nests that one composite step schedules (besides matmuls): how to
    find them in a kernel, the step's parameters (their defaults for a nest on a target,
    and the values a search tries), and the step's arguments for given values."""

    step: str  # the primitive's name (ember/loops/primitives.py), also the tuning key's
    nests: Callable[[Kernel, Windows], list[tuple[str, Any]]]
    defaults: Callable[[Any, Target], dict[str, int]]  # (nest, target) -> values
    choices: Callable[[Target], dict[str, tuple[int, ...]]]
    # (nest, values, target) -> the step's arguments after its loop; None: the values
    arguments: Callable[[Any, dict[str, int], Target], tuple] | None = None
    # (nest, values) -> whether the step can schedule the nest so (None: always); a nest
    # it cannot keeps its plain nest
    fits: Callable[[Any, dict[str, int]], bool] | None = None

    def make_step(self, loop: str, nest: Any, values: dict[str, int], target: Target) -> Step:
        args = tuple(values.values()) if self.arguments is None else \
            self.arguments(nest, values, target)
        return Step(self.step, (loop, *args))


def _choices(parameters: Parameters) -> dict[str, tuple[int, ...]]:
    return {name: values for name, (_, values) in parameters.items()}


# In order: a nest that one class takes is not offered to the next (a packed conv's nest is
# a conv nest too).
NEST_CLASSES = (
    NestClass("packed_conv", packed_conv_schedules.nests,
              packed_conv_schedules.default_parameters,
              lambda target: _choices(packed_conv_schedules.PARAMETERS),
              packed_conv_schedules.step_arguments),
    NestClass("conv_gemm", conv_schedules.nests, conv_schedules.default_parameters,
              lambda target: _choices(conv_schedules.parameters(target)),
              conv_schedules.step_arguments),
    NestClass("pool", pool_schedules.nests, pool_schedules.default_parameters,
              lambda target: _choices(pool_schedules.PARAMETERS)),
    NestClass("depthwise_conv", depthwise_schedules.nests,
              depthwise_schedules.default_parameters,
              lambda target: _choices(depthwise_schedules.PARAMETERS),
              fits=depthwise_schedules.plane_fits),
    NestClass("attention", attention_schedules.nests, attention_schedules.default_parameters,
              lambda target: _choices(attention_schedules.PARAMETERS),
              attention_schedules.step_arguments),
)


@dataclass(frozen=True)
class NestStep:
    """A nest's composite step: the parameters chosen and the step they make."""

    loop: str
    values: dict[str, int]
    step: Step


def _nest_steps(kernel: Kernel, target: Target, tuning: Tuning | None,
                matmuls: list) -> list[NestStep]:
    """The composite step of each nest of a NEST_CLASSES class in `kernel`: its
    parameters are the session's (given back, or found by a search: each candidate
    scheduled in full and timed), else the target's defaults; each noted in
    `tuning.chosen` under `<step>/<hash of the nest>`."""
    found: list[NestStep] = []
    windows = functools.cache(functools.partial(window_nests, kernel))  # found once a depth
    for cls in NEST_CLASSES:
        for loop, nest in cls.nests(kernel, windows):
            if loop in {s.loop for s in found}:
                continue
            values = cls.defaults(nest, target)
            if tuning is not None:
                top = [s for s in kernel.body if isinstance(s, For) and s.var.name == loop]
                key = kernel_key(Kernel(kernel.name, kernel.params, top, kernel.locals),
                                 cls.step)
                record = tuning.lookup(key)
                if record is None and tuning.searching:
                    record = _search_nest(kernel, target, tuning, matmuls, found,
                                          (cls, loop, nest, values, key))
                given = record.get("schedule", {}) if isinstance(record, dict) else {}
                values = {n: int(given.get(n, v)) for n, v in values.items()}
                tuning.chosen[key] = {"schedule": values}
            if cls.fits is None or cls.fits(nest, values):
                found.append(NestStep(loop, values, cls.make_step(loop, nest, values, target)))
    return found


def _search_nest(kernel: Kernel, target: Target, tuning: Tuning, matmuls: list,
                 before: list[NestStep], candidate) -> dict:
    """Time the kernel scheduled with each candidate set of one nest's parameters (the
    nests before it with theirs, those after with their defaults); store the winner."""
    cls, loop, nest, defaults, key = candidate
    options = [values[cls.step] for values in
               value_sets({cls.step: (defaults, cls.choices(target))})]
    options = [v for v in options if cls.fits is None or cls.fits(nest, v)]
    # The nests after this one with their defaults.
    later = [s for s in _nest_steps(kernel, target, None, matmuls)
             if s.loop not in {loop, *(t.loop for t in before)}]
    texts = []
    for values in options:
        steps = [*before, NestStep(loop, values, cls.make_step(loop, nest, values, target)),
                 *later]
        texts.append(print_kernel(_default_scheduling(kernel, target, matmuls, steps).kernel))
    outputs = len(stored_buffers(kernel.body) & {b.name for b in kernel.params})
    winner, seconds, defaults, tried, machines = search_texts(key, kernel, texts, outputs,
                                                              tuning)
    record = {"schedule": options[winner], "seconds": seconds, "default_seconds": defaults,
              "tried": tried, "measured_on": machines}
    tuning.store(key, record)
    return record


def transpose_block(target: Target) -> int:
    """The side of a transposed block: one vector of f32, so that the block's loads and
    stores are whole vectors."""
    return target.lanes(DType.f32)


def block_transposes(kernel: Kernel, target: Target) -> Kernel:
    """Tile each transposing nest `for %a { for %b { y[.., %b] = f(x[.., %b, .., %a]) } }`
    (every store contiguous in %b, a load contiguous in %a instead) into square blocks,
    `for %a.o { for %b.o { for %a.i unrolled { for %b.i vectorized { .. } } } }`. Code
    generation transposes a full block in registers (ember/codegen/vector.py,
    `transposed_loads`): W vector loads along %a, W log2(W) shuffles, W vector stores along
    %b; the edge blocks gather. Untiled, the load walked down a column, a cache line per
    element, and rows whose pitch is a multiple of 1 KiB share a few L1 sets, so the lines
    were evicted before the next column came back to them (BERT's key heads, [128, 12, 64]
    -> [12, 64, 128] by 0.125: 106 -> 22 us a call on one thread, PyTorch's 43; the
    transposing kernels of BERT-base 2.25 -> 1.20 ms, of GPT-2 2.00 -> 0.90)."""
    scheduling = _Scheduling(kernel)
    _block_transposes(scheduling, target)
    return scheduling.kernel


def _block_transposes(scheduling: _Scheduling, target: Target) -> None:
    kernel, side = scheduling.kernel, transpose_block(target)
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    pairs = []
    for outer in walk_stmts(kernel.body):
        if not (isinstance(outer, For) and len(outer.body) == 1 and
                isinstance(outer.body[0], For)):
            continue
        inner = outer.body[0]
        # (A block is register-transposed vectors: a fused epilogue without vector code, a
        # sin, leaves the nest as it is.)
        if not all(isinstance(x, Store) and lanes_compute(x.value) for x in inner.body) \
                or not all(_constant_bounds(x) and x.kind == "serial" and x.step == 1 and
                           trip_count(x) >= side for x in (outer, inner)):
            continue
        a, b = outer.var.name, inner.var.name
        loads = list(loads_in(inner.body))
        if all(access_kind(s.index, b, shapes[s.buffer]) == "contiguous"
               for s in inner.body) and any(
                access_kind(x.index, b, shapes[x.buffer]) == "gather" and
                access_kind(x.index, a, shapes[x.buffer]) == "contiguous" for x in loads):
            pairs.append((a, b))
    for a, b in pairs:
        _, rows = scheduling.split(a, side)
        blocks, lanes = scheduling.split(b, side)
        scheduling.apply("reorder", rows, blocks)
        scheduling.apply("unroll", rows)
        scheduling.apply("vectorize", lanes)


def vectorize_inner_loops(kernel: Kernel, target: Target) -> Kernel:
    """Each innermost serial loop with constant bounds whose body ember.codegen.vector can
    run on lanes without gathers becomes a loop over blocks of one of `target`'s vector
    registers of its widest type (at least 4 lanes), each a vectorized loop, and a
    vectorized tail for the rest; a shorter loop over tiles (`_tile_loop`) becomes one
    vectorized loop. Kernels that already have vectorized loops (a GEMM's) keep their
    schedule.

    LLVM's loop vectorizer would widen most of these loops too, but behind a run-time check
    that the output does not overlap the inputs: an output planned in place of its input
    (ember/runtime/memory_plan.py) fails it and runs serially. BERT's GELU in place took
    3 ms a layer that way instead of 0.3."""
    scheduling = _Scheduling(kernel)
    _vectorize_inner_loops(scheduling, target)
    return scheduling.kernel


def _vectorize_inner_loops(scheduling: _Scheduling, target: Target) -> None:
    kernel = scheduling.kernel
    if any(isinstance(s, For) and s.kind == "vectorized" for s in walk_stmts(kernel.body)):
        return
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    locals_ = {b.name for b in kernel.locals}
    chosen = []
    parents = {id(s): p for p in walk_stmts(kernel.body) if isinstance(p, For) for s in p.body}
    for loop in walk_stmts(kernel.body):
        if not isinstance(loop, For) or loop.kind != "serial" or loop.step != 1 or \
                not _constant_bounds(loop) or \
                any(isinstance(s, For) for s in walk_stmts(loop.body)):
            continue
        body_stmts = list(walk_stmts(loop.body))
        if not all(isinstance(s, Store) for s in body_stmts):
            continue
        loads = [x for s in body_stmts for x in walk_expr(s.value) if isinstance(x, Load)]
        widest = max(x.dtype.itemsize for x in [*loads, *(s.value for s in body_stmts)])
        width = max(4, target.vector_bytes // widest)
        trips = trip_count(loop)
        if trips < width and trips > 1 and _tile_loop(body_stmts, locals_):
            width = trips
        outer = parents.get(id(loop))
        if trips < width and outer is not None and _fusable_around(outer, loop, width):
            chosen.append((loop.var.name, width, outer.var.name))
        elif trips >= width and not any(
                access_kind(x.index, loop.var.name, shapes[x.buffer]) == "gather"
                for x in loads):
            chosen.append((loop.var.name, width, None))
    for name, width, outer in chosen:
        if outer is not None:
            name = _fused_for_lanes(scheduling, outer, name, shapes)
            if name is None:
                continue
        try:
            scheduling.apply("vectorize_blocks", name, width)
        except ScheduleError:
            continue


def _fusable_around(outer: For, inner: For, width: int) -> bool:
    """Whether a loop too short for a vector (a 7x7 or 14x14 plane's rows) and the loop
    around it, a perfect serial nest with constant bounds, make enough iterations for one."""
    return outer.kind == "serial" and outer.step == 1 and _constant_bounds(outer) and \
        len(outer.body) == 1 and trip_count(outer) * trip_count(inner) >= width


def _fused_for_lanes(scheduling: _Scheduling, outer: str, inner: str,
                     shapes: dict) -> str | None:
    """`outer` and `inner` fused into one loop (`fuse`), when no load gathers along it (the
    plane's rows are contiguous in memory): its name; else None, and the kernel as it was."""
    kernel = scheduling.kernel
    try:
        fused = primitives.fuse(kernel, outer, inner)
    except ScheduleError:
        return None
    before = {s.var.name for s in walk_stmts(kernel.body) if isinstance(s, For)}
    loop = next(s for s in walk_stmts(simplify_kernel(fused).body)  # (as it will be seen)
                if isinstance(s, For) and s.var.name not in before)
    loads = [x for s in walk_stmts(loop.body) if isinstance(s, Store)
             for x in walk_expr(s.value) if isinstance(x, Load)]
    stores = [s for s in walk_stmts(loop.body) if isinstance(s, Store) and s.index]
    name = loop.var.name
    if any(access_kind(x.index, name, shapes[x.buffer]) == "gather" for x in loads) or \
            any(access_kind(s.index, name, shapes[s.buffer]) not in ("contiguous", "uniform")
                for s in stores):
        return None
    scheduling.apply("fuse", outer, inner)
    return name


def _tile_loop(body: list[Store], locals_: set[str]) -> bool:
    """Whether a loop body of stores computes a tile through scalar temporaries (Winograd's
    transforms: a tile's 16 points): on lanes those are vectors, one tile a lane, so that
    even a row of fewer tiles than a vector's lanes runs on one (masked) vector."""
    return any(s.index == () and s.buffer in locals_ for s in body) and \
        any(s.buffer not in locals_ for s in body)


class _Scheduling:
    """A kernel being scheduled: primitives applied one at a time, noted in order (the
    kernel's schedule, which `Schedule.apply` replays)."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.steps: list[Step] = []

    def apply(self, name: str, *args: str | int) -> None:
        step = Step(name, args)
        self.kernel = step.apply(self.kernel)
        self.steps.append(step)

    def split(self, loop: str, factor: int) -> tuple[str, str]:
        """Split `loop` by `factor`: the names of the outer and inner loops."""
        self.kernel, outer, inner = _split(self.kernel, loop, factor)
        self.steps.append(Step("split", (loop, factor)))
        return outer, inner


def default_kernel_schedule(kernel: Kernel, target: Target) -> Schedule:
    """The default schedule of `kernel` (its indices simplified) on `target`, as
    primitives: transposes in blocks, parallel outer loops, vectorized inner ones."""
    return Schedule(_default_scheduling(kernel, target).steps)


def _default_scheduling(kernel: Kernel, target: Target, matmuls: list | None = None,
                        nests: list[NestStep] | None = None) -> _Scheduling:
    """The default schedule derived on `kernel`: its steps and the kernel they made (so
    that a compile applies them once). `matmuls` and `nests`: its `_matmul_schedules` and
    `_nest_steps`, when known."""
    scheduling = _Scheduling(kernel)
    if matmuls is None:
        matmuls = _matmul_schedules(kernel, target, None)
    _block_matmuls(scheduling, target, matmuls)
    for nest in _nest_steps(kernel, target, None, matmuls) if nests is None else nests:
        # (A step that needs a size known only at call time raises SymbolicShapeError: the
        # plain nest would be many times slower, so the driver compiles per size instead.)
        scheduling.apply(nest.step.name, *nest.step.args)
    _block_transposes(scheduling, target)
    _parallelize_nests(scheduling, MIN_PARALLEL_WORK)
    _vectorize_inner_loops(scheduling, target)
    return scheduling


def schedule_kernel(kernel: Kernel, target: Target) -> Kernel:
    """`kernel` with its index arithmetic simplified by the loops' ranges (divisions that
    inlined reshapes leave) and the default schedule for `target` applied."""
    return _default_scheduling(simplify_kernel(kernel), target).kernel


def schedule_program(program: Program, target: Target, tuning: Tuning | None = None
                     ) -> Program:
    """`program` with each kernel's indices simplified and its schedule applied: the one
    that `tuning`'s schedules file gives for it, else the default for `target` (a GPU's:
    `ember/loops/schedules/gpu.py`). Each
    kernel's schedule is noted in `tuning.chosen` under `kernel/<name>`, with the
    fingerprint of the loop nest it applies to (one given back for another nest is
    not applied)."""
    scheduled = []
    # A model's repeated blocks lower to identical kernels: each nest is scheduled once,
    # and its copies (the same loop IR under another name) take the result.
    done: dict[str, tuple[Kernel, list[Step], str | None]] = {}
    for kernel in program.kernels:
        key = f"kernel/{kernel.name}"
        record = tuning.lookup(key) if tuning is not None else None
        structure = None if record else kernel_structure(kernel)
        if structure in done:
            result, steps, fingerprint = done[structure]
            scheduled.append(replace(result, name=kernel.name, origin=kernel.origin))
        else:
            result, steps, fingerprint = _schedule_one(kernel, target, tuning, record)
            scheduled.append(result)
            if structure is not None:
                done[structure] = result, steps, fingerprint
        if tuning is not None:
            tuning.chosen[key] = {"nest": fingerprint,
                                  "steps": [[s.name, *s.args] for s in steps]}
    program.kernels = scheduled
    return program


def _schedule_one(kernel: Kernel, target: Target, tuning: Tuning | None, record: Any
                  ) -> tuple[Kernel, list[Step], str | None]:
    """`kernel` simplified and scheduled (by `record`, its schedule given back, when that
    was written for this nest); its steps; its nest's fingerprint (with `tuning`)."""
    simplified = simplify_kernel(kernel)
    gpu = target.kind == "gpu"  # (whose schedules are gpu_steps' alone, for now)
    matmuls = [] if gpu else _matmul_schedules(simplified, target, tuning)
    nests = [] if gpu else _nest_steps(simplified, target, tuning, matmuls)
    fingerprint = None
    if tuning is not None:
        # A kernel's steps are written for its nest and its matmuls' and other nests'
        # parameters: an edited one (its own record) is then what the kernel gets.
        fingerprint = nest_fingerprint(simplified,
                                       [asdict(chosen) for *_, chosen in matmuls]
                                       + [nest.values for nest in nests])
    schedule = _given_schedule(kernel.name, record, fingerprint) if record else None
    if schedule is not None:
        steps, result = schedule.steps, schedule.apply(simplified)
    elif gpu:
        result, steps = gpu_schedules.gpu_steps(simplified)
    else:
        derived = _default_scheduling(simplified, target, matmuls, nests)
        steps, result = derived.steps, derived.kernel
    # The steps write a partial tile's bounds (min(rows left, mr)) where every tile may
    # be whole: the loops' ranges decide those, for constant trips.
    return simplify_kernel(result), steps, fingerprint


def nest_fingerprint(kernel: Kernel, matmuls: list[dict] | None = None) -> str:
    """A short hash of `kernel`'s loop-IR text (and of its matmul nests' schedules): which
    nest a schedule was written for."""
    text = print_kernel(kernel) + (json.dumps(matmuls, sort_keys=True) if matmuls else "")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _given_schedule(name: str, record: dict, fingerprint: str) -> Schedule | None:
    """The schedule of a record given back for kernel `name`, or None (with a warning)
    when it was written for another loop nest: the lowering's parameters or a matmul's
    schedule were edited too, or the model or the compiler changed."""
    if not isinstance(record, dict) or not isinstance(record.get("steps"), list):
        raise ScheduleError(f"the schedule given for kernel @{name} has no list of steps")
    if record.get("nest") != fingerprint:
        warnings.warn(f"the schedule given for kernel @{name} was written for another loop"
                      " nest; the kernel gets the default schedule", stacklevel=3)
        return None
    return Schedule.from_json(json.dumps({"steps": record["steps"]}))
