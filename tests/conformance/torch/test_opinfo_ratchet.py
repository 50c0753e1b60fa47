"""The PyTorch OpInfo ratchets: every OpInfo listed in opinfo_ratchet.txt (interpreted) and
opinfo_ratchet_cpu.txt (compiled through LLVM) must keep passing.

The lists only grow (`python -m ember.conformance.torch_opinfo [--executor cpu]
--update-ratchet`). An entry
passes when its float32 CPU samples, compiled by `torch.compile(backend="ember",
fullgraph=True, dynamic=False, options={"strict": True})`, match eager PyTorch
(ember/conformance/torch_opinfo.py).

CI runs a fixed, representative part: the CORE ops below that are listed, and every
entry whose name hashes (CRC-32) into one bucket of CI_BUCKETS (a choice that never changes
for a name as the list grows), each on its first CI_MAX_SAMPLES samples. The slow test
(`make test-full`) runs every entry on all its samples.
"""

from __future__ import annotations

import zlib

import pytest

from ember.conformance import torch_opinfo

ENTRIES = torch_opinfo.read_ratchet()
COMPILED = torch_opinfo.read_ratchet(torch_opinfo.RATCHET_CPU)
CI_BUCKETS = 4  # one entry in four, by the CRC-32 of its name
CI_MAX_SAMPLES = 3
# Ops every model uses; in the CI part whenever they are in the ratchet.
CORE = {
    "add", "sub", "mul", "div.no_rounding_mode", "matmul", "addmm", "bmm", "mm",
    "nn.functional.linear", "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "tanh", "sigmoid", "exp", "sqrt", "rsqrt", "softmax", "log_softmax", "sum", "mean",
    "amax", "where", "reshape", "view", "permute", "transpose", "unsqueeze", "squeeze", "cat",
    "expand", "clone", "contiguous", "nn.functional.embedding", "nn.functional.layer_norm",
    "nn.functional.batch_norm", "nn.functional.conv2d", "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d", "nn.functional.scaled_dot_product_attention", "mT",
}


def in_ci_part(name: str) -> bool:
    return name in CORE or zlib.crc32(name.encode()) % CI_BUCKETS == 0


def _check(name: str, max_samples: int | None, executor: str = "interp") -> None:
    if name not in torch_opinfo.float32_ops():
        pytest.fail(f"{name} is no OpInfo with float32 CPU samples in this torch", pytrace=False)
    options = torch_opinfo.BACKEND_OPTIONS
    saved, options["executor"] = options["executor"], executor
    try:
        result = torch_opinfo.run_op(name, max_samples)
    finally:
        options["executor"] = saved
    assert result.status == "pass", f"{name} ({executor}): {result.status}: {result.detail}"


@pytest.mark.parametrize("name", [n for n in ENTRIES if in_ci_part(n)])
def test_listed_opinfo_still_passes(name: str) -> None:
    _check(name, CI_MAX_SAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("name", ENTRIES)
def test_listed_opinfo_still_passes_all_samples(name: str) -> None:
    _check(name, None)


@pytest.mark.parametrize("name", [n for n in COMPILED if in_ci_part(n)])
def test_listed_opinfo_still_passes_compiled(name: str) -> None:
    _check(name, CI_MAX_SAMPLES, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPILED)
def test_listed_opinfo_still_passes_compiled_all_samples(name: str) -> None:
    _check(name, None, "cpu")


def test_ratchet_is_not_empty() -> None:
    assert ENTRIES, "opinfo_ratchet.txt lists no OpInfo"
    assert COMPILED, "opinfo_ratchet_cpu.txt lists no OpInfo"


def test_ci_part_is_not_empty() -> None:
    assert any(in_ci_part(n) for n in ENTRIES), "no ratchet entry runs in CI"
