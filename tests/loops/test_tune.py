"""The tuner: a tuned compile searches matmul schedules, other scheduling steps'
parameters and lowerings' knobs through an executor (a worker process here, workers on a
Ray cluster: tests/loops/test_tune_ray.py), keeps the winner in the database, and later
tuned compiles reuse it; a crashing or hanging candidate does not take the caller down."""

from __future__ import annotations

import concurrent.futures
import ctypes
import json
import multiprocessing
import re
import socket
import threading
import time

import numpy as np
import pytest

import ember
from ember.driver.pipeline import lower_to_program
from ember.loops.text import parse_kernel, print_kernel
from ember.loops.tune import Tuning, TuningDatabase, knobs
from ember.loops.tune.executor import Executor, LocalExecutor, run_all
from ember.target import Target

HOST = Target.host()


def _crash() -> None:
    ctypes.string_at(0)  # a segfault in the worker


def _answer(x: int) -> int:
    return x + 1


def _hang() -> None:
    time.sleep(600)


def _run(executor: Executor, jobs: list, budget: float = 60.0, timeout: float = 60.0):
    heard: dict[int, tuple] = {}
    results = run_all(executor, len(jobs), jobs.__getitem__, budget,
                      lambda i, result, why: heard.__setitem__(i, (result, why)), timeout)
    return results, heard


def test_a_crash_or_a_hang_in_the_worker_is_a_result() -> None:
    """A crashed or hung worker is replaced; the jobs after it run on the new one."""
    executor = LocalExecutor()
    try:
        results, heard = _run(executor, [(_answer, (41,)), (_crash, ()), (_answer, (1,))])
        assert [(i, r) for i, r, _ in results] == [(0, 42), (2, 2)]
        assert heard[1][0] is None and "crashed" in heard[1][1]
        results, heard = _run(executor, [(_hang, ()), (_answer, (2,))], timeout=3.0)
        assert heard[0] == (None, "timed out after 3 s") and heard[1] == (3, None)
    finally:
        executor.close()


def test_a_job_that_raises_is_a_result_and_the_budget_stops_new_jobs() -> None:
    executor = LocalExecutor()
    try:
        _, heard = _run(executor, [(int, ("x",)), (_answer, (0,))])
        assert heard[0][0] is None and heard[0][1].startswith("ValueError: invalid literal")
        assert heard[1] == (1, None)
        # A spent budget still runs the first job, and no other.
        results, heard = _run(executor, [(_answer, (i,)) for i in range(5)], budget=0.0)
        assert [(i, r) for i, r, _ in results] == [(0, 1)] and list(heard) == [0]
    finally:
        executor.close()


class _Machines(Executor):
    """Three machines, simulated by threads: each runs one job at a time."""

    slots = 3

    def __init__(self) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(3)
        self.busy: set[int] = set()
        self.most = 0
        self.lock = threading.Lock()

    def start(self, slot, fn, args):
        def job():
            with self.lock:
                assert slot not in self.busy  # one measurement per machine at a time
                self.busy.add(slot)
                self.most = max(self.most, len(self.busy))
            try:
                return fn(*args)
            finally:
                with self.lock:
                    self.busy.discard(slot)
        return self.pool.submit(job)

    def replace(self, slot) -> None:
        pass

    def crashed(self, error) -> bool:
        return False

    def machine(self, slot) -> str:
        return f"m{slot}"

    def close(self) -> None:
        self.pool.shutdown()


def test_jobs_spread_over_an_executors_machines_one_at_a_time_each() -> None:
    machines = _Machines()
    jobs = [(lambda i=i: (time.sleep(0.05), i)[1], ()) for i in range(9)]
    results, heard = _run(machines, jobs)
    machines.close()
    assert sorted(r for _, r, _ in results) == list(range(9)) and len(heard) == 9
    assert machines.most == 3 and {m for _, _, m in results} == {"m0", "m1", "m2"}


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
    assert record["measured_on"] == [socket.gethostname()]
    assert record["default_seconds"] >= record["seconds"]
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
    # The scores (the 40 keys, to a whole vector) and sums of 2 rows.
    assert scores_and_sums_rows(print_kernel(program.kernels[0])) == {2}
    untuned, _ = lower_to_program(graph, ember.Config(executor="cpu", disk_cache=False))
    assert scores_and_sums_rows(print_kernel(untuned.kernels[0])) != {2}


def scores_and_sums_rows(kernel_text: str) -> set[int]:
    """The rows of the attention kernel's locals of scores (40 keys or more across) and of
    output sums (16 across)."""
    shapes = re.findall(r"local %\w+: f32\[(\d+),(\d+)\]", kernel_text)
    return {int(r) for r, c in shapes if int(c) >= 40 or int(c) == 16}


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
    monkeypatch.setattr(knobs, "search", lambda *args: (measured, ["here"]))
    db = TuningDatabase(tmp_path / "tuning.json")
    kernel = parse_kernel("kernel @k(%y: f32[4]) {\n}")
    texts = [f"kernel @k(%y: f32[{a}]) {{\n}}" for a in (1, 2, 3)]  # each its own code
    tuning = Tuning(HOST, db, measure=lambda text, outputs: 0.0, search=True,
                    budget_seconds=1.0, machine_in_keys=False)
    chosen, seconds, defaults, tried, machines = knobs.search_texts("k/x/cpu", kernel, texts,
                                                                    1, tuning)
    assert chosen == winner and tried == len(measured) and machines == ["here"]
    assert defaults == (1.0 if measured[0][0] == 0 else pytest.approx(float("nan"), nan_ok=True))


# -- the database --------------------------------------------------------------------------

def test_merging_databases_keeps_the_faster_record(tmp_path) -> None:
    ours = TuningDatabase(tmp_path / "ours.json")
    ours.put("a", {"schedule": {"x": 1}, "seconds": 2.0})
    ours.put("b", {"schedule": {"x": 1}, "seconds": 1.0})
    ours.put("c", {"schedule": {"x": 1}, "seconds": float("nan")})  # nothing built
    theirs = TuningDatabase(tmp_path / "theirs.json")
    for key, seconds in (("a", 1.0), ("b", 3.0), ("c", 5.0), ("d", 4.0)):
        theirs.put(key, {"schedule": {"x": 2}, "seconds": seconds})
    assert ours.merge(tmp_path / "theirs.json") == 3
    merged = TuningDatabase(tmp_path / "ours.json").entries
    assert {k: r["schedule"]["x"] for k, r in merged.items()} == {"a": 2, "b": 1, "c": 2, "d": 2}
    with pytest.raises(ember.EmberError, match="no tuning database"):
        ours.merge(tmp_path / "missing.json")


def _write_records(path: str, prefix: str, count: int) -> None:
    db = TuningDatabase(path)
    for i in range(count):
        db.put(f"{prefix}{i}", {"schedule": {}, "seconds": 1.0})


def test_processes_tuning_into_one_database_lose_nothing(tmp_path) -> None:
    """Each write reads what the others wrote, under a lock: no process's records vanish."""
    path = str(tmp_path / "shared.json")
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write_records, args=(path, prefix, 40))
               for prefix in "pq"]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
    assert sorted(TuningDatabase(path).entries) == sorted(
        f"{p}{i}" for p in "pq" for i in range(40))
