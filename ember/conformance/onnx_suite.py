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
from ember.onnx import backend


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


@cache
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
            yield [_as_array(x) for x in inputs], [_as_array(x) for x in outputs]
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


def _as_array(x) -> np.ndarray:
    # Some in-memory cases hold TensorProtos (bf16, f16 cast cases), as onnx's runner knows.
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x


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
    model = _model(case)
    reason = exclusion_reason(model)
    if reason:
        return CaseResult(case.name, "excluded", reason, 0.0, case_ops(case))

    def check() -> None:
        rep = backend.prepare(model, executor=executor)
        for inputs, expected in _data_sets(case):
            with np.errstate(all="ignore"):
                outputs = rep.run(inputs)
            BackendTest.assert_similar_outputs(expected, list(outputs), rtol=case.rtol,
                                               atol=case.atol)

    result = _guarded(case.name, check)
    result.ops = case_ops(case)
    return result


# -- the light models: shipped outputs, and random weights against ONNX Runtime -----------------
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_models() -> dict[str, Path]:
    return {p.stem.removeprefix("light_"): p for p in sorted(LIGHT_DIR.glob("light_*.onnx"))}


def _float_inputs(model: onnx.ModelProto, fill) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for info in model.graph.input:
        if info.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                      for d in info.type.tensor_type.shape.dim)
        feeds[info.name] = fill(shape)
    return feeds


def run_light_shipped(name: str, executor: str | None = None) -> CaseResult:
    """The model as shipped, on onnx's runner inputs (arange(n)/n), against its output file."""
    path = light_models()[name]

    def arange(shape):
        n = int(np.prod(shape))
        return (np.arange(n).reshape(shape) / n).astype(np.float32)

    def check() -> None:
        model = onnx.load(str(path))
        feeds = _float_inputs(model, arange)
        expected = _read_tensor(path.with_name(f"light_{name}_output_0.pb"))
        outputs = backend.prepare(model, executor=executor).run(list(feeds.values()))
        BackendTest.assert_similar_outputs([expected], [outputs[0]], rtol=1e-3, atol=1e-7)

    return _guarded(f"light_{name}", check)


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy whose ConstantOfShape weight fills are replaced by random initializers."""
    rng = np.random.default_rng(seed)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    consts = {}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    consts[node.output[0]] = numpy_helper.to_array(attr.t)
    for t in model.graph.initializer:
        consts[t.name] = numpy_helper.to_array(t)
    kept = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in consts:
            shape = tuple(int(d) for d in consts[node.input[0]])
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            data = (rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)
            if len(shape) == 1:  # biases, batch-norm parameters: keep variances positive
                data = (np.abs(data) * 0.1 + 0.9).astype(np.float32)
            model.graph.initializer.append(numpy_helper.from_array(data, node.output[0]))
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model


def run_light_random(name: str, executor: str | None = None, seed: int = 0) -> CaseResult:
    """Random weights and inputs; ONNX Runtime is the reference."""
    import onnxruntime

    def check() -> None:
        model = randomize_weights(onnx.load(str(light_models()[name])), seed)
        rng = np.random.default_rng(seed + 1)
        feeds = _float_inputs(model, lambda s: rng.standard_normal(s).astype(np.float32))
        rep = backend.prepare(model, executor=executor)
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # the light models carry unused initializers
        session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                               providers=["CPUExecutionProvider"])
        expected = session.run(None, feeds)
        outputs = rep.run(list(feeds.values()))
        BackendTest.assert_similar_outputs(expected, list(outputs), rtol=1e-3, atol=1e-4)

    return _guarded(f"light_{name}_random", check)


def _guarded(name: str, check) -> CaseResult:
    start = time.perf_counter()
    try:
        check()
        status, detail = "pass", ""
    except UnsupportedOpError as e:
        status, detail = "unsupported", str(e)
    except EmberError as e:
        status, detail = "fail", f"{type(e).__name__}: {e}"
    except AssertionError as e:
        status, detail = "fail", f"wrong result: {str(e)[:2000]}"
    except Exception as e:  # noqa: BLE001
        status, detail = "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}"
    return CaseResult(name, status, detail, time.perf_counter() - start)
