"""The output pool: large outputs reuse the memory of arrays the caller dropped, never the
memory of one still alive (or of a view or tensor made from it)."""

from __future__ import annotations

import gc

import numpy as np

import ember
from ember.runtime.pool import OutputPool


def test_a_dropped_array_is_reused() -> None:
    pool = OutputPool(min_bytes=1024)
    a = pool.array((64, 64), np.float32)
    address = a.ctypes.data
    del a
    gc.collect()
    b = pool.array((64, 64), np.float32)
    assert b.ctypes.data == address and pool.reused == 1
    assert b.flags.c_contiguous and b.flags.writeable and address % 64 == 0


def test_memory_a_view_holds_is_not_reused() -> None:
    pool = OutputPool(min_bytes=1024)
    a = pool.array((64, 64), np.float32)
    a[:] = 7
    view = a[3:]
    del a
    gc.collect()
    b = pool.array((64, 64), np.float32)
    b[:] = 0
    assert (view == 7).all() and pool.reused == 0


def test_small_arrays_are_not_pooled() -> None:
    pool = OutputPool(min_bytes=1 << 20)
    a = pool.array((4,), np.float32)
    assert a.base is None or isinstance(a.base, np.ndarray)
    assert not pool.free


def test_compiled_calls_reuse_dropped_outputs() -> None:
    torch = __import__("pytest").importorskip("torch")
    b = ember.Builder("g")
    x = b.input("x", "f32", (512, 1024))
    b.output(b.mul(x, b.constant(np.float32(2))))
    run = ember.compile(b.build(), config=ember.Config(executor="cpu", disk_cache=False))
    x = np.ones((512, 1024), np.float32)
    first = run(x)[0]
    kept = torch.from_numpy(first)  # a tensor keeps the memory alive
    del first
    gc.collect()
    second = run(x)[0]
    assert kept.data_ptr() != second.ctypes.data
    assert (kept.numpy() == 2).all() and (second == 2).all()
    address = second.ctypes.data
    del second
    gc.collect()
    assert run(x)[0].ctypes.data == address
