"""Compiles and runs at once, and what is left behind: threads and processes compiling the
same and different models through shared caches get correct results and leave whole
entries; a process killed in the middle of a cache write leaves the cache usable; and
compile-and-drop cycles do not grow the process's memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from ember import Builder, Config, DType, interpret
from ember.driver import pipeline
from ember.driver.keys import cache_key
from ember.runtime.cache import DiskCache

REPO = Path(__file__).resolve().parents[2]


def mlp(seed: int, width: int = 64):
    """A two-layer MLP with softmax whose weights come from `seed` (another seed: another
    graph and cache key)."""
    rng = np.random.default_rng(seed)
    b = Builder(f"mlp{seed}")
    x = b.input("x", DType.f32, (4, width))
    w1 = b.constant(rng.standard_normal((width, width)).astype(np.float32), name="w1")
    w2 = b.constant(rng.standard_normal((width, 8)).astype(np.float32), name="w2")
    b.output(b.softmax(b.matmul(b.tanh(b.matmul(x, w1)), w2), axis=-1))
    return b.build()


X = np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64)


def test_threads_compile_and_run_the_same_and_different_models(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    pipeline.clear_memory_cache()
    graphs = [mlp(1001), mlp(1002)]
    want = [interpret(g, [X])[0] for g in graphs]
    config = Config(executor="cpu")
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for round_ in range(6):
                which = (index + round_) % 2
                run = pipeline.compile_graph(graphs[which], config)
                np.testing.assert_allclose(run(X)[0], want[which], rtol=1e-5, atol=1e-6)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    disk = DiskCache(tmp_path)
    resolved = pipeline.resolve(config)
    for g in graphs:  # each entry whole, loading to the same results
        key = cache_key(g, pipeline.signature(g), resolved)
        assert disk.load(key) is not None


CHILD = """
import json, os, sys, time
import numpy as np
import pytest
from ember import Config
from ember.driver import pipeline
from ember.runtime import cache
from tests.runtime.test_concurrency import X, mlp

if os.environ.get("SLOW_WRITE"):  # a slow disk: a window to be killed in, mid-entry
    real = cache._write_file
    def slow(path, data):
        real(path, data)
        print("writing", flush=True)
        time.sleep(60)
    cache._write_file = slow
run = pipeline.compile_graph(mlp(int(os.environ["SEED"])), Config(executor="cpu"))
print(json.dumps({"builds": pipeline.stats.builds, "disk_hits": pipeline.stats.disk_hits,
                  "y": run(X)[0].tolist()}))
"""


def _child(cache: Path, seed: int, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "EMBER_CACHE_DIR": str(cache),
                                 "PYTHONPATH": str(REPO), "SEED": str(seed), **env})


def _result(child: subprocess.Popen) -> dict:
    out, err = child.communicate(timeout=180)
    assert child.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_compiling_one_model_at_once_agree(tmp_path) -> None:
    first, second = _child(tmp_path, 7), _child(tmp_path, 7)
    results = [_result(first), _result(second)]
    assert sum(r["builds"] for r in results) <= 2  # the work done at most twice
    assert results[0]["y"] == results[1]["y"]
    np.testing.assert_allclose(results[0]["y"], interpret(mlp(7), [X])[0], rtol=1e-5,
                               atol=1e-6)
    later = _result(_child(tmp_path, 7))  # and the entry they left loads
    assert later["builds"] == 0 and later["disk_hits"] == 1 and later["y"] == results[0]["y"]


def test_a_process_killed_while_writing_the_cache_leaves_it_usable(tmp_path) -> None:
    writer = _child(tmp_path, 11, SLOW_WRITE="1")
    # One file of the entry written (in the background: the result may come first, and
    # the two threads' lines may interleave).
    assert any("writing" in writer.stdout.readline() for _ in range(3))
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    leftovers = [p for p in tmp_path.rglob("*") if p.is_dir() and p.name.startswith(".tmp")]
    assert leftovers  # the killed writer's temp folder: never taken for an entry
    after = _result(_child(tmp_path, 11))
    assert after["builds"] == 1 and after["disk_hits"] == 0
    np.testing.assert_allclose(after["y"], interpret(mlp(11), [X])[0], rtol=1e-5, atol=1e-6)
    again = _result(_child(tmp_path, 11))
    assert again["builds"] == 0 and again["disk_hits"] == 1 and again["y"] == after["y"]


LEAK_CHILD = """
import gc, json
import numpy as np
import pytest
from ember import Config
from ember.driver import pipeline
from tests.runtime.test_concurrency import mlp

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

graph, config = mlp(77, width=512), Config(executor="cpu")
sizes = []
for cycle in range(40):
    pipeline.clear_memory_cache()  # each cycle loads the code and weights again
    run = pipeline.compile_graph(graph, config)
    run(np.ones((4, 512), np.float32))
    del run
    gc.collect()
    sizes.append(resident())
print(json.dumps({"sizes": sizes, "builds": pipeline.stats.builds,
                  "disk_hits": pipeline.stats.disk_hits}))
"""


def test_load_and_drop_cycles_do_not_grow_memory(tmp_path) -> None:
    """40 cycles of loading a compiled model (its machine code, 1 MiB of weights, its
    arena) and dropping it: after the first 10, resident memory grows by less than one
    cycle's weights."""
    done = subprocess.run([sys.executable, "-c", LEAK_CHILD], cwd=REPO, text=True,
                          capture_output=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "EMBER_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["builds"] == 1 and result["disk_hits"] == 39
    sizes = result["sizes"]
    growth = sizes[-1] - sizes[9]
    assert growth < 1 << 20, f"resident memory grew {growth >> 10} KiB over 30 loads: {sizes}"


COMPILE_CHILD = """
import ctypes, gc, json
import numpy as np
from ember import Config
from ember.driver import pipeline
from ember.loops import analysis
from tests.runtime.test_concurrency import mlp

trim = ctypes.CDLL("libc.so.6").malloc_trim

def resident():
    gc.collect()
    trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

config = Config(executor="cpu", disk_cache=False)
sizes = []
for cycle in range(50):
    pipeline.clear_memory_cache()
    analysis._PLANS.clear()  # (a bounded cache of vector plans: 4096 loops)
    run = pipeline.compile_graph(mlp(cycle, width=64), config)  # a cold compile each time
    run(np.ones((4, 64), np.float32))
    del run
    sizes.append(resident())
print(json.dumps({"sizes": sizes, "builds": pipeline.stats.builds}))
"""


def test_compile_and_drop_cycles_do_not_grow_memory() -> None:
    """50 cold compiles of a model, each dropped: after the first 10, resident memory grows
    by less than 20 KiB a compile. The modules past the first (here) are optimized in
    helper processes (ember/codegen/helpers.py): in this process llvmlite's O3 pipeline
    keeps about 114 KiB a compile of this model."""
    done = subprocess.run([sys.executable, "-c", COMPILE_CHILD], cwd=REPO, text=True,
                          capture_output=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "EMBER_LLVM_IN_PROCESS": "1"})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["builds"] == 50
    sizes = result["sizes"]
    growth = (sizes[-1] - sizes[9]) / 40
    assert growth < 20 << 10, f"resident memory grew {growth / 1024:.0f} KiB a compile: {sizes}"


def test_work_that_needs_more_memory_than_the_machine_has_is_refused_before_allocating(
        ) -> None:
    import ember
    from ember.graph.symbolic import symbol

    b = Builder("huge")
    rows = b.input("rows", DType.f32, (1 << 18, 1))
    cols = b.input("cols", DType.f32, (1, 1 << 18))
    b.output(b.add(rows, cols))  # 256 GiB of output
    with pytest.raises(ember.ResourceError, match="more than this machine"):
        pipeline.lower_to_program(b.build(), Config(executor="cpu", disk_cache=False))
    sized = Builder("sized")  # sizes known at call time: refused at the call that binds them
    n = symbol("n")
    rows = sized.input("rows", DType.f32, (n, 1))
    cols = sized.input("cols", DType.f32, (1, n))
    sized.output(sized.add(rows, cols))
    run = pipeline.compile_graph(sized.build(), Config(executor="cpu", disk_cache=False))
    small = np.ones((3, 1), np.float32)
    np.testing.assert_array_equal(run(small, small.T)[0], np.full((3, 3), 2, np.float32))
    column = np.lib.stride_tricks.as_strided(np.ones(1, np.float32), (1 << 18, 1), (0, 0))
    with pytest.raises(ember.ResourceError, match="more than this machine"):
        run(column, column.T)
