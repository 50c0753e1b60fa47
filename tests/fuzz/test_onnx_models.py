"""NNSmith-style model fuzzing: random valid ONNX models (tests/fuzz/onnx_models.py) run
through Ember's ONNX backend (compiled) and through ONNX Runtime, whose outputs must agree
within RTOL/ATOL. A disagreement shrinks to a minimal model, written to
$EMBER_FUZZ_OUT/mismatch.onnx (with its inputs) when that is set.

CI runs EXAMPLES models; `make fuzz-models` runs EMBER_FUZZ_JOBS workers for
EMBER_FUZZ_SECONDS each and prints how many models each checked.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings

from tests.fuzz.onnx_models import onnx_models

ort = pytest.importorskip("onnxruntime")

EXAMPLES = 15
ROUND = 25
RTOL, ATOL = 1e-3, 1e-4  # (f32 sums in another order through up to 30 ops)
COUNTS = {"checked": 0}


def check_model(model, feeds: dict[str, np.ndarray]) -> None:
    from ember.api.onnx_backend import EmberRep
    from ember.config import Config

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    with np.errstate(all="ignore"):
        got = EmberRep(model, config=Config(executor="cpu", disk_cache=False)).run(feeds)
    COUNTS["checked"] += 1
    try:
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape, f"output {i}: shape {g.shape}, ONNX Runtime {w.shape}"
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True,
                                       err_msg=f"output {i}")
    except AssertionError:
        out = os.environ.get("EMBER_FUZZ_OUT")
        if out:  # (the last one written is the shrunk model: hypothesis replays it last)
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "mismatch.onnx").write_bytes(model.SerializeToString())
            np.savez(Path(out) / "mismatch-inputs.npz", **feeds)
        raise


FUZZ = dict(deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                   HealthCheck.filter_too_much])


@settings(max_examples=EXAMPLES, **FUZZ)
@given(onnx_models())
def test_random_onnx_models_agree_with_onnx_runtime(case) -> None:
    check_model(*case)


@pytest.mark.skipif(not os.environ.get("EMBER_FUZZ_SECONDS"),
                    reason="make fuzz-models sets EMBER_FUZZ_SECONDS")
@pytest.mark.parametrize("worker", range(int(os.environ.get("EMBER_FUZZ_JOBS", "1"))))
def test_fuzz_models_for_a_while(worker: int) -> None:
    budget = float(os.environ["EMBER_FUZZ_SECONDS"])
    first = int(os.environ.get("EMBER_FUZZ_SEED", time.time_ns() % 2**31)) + worker * 10**6
    start, rounds, before = time.monotonic(), 0, COUNTS["checked"]
    while time.monotonic() - start < budget:
        run = settings(max_examples=ROUND, **FUZZ)(given(onnx_models())(
            lambda case: check_model(*case)))
        seed(first + rounds)(run)()
        rounds += 1
    print(f"\nfuzz-models: {COUNTS['checked'] - before} random ONNX models agreed with ONNX"
          f" Runtime in {time.monotonic() - start:.0f} s, seeds {first}..{first + rounds - 1}")
