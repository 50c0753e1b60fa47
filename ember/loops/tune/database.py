"""The tuning database: one JSON file (the driver's is tuning.json in the cache folder, or
`Config.tuning_db`), mapping a kernel key (its class, shapes, dtypes, the target and thread
count) to the winning schedule's parameters and its measured time.

Several processes, and machines sharing a file system, may tune into one file: a write
takes a lock on the file, reads what others wrote since, adds its record and renames a
temp file into place, so nothing is lost and no reader sees half a file. Where one key was
measured twice, the faster record stays (`merge` folds in another machine's file the same
way); a key names its target, so machines of other targets add entries beside."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ember.errors import EmberError
from ember.util.files import write_atomically


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: empty (a damaged file is replaced on write)
    return loaded if isinstance(loaded, dict) else {}


def _better(record: dict[str, Any], than: dict[str, Any] | None) -> bool:
    """Whether `record` should replace `than` under one key: the faster measurement (an
    unmeasured record, whose seconds are NaN, loses to a measured one)."""
    if than is None:
        return True
    seconds, other = record.get("seconds", math.nan), than.get("seconds", math.nan)
    if not isinstance(other, int | float) or math.isnan(other):
        return True
    return isinstance(seconds, int | float) and not math.isnan(seconds) and seconds < other


class TuningDatabase:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lock = threading.Lock()
        self.entries: dict[str, dict[str, Any]] = _read(self.path)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, record: dict[str, Any]) -> None:
        self.merge_entries({key: record})

    def merge(self, other: str | Path) -> int:
        """Fold the database file `other` in (another machine's winners); returns how many
        of its records were taken."""
        path = Path(other)
        if not path.is_file():
            raise EmberError(f"no tuning database at {path}")
        return self.merge_entries(_read(path))

    def merge_entries(self, records: dict[str, dict[str, Any]]) -> int:
        with self.lock, self._file_lock():
            self.entries.update(_read(self.path))
            taken = 0
            for key, record in records.items():
                if isinstance(record, dict) and _better(record, self.entries.get(key)):
                    self.entries[key] = record
                    taken += 1
            write_atomically(self.path, json.dumps(self.entries, indent=1, sort_keys=True))
        return taken

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """An exclusive lock between processes, on a file beside the database."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
