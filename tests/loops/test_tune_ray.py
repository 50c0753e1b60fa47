"""The tuner's Ray executor on a local Ray instance (one machine): a tuned compile measures
its candidates on the cluster's workers and stores the winner keyed by target; a crashing
candidate replaces its worker. Skipped where Ray is not installed (the `ember[ray]` extra;
`make test` installs it)."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

import ember
from ember.loops.tune.executor import RayExecutor, run_all
from ember.target import Target

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, object_store_memory=100 << 20, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    yield ray.nodes()[0]["NodeManagerAddress"]
    ray.shutdown()


def _crash() -> None:
    ctypes.string_at(0)


def _double(x: int) -> int:
    return 2 * x


def test_a_tuned_compile_measures_on_the_clusters_machines(cluster, monkeypatch,
                                                           tmp_path) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    config = ember.Config(executor="cpu", disk_cache=False, tune=True, tune_budget=0.5,
                          tune_executor="ray")
    b = ember.Builder("tuned_on_ray")
    b.output(b.matmul(b.input("x", "f32", (32, 64)), b.input("w", "f32", (64, 48))))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    np.testing.assert_allclose(ember.compile(b.build(), config=config)(x, w)[0], x @ w,
                               rtol=1e-4, atol=1e-4)
    (key, record), = json.loads((tmp_path / "tuning.json").read_text()).items()
    assert key.startswith("gemm/-/32x48x64/f32/") and Target.host().key() in key
    assert record["tried"] >= 1 and record["measured_on"] == [cluster]


def test_a_crash_on_a_ray_worker_replaces_it(cluster) -> None:
    executor = RayExecutor(Target.host(), threads=1)
    try:
        assert executor.slots == 1 and executor.machine(0) == cluster
        jobs = [(_double, (1,)), (_crash, ()), (_double, (3,))]
        heard = {}
        results = run_all(executor, len(jobs), jobs.__getitem__, 60.0,
                          lambda i, result, why: heard.__setitem__(i, why))
        assert [(i, r) for i, r, _ in results] == [(0, 2), (2, 6)]
        assert "crashed" in heard[1]
    finally:
        executor.close()


def test_a_cluster_without_the_targets_machines_is_refused(cluster) -> None:
    other = Target.host().with_(l2_bytes=Target.host().l2_bytes * 2)
    with pytest.raises(ember.EmberError, match="no machine of the Ray cluster is a"):
        RayExecutor(other, threads=1)
