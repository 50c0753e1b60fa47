"""Tuning the matmul schedule: candidates around the default (tile shape, blocks, parallel
tasks), each compiled as a matmul of the kernel's shapes and timed in a worker process.

A key names what the winner depends on: the batch extents, M, N, K, the dtype, whether B
has batch dims or comes packed in panels (`Gemm.b_panels`), the CPU and the thread count.
The search measures the default first, then candidates in random order until the budget is
spent; a candidate that fails to build or crashes its worker is skipped (the worker is
restarted).
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

from ember.loops.tune.database import TuningDatabase
from ember.loops.tune.worker import search, target_name


def gemm_key(batch: tuple, m: int, n: int, depth: int, dtype: Any, b_batched: bool = False,
             b_panels: int | None = None) -> str:
    extents = "x".join(str(e) for _, e in batch) or "-"
    name = getattr(dtype, "value", dtype)
    b = f"p{b_panels}" if b_panels else "bb" if b_batched else "b"
    return f"gemm/{extents}/{m}x{n}x{depth}/{name}/{b}/{target_name()}"


def key_of(g: Any) -> str:
    """The database key of matmul `g` (a Gemm)."""
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
    """A database that answers every key with one schedule (for measuring it)."""

    def __init__(self, schedule: dict):
        self.record = {"schedule": schedule}

    def get(self, key: str) -> dict:
        return self.record


def measure(spec: dict, schedule: dict, repeat: int = 5) -> float:
    """Seconds per call of the matmul `spec` lowered with `schedule` (runs in a worker)."""
    import numpy as np

    from ember.loops.lower import lower_graph
    from ember.loops.schedule import schedule_program
    from ember.loops.tune.context import using_database
    from ember.runtime.executable import compile_program

    graph = _spec_graph(spec)
    with using_database(_OneSchedule(schedule)):
        program = schedule_program(lower_graph(graph))
    run = compile_program(program)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(v.shape).astype(v.dtype.np) for v in graph.inputs]
    out = [np.empty(v.shape, v.dtype.np) for v in graph.outputs]
    run(*inputs, out=out)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run(*inputs, out=out)
        best = min(best, time.perf_counter() - start)
    return best


def tune_gemm(g: Any, db: TuningDatabase, budget_seconds: float = 10.0,
              max_candidates: int = 24) -> dict:
    """Search schedules for matmul `g` (a Gemm), store the winner in `db`; returns its
    record ({"schedule", "seconds", "tried"})."""
    from ember.loops.schedule import f32_lanes
    from ember.loops.schedules.gemm import _variables, default_gemm_schedule

    b_batched = bool(_variables(g.b) & {name for name, _ in g.batch})
    key = key_of(g)
    known = db.get(key)
    if known is not None:
        return known
    spec = {"batch": [e for _, e in g.batch], "m": g.m, "n": g.n, "k": g.depth,
            "dtype": g.a.dtype.value, "b_batched": b_batched, "b_panels": g.b_panels}
    options = candidates(default_gemm_schedule(g), f32_lanes())[:max_candidates]
    label = f"matmul {'x'.join(map(str, spec['batch'])) + 'x' if spec['batch'] else ''}" \
            f"{g.m}x{g.n}x{g.depth}"
    measured = search(label, options,
                      lambda schedule: (measure, spec, dataclasses.asdict(schedule)),
                      budget_seconds)
    # Nothing built: keep the default, unmeasured.
    winner, seconds = min(measured, key=lambda m: m[1], default=(options[0], float("nan")))
    record = {"schedule": dataclasses.asdict(winner), "seconds": seconds,
              "tried": len(measured)}
    db.put(key, record)
    return record
