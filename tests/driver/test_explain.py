"""ember.explain: a compiled model's kernels, the graph ops each holds, the bytes it moves."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.driver import pipeline


def graph():
    b = ember.Builder("explained")
    x, w = b.input("x", "f32", (16, 32)), b.input("w", "f32", (32, 8))
    h = b.relu(b.add(b.matmul(x, w), b.constant(np.float32(1.0))))
    b.output(b.softmax(h, axis=-1))
    return b.build()


def test_explain_lists_each_kernel_with_its_ops_and_bytes() -> None:
    compiled = ember.compile(graph(), config=ember.Config(executor="cpu", disk_cache=False))
    compiled(np.ones((16, 32), np.float32), np.ones((32, 8), np.float32))
    report = ember.explain(compiled, measure=False)
    assert [k.ops for k in report.kernels] == [
        ["matmul", "add", "max"],
        ["reduce_max", "sub", "exp", "reduce_sum", "div"]]
    # matmul kernel: x, w and its output; softmax kernel: its input and output.
    assert [k.bytes for k in report.kernels] == [(16 * 32 + 32 * 8 + 16 * 8) * 4,
                                                 2 * 16 * 8 * 4]
    text = str(report)
    assert "matmul + add + max" in text and "2 kernels (2 fused) for 8 graph ops" in text


def test_explain_works_from_the_disk_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    config = ember.Config(executor="cpu")
    first = ember.explain(ember.compile(graph(), config=config).run, measure=False)
    monkeypatch.setattr(pipeline._MEMORY, "entries", type(pipeline._MEMORY.entries)())
    builds = pipeline.stats.builds
    again = ember.explain(ember.compile(graph(), config=config).run, measure=False)
    assert pipeline.stats.builds == builds  # loaded, not built
    assert again.kernels == first.kernels


def test_explain_needs_compiled_code() -> None:
    interpreted = ember.compile(graph(), config=ember.Config(executor="interp"))
    with pytest.raises(ember.EmberError, match="nothing compiled to explain"):
        ember.explain(interpreted)


def test_explain_measures_each_kernel_against_the_roofline() -> None:
    compiled = ember.compile(graph(), config=ember.Config(executor="cpu", disk_cache=False))
    report = ember.explain(compiled, budget_seconds=0.01)
    times = [k.seconds for k in report.kernels]
    assert all(t > 0 for t in times) and times == sorted(times, reverse=True)
    matmul = next(k for k in report.kernels if "matmul" in k.ops)
    # 16x8 outputs, each 32 multiply-adds, plus the bias add and relu's max: 2 flops each;
    # the blocked schedule computes padded tiles (rows up to a multiple of its tile) too.
    assert 16 * 8 * (2 * 32 + 2) <= matmul.flops <= 1.25 * 16 * 8 * (2 * 32 + 2)
    assert 0 < matmul.roofline <= 1.5 and report.total_seconds > 0
    assert "vectorized" in matmul.schedule and "unrolled" in matmul.schedule  # the gemm tile
    text = str(report)
    assert "roofline" in text and "GFLOP/s" in text and "roofs:" in text
