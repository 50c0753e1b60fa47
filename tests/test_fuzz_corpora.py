"""Every input in the fuzzers' checked-in corpora (fuzz/corpus/<target>/) ends in a result
or an EmberError: the inputs that reached new code, and those that once broke Ember, stay
regression tests (fuzz/harness.py says how the fuzzers run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.harness import TARGETS

CORPORA = Path(__file__).resolve().parents[1] / "fuzz" / "corpus"
FILES = [(target, path) for target in sorted(TARGETS)
         for path in sorted((CORPORA / target).glob("*"))]


def test_every_target_has_a_corpus() -> None:
    assert {target for target, _ in FILES} == set(TARGETS)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_corpus_inputs_end_in_a_result_or_an_ember_error(target: str) -> None:
    for path in (p for t, p in FILES if t == target):
        TARGETS[target](path.read_bytes())  # (raises on a bug; the file names the input)
