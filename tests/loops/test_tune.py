"""The tuner: a tuned compile searches matmul schedules, other scheduling steps'
parameters and lowerings' knobs, in a worker process, keeps the winner in the database, and
later tuned compiles reuse it; a crashing candidate does not take the caller down."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

import ember
from ember.driver.pipeline import lower_to_program
from ember.loops.text import parse_kernel, print_kernel
from ember.loops.tune import Tuning, TuningDatabase, knobs
from ember.loops.tune.worker import run_isolated
from ember.target import Target

HOST = Target.host()


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


# -- knobs: the parameters of other lowerings ------------------------------------------------

def attention_graph(name: str = "att"):
    b = ember.Builder(name)
    ins = [b.input("q", "f32", (2, 24, 16)), b.input("kt", "f32", (2, 16, 40)),
           b.input("v", "f32", (2, 40, 16))]
    b.output(b.op("attention", ins, {"empty_rows_zero": False}).result)
    return b.build()


def test_value_sets_start_with_the_defaults_and_sample_the_choices() -> None:
    asked = {"k": ({"a": 1, "b": 2}, {"a": (1, 3, 5), "b": (2, 4)})}
    sets = knobs.value_sets(asked)
    assert sets[0] == {"k": {"a": 1, "b": 2}} and len(sets) == 6
    assert sorted((s["k"]["a"], s["k"]["b"]) for s in sets) == [
        (a, b) for a in (1, 3, 5) for b in (2, 4)]
    big = {"k": ({"a": 0}, {"a": tuple(range(100))})}
    assert len(knobs.value_sets(big)) == knobs.MAX_CANDIDATES


def test_tuned_compile_searches_the_attention_steps_parameters_and_reuses_them(
        monkeypatch, tmp_path, capsys) -> None:
    """The attention step's parameters are searched once; the winner is stored under a key
    of the plain nest's loop IR (not its name or place: another graph with the same
    attention measures nothing), and scheduling with the database uses the stored values."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    config = ember.Config(executor="cpu", disk_cache=False, tune=True, tune_budget=1.0)
    graph = attention_graph()
    arrays = [np.random.default_rng(2).standard_normal(v.shape).astype(np.float32)
              for v in graph.inputs]
    np.testing.assert_allclose(ember.compile(graph, config=config)(*arrays)[0],
                               ember.interpret(graph, arrays)[0], rtol=1e-5, atol=1e-5)
    assert "tuning attention -> f32[2,24,16]" in capsys.readouterr().err
    entries = json.loads((tmp_path / "tuning.json").read_text())
    (key, record), = entries.items()
    assert key.startswith("attention/") and record["tried"] >= 1 and record["seconds"] > 0
    assert set(record["schedule"]) == {"key_block", "row_group", "tile_vectors"}
    ember.compile(attention_graph("another"), config=config)
    assert "tuning" not in capsys.readouterr().err
    # A stored winner (here: groups of 2 query rows) is what a tuned compile uses.
    record["schedule"].update(row_group=2, key_block=64)
    (tmp_path / "tuning.json").write_text(json.dumps({key: record}))
    program, _ = lower_to_program(graph, config)
    text = print_kernel(program.kernels[0])
    assert "f32[2,40]" in text and "f32[2,16]" in text  # the scores and sums of 2 rows
    untuned, _ = lower_to_program(graph, ember.Config(executor="cpu", disk_cache=False))
    assert "f32[4,40]" in print_kernel(untuned.kernels[0])


def test_tuned_compile_searches_a_scheduling_steps_parameters(monkeypatch, tmp_path,
                                                              capsys) -> None:
    """A pool's step (scheduled after lowering: ember/loops/schedules/pool.py) is searched
    as attention's: each candidate is the kernel scheduled in full, the winner is stored
    under a key of the plain nest, and an edited record gives that code."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    config = ember.Config(executor="cpu", disk_cache=False, tune=True, tune_budget=1.0)
    b = ember.Builder("pooled")
    b.output(b.max_pool(b.input("x", "f32", (1, 4, 12, 20)), kernel=(3, 3), strides=(1, 1),
                        pads=(1, 1, 1, 1)))
    graph = b.build()
    x = np.random.default_rng(3).standard_normal((1, 4, 12, 20)).astype(np.float32)
    np.testing.assert_array_equal(ember.compile(graph, config=config)(x)[0],
                                  ember.interpret(graph, [x])[0])
    assert "tuning pool -> f32[1,4,12,20]" in capsys.readouterr().err
    entries = json.loads((tmp_path / "tuning.json").read_text())
    (key, record), = entries.items()
    assert key.startswith("pool/") and record["tried"] >= 1
    assert set(record["schedule"]) == {"lanes", "chains"}
    record["schedule"].update(lanes=8, chains=1)
    (tmp_path / "tuning.json").write_text(json.dumps({key: record}))
    program, _ = lower_to_program(graph, config)
    assert "local %t0: f32[1,8]" in print_kernel(program.kernels[0])


@pytest.mark.parametrize("measured, winner", [
    ([(0, 1.0), (1, 0.99), (2, 1.2)], 0),   # within MIN_GAIN of the defaults: keep them
    ([(0, 1.0), (1, 0.9), (2, 0.8)], 2),    # clearly faster
    ([(1, 0.9)], 1),                         # the defaults failed to build
])
def test_the_defaults_stay_unless_clearly_beaten(monkeypatch, tmp_path, measured,
                                                 winner) -> None:
    monkeypatch.setattr(knobs, "search", lambda *args: measured)
    db = TuningDatabase(tmp_path / "tuning.json")
    kernel = parse_kernel("kernel @k(%y: f32[4]) {\n}")
    texts = [f"kernel @k(%y: f32[{a}]) {{\n}}" for a in (1, 2, 3)]  # each its own code
    tuning = Tuning(HOST, db, measure=lambda text, outputs: 0.0, search=True,
                    budget_seconds=1.0, machine_in_keys=False)
    chosen, seconds, tried = knobs.search_texts("k/x/cpu", kernel, texts, 1, tuning)
    assert chosen == winner and tried == len(measured)
