"""Running the onnx package's backend test cases through `ember.onnx.backend`.

Node cases are built in memory by onnx's loader; model cases (simple, pytorch-operator,
pytorch-converted, light) are read from the onnx package's data folder. Each case runs
through the Backend API and is compared the way onnx's own runner compares.
"""

from __future__ import annotations

import time
import traceback
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests, load_node_model_tests
from onnx.backend.test.runner import Runner as BackendTest

from ember.conformance.onnx_scope import exclusion_reason
from ember.errors import EmberError, UnsupportedOpError
from ember.frontends.onnx import backend


@dataclass
class CaseResult:
    name: str
    status: str  # pass, fail, unsupported, error, excluded
    detail: str = ""
    seconds: float = 0.0
    ops: tuple[str, ...] = ()


@cache
def node_cases() -> dict[str, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in load_node_model_tests()}


def model_cases(kind: str) -> dict[str, object]:
    return {c.name: c for c in load_model_tests(kind=kind)}


def case_ops(case) -> tuple[str, ...]:
    model = case.model if isinstance(case.model, onnx.ModelProto) else None
    if model is None:
        return ()
    return tuple(sorted({n.op_type for n in model.graph.node}))


def _data_sets(case) -> Iterable[tuple[list[np.ndarray], list[np.ndarray]]]:
    if case.data_sets is not None:
        for inputs, outputs in case.data_sets:
            yield list(inputs), list(outputs)
        return
    model_dir = Path(case.model_dir)
    for folder in sorted(model_dir.glob("test_data_set*")):
        inputs = [_read_tensor(p) for p in sorted(folder.glob("input_*.pb"),
                                                   key=lambda p: int(p.stem.split("_")[1]))]
        outputs = [_read_tensor(p) for p in sorted(folder.glob("output_*.pb"),
                                                    key=lambda p: int(p.stem.split("_")[1]))]
        yield inputs, outputs
    for npz in sorted(model_dir.glob("test_data_*.npz")):
        data = np.load(npz, encoding="bytes")
        yield list(data["inputs"]), list(data["outputs"])


def _read_tensor(path: Path) -> np.ndarray:
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(tensor)


def _model(case) -> onnx.ModelProto:
    if isinstance(case.model, onnx.ModelProto):
        return case.model
    return onnx.load(str(Path(case.model_dir) / "model.onnx"))


def run_case(case, executor: str | None = None) -> CaseResult:
    """Run one case; never raises (an internal error is reported as status 'error')."""
    start = time.perf_counter()
    ops = case_ops(case)
    try:
        model = _model(case)
        reason = exclusion_reason(model)
        if reason:
            return CaseResult(case.name, "excluded", reason, 0.0, ops)
        rep = backend.prepare(model, executor=executor)
        for inputs, expected in _data_sets(case):
            with np.errstate(all="ignore"):
                outputs = rep.run(inputs)
            BackendTest.assert_similar_outputs(expected, list(outputs), rtol=case.rtol,
                                               atol=case.atol)
        status, detail = "pass", ""
    except UnsupportedOpError as e:
        status, detail = "unsupported", str(e)
    except EmberError as e:
        status, detail = "fail", f"{type(e).__name__}: {e}"
    except AssertionError as e:
        status, detail = "fail", f"wrong result: {str(e)[:2000]}"
    except Exception as e:  # noqa: BLE001  (a crash in Ember is a finding, not a stop)
        tb = traceback.format_exc(limit=-3)
        status, detail = "error", f"{type(e).__name__}: {e}\n{tb}"
    return CaseResult(case.name, status, detail, time.perf_counter() - start, ops)
