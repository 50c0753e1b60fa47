"""Which schedules the lowering uses: while `using_database(db)` is active (a tuned
compile), the matmul lowering asks `chosen_gemm_schedule` for the database's winner, and
other lowerings' knobs come from it (ember/loops/tune/knobs.py)."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any

_DATABASE: contextvars.ContextVar[Any] = contextvars.ContextVar("ember_tuning_db",
                                                                default=None)


@contextlib.contextmanager
def using_database(db: Any, tune: bool = False, budget_seconds: float = 10.0):
    """Lower with the winners of `db`; with `tune`, search the shapes it does not know."""
    token = _DATABASE.set((db, tune, budget_seconds))
    try:
        yield db
    finally:
        _DATABASE.reset(token)


def active_database() -> tuple[Any, bool, float] | None:
    """(the database, whether to search what it lacks, the budget per search) while a tuned
    compile is lowering, else None."""
    return _DATABASE.get()


def chosen_gemm_schedule(g: Any) -> Any:
    """The tuned GemmSchedule for matmul `g` when a tuned compile is lowering it, else None."""
    active = active_database()
    if active is None:
        return None
    db, tune, budget = active
    from ember.loops.schedules.gemm import GemmSchedule
    from ember.loops.tune.gemm import key_of, tune_gemm

    record = db.get(key_of(g))
    if record is None and tune:
        record = tune_gemm(g, db, budget)
    return GemmSchedule(**record["schedule"]) if record else None
