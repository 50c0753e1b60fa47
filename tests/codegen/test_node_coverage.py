"""Every loop-IR expression and statement kind compiles through the scalar code generator
(ember/codegen/llvm.py with ember/codegen/scalar.py) and computes what its sample says
(tests/loops/node_samples.py; the loop-level modules: tests/loops/test_node_coverage.py)."""

from __future__ import annotations

import numpy as np
import pytest

from ember.codegen import cpu
from ember.codegen.llvm import kernel_module
from ember.target import Target
from tests.loops.node_samples import REDUNDANT_INDEX, SAMPLES, inputs

HOST = Target.host()


@pytest.mark.parametrize("kind", sorted(SAMPLES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_scalar_code_computes(kind: type) -> None:
    sample = SAMPLES[kind]
    kernel = sample.kernel(REDUNDANT_INDEX)
    jit = cpu.compile_module(kernel_module([kernel]), target=HOST)
    x, y = inputs(), np.zeros(kernel.params[1].shape, kernel.params[1].dtype.np)
    jit.kernel(kernel.name, 2)(x.ctypes.data, y.ctypes.data)
    np.testing.assert_allclose(y, sample.expected(x), rtol=1e-6)
