"""The tuner: a tuned compile searches matmul schedules in a worker process, keeps the
winner in the database, and later tuned compiles reuse it; a crashing candidate does not
take the caller down."""

from __future__ import annotations

import ctypes
import json

import numpy as np

import ember
from ember.loops.tune import TuningDatabase
from ember.loops.tune.gemm import run_isolated


def _crash() -> None:
    ctypes.string_at(0)  # a segfault in the worker


def _answer(x: int) -> int:
    return x + 1


def test_a_crash_in_the_worker_is_a_result() -> None:
    assert run_isolated(_answer, 41) == (42, None)
    result, why = run_isolated(_crash)
    assert result is None and "crashed" in why


def matmul_graph():
    b = ember.Builder("tuned")
    x, w = b.input("x", "f32", (48, 96)), b.input("w", "f32", (96, 40))
    b.output(b.relu(b.matmul(x, w)))
    return b.build()


def test_tuned_compile_stores_and_reuses_the_winner(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    config = ember.Config(executor="cpu", disk_cache=False, tune=True, tune_budget=0.5)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 96)).astype(np.float32)
    w = rng.standard_normal((96, 40)).astype(np.float32)
    run = ember.compile(matmul_graph(), config=config)
    np.testing.assert_allclose(run(x, w)[0], np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)
    entries = json.loads((tmp_path / "tuning.json").read_text())
    (key, record), = entries.items()
    assert key.startswith("gemm/-/48x40x96/f32/") and record["tried"] >= 1
    assert record["seconds"] > 0 and {"mr", "nr", "kc"} <= set(record["schedule"])
    assert "tuning matmul 48x40x96" in capsys.readouterr().err
    # A second tuned compile (another graph, same matmul) measures nothing new.
    b = ember.Builder("again")
    x2, w2 = b.input("x", "f32", (48, 96)), b.input("w", "f32", (96, 40))
    b.output(b.tanh(b.matmul(x2, w2)))
    ember.compile(b.build(), config=config)(x, w)
    assert TuningDatabase(tmp_path / "tuning.json").entries == entries
    assert "tuning" not in capsys.readouterr().err


def test_a_packed_matrix_is_tuned_as_packed(monkeypatch, tmp_path) -> None:
    """A matmul by a constant matrix (packed by pack_matmuls) has a key of its own, and its
    candidates are measured on packed panels: the kernel it runs."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    config = ember.Config(executor="cpu", disk_cache=False, tune=True, tune_budget=0.5)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((48, 256)).astype(np.float32)
    w = rng.standard_normal((256, 300)).astype(np.float32)
    b = ember.Builder("tuned_packed")
    b.output(b.matmul(b.input("x", "f32", x.shape), b.constant(w)))
    run = ember.compile(b.build(), config=config)
    np.testing.assert_allclose(run(x)[0], x @ w, rtol=1e-4, atol=1e-3)
    entries = json.loads((tmp_path / "tuning.json").read_text())
    (key, record), = entries.items()
    assert key.startswith("gemm/-/48x300x256/f32/p") and record["seconds"] > 0
