"""Copy coalescing (ember/runtime/copies.py): the copies that `if` and `loop` lower to go
where their writers can write the destination, and the program computes the same."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, DType, interpret
from ember.loops.ir import Call, ProgramIf, ProgramLoop
from ember.loops.lower.program import lower_graph
from ember.runtime.copies import coalesce_copies
from ember.runtime.executable import compile_program
from ember.runtime.memory_plan import plan_memory
from ember.target import Target

HOST = Target.host()


def copies(program, steps=None) -> int:
    count = 0
    for step in program.steps if steps is None else steps:
        if isinstance(step, Call):
            count += program.kernel(step.kernel).origin == "copy"
        elif isinstance(step, ProgramIf):
            count += copies(program, step.then) + copies(program, step.orelse)
        elif isinstance(step, ProgramLoop):
            count += copies(program, step.body)
    return count


def guarded_update():
    """A loop whose body updates two carried arrays under an `if` (a `break` guard), and
    swaps two others: the update's copies go, the swap's stay staged."""
    b = Builder("guarded")
    x = b.input("x", DType.f32, (64,))
    n = b.input("n", DType.i64, ())
    limit = b.input("limit", DType.f32, ())

    def body(bb, i, u, v, p, q):
        big = bb.gt(bb.reduce_max(u, axes=(0,)), limit)
        u2, v2 = bb.if_(big, lambda tb: [u, v],
                        lambda eb: [eb.add(eb.mul(u, v), x), eb.tanh(eb.add(v, u))])
        return [bb.op("not", [big]).result, u2, v2, q, p]  # p and q trade places each iteration

    t = b.constant(np.array(True))
    u, v, p, q = b.loop(n, t, [x, b.neg(x), b.exp(x), b.abs(x)], body)
    b.output(u, b.add(v, p), q)
    return b.build()


def test_coalescing_removes_the_updates_copies_and_keeps_the_results() -> None:
    graph = guarded_update()
    program = lower_graph(graph, target=HOST)
    before = copies(program)
    removed = coalesce_copies(program)
    assert removed > 0 and copies(program) == before - removed
    exe = compile_program(program, HOST, plan_memory(program))
    xv = np.linspace(-1, 1, 64, dtype=np.float32)
    for trips in (0, 1, 2, 5):
        for limit in (0.5, 10.0):
            args = [xv, np.array(trips, np.int64), np.array(limit, np.float32)]
            for got, want in zip(exe(*args), interpret(graph, args)):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_copy_whose_destination_is_read_before_it_stays() -> None:
    """y = exp(x); out = x + 1 read after the writer: copying exp(x) into a buffer the
    program still reads before the copy would lose that value."""
    b = Builder("kept")
    x = b.input("x", DType.f32, (8,))
    n = b.input("n", DType.i64, ())

    def body(bb, i, acc):
        new = bb.exp(bb.neg(acc))
        keep = bb.add(acc, new)  # reads the old carried value after `new` is computed
        return [bb.constant(np.array(True)), bb.mul(keep, new)]

    (out,) = b.loop(n, b.constant(np.array(True)), [x], body)
    b.output(out)
    graph = b.build()
    program = lower_graph(graph, target=HOST)
    coalesce_copies(program)
    exe = compile_program(program, HOST, plan_memory(program))
    args = [np.linspace(0, 1, 8, dtype=np.float32), np.array(3, np.int64)]
    np.testing.assert_allclose(exe(*args)[0], interpret(graph, args)[0], rtol=1e-5)


@pytest.mark.parametrize("trips", [0, 1, 4])
def test_scripted_loops_compute_the_same_after_coalescing(trips) -> None:
    """The ONNX-style loop in tests/runtime/test_executable.py, through the driver."""
    import ember

    graph = guarded_update()
    compiled = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))
    args = [np.linspace(-2, 2, 64, dtype=np.float32), np.array(trips, np.int64),
            np.array(1.0, np.float32)]
    for got, want in zip(compiled(*args), interpret(graph, args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
