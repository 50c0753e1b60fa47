"""The one configuration object: part of every cache key, its target included.
Environment variables may set it: EMBER_BACKEND=interp runs the reference interpreter
instead of compiled code, EMBER_TUNE=1 tunes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ember.errors import EmberError
from ember.target import Target, is_host

EXECUTORS = ("interp", "cpu")


@dataclass(frozen=True)
class Config:
    # What runs the graph: "cpu" (compiled through LLVM) or "interp" (the reference).
    executor: str = field(default_factory=lambda: os.environ.get("EMBER_BACKEND") or "cpu")
    # How many input signatures one compiled callable keeps before evicting the oldest.
    max_specializations: int = 8
    # Fuse ops into shared kernels (the `fuse` pass); off only to compare or bisect.
    fusion: bool = True
    # Search matmul schedules and other steps' parameters on this machine (EMBER_TUNE=1),
    # within tune_budget seconds per shape or kernel the tuning database does not know;
    # winners are kept for later tuned compiles.
    tune: bool = field(default_factory=lambda: os.environ.get("EMBER_TUNE", "") not in
                       ("", "0", "false", "no"))
    tune_budget: float = 10.0
    # Where the tuner measures (EMBER_TUNE_EXECUTOR): "local" (a worker process here),
    # "ray" (a worker on each machine of the Ray cluster RAY_ADDRESS names, else of a new
    # local instance; the `ember[ray]` extra) or "ray:ADDRESS" (docs/tuning.md).
    tune_executor: str = field(default_factory=lambda: os.environ.get("EMBER_TUNE_EXECUTOR")
                               or "local")
    # The tuning database (EMBER_TUNING_DB): a JSON file, shared by every process and
    # machine that names it; None is tuning.json in the cache folder.
    tuning_db: str | None = field(default_factory=lambda: os.environ.get("EMBER_TUNING_DB")
                                  or None)
    # Keep compiled code on disk (EMBER_CACHE_DIR) so that a new process skips every stage.
    disk_cache: bool = True
    # Make scaled dot-product attention one kernel with an online softmax (the
    # fuse_attention pass): a group of rows' scores in memory instead of all of them, and
    # faster than the unfused GEMMs and softmax (12 heads of 64, one thread: 0.58 against
    # 0.64 ms at sequence 128, 140 against 168 ms at 2048); off only to compare or bisect.
    fuse_attention: bool = True
    # Compute 3x3 convs at stride 1 with a constant filter by Winograd's F(4x4, 3x3) or
    # F(2x2, 3x3) (the winograd_convs pass): 4x or 2.25x fewer multiplies, with rounding a
    # few times or of the same order as the direct sum's (docs/decisions.md); off computes
    # every conv directly.
    winograd: bool = True
    # The machine to compile for: a Target, a preset's name ("znver4", "neoverse-n1", ...)
    # or None for this machine (`ember.Target`). The driver resolves it before any stage
    # (`ember.driver.pipeline.resolve`).
    target: Target | str | None = None
    # Schedules to use instead of the defaults and the tuner's, by kernel (a file written
    # by `ember lower --schedule` or EMBER_DUMP, possibly edited): see loops/schedules.
    schedules: str | None = None

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise EmberError(f"unknown executor '{self.executor}' (available:"
                             f" {', '.join(EXECUTORS)})")
        if self.tune_executor != "local" and self.tune_executor.partition(":")[0] != "ray":
            raise EmberError(f"unknown tuning executor '{self.tune_executor}' (available:"
                             " local, ray, ray:ADDRESS)")
        if self.max_specializations < 1:
            raise EmberError("max_specializations must be at least 1")
        if isinstance(self.target, str) and not is_host(self.target):
            Target.get(self.target)  # an unknown name fails here, before any work
