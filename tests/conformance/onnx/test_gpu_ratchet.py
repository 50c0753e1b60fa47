"""The ONNX ratchet's node cases for the GPU, without a GPU: each case's graph scheduled for
sm_90 computes the expected outputs (run on this CPU, where a `threads` loop is a serial
loop), and its PTX is assembled by ptxas for sm_80 and sm_90 with no spills. CI takes
every SAMPLE-th case; `make test-full` takes them all. On a GPU, `bench/gpu_check.py` runs
them there."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.backend.test.runner import Runner as BackendTest

from ember.codegen import nvptx
from ember.config import Config
from ember.conformance import onnx_suite
from ember.conformance.onnx_scope import exclusion_reason
from ember.driver.pipeline import lower_to_program
from ember.frontends.onnx.importer import Importer
from ember.runtime.executable import compile_program
from ember.target import Target

from .test_ratchet import ENTRIES

SAMPLE = 12
CASES = sorted(e.removeprefix("cpu:node/") for e in ENTRIES if e.startswith("cpu:node/"))
PARAMS = [name if i % SAMPLE == 0 else pytest.param(name, marks=pytest.mark.slow)
          for i, name in enumerate(CASES)]
GPU = Target.named("sm_90")  # (sm_80 is scheduled alike)


@pytest.mark.skipif(nvptx.ptxas_path() is None, reason="ptxas is not installed")
@pytest.mark.parametrize("name", PARAMS)
def test_node_case_on_the_gpu_schedule(name: str) -> None:
    case = onnx_suite.node_cases()[name]
    model = onnx_suite._model(case)
    assert exclusion_reason(model) is None
    names = [i.name for i in model.graph.input
             if i.name not in {t.name for t in model.graph.initializer}]
    for inputs, expected in onnx_suite._data_sets(case):
        graph = Importer(model, input_values=dict(zip(names, inputs))).run()
        program, plan = lower_to_program(graph, Config(target=GPU, disk_cache=False))
        with np.errstate(all="ignore"):
            outputs = compile_program(program, Target.host(), plan)(*inputs)
        BackendTest.assert_similar_outputs(expected, list(outputs), rtol=case.rtol,
                                           atol=case.atol)
        for arch in ("sm_80", "sm_90"):  # (the schedule is the same for both)
            assembled = nvptx.assemble(nvptx.program_ptx(program, Target.named(arch))[0],
                                       arch)
            assert not any(assembled.spills.values()), assembled.spills
