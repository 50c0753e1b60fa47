"""The native call of a compiled program (ember.runtime.fastcall): it takes exactly the
arrays the program takes as they are and declines everything else, allocates fresh
outputs, shares the arena's lock, and leaks no reference."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import ember
from ember.errors import ShapeError
from ember.runtime.executable import NATIVE_AFTER_CALLS
from ember.runtime.fastcall import layout_matches, native_call

pytestmark = pytest.mark.skipif(not layout_matches(),
                                reason="this Python lays out objects otherwise")

CPU = ember.Config(executor="cpu", disk_cache=False)


def _program(rows: int = 4, cols: int = 8):
    """y = x * 2 + b (b a constant), z = sum(x, axis=1): two outputs."""
    g = ember.Builder("two_outputs")
    x = g.input("x", "f32", (rows, cols))
    b = g.constant(np.arange(cols, dtype=np.float32))
    g.output(g.add(g.mul(x, g.constant(np.float32(2))), b))
    g.output(g.reduce_sum(x, axes=[1]))
    return ember.compile(g.build(), config=CPU).run, b


def _expected(x: np.ndarray) -> list[np.ndarray]:
    return [x * 2 + np.arange(x.shape[1], dtype=np.float32), x.sum(axis=1)]


def test_native_call_returns_fresh_outputs_equal_to_the_general_path() -> None:
    exe, _ = _program()
    call = exe.native("list")
    assert call is not None
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    first, second = call(x), call(x)
    for got, want in zip(first, _expected(x)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert all(a is not b and not np.shares_memory(a, b) for a, b in zip(first, second))
    as_tuple = exe.native("tuple")(x)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 2
    assert exe.native("single") is None  # two outputs are not one


def test_native_call_declines_what_the_program_does_not_take_as_it_is() -> None:
    exe, _ = _program()
    call = exe.native("list")
    x = np.ones((4, 8), np.float32)

    class Sub(np.ndarray):
        pass

    declined = [
        (), (x, x),  # the count
        (np.ones((4, 8)),),  # the dtype
        (np.ones((4, 9), np.float32),), (np.ones(32, np.float32),),  # shape, rank
        (np.ones((8, 4), np.float32).T,),  # not C-contiguous
        (np.ones((4, 16), np.float32)[:, ::2],),
        (x.view(Sub),), (x.tolist(),), (x.astype(">f4"),),  # a subclass, a list, byte order
    ]
    for args in declined:
        assert call(*args) is NotImplemented, args
    # The general path still explains what it refuses, and takes what it can copy.
    with pytest.raises(ShapeError, match="takes 1 inputs"):
        exe(x, x)
    with pytest.raises(ShapeError, match="expected f32\\[4,8\\]"):
        exe(np.ones((4, 9), np.float32))
    np.testing.assert_allclose(exe(np.ones((8, 4), np.float32).T)[0], _expected(x)[0])
    with pytest.raises(TypeError):
        call(x=x)  # keywords are Python's business: a builtin that takes none


def test_executable_calls_go_native_after_a_few_plain_calls() -> None:
    exe, _ = _program(5, 8)  # a program of its own (compiles are cached in memory)
    x = np.ones((5, 8), np.float32)
    for _ in range(NATIVE_AFTER_CALLS + 1):
        assert "list" not in exe._natives
        exe(x)
    assert exe._natives.get("list") is not None
    got = exe(x)
    assert isinstance(got, list)
    np.testing.assert_allclose(got[0], _expected(x)[0])
    out = [np.empty((5, 8), np.float32), np.empty(5, np.float32)]
    assert exe(x, out=out)[0] is out[0]  # out= keeps the general path


def test_a_busy_arena_is_declined_and_the_general_path_waits() -> None:
    exe, _ = _program()
    call = exe.native("list")
    x = np.ones((4, 8), np.float32)
    with exe.arena_lock:
        assert call(x) is NotImplemented
    assert call(x) is not NotImplemented  # the lock was not left taken


def test_native_calls_leak_no_references() -> None:
    exe, _ = _program()
    call = exe.native("list")
    x = np.ones((4, 8), np.float32)
    wrong = np.ones((4, 9), np.float32)
    call(x)
    before = sys.getrefcount(x), sys.getrefcount(wrong), sys.getrefcount(NotImplemented)
    for _ in range(1000):
        outputs = call(x)
        call(wrong)
    assert (sys.getrefcount(x), sys.getrefcount(wrong)) == before[:2]
    first = outputs[0]
    count = sys.getrefcount(first)  # (out of the assert, whose rewriting holds values)
    assert count == 3  # the list's, `first`'s and the argument's


def test_a_failing_allocation_raises_and_drops_the_outputs_made() -> None:
    exe, _ = _program()
    made = []

    def allocate(shape, dtype):
        made.append(np.empty(shape, dtype))
        return made[-1]

    def refuse(shape, dtype):
        raise MemoryError("no room")

    call = native_call(_entry(exe), exe._entry_args[2],
                       exe._entry_args[3], exe._expected,
                       [(allocate, ((4, 8), np.float32)), (refuse, ((4,), np.float32))],
                       exe.arena_lock, exe.target)
    with pytest.raises(MemoryError, match="no room"):
        call(np.ones((4, 8), np.float32))
    count = sys.getrefcount(made[0])
    assert count == 2  # only `made` and the argument hold it
    assert not exe.arena_lock.locked()


def _entry(exe) -> int:
    return exe._entry_address


def test_calls_from_many_threads_share_the_arena_in_turn() -> None:
    exe, _ = _program(64, 256)
    call = exe.native("list")
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((64, 256)).astype(np.float32) for _ in range(4)]
    errors = []

    def work(x: np.ndarray) -> None:
        want = _expected(x)
        for _ in range(200):
            got = call(x)
            if got is NotImplemented:
                got = exe(x)
            if not np.allclose(got[0], want[0]) or not np.allclose(got[1], want[1], atol=1e-3):
                errors.append(x)
                return

    threads = [threading.Thread(target=work, args=(x,)) for x in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_scripted_calls_go_native_and_are_counted() -> None:
    def step(x, w):
        for _ in range(3):
            x = np.tanh(x @ w)
        return x

    def pair(x):
        return x + 1, x * 2

    scripted, both = ember.script(step, config=CPU), ember.script(pair, config=CPU)
    rng = np.random.default_rng(2)
    x, w = (rng.standard_normal((2, 8)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal((8, 8)).astype(np.float32)
    for _ in range(4):
        np.testing.assert_allclose(scripted(x, w), step(x, w), rtol=1e-5, atol=1e-6)
        got = both(x)
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_allclose(got[1], x * 2)
    assert scripted._native is not None and scripted._native_calls == 2
    assert scripted.stats == {"compiles": 1, "calls": 4, "hits": 3, "evictions": 0}
    # Another signature leaves the native call to the general path, which still answers.
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(scripted(x64, w.astype(np.float64)), step(x64, w), rtol=1e-6)
    assert scripted.stats["compiles"] == 2


def test_a_native_call_keeps_its_program_alive() -> None:
    """The builtin holds the executable (its code, arena and constants): dropping every
    other reference and collecting leaves it callable."""
    import gc

    from ember.driver.pipeline import clear_memory_cache

    exe, _ = _program(6, 8)
    call = exe.native("list")
    del exe
    clear_memory_cache()
    gc.collect()
    x = np.ones((6, 8), np.float32)
    np.testing.assert_allclose(call(x)[0], _expected(x)[0])
