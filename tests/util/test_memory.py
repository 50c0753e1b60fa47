"""A compile allocates without NumPy's huge-page advice and with the cyclic collector off,
and the settings it found come back after (ember/util/memory.py)."""

import gc
import threading

import numpy as np
import pytest

from ember.util import memory

pytestmark = pytest.mark.skipif(memory._set_madvise_hugepage is None,
                                reason="this NumPy has no huge-page switch")

try:
    from numpy._core.multiarray import _get_madvise_hugepage
except ImportError:
    from numpy.core.multiarray import _get_madvise_hugepage


@pytest.fixture(params=[True, False], ids=["as-found", "user-set"])
def setting(request):
    """NumPy's advice on (its default) with the collector on, or both off by the user."""
    before = memory._set_madvise_hugepage(request.param)
    collecting = gc.isenabled()
    (gc.enable if request.param else gc.disable)()
    yield request.param
    memory._set_madvise_hugepage(before)
    (gc.enable if collecting else gc.disable)()


def _off() -> bool:
    return not _get_madvise_hugepage() and not gc.isenabled()


def _restored(setting: bool) -> bool:
    return _get_madvise_hugepage() == setting and gc.isenabled() == setting


def test_scope_turns_advice_and_collector_off_and_restores_them(setting):
    with memory.compiling():
        assert _off()
        np.ones(2 << 20, np.float32)  # (an allocation the advice would cover)
        with memory.compiling():
            assert _off()
        assert _off()  # the inner scope's end is not the outer's
    assert _restored(setting)


def test_overlapping_scopes_of_threads_restore_once_both_end(setting):
    inside, leave = threading.Event(), threading.Event()

    def other():
        with memory.compiling():
            inside.set()
            leave.wait()

    thread = threading.Thread(target=other)
    with memory.compiling():
        thread.start()
        inside.wait()
    assert _off()  # the other thread's compile still runs
    leave.set()
    thread.join()
    assert _restored(setting)


def test_scope_restores_after_an_error(setting):
    with pytest.raises(ValueError), memory.compiling():
        raise ValueError("a compile that fails")
    assert _restored(setting)


def _spy(monkeypatch, module, name, seen):
    inner = getattr(module, name)

    def spying(*args, **kwargs):
        seen.append((name, not _off()))
        return inner(*args, **kwargs)

    monkeypatch.setattr(module, name, spying)


def test_every_door_imports_and_builds_inside_the_scope(setting, monkeypatch):
    """A weight's copy (torch import, ONNX import) and the stages that pack and fold
    weights (the build) all run inside the scope."""
    torch = pytest.importorskip("torch")
    import onnx
    from onnx import helper

    import ember
    from ember.driver import pipeline
    from ember.frontends.onnx import importer
    from ember.frontends.torch import fx_importer

    seen = []
    _spy(monkeypatch, pipeline, "lower_to_program", seen)
    _spy(monkeypatch, fx_importer, "to_numpy", seen)
    _spy(monkeypatch, importer, "tensor_to_array", seen)
    config = ember.Config(executor="cpu", disk_cache=False)
    ember.compile(torch.nn.Linear(4, 3), (torch.ones(2, 4),), config=config)
    weight = onnx.numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "scoped",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])], [weight])
    ember.compile(helper.make_model(graph), config=config).run([np.ones((2, 4), np.float32)])
    assert {name for name, _ in seen} == {"lower_to_program", "to_numpy", "tensor_to_array"}
    assert not any(as_outside for _, as_outside in seen), seen
    assert _restored(setting)


def test_a_warm_compile_loads_inside_the_scope(setting, monkeypatch, tmp_path):
    """The warm path reads a cache entry (JSON of every kernel) inside the scope too."""
    torch = pytest.importorskip("torch")
    import ember
    from ember.driver import pipeline
    from ember.runtime.cache import wait_for_writes

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    model, x = torch.nn.Linear(4, 3), torch.ones(2, 4)
    ember.compile(model, (x,), config=ember.Config(executor="cpu"))
    wait_for_writes()
    pipeline.clear_memory_cache()
    seen, hits = [], pipeline.stats.disk_hits
    _spy(monkeypatch, pipeline, "get_cached", seen)
    warm = ember.compile(model, (x,), config=ember.Config(executor="cpu"))
    assert pipeline.stats.disk_hits == hits + 1  # loaded, not built
    assert seen == [("get_cached", False)]
    torch.testing.assert_close(warm(x), model(x))
    assert _restored(setting)
