"""NNSmith-style model fuzzing: random valid ONNX models (tests/fuzz/onnx_models.py) run
through Ember's ONNX backend (compiled) and through ONNX Runtime, whose outputs must agree
within RTOL/ATOL. A disagreement shrinks to a minimal model, written to
$EMBER_FUZZ_OUT/mismatch.onnx (with its inputs) when that is set.

CI runs EXAMPLES models; `make fuzz-models` runs EMBER_FUZZ_JOBS workers for
EMBER_FUZZ_SECONDS each and prints how many models each checked.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

from tests.fuzz.budget import FUZZ, run_for_a_while, timed, workers
from tests.fuzz.onnx_models import onnx_models

ort = pytest.importorskip("onnxruntime")

EXAMPLES = 15
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


@settings(max_examples=EXAMPLES, **FUZZ)
@given(onnx_models())
def test_random_onnx_models_agree_with_onnx_runtime(case) -> None:
    check_model(*case)


@timed
@workers
def test_fuzz_models_for_a_while(worker: int) -> None:
    before = COUNTS["checked"]
    ran = run_for_a_while(onnx_models(), check_model, worker)
    print(f"\nfuzz-models: {COUNTS['checked'] - before} random ONNX models agreed with ONNX"
          f" Runtime {ran}")
