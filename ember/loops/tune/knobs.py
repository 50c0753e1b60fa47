"""Tuning the parameters of a schedule that a lowering still builds ("knobs"): the rows a
depthwise conv sums at once, an attention kernel's block of keys. (A scheduling-stage
step's parameters, a pool's, are searched by ember/loops/schedule.py through
`search_texts`; a matmul's by ember/loops/tune/gemm.py.)

A schedule (ember/loops/schedules/) asks the lowering context for its parameters by name,
with their defaults and the values worth trying (declared as data, `PARAMETERS`, and asked
for by `params.chosen`):

    k = ctx.knobs("attention", {"key_block": 256, "row_group": 4}, key_block=(64, 128, 256),
                  row_group=(2, 4, 6, 8))

and gets the defaults, except in a tuned compile (a `Tuning` session: `Config(tune=True)`,
or given schedules). There `tuned_kernel` lowers each op once with the defaults, noting
the knobs asked for; a kernel that asked for none is done. Else its key is the class of
the first knob asked for, a hash of the kernel's loop IR with the defaults (the shapes,
dtypes, fused epilogue: all that the kernel computes, and nothing of where in a model it
sits) and the session's machine (target and threads). The database's winner for the key
is used when there is one; when searching, a missing key is measured first: the kernel is
lowered again with each candidate set of values (the defaults first, the rest in random
order), given the default schedule and timed alone by the backend in a worker process until
the budget is spent. Candidates that lower to the same loop IR are timed once.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from ember.loops.ir import Kernel
from ember.loops.tune.context import Tuning
from ember.loops.tune.worker import search

MAX_CANDIDATES = 16  # value sets per kernel: the product of the choices, sampled
MIN_GAIN = 0.03  # how much faster than the defaults a winner must be

# kernel class -> (defaults, choices)
Choices = dict[str, tuple[dict[str, int], dict[str, tuple[int, ...]]]]


@dataclass
class KnobValues:
    """The knobs one lowering asked for, and the values to give them (the defaults where
    none is given)."""

    values: dict[str, dict[str, int]] = field(default_factory=dict)  # class -> name -> value
    asked: Choices = field(default_factory=dict)

    def ask(self, kernel_class: str, defaults: dict[str, int],
            choices: dict[str, tuple[int, ...]]) -> dict[str, int]:
        self.asked.setdefault(kernel_class, (dict(defaults), choices))
        given = self.values.get(kernel_class, {})  # (names a stored record no longer has: not)
        return {name: int(given.get(name, value)) for name, value in defaults.items()}


Lower = Callable[[KnobValues], Kernel]  # lowers one op with the given knob values


def kernel_key(kernel: Kernel, kernel_class: str) -> str:
    """`kernel_class`/a hash of the kernel's loop IR, its name and origin left out (a
    tuning database adds the machine)."""
    from ember.loops.text import print_kernel

    text = print_kernel(Kernel("k", kernel.params, kernel.body, kernel.locals))
    return f"{kernel_class}/{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def value_sets(asked: Choices, seed: int = 0) -> list[dict[str, dict[str, int]]]:
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


def tuned_kernel(lower: Lower, outputs: int, tuning: Tuning | None) -> Kernel:
    """lower(values) (which builds an op's kernel, its last `outputs` parameters its
    results) with the tuned values of the knobs it asks for in a tuned compile; see the
    module's docstring."""
    if tuning is None:
        return lower(KnobValues())
    asked = KnobValues()
    kernel = lower(asked)
    if not asked.asked:
        return kernel
    key = kernel_key(kernel, next(iter(asked.asked)))
    record = tuning.lookup(key)
    if record is None and tuning.searching:
        record = tune_kernel(lower, asked, kernel, key, outputs, tuning)
    defaults = {c: d for c, (d, _) in asked.asked.items()}
    tuning.chosen[key] = {"knobs": record["knobs"] if record else defaults}
    if record is None or record["knobs"] == defaults:
        return kernel
    return lower(KnobValues(record["knobs"]))


def tune_kernel(lower: Lower, asked: KnobValues, kernel: Kernel, key: str, outputs: int,
                tuning: Tuning) -> dict:
    """Search the knobs that `kernel` (lowered with the defaults) asked for; store the
    winner in the session's database under `key` and return its record ({"knobs",
    "seconds", "tried"})."""
    from ember.loops.schedule import schedule_kernel
    from ember.loops.text import print_kernel

    options = value_sets(asked.asked)
    texts = [print_kernel(schedule_kernel(lower(KnobValues(values)), tuning.target))
             for values in options]
    winner, seconds, tried = search_texts(key, kernel, texts, outputs, tuning)
    record = {"knobs": options[winner], "seconds": seconds, "tried": tried}
    tuning.store(key, record)
    return record


def search_texts(key: str, kernel: Kernel, texts: list[str], outputs: int,
                 tuning: Tuning) -> tuple[int, float, int]:
    """Time the scheduled kernels `texts` (the defaults' first; those that print alike
    once) in a worker within the session's budget: (the winner's position, its seconds,
    how many ran). The defaults stay unless another is clearly faster: a win within the
    noise of timing a short kernel would change code for nothing."""
    first: dict[str, int] = {}  # value sets that schedule alike (clamped by a small kernel)
    for i, text in enumerate(texts):
        first.setdefault(text, i)
    results = ", ".join(f"{p.dtype.value}[{','.join(map(str, p.shape))}]"
                        for p in kernel.params[len(kernel.params) - outputs:])
    measured = search(f"{key.split('/', 1)[0]} -> {results}", list(first.values()),
                      lambda i: (tuning.measure, texts[i], outputs), tuning.budget_seconds)
    winner, seconds = min(measured, key=lambda m: m[1], default=(0, float("nan")))
    if measured and measured[0][0] == 0 and seconds > (1 - MIN_GAIN) * measured[0][1]:
        winner, seconds = measured[0]
    return winner, seconds, len(measured)
