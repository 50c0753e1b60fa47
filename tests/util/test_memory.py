"""The compile's allocations go without NumPy's huge-page advice, and the setting it found
comes back after (ember/util/memory.py)."""

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


@pytest.fixture(params=[True, False], ids=["advised", "not-advised"])
def setting(request):
    before = memory._set_madvise_hugepage(request.param)
    yield request.param
    memory._set_madvise_hugepage(before)


def test_scope_turns_the_advice_off_and_restores_it(setting):
    with memory.compile_allocations():
        assert not _get_madvise_hugepage()
        np.ones(2 << 20, np.float32)  # (an allocation the advice would cover)
        with memory.compile_allocations():
            assert not _get_madvise_hugepage()
        assert not _get_madvise_hugepage()  # the inner scope's end is not the outer's
    assert _get_madvise_hugepage() == setting


def test_overlapping_scopes_of_threads_restore_once_both_end(setting):
    inside, leave = threading.Event(), threading.Event()

    def other():
        with memory.compile_allocations():
            inside.set()
            leave.wait()

    thread = threading.Thread(target=other)
    with memory.compile_allocations():
        thread.start()
        inside.wait()
    assert not _get_madvise_hugepage()  # the other thread's compile still runs
    leave.set()
    thread.join()
    assert _get_madvise_hugepage() == setting


def test_scope_restores_after_an_error(setting):
    with pytest.raises(ValueError), memory.compile_allocations():
        raise ValueError("a compile that fails")
    assert _get_madvise_hugepage() == setting


def _spy(monkeypatch, module, name, seen):
    inner = getattr(module, name)

    def spying(*args, **kwargs):
        seen.append((name, bool(_get_madvise_hugepage())))
        return inner(*args, **kwargs)

    monkeypatch.setattr(module, name, spying)


def test_every_door_imports_and_builds_inside_the_scope(setting, monkeypatch):
    """A weight's copy (torch import, ONNX import) and the stages that pack and fold
    weights (the build) all run with the advice off."""
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
    assert not any(advised for _, advised in seen), seen
    assert _get_madvise_hugepage() == setting
