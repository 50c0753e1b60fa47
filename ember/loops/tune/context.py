"""What a tuned compile's lowering is given: a `Tuning` session, passed down with the
lowering context (no global state). The matmul lowering asks `chosen_gemm_schedule` for
the database's winner, other lowerings' knobs come from it too (ember/loops/tune/knobs.py);
with `search`, shapes the database lacks are measured first, through the backend's
`measure` (a kernel's loop-IR text and its output count -> seconds, run in a worker)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ember.target import Target


@dataclass
class Tuning:
    database: Any  # .get(key) -> record | None, .put(key, record)
    target: Target
    measure: Callable[[str, int], float] | None = None  # None: use winners, search nothing
    search: bool = False
    budget_seconds: float = 10.0
    threads: int = 1  # the team size the winners are measured with

    @property
    def machine(self) -> str:
        """What a measured winner depends on besides the kernel: the target and threads."""
        return f"{self.target.key()}/t{self.threads}"


def chosen_gemm_schedule(g: Any, tuning: Tuning | None) -> Any:
    """The tuned GemmSchedule for matmul `g` in a tuned compile, else None."""
    if tuning is None:
        return None
    from ember.loops.schedules.gemm import GemmSchedule
    from ember.loops.tune.gemm import key_of, tune_gemm

    record = tuning.database.get(key_of(g, tuning))
    if record is None and tuning.search and tuning.measure is not None:
        record = tune_gemm(g, tuning)
    return GemmSchedule(**record["schedule"]) if record else None
