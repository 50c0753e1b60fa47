"""The model zoo (bench/zoo.py) through both doors, compiled to machine code, against eager.

Every architecture of the zoo runs at its tiny size here (a few narrow layers, small
inputs: the same code paths in the model as its usual size) through
`ember.compile(strict=True)`, so every ATen op has a converter and nothing falls back to
eager, and through `torch.compile(backend="ember")` with fallback off. Both must match
eager within `zoo.matches`: rtol and atol 1e-4, the atol shrunk for outputs under 1.

The usual sizes run with `-m slow` (~15 minutes) and are timed by `make zoo`
(bench/zoo.py), which writes the tables in docs/benchmarks.md.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never download

import pytest  # noqa: E402
import torch  # noqa: E402

import ember  # noqa: E402

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[3]


def _load_zoo():
    spec = importlib.util.spec_from_file_location("zoo", ROOT / "bench" / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("zoo", module)
    spec.loader.exec_module(module)
    return module


zoo = _load_zoo()
COMPILED = ember.Config(executor="cpu", disk_cache=False)


def _assert_matches(name: str, door: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape, f"{name} through {door}: shape {got.shape}"
    assert zoo.matches(name, got, expected), (
        f"{name} through {door}: max error {float((got - expected).abs().max()):.3g}"
        f" for outputs up to {float(expected.abs().max()):.3g}")


@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_tiny_model_matches_eager_through_both_doors(name):
    model, inputs = zoo.build(name, tiny=True)
    with torch.no_grad():
        expected = model(*inputs)
        compiled = ember.compile(model, inputs, config=COMPILED, strict=True)
        _assert_matches(name, "ember.compile", compiled(*inputs), expected)
        torch._dynamo.reset()
        dynamo = torch.compile(model, backend="ember",
                               options={"executor": "cpu", "disk_cache": False,
                                        "strict": True})
        _assert_matches(name, "torch.compile", dynamo(*inputs), expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_model_at_its_usual_size_matches_eager(name):
    model, inputs = zoo.build(name)
    with torch.no_grad():
        expected = model(*inputs)
        compiled = ember.compile(model, inputs, config=COMPILED, strict=True)
        _assert_matches(name, "ember.compile", compiled(*inputs), expected)
