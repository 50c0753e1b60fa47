"""What every search of the tuner shares: candidates run in a worker process, so that one
that crashes or hangs cannot take the caller down; a progress bar; the name of the machine
a winner was measured on is the tuning session's (`Tuning.machine`)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def new_pool() -> concurrent.futures.ProcessPoolExecutor:
    """One worker process, started afresh (spawn: no state copied from the caller)."""
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=1, mp_context=multiprocessing.get_context("spawn"))


def run_isolated(fn, *args, timeout: float = 120.0, pool=None) -> tuple[Any, str | None]:
    """fn(*args) in a worker process: (result, None), or (None, why) when it raised, crashed
    or ran out of time. The caller survives a crash of the worker."""
    own = pool is None
    pool = pool or new_pool()
    try:
        with _main_script_hidden():  # the worker starts here, at its first job
            future = pool.submit(fn, *args)
        return future.result(timeout=timeout), None
    except concurrent.futures.process.BrokenProcessPool:
        return None, "the worker process crashed"
    except concurrent.futures.TimeoutError:
        return None, f"timed out after {timeout:.0f} s"
    except Exception as e:  # noqa: BLE001  (a candidate's failure is a result, not an error)
        return None, f"{type(e).__name__}: {e}"
    finally:
        if own:
            pool.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def _main_script_hidden():
    """A spawned worker runs the caller's main script again (as `__mp_main__`) unless it
    cannot find it; a script without an `if __name__ == "__main__"` guard would then run
    its compile again in every worker. The workers need Ember only: while one starts, the
    script's path is hidden."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


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
           budget_seconds: float) -> list[tuple[Any, float]]:
    """Measure options in turn in one worker process, `job(option)` giving the function to
    run there and its arguments (it returns seconds), until all are measured or the
    budget is spent (the first is always tried); the worker is replaced after a crash.
    Returns (option, seconds) for each option that ran, in the order tried."""
    measured: list[tuple[Any, float]] = []
    tried = 0
    deadline = time.perf_counter() + budget_seconds
    pool = new_pool()

    def best() -> float | None:
        return min((seconds for _, seconds in measured), default=None)

    try:
        for option in options:
            if tried and time.perf_counter() > deadline:
                break
            fn, *args = job(option)
            seconds, why = run_isolated(fn, *args, pool=pool)
            tried += 1
            if why is not None and "crashed" in why:
                pool.shutdown(wait=False, cancel_futures=True)
                pool = new_pool()
            if seconds is not None:
                measured.append((option, seconds))
            if tried < len(options):
                progress(label, tried, len(options), best())
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    progress(label, tried, tried, best())  # the budget ends the search
    return measured
