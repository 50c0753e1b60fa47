"""Tuning the parameters of a kernel's lowering ("knobs"): the rows a depthwise conv sums
at once, an attention kernel's block of keys, a pool's vector width.

A lowering asks for its parameters by name, with their defaults and the values worth
trying:

    k = knobs("attention", {"key_block": 256, "row_group": 4}, key_block=(64, 128, 256),
              row_group=(2, 4, 6, 8))

and gets the defaults, except in a tuned compile (`Config(tune=True)`, or one that reads
the tuning database). There `tuned_kernel` lowers each op once with the defaults, noting
the knobs asked for; a kernel that asked for none is done. Else its key is the class of
the first knob asked for, a hash of the kernel's loop IR with the defaults (the shapes,
dtypes, fused epilogue: all that the kernel computes, and nothing of where in a model it
sits) and the target CPU and thread count. The database's winner for the key is used
when there is one; when tuning, a missing key is searched first: the kernel is lowered
again with each candidate set of values (the defaults first, the rest in random order),
given the default schedule and timed alone on scratch buffers in a worker process until
the budget is spent. Candidates that lower to the same loop IR are timed once.
"""

from __future__ import annotations

import contextvars
import hashlib
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ember.loops.ir import Call, Kernel, Program, ProgramBuffer
from ember.loops.tune.worker import search, target_name

MAX_CANDIDATES = 16  # value sets per kernel: the product of the choices, sampled
MIN_GAIN = 0.03  # how much faster than the defaults a winner must be
MEASURE_SECONDS = 0.05  # calls of a candidate, after the first, for about this long


@dataclass
class _Asked:
    """The knobs one lowering asked for, and the values to give them."""

    values: dict[str, dict[str, int]] = field(default_factory=dict)  # class -> name -> value
    asked: dict[str, tuple[dict[str, int], dict[str, tuple[int, ...]]]] = \
        field(default_factory=dict)  # class -> (defaults, choices)


_LOWERING: contextvars.ContextVar[_Asked | None] = contextvars.ContextVar("ember_knobs",
                                                                          default=None)


def knobs(kernel_class: str, defaults: dict[str, int], **choices: tuple[int, ...]) -> dict[
        str, int]:
    """The values of a lowering's parameters: `defaults`, unless a tuned lowering gives
    others; `choices` are the values a search tries (the default included or not)."""
    asked = _LOWERING.get()
    if asked is None:
        return dict(defaults)
    asked.asked.setdefault(kernel_class, (dict(defaults), choices))
    given = asked.values.get(kernel_class, {})  # (names a stored record no longer has: not)
    return {name: int(given.get(name, value)) for name, value in defaults.items()}


def _lower_with(lower: Callable[[], Kernel], values: dict[str, dict[str, int]]) -> tuple[
        Kernel, _Asked]:
    asked = _Asked(values)
    token = _LOWERING.set(asked)
    try:
        return lower(), asked
    finally:
        _LOWERING.reset(token)


def kernel_key(kernel: Kernel, kernel_class: str) -> str:
    """`kernel_class`/a hash of the kernel's loop IR, its name and origin left out/target."""
    from ember.loops.text import print_kernel

    text = print_kernel(Kernel("k", kernel.params, kernel.body, kernel.locals))
    return f"{kernel_class}/{hashlib.sha256(text.encode()).hexdigest()[:16]}/{target_name()}"


def value_sets(asked: dict[str, tuple[dict[str, int], dict[str, tuple[int, ...]]]],
               seed: int = 0) -> list[dict[str, dict[str, int]]]:
    """The defaults, then up to MAX_CANDIDATES - 1 other combinations of the choices in
    random order."""
    names = [(cls, name) for cls, (_, choices) in asked.items() for name in choices]
    default = {cls: dict(defaults) for cls, (defaults, _) in asked.items()}
    grid = list(itertools.product(*(asked[cls][1][name] for cls, name in names)))
    random.Random(seed).shuffle(grid)
    sets = [default]
    for combination in grid:
        values = {cls: dict(defaults) for cls, (defaults, _) in asked.items()}
        for (cls, name), value in zip(names, combination):
            values[cls][name] = value
        if values not in sets:
            sets.append(values)
        if len(sets) == MAX_CANDIDATES:
            break
    return sets


def tuned_kernel(lower: Callable[[], Kernel], outputs: int) -> Kernel:
    """lower() (which builds an op's kernel, its last `outputs` parameters its results) with
    the tuned values of the knobs it asks for, when a tuned compile is lowering; see the
    module's docstring."""
    from ember.loops.tune.context import active_database

    active = active_database()
    if active is None:
        return lower()
    db, tune, budget = active
    kernel, asked = _lower_with(lower, {})
    if not asked.asked:
        return kernel
    key = kernel_key(kernel, next(iter(asked.asked)))
    record = db.get(key)
    if record is None and tune:
        record = tune_kernel(lower, asked, kernel, key, outputs, db, budget)
    if record is None or record["knobs"] == {c: d for c, (d, _) in asked.asked.items()}:
        return kernel
    return _lower_with(lower, record["knobs"])[0]


def tune_kernel(lower: Callable[[], Kernel], asked: _Asked, kernel: Kernel, key: str,
                outputs: int, db: Any, budget_seconds: float) -> dict:
    """Search the knobs that `kernel` (lowered with the defaults) asked for; store the
    winner in `db` under `key` and return its record ({"knobs", "seconds", "tried"})."""
    from ember.loops.schedule import schedule_kernel
    from ember.loops.text import print_kernel

    options = value_sets(asked.asked)
    texts = [print_kernel(schedule_kernel(_lower_with(lower, values)[0])) for values in options]
    first: dict[str, int] = {}  # value sets that lower alike (clamped by a small kernel)
    for i, text in enumerate(texts):
        first.setdefault(text, i)
    results = ", ".join(f"{p.dtype.value}[{','.join(map(str, p.shape))}]"
                        for p in kernel.params[len(kernel.params) - outputs:])
    measured = search(f"{key.split('/', 1)[0]} -> {results}", list(first.values()),
                      lambda i: (measure_kernel, texts[i], outputs), budget_seconds)
    # The defaults (tried first) stay unless another set is clearly faster: a win within
    # the noise of timing a short kernel would change code for nothing.
    winner, seconds = min(measured, key=lambda m: m[1], default=(0, float("nan")))
    if measured and measured[0][0] == 0 and seconds > (1 - MIN_GAIN) * measured[0][1]:
        winner, seconds = measured[0]
    record = {"knobs": options[winner], "seconds": seconds, "tried": len(measured)}
    db.put(key, record)
    return record


def measure_kernel(text: str, outputs: int, repeat: int = 5) -> float:
    """Seconds per call of the kernel in loop-IR `text` on scratch buffers (runs in a
    worker): the fastest of at least `repeat` calls after a first, for about
    MEASURE_SECONDS."""
    from ember.explain import scratch_arrays
    from ember.loops.text import parse_kernel
    from ember.loops.verify import verify_kernel
    from ember.runtime.executable import compile_program

    kernel = verify_kernel(parse_kernel(text))
    inputs = len(kernel.params) - outputs
    program = Program("tune", [ProgramBuffer(p, "input" if i < inputs else "output")
                               for i, p in enumerate(kernel.params)], [kernel],
                      [Call(kernel.name, [p.name for p in kernel.params])])
    arrays = scratch_arrays([[p.dtype.value, list(p.shape)] for p in kernel.params])
    run = compile_program(program)
    run(*arrays[:inputs], out=arrays[inputs:])
    times: list[float] = []
    deadline = time.perf_counter() + MEASURE_SECONDS
    while len(times) < repeat or time.perf_counter() < deadline:
        start = time.perf_counter()
        run(*arrays[:inputs], out=arrays[inputs:])
        times.append(time.perf_counter() - start)
    return min(times)
