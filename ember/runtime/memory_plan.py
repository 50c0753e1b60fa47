"""Static memory planning: every temp buffer of a Program gets an offset in one arena.

    plan = plan_memory(program)
    plan.offsets["t3"]        # byte offset of temp %t3 in the arena (a multiple of 64)
    print(plan.report())      # arena size vs the sum of temp sizes vs the peak of live bytes

Liveness runs over the program's top-level steps: a temp is live from the first step that
touches it to the last. A `ProgramIf` or `ProgramLoop` counts as one step, so a buffer used
inside a loop stays live for the whole loop. Temps whose lifetimes are disjoint may share
memory; a greedy best-fit packs the largest first. An elementwise call may also write its
output over an input that dies at that call (in-place): the two then form one slot.

In-place is legal when each output element is stored once, from loads of the input at the
same byte offset only (see `inplace_pairs`). A kernel may declare its pairs itself with an
`inplace: dict[out_param, in_param]` attribute; the analysis checks them either way.

A program compiled for every size (temps whose sizes are expressions of `?b`) gets a plan
without offsets: its slots (which temps share memory, and when they live) are decided once,
and `MemoryPlan.bind` packs them for the sizes of a call, as the runtime does once per
binding.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ember.errors import ResourceError
from ember.graph.symbolic import Dim, DimLike, dim_max, evaluate, parse_dim
from ember.loops.analysis import linear_offset
from ember.loops.ir import (
    Buffer,
    Call,
    Const,
    Expr,
    For,
    If,
    Kernel,
    Load,
    Program,
    ProgramIf,
    ProgramLoop,
    ProgramStep,
    Stmt,
    Store,
    walk_expr,
)

ALIGNMENT = 64


def align(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(nbytes: int, what: str) -> None:
    """Raise ResourceError when `nbytes` exceed this machine's memory: refused before any
    allocation (the system would grant it lazily and kill the process when it is used)."""
    total = machine_memory()
    if total is not None and nbytes > total:
        raise ResourceError(f"{what} needs {nbytes / 2**30:.1f} GiB, more than this"
                            f" machine's {total / 2**30:.1f} GiB of memory")


@dataclass
class MemoryPlan:
    """Arena offsets of a program's temps, with the facts that justify them."""

    offsets: dict[str, int]
    arena_size: int
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of each temp
    intervals: dict[str, tuple[int, int]] = field(default_factory=dict)  # first, last step
    inplace: dict[str, str] = field(default_factory=dict)  # temp -> temp whose memory it reuses
    peak_bytes: int = 0  # most bytes live at one step (in-place pairs counted once)
    # For a program of every size: its slots, packed by `bind` (the offsets are then empty).
    slots: list[_Slot] = field(default_factory=list)

    @property
    def symbolic(self) -> bool:
        return bool(self.slots)

    def bind(self, env: Mapping[str, int]) -> MemoryPlan:
        """The plan for the sizes `env` of a symbolic plan: its slots packed at their
        sizes' values (a plan of numbers is its own)."""
        if not self.symbolic:
            return self
        slots = [replace(s, size=int(evaluate(s.size, env))) for s in self.slots]
        _pack(slots)
        offsets = {name: slot.offset for slot in slots for name in slot.names}
        sizes = {name: int(evaluate(size, env)) for name, size in self.sizes.items()}
        return MemoryPlan(offsets, align(max((s.offset + s.size for s in slots), default=0)),
                          sizes, self.intervals, self.inplace,
                          _peak(slots, 1 + max((s.last for s in slots), default=0)))

    @property
    def total_bytes(self) -> int:
        """The arena size without any reuse: the sum of all temp sizes."""
        return sum(self.sizes.values())

    def report(self) -> str:
        if self.symbolic:
            return (f"arena packed per binding of the sizes for {len(self.sizes)} temps in"
                    f" {len(self.slots)} slots; {len(self.inplace)} in place")
        return (f"arena {_fmt(self.arena_size)} for {len(self.offsets)} temps of"
                f" {_fmt(self.total_bytes)} in all; peak live {_fmt(self.peak_bytes)};"
                f" {len(self.inplace)} in place")

    def to_json(self) -> dict[str, Any]:
        return {"offsets": self.offsets, "arena_size": self.arena_size,
                "sizes": {k: _size_json(v) for k, v in self.sizes.items()},
                "intervals": {k: list(v) for k, v in self.intervals.items()},
                "inplace": self.inplace, "peak_bytes": self.peak_bytes,
                "slots": [[s.names, _size_json(s.size), s.first, s.last] for s in self.slots]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MemoryPlan:
        return cls({k: int(v) for k, v in d["offsets"].items()}, int(d["arena_size"]),
                   {k: _size_of_json(v) for k, v in d["sizes"].items()},
                   {k: (int(a), int(b)) for k, (a, b) in d["intervals"].items()},
                   dict(d["inplace"]), int(d["peak_bytes"]),
                   [_Slot(list(names), _size_of_json(size), int(first), int(last))
                    for names, size, first, last in d.get("slots", [])])


def _size_json(size: DimLike) -> int | str:
    return str(size) if isinstance(size, Dim) else int(size)


def _size_of_json(size: int | str) -> DimLike:
    return parse_dim(size) if isinstance(size, str) else int(size)


def _fmt(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


# -- liveness -------------------------------------------------------------------------------

def step_buffers(program: Program, step: ProgramStep) -> set[str]:
    """The program buffers a step touches, including every step nested in it."""
    if isinstance(step, Call):
        return set(step.args)
    if isinstance(step, ProgramIf):
        names = {step.cond}
        for s in (*step.then, *step.orelse):
            names |= step_buffers(program, s)
        return names
    if isinstance(step, ProgramLoop):
        names = {step.trip_count, step.cond, step.counter}
        for s in step.body:
            names |= step_buffers(program, s)
        return names
    raise TypeError(step)


def live_intervals(program: Program) -> dict[str, tuple[int, int]]:
    """(first, last) top-level step that touches each temp; temps never touched are left out."""
    temps = {b.name for b in program.of_kind("temp")}
    intervals: dict[str, tuple[int, int]] = {}
    for i, step in enumerate(program.steps):
        for name in step_buffers(program, step) & temps:
            first = intervals.get(name, (i, i))[0]
            intervals[name] = (first, i)
    return intervals


# -- in-place legality ----------------------------------------------------------------------

def _injective(offset: dict[str | None, int], loops: list[For], reach: int = 0) -> bool:
    """Whether distinct iterations of `loops` give distinct offsets (mixed-radix test); with
    `reach`, offsets that far apart or more (stores inside the loops that cover that range)."""
    terms = []
    if any(isinstance(c, Dim) for c in offset.values()):  # strides known at call time
        return False
    for loop in loops:
        if not (isinstance(loop.start, Const) and isinstance(loop.stop, Const)) or loop.step < 1:
            return False
        trips = max(0, -(-(loop.stop.value - loop.start.value) // loop.step))
        if trips > 1:
            terms.append((abs(offset.get(loop.var.name, 0)) * loop.step, trips))
    # (`reach`: the largest offset difference the smaller terms can make)
    for weight, trips in sorted(terms):
        if weight <= reach:
            return False
        reach += weight * (trips - 1)
    return True


def _stores(stmts: list[Stmt], loops: list[For], out: list[tuple[Store, list[For]]]) -> None:
    for s in stmts:
        if isinstance(s, Store):
            out.append((s, loops))
        elif isinstance(s, For):
            _stores(s.body, [*loops, s], out)
        elif isinstance(s, If):
            _stores(s.then, loops, out)
            _stores(s.orelse, loops, out)


def _loads(stmts: list[Stmt]) -> list[tuple[Load, Store | None]]:
    """Every load in `stmts`, with the store whose value holds it (None: an index or a cond)."""
    found: list[tuple[Load, Store | None]] = []

    def expr(e: Expr, owner: Store | None) -> None:
        found.extend((x, owner) for x in walk_expr(e) if isinstance(x, Load))

    def visit(ss: list[Stmt]) -> None:
        for s in ss:
            if isinstance(s, Store):
                expr(s.value, s)
                for i in s.index:
                    expr(i, None)
            elif isinstance(s, For):
                expr(s.start, None)
                expr(s.stop, None)
                visit(s.body)
            elif isinstance(s, If):
                expr(s.cond, None)
                visit(s.then)
                visit(s.orelse)

    visit(stmts)
    return found


def _distinct_offsets(buf: Buffer, stores: list[tuple[Store, list[For]]]
                      ) -> dict[int, dict[str | None, int]] | None:
    """Each store's element offset in `buf` (by id of the store), when no two iterations of
    the stores write one element: one store injective over its loops, or several (a
    vectorized loop's blocks and its tail) inside the same loops, each injective over its
    own, writing apart ranges of offsets that together step like one more loop inside the
    shared ones. None otherwise."""
    offsets = {id(s): linear_offset(buf, s.index) for s, _ in stores}
    if not stores or any(o is None for o in offsets.values()):
        return None
    shared = 0  # the loops around every store (all of one store's)
    while all(len(loops) > shared and loops[shared] is stores[0][1][shared]
              for _, loops in stores):
        shared += 1
    outer = stores[0][1][:shared]
    names = {loop.var.name for loop in outer}
    within = {v: c for v, c in offsets[id(stores[0][0])].items() if v in names}
    spans = []
    for store, loops in stores:
        offset = offsets[id(store)]
        inner = {v: c for v, c in offset.items() if v not in names}
        span = _span(inner, loops[shared:])
        if {v: c for v, c in offset.items() if v in names} != within or span is None or \
                not _injective(inner, loops[shared:]):
            return None
        spans.append(span)
    spans.sort()
    if any(a[1] >= b[0] for a, b in zip(spans, spans[1:])):
        return None
    return offsets if _injective(within, outer, spans[-1][1] - spans[0][0]) else None


def _span(offset: dict[str | None, int], loops: list[For]) -> tuple[int, int] | None:
    """[least, most] of an affine offset over `loops` (constant bounds), else None."""
    low = high = offset.get(None, 0)
    bounds = {}
    for loop in loops:
        if not (isinstance(loop.start, Const) and isinstance(loop.stop, Const)) or \
                loop.step != 1 or loop.stop.value <= loop.start.value:
            return None
        bounds[loop.var.name] = (loop.start.value, loop.stop.value - 1)
    for v, c in offset.items():
        if v is None:
            continue
        if v not in bounds or isinstance(c, Dim):
            return None
        a, b = (c * x for x in bounds[v])
        low, high = low + min(a, b), high + max(a, b)
    return low, high


def inplace_pairs(kernel: Kernel) -> dict[str, str]:
    """Output params that may share memory with an input param: {out: in}.

    Legal when no two iterations of the stores of `out` write one element (one store whose
    index is injective over its loops, or a vectorized loop's blocks and tail:
    `_distinct_offsets`), `out` is never loaded, and `in` is never stored and loaded only
    in the value of a store of `out`, at the same offset as it. Each element of `in` is
    then read before the one store that overwrites it, and never again.
    """
    params = {b.name: b for b in kernel.params}
    stores: list[tuple[Store, list[For]]] = []
    _stores(kernel.body, [], stores)
    loads = _loads(kernel.body)
    stored = {s.buffer for s, _ in stores}
    loaded = {ld.buffer for ld, _ in loads}
    declared = getattr(kernel, "inplace", None)
    candidates = dict(declared) if declared is not None else {}
    pairs: dict[str, str] = {}
    for out_name in params:
        if out_name in loaded:
            continue
        mine = [(s, loops) for s, loops in stores if s.buffer == out_name]
        out = params[out_name]
        offsets = _distinct_offsets(out, mine)
        if offsets is None:
            continue
        for in_name in params:
            if (in_name == out_name or in_name in stored or in_name in pairs.values()
                    or (declared is not None and candidates.get(out_name) != in_name)):
                continue
            src = params[in_name]
            if src.dtype.itemsize != out.dtype.itemsize:
                continue
            mine_loads = [(ld, owner) for ld, owner in loads if ld.buffer == in_name]
            if mine_loads and all(id(owner) in offsets and
                                  linear_offset(src, ld.index) == offsets[id(owner)]
                                  for ld, owner in mine_loads):
                pairs[out_name] = in_name
                break
    return pairs


# -- packing --------------------------------------------------------------------------------

@dataclass
class _Slot:
    """Temps that share one region: a buffer and the in-place outputs that reuse it."""

    names: list[str]
    size: DimLike  # bytes; an expression of the sizes in a program of every size
    first: int
    last: int
    offset: int = -1


def plan_memory(program: Program, *, inplace: bool = True) -> MemoryPlan:
    """Offsets for every temp of `program` in one arena, reusing memory of dead temps."""
    temps = {b.name: b for b in program.of_kind("temp")}
    intervals = live_intervals(program)
    sizes = {name: b.nbytes for name, b in temps.items()}
    slot_of: dict[str, _Slot] = {}
    for name in temps:
        first, last = intervals.get(name, (0, 0))  # an unused temp still gets an address
        slot_of[name] = _Slot([name], sizes[name], first, last)

    reused: dict[str, str] = {}
    if inplace:
        pairs_of = {k.name: inplace_pairs(k) for k in program.kernels}
        for i, step in enumerate(program.steps):
            if not isinstance(step, Call):
                continue
            kernel = program.kernel(step.kernel)
            arg_of = {p.name: a for p, a in zip(kernel.params, step.args)}
            for out_param, in_param in pairs_of[kernel.name].items():
                out, src = arg_of[out_param], arg_of[in_param]
                if out not in temps or src not in temps or out == src or step.args.count(src) > 1:
                    continue
                slot, target = slot_of[out], slot_of[src]
                # The input must die here, the output start here, and neither be shared yet.
                if target.last != i or slot.first != i or len(slot.names) > 1 or slot is target:
                    continue
                target.names.append(out)
                target.size = dim_max(target.size, slot.size)
                target.last = max(target.last, slot.last)
                slot_of[out] = target
                reused[out] = src

    slots = list({id(s): s for s in slot_of.values()}.values())
    own = {name: intervals.get(name, (0, 0)) for name in temps}
    if any(isinstance(size, Dim) for size in sizes.values()):  # packed per binding
        return MemoryPlan({}, 0, sizes, own, reused, 0, slots)
    _pack(slots)
    offsets = {name: slot_of[name].offset for name in temps}
    arena = align(max((s.offset + s.size for s in slots), default=0))
    return MemoryPlan(offsets, arena, sizes, own, reused, _peak(slots, len(program.steps)))


def _overlaps(a: _Slot, b: _Slot) -> bool:
    return a.first <= b.last and b.first <= a.last


def _pack(slots: list[_Slot]) -> None:
    """Greedy best fit: largest slots first, each into the smallest gap left between the
    slots already placed that are live at the same time as it."""
    placed: list[_Slot] = []
    for slot in sorted(slots, key=lambda s: (-s.size, s.first, s.names[0])):
        if slot.size == 0:
            slot.offset = 0
            continue
        busy = sorted((s.offset, s.offset + s.size) for s in placed if _overlaps(s, slot))
        best, best_gap, cursor = None, None, 0
        for start, end in busy:
            gap = start - cursor
            if gap >= slot.size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, align(end))
        slot.offset = best if best is not None else cursor
        placed.append(slot)


def _peak(slots: list[_Slot], steps: int) -> int:
    return max((sum(s.size for s in slots if s.first <= i <= s.last) for i in range(steps)),
               default=0)
