"""What every search of the tuner shares: candidates measured through the session's
executor (`executor.py`: a worker process here, or a worker on each machine of a Ray
cluster), so that one that crashes or hangs cannot take the caller down, within the
session's budget; a progress bar."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from ember.loops.tune.context import Tuning
from ember.loops.tune.executor import run_all


def progress(label: str, done: int, total: int, best: float | None) -> None:
    if not sys.stderr.isatty() and done != total:
        return  # a log, not a terminal: the final line only
    width = 24
    filled = int(width * done / max(total, 1))
    best_text = f"best {1e3 * best:.3f} ms" if best is not None else ""
    sys.stderr.write(f"\rtuning {label} [{'#' * filled}{'.' * (width - filled)}]"
                     f" {done}/{total} {best_text}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def search(label: str, options: Sequence[Any], job: Callable[[Any], tuple],
           tuning: Tuning) -> tuple[list[tuple[Any, float]], list[str]]:
    """Measure options through the session's executor, `job(option)` giving the function
    to run there and its arguments (it returns seconds), until all are measured or the
    session's budget is spent (the first is always tried). Returns (option, seconds) for
    each option that ran, in the order of `options`, and the machines that measured."""
    best: list[float] = []
    ran = 0

    def heard(index: int, seconds: Any, why: str | None) -> None:
        nonlocal ran
        ran += 1
        if seconds is not None:
            best[:] = [min([seconds, *best])]
        if ran < len(options):
            progress(label, ran, len(options), best[0] if best else None)

    def made(index: int) -> tuple:
        fn, *args = job(options[index])
        return fn, tuple(args)

    results = run_all(tuning.executor(), len(options), made, tuning.budget_seconds, heard)
    progress(label, ran, ran, best[0] if best else None)  # the budget ends the search
    measured = sorted((index, seconds) for index, seconds, _ in results)
    return [(options[index], seconds) for index, seconds in measured], \
        sorted({machine for _, _, machine in results})
