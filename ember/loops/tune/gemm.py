"""Tuning the matmul schedule: candidates around the default (tile shape, blocks, parallel
tasks), each compiled as a matmul of the kernel's shapes and timed by the session's executor.

A key names what the winner depends on: the batch extents, M, N, K, the dtype, whether B
has batch dims or comes packed in panels (`Gemm.b_panels`), the CPU and the thread count.
The search measures the default first, then candidates in random order until the budget is
spent; a candidate that fails to build or crashes its worker is skipped (the worker is
restarted).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from ember.loops.tune.context import Tuning
from ember.loops.tune.worker import search
from ember.target import Target


def gemm_key(batch: tuple, m: int, n: int, depth: int, dtype: Any, b_batched: bool = False,
             b_panels: int | None = None) -> str:
    extents = "x".join(str(e) for _, e in batch) or "-"
    name = getattr(dtype, "value", dtype)
    b = f"p{b_panels}" if b_panels else "bb" if b_batched else "b"
    return f"gemm/{extents}/{m}x{n}x{depth}/{name}/{b}"


def key_of(g: Any) -> str:
    """The key of matmul `g` (a Gemm); a tuning database adds the machine."""
    from ember.loops.schedules.gemm import _variables

    b_batched = bool(_variables(g.b) & {name for name, _ in g.batch})
    return gemm_key(g.batch, g.m, g.n, g.depth, g.a.dtype, b_batched, g.b_panels)


def candidates(default: Any, lanes: int, seed: int = 0) -> list[Any]:
    """The default first, then variations of it in random order."""
    options = []
    for mr in (4, 6, 8):
        for nr in sorted({lanes, 2 * lanes}):
            for mc in (48, 96, 192):
                for nc in (128, 256, 512):
                    for parallel in (2, 4, 8):
                        options.append(dataclasses.replace(default, mr=mr, nr=nr, mc=mc - mc % mr,
                                                           nc=nc - nc % nr, parallel=parallel))
    random.Random(seed).shuffle(options)
    return [default, *[o for o in options if o != default]]


def _spec_graph(spec: dict):
    from ember.graph.builder import Builder

    b = Builder("tune_gemm")
    batch = list(spec["batch"])
    x = b.input("a", spec["dtype"], (*batch, spec["m"], spec["k"]))
    lanes = spec.get("b_panels")
    if lanes:  # B packed in panels (a packed_matmul's weights)
        wp = b.input("b", spec["dtype"], (-(-spec["n"] // lanes), spec["k"], lanes))
        b.output(b.op("packed_matmul", [x, wp], {"n": spec["n"]}).result)
        return b.build()
    w = b.input("b", spec["dtype"], ((*batch,) if spec["b_batched"] else ()) +
                (spec["k"], spec["n"]))
    b.output(b.matmul(x, w))
    return b.build()


class _OneSchedule:
    """A database that answers every matmul's key with one schedule (for measuring it)."""

    def __init__(self, schedule: dict):
        self.record = {"schedule": schedule}

    def get(self, key: str) -> dict | None:
        return self.record if key.startswith("gemm/") else None


def scheduled_text(spec: dict, schedule: dict, target: Target) -> str:
    """The loop-IR text of the matmul `spec`'s kernel scheduled with `schedule` (and the
    rest of the default schedule): what the backend measures."""
    from ember.loops.lower import lower_graph
    from ember.loops.schedule import schedule_program
    from ember.loops.text import print_kernel

    tuning = Tuning(target, _OneSchedule(schedule), machine_in_keys=False)
    (kernel,) = schedule_program(lower_graph(_spec_graph(spec), target), target,
                                 tuning).kernels
    return print_kernel(kernel)


def tune_gemm(g: Any, tuning: Tuning, max_candidates: int = 24) -> dict:
    """Search schedules for matmul `g` (a Gemm), store the winner in the session's database;
    returns its record ({"schedule", "seconds", "tried"})."""
    from ember.loops.schedules.gemm import _variables, default_gemm_schedule

    b_batched = bool(_variables(g.b) & {name for name, _ in g.batch})
    key = key_of(g)
    known = tuning.lookup(key)
    if known is not None:
        return known
    spec = {"batch": [e for _, e in g.batch], "m": g.m, "n": g.n, "k": g.depth,
            "dtype": g.a.dtype.value, "b_batched": b_batched, "b_panels": g.b_panels}
    target = tuning.target
    options = candidates(default_gemm_schedule(g, target),
                         target.lanes(g.a.dtype))[:max_candidates]
    label = f"matmul {'x'.join(map(str, spec['batch'])) + 'x' if spec['batch'] else ''}" \
            f"{g.m}x{g.n}x{g.depth}"
    measured, machines = search(label, options, lambda schedule: (
        tuning.measure, scheduled_text(spec, dataclasses.asdict(schedule), target), 1),
        tuning)
    # Nothing built: keep the default, unmeasured.
    winner, seconds = min(measured, key=lambda m: m[1], default=(options[0], float("nan")))
    record = {"schedule": dataclasses.asdict(winner), "seconds": seconds,
              "default_seconds": _defaults_seconds(measured, options[0]),
              "tried": len(measured), "measured_on": machines}
    tuning.store(key, record)
    return record


def _defaults_seconds(measured: list[tuple[Any, float]], default: Any) -> float:
    """The default schedule's time among `measured` (NaN when it did not build)."""
    return next((seconds for option, seconds in measured if option == default), float("nan"))
