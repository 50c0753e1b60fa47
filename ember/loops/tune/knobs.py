"""Searching the parameters of a scheduling-stage step (a pool's lanes and rows, an
attention kernel's block of keys; ember/loops/schedule.py's NEST_CLASSES; a matmul's are
searched by ember/loops/tune/gemm.py): the candidates' value sets (`value_sets`: the
defaults first, then a sample of the choices), the key a kernel's winner is stored under
(`kernel_key`: the step's name and a hash of the plain nest's loop IR, nothing of where
in a model it sits; the database adds the machine), and the timing (`search_texts`: each
candidate scheduled in full, timed alone by the backend through the session's executor until
the budget is spent, candidates that schedule alike timed once).
"""

from __future__ import annotations

import hashlib
import itertools
import random

from ember.loops.ir import Kernel
from ember.loops.tune.context import Tuning
from ember.loops.tune.worker import search

MAX_CANDIDATES = 16  # value sets per kernel: the product of the choices, sampled
MIN_GAIN = 0.03  # how much faster than the defaults a winner must be

# kernel class -> (defaults, choices)
Choices = dict[str, tuple[dict[str, int], dict[str, tuple[int, ...]]]]


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


def search_texts(key: str, kernel: Kernel, texts: list[str], outputs: int,
                 tuning: Tuning) -> tuple[int, float, float, int, list[str]]:
    """Time the scheduled kernels `texts` (the defaults' first; those that print alike
    once) through the session's executor within its budget: (the winner's position, its
    seconds, the defaults' seconds, how many ran, the machines that measured). The
    defaults stay unless another is clearly faster: a win within the noise of timing a
    short kernel would change code for nothing."""
    first: dict[str, int] = {}  # value sets that schedule alike (clamped by a small kernel)
    for i, text in enumerate(texts):
        first.setdefault(text, i)
    results = ", ".join(f"{p.dtype.value}[{','.join(map(str, p.shape))}]"
                        for p in kernel.params[len(kernel.params) - outputs:])
    measured, machines = search(f"{key.split('/', 1)[0]} -> {results}", list(first.values()),
                                lambda i: (tuning.measure, texts[i], outputs), tuning)
    winner, seconds = min(measured, key=lambda m: m[1], default=(0, float("nan")))
    if measured and measured[0][0] == 0 and seconds > (1 - MIN_GAIN) * measured[0][1]:
        winner, seconds = measured[0]
    defaults = measured[0][1] if measured and measured[0][0] == 0 else float("nan")
    return winner, seconds, defaults, len(measured), machines
