"""What a compile's lowering is given: a `Tuning` session, passed down with the lowering
context (no global state). It answers which parameters each tunable kernel gets: the
database's record (a tuning database's winners, or a schedules file given back), else the
defaults; with `search`, kernels the database lacks are measured first, through the
backend's `measure` (a kernel's loop-IR text and its output count -> seconds, run by the
session's executor: a worker process here, or workers on a Ray cluster). Every kernel's
parameters, chosen or default, are noted in `chosen`: a model's schedules, which can be
written out, edited and given back (`ScheduleFile`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.errors import EmberError
from ember.target import Target


@dataclass
class Tuning:
    target: Target
    database: Any = None  # .get(key) -> record | None, .put(key, record); None: defaults
    measure: Callable[[str, int], float] | None = None  # None: search nothing
    search: bool = False
    budget_seconds: float = 10.0
    threads: int = 1  # the team size the winners are measured with
    # A tuning database keys winners by the machine they were measured on; a schedules
    # file is one model's, given back as it is.
    machine_in_keys: bool = True
    chosen: dict[str, dict] = field(default_factory=dict)  # key -> the kernel's record
    # Where measurements run: "local", "ray" or "ray:ADDRESS" (executor.py); started at the
    # first search, stopped by `close`.
    executor_name: str = "local"
    _executor: Any = field(default=None, init=False, repr=False, compare=False)

    def executor(self) -> Any:
        if self._executor is None:
            from ember.loops.tune.executor import make_executor

            self._executor = make_executor(self.executor_name, self.target, self.threads)
        return self._executor

    def close(self) -> None:
        """Stop the executor's workers, if a search started them."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    @property
    def machine(self) -> str:
        """What a measured winner depends on besides the kernel: the target and threads."""
        return f"{self.target.key()}/t{self.threads}"

    def _key(self, key: str) -> str:
        return f"{key}/{self.machine}" if self.machine_in_keys else key

    def lookup(self, key: str) -> dict | None:
        return None if self.database is None else self.database.get(self._key(key))

    def store(self, key: str, record: dict) -> None:
        if self.database is not None:
            self.database.put(self._key(key), record)

    @property
    def searching(self) -> bool:
        return self.search and self.measure is not None and self.database is not None


class ScheduleFile:
    """A model's schedules as written by a compile (EMBER_DUMP's schedules.json, `ember
    lower --schedule`), read back: kernel key -> record. Read only."""

    def __init__(self, path: str | Path):
        try:
            self.entries = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise EmberError(f"cannot read the schedules file {path}: {e}") from None
        if not isinstance(self.entries, dict):
            raise EmberError(f"{path}: a schedules file maps kernel keys to records")

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def put(self, key: str, record: dict) -> None:
        raise EmberError("a schedules file is given back as it is; it takes no new records")


def chosen_gemm_schedule(g: Any, tuning: Tuning | None) -> Any:
    """The GemmSchedule for matmul `g` that the session's database has (searching first
    when it lacks one), else None."""
    if tuning is None:
        return None
    from ember.loops.schedules.gemm import GemmSchedule
    from ember.loops.tune.gemm import key_of, tune_gemm

    record = tuning.lookup(key_of(g))
    if record is None and tuning.searching:
        record = tune_gemm(g, tuning)
    return GemmSchedule(**record["schedule"]) if record else None
