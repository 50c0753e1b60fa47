"""The tuning database: one JSON file (the driver's is tuning.json in the cache folder),
mapping a kernel key (its class, shapes, dtypes, the target and thread count) to the
winning schedule's parameters and its measured time. Writes are atomic (a temp file
renamed)."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any


class TuningDatabase:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lock = threading.Lock()
        self.entries: dict[str, dict[str, Any]] = {}
        try:
            loaded = json.loads(self.path.read_text())
            if isinstance(loaded, dict):
                self.entries = loaded
        except (OSError, ValueError):
            pass  # missing or damaged: start empty (a damaged file is replaced on write)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, record: dict[str, Any]) -> None:
        with self.lock:
            self.entries[key] = record
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tuning.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(self.entries, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
