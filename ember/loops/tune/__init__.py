"""The tuner: schedule parameters searched on this machine, winners kept in a database.

`Config(tune=True)` (or EMBER_TUNE=1) makes a compile tune every matmul shape the database
does not know yet, within a time budget per shape, and lower every matmul with the best
schedule found (ember/loops/schedules/gemm.py); later compiles with `tune=True` reuse the
winners. The scheduling stage's other steps (pools, convolutions, attention) declare the
parameters worth searching, and each nest of theirs is searched the same way, keyed by a
hash of its loop IR (`knobs.py`).
Candidates run in a separate process (`worker.py`), so that one that crashes cannot take
the caller down.
"""

from ember.loops.tune.context import ScheduleFile, Tuning, chosen_gemm_schedule
from ember.loops.tune.database import TuningDatabase
from ember.loops.tune.gemm import gemm_key, key_of, tune_gemm

__all__ = ["ScheduleFile", "Tuning", "TuningDatabase", "chosen_gemm_schedule",
           "gemm_key", "key_of", "tune_gemm"]
