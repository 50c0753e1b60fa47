"""The ONNX conformance ratchet: every case listed in ratchet.txt must keep passing.

The list only grows (`python -m ember.conformance onnx --models --update-ratchet`).
CI runs all of it: the whole node suite runs through the interpreter in well under the
time budget. The random-weight runs of the light models are the slowest part.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.conformance import onnx_suite

RATCHET = Path(__file__).with_name("ratchet.txt")
ENTRIES = [line.strip() for line in RATCHET.read_text().splitlines()
           if line.strip() and not line.startswith("#")] if RATCHET.exists() else []


def _run(entry: str):
    kind, name = entry.split("/", 1)
    if kind == "node":
        return onnx_suite.run_case(onnx_suite.node_cases()[name])
    if kind == "light":
        return onnx_suite.run_light_shipped(name.removeprefix("light_"))
    if kind == "light-random":
        return onnx_suite.run_light_random(name.removeprefix("light_").removesuffix("_random"))
    return onnx_suite.run_case(onnx_suite.model_cases(kind)[name])


@pytest.mark.parametrize("entry", ENTRIES)
def test_listed_case_still_passes(entry: str) -> None:
    result = _run(entry)
    assert result.status == "pass", f"{entry}: {result.status}: {result.detail}"


def test_ratchet_is_not_empty() -> None:
    assert len(ENTRIES) > 0
