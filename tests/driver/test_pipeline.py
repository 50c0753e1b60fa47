"""The compiled pipeline: stage dumps, the caches, and agreement with the interpreter."""

from __future__ import annotations

import re

import numpy as np

from ember import Builder, Config, DType, interpret
from ember.driver import pipeline


def small_graph(scale: float = 2.0):
    b = Builder("small")
    x = b.input("x", DType.f32, (4, 8))
    w = b.constant(np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3), name="w")
    b.output(b.softmax(b.mul(b.matmul(x, w), scale)))
    return b.build()


def test_dump_writes_every_stage(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("EMBER_DUMP", str(tmp_path))
    graph = small_graph(3.0)
    exe = pipeline.compile_graph(graph, Config(executor="cpu", disk_cache=False))
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(exe(x)[0], interpret(graph, [x])[0], rtol=1e-6, atol=1e-7)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"00-input.ir", "01-fuse_attention.ir", "02-decompose.ir", "loops.ir", "llvm.ll",
            "asm.s"} <= names
    assert "kernel @k0_matmul" in (tmp_path / "loops.ir").read_text()
    assert re.search(r"define .*i32 @small_entry", (tmp_path / "llvm.ll").read_text())


def test_memory_cache_skips_every_stage() -> None:
    graph = small_graph(5.0)
    config = Config(executor="cpu", disk_cache=False)
    builds = pipeline.stats.builds
    first = pipeline.compile_graph(graph, config)
    second = pipeline.compile_graph(graph, config)
    assert pipeline.stats.builds == builds + 1 and first is second


def test_compiled_code_is_the_default(monkeypatch) -> None:
    monkeypatch.delenv("EMBER_BACKEND", raising=False)
    assert Config().executor == "cpu"
    monkeypatch.setenv("EMBER_BACKEND", "interp")
    assert Config().executor == "interp"
