"""The ONNX conformance ratchet: every case listed in ratchet.txt must keep passing.

The list only grows (`python -m ember.conformance onnx --models --update-ratchet`, and
with `--executor cpu` for the compiled path, whose entries read `cpu:suite/case`). CI runs
all of it through both executors, except the compiled random-weight light models.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.conformance import onnx_suite

RATCHET = Path(__file__).with_name("ratchet.txt")
ENTRIES = [line.strip() for line in RATCHET.read_text().splitlines()
           if line.strip() and not line.startswith("#")] if RATCHET.exists() else []


def _run(entry: str):
    """Run one ratchet entry: `[executor:]suite/case` (no executor: the interpreter)."""
    executor, _, entry = entry.rpartition(":")
    executor = executor or "interp"
    kind, name = entry.split("/", 1)
    if kind == "node":
        return onnx_suite.run_case(onnx_suite.node_cases()[name], executor)
    if kind == "light":
        return onnx_suite.run_light_shipped(name.removeprefix("light_"), executor)
    if kind == "light-random":
        return onnx_suite.run_light_random(name.removeprefix("light_").removesuffix("_random"),
                                           executor)
    return onnx_suite.run_case(onnx_suite.model_cases(kind)[name], executor)


# Compiling the random-weight light models again (new constants, new cache key) is the
# slowest part; CI compiles the shipped ones, `make test-full` both.
SLOW = ("cpu:light-random/",)
PARAMS = [pytest.param(e, marks=pytest.mark.slow) if e.startswith(SLOW) else e
          for e in ENTRIES]


@pytest.mark.parametrize("entry", PARAMS)
def test_listed_case_still_passes(entry: str) -> None:
    result = _run(entry)
    assert result.status == "pass", f"{entry}: {result.status}: {result.detail}"


def test_ratchet_is_not_empty() -> None:
    assert len(ENTRIES) > 0
