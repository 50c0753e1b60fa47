"""What the fuzz tests share: hypothesis settings for fuzzing, and a run of a strategy for
EMBER_FUZZ_SECONDS (`make fuzz`, `make fuzz-models`), one per EMBER_FUZZ_JOBS worker."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, seed, settings

FUZZ = dict(deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                   HealthCheck.filter_too_much])
ROUND = 25  # examples a seed

# A test that runs for EMBER_FUZZ_SECONDS, once per worker (its argument `worker`).
timed = pytest.mark.skipif(not os.environ.get("EMBER_FUZZ_SECONDS"),
                           reason="make fuzz and make fuzz-models set EMBER_FUZZ_SECONDS")
workers = pytest.mark.parametrize("worker",
                                  range(int(os.environ.get("EMBER_FUZZ_JOBS", "1"))))


def run_for_a_while(strategy, check: Callable, worker: int) -> str:
    """`check(*case)` on cases of `strategy` for EMBER_FUZZ_SECONDS, in rounds of ROUND
    from consecutive seeds (EMBER_FUZZ_SEED, else the clock, then 10**6 apart per worker;
    a failure shrinks within its round). Returns how long it ran and its seeds."""
    budget = float(os.environ["EMBER_FUZZ_SECONDS"])
    first = int(os.environ.get("EMBER_FUZZ_SEED", time.time_ns() % 2**31)) + worker * 10**6
    start, rounds = time.monotonic(), 0
    while time.monotonic() - start < budget:
        run = settings(max_examples=ROUND, **FUZZ)(given(strategy)(lambda case: check(*case)))
        seed(first + rounds)(run)()
        rounds += 1
    return f"in {time.monotonic() - start:.0f} s, seeds {first}..{first + rounds - 1}"
