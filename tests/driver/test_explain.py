"""ember.explain: a compiled model's kernels, the graph ops each holds, the bytes it moves."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.driver import pipeline


def graph():
    b = ember.Builder("explained")
    x, w = b.input("x", "f32", (16, 32)), b.input("w", "f32", (32, 8))
    h = b.relu(b.add(b.matmul(x, w), b.constant(np.float32(1.0))))
    b.output(b.softmax(h, axis=-1))
    return b.build()


def test_explain_lists_each_kernel_with_its_ops_and_bytes() -> None:
    compiled = ember.compile(graph(), config=ember.Config(executor="cpu", disk_cache=False))
    compiled(np.ones((16, 32), np.float32), np.ones((32, 8), np.float32))
    report = ember.explain(compiled, measure=False)
    assert [k.ops for k in report.kernels] == [
        ["matmul", "add", "max"],
        ["reduce_max", "sub", "exp", "reduce_sum", "div"]]
    # matmul kernel: x, w and its output; softmax kernel: its input and output.
    assert [k.bytes for k in report.kernels] == [(16 * 32 + 32 * 8 + 16 * 8) * 4,
                                                 2 * 16 * 8 * 4]
    text = str(report)
    assert "matmul + add + max" in text and "2 kernels (2 fused) for 8 graph ops" in text


def test_ops_come_from_the_members_not_a_quoted_source_line() -> None:
    """Origins quote source lines, which may hold brackets of their own."""
    b = ember.Builder("quoted")
    x, w = b.input("x", "f32", (16, 32)), b.input("w", "f32", (32, 8))
    y = b.matmul(x, w, loc="m.py:3: y = x[0] @ w[1:]")
    b.output(b.exp(b.matmul(b.relu(y, loc="m.py:4: z = act[kind](y)"), b.transpose(
        w, perm=[1, 0]), loc="m.py:5: return z @ w.T[..]")))
    compiled = ember.compile(b.build(), config=ember.Config(executor="cpu", disk_cache=False))
    report = ember.explain(compiled, measure=False)
    assert sorted(k.ops for k in report.kernels) == [
        ["matmul", "exp"], ["matmul", "max"], ["transpose"]]


def test_explain_works_from_the_disk_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    config = ember.Config(executor="cpu")
    first = ember.explain(ember.compile(graph(), config=config).run, measure=False)
    monkeypatch.setattr(pipeline._MEMORY, "entries", type(pipeline._MEMORY.entries)())
    builds = pipeline.stats.builds
    again = ember.explain(ember.compile(graph(), config=config).run, measure=False)
    assert pipeline.stats.builds == builds  # loaded, not built
    assert again.kernels == first.kernels


def test_explain_needs_compiled_code() -> None:
    interpreted = ember.compile(graph(), config=ember.Config(executor="interp"))
    with pytest.raises(ember.EmberError, match="nothing compiled to explain"):
        ember.explain(interpreted)


def test_explain_measures_each_kernel_against_the_roofline() -> None:
    compiled = ember.compile(graph(), config=ember.Config(executor="cpu", disk_cache=False))
    report = ember.explain(compiled, budget_seconds=0.01)
    times = [k.seconds for k in report.kernels]
    assert all(t > 0 for t in times) and times == sorted(times, reverse=True)
    matmul = next(k for k in report.kernels if "matmul" in k.ops)
    # 16x8 outputs, each 32 multiply-adds, plus the bias add and relu's max: 2 flops each;
    # the blocked schedule computes padded tiles (rows up to a multiple of its tile) too.
    assert 16 * 8 * (2 * 32 + 2) <= matmul.flops <= 1.25 * 16 * 8 * (2 * 32 + 2)
    assert 0 < matmul.roofline <= 1.5 and report.total_seconds > 0
    assert "vectorized" in matmul.schedule and "unrolled" in matmul.schedule  # the gemm tile
    text = str(report)
    assert "roofline" in text and "GFLOP/s" in text and "roofs:" in text
    assert report.timing == "in sequence" and "(in sequence)" in text


def test_kernels_are_timed_in_their_places_on_the_programs_buffers(monkeypatch) -> None:
    """A straight-line program's steps run in order on its own arena: each kernel is called
    once per round, with the buffers a real inference gives it (an output planned in place
    of its input included). A program with control flow times its kernels alone."""
    import importlib

    explain_module = importlib.import_module("ember.explain")  # (ember.explain: the function)
    compiled = ember.compile(graph(), config=ember.Config(executor="cpu", disk_cache=False))
    executable = compiled.run
    steps = executable.notes["steps"]
    assert [name for name, _ in steps] == [k for k in executable.interface.kernels]
    temps = {b.name for b in executable.interface.temps}
    assert any(arg in temps for _, args in steps for arg in args)  # the arena, not scratch
    seen = []
    real = explain_module._time_steps

    def spy(exe, steps, budget, table):
        seen.append([args for _, args in steps])
        return real(exe, steps, budget, table)

    monkeypatch.setattr(explain_module, "_time_steps", spy)
    report = ember.explain(compiled, budget_seconds=0.01)
    assert seen == [[args for _, args in steps]] and report.timing == "in sequence"
    x = np.ones((16, 32), np.float32)
    np.testing.assert_allclose(compiled(x, np.ones((32, 8), np.float32))[0],
                               np.full((16, 8), 1 / 8, np.float32))  # still the right values

    b = ember.Builder("branchy")
    c, v = b.input("c", "bool", ()), b.input("v", "f32", (8,))
    (out,) = b.if_(c, lambda t: [t.relu(v)], lambda e: [e.neg(v)])
    b.output(out)
    branchy = ember.compile(b.build(), config=ember.Config(executor="cpu", disk_cache=False))
    branchy(np.array(True), np.ones(8, np.float32))
    assert "steps" not in branchy.run.notes
    assert ember.explain(branchy, budget_seconds=0.01).timing == "alone"


def test_kernels_that_check_their_indices_are_timed_in_sequence() -> None:
    """A gather's kernel writes the status word of its index check: timed in its place,
    given a word of its own (the entry keeps the real one on its stack)."""
    b = ember.Builder("lookup")
    ids = b.input("ids", "i64", (6,))
    b.output(b.relu(b.gather(b.constant(np.ones((50, 16), np.float32)), ids, axis=0)))
    compiled = ember.compile(b.build(), config=ember.Config(executor="cpu", disk_cache=False))
    compiled(np.arange(6))
    assert compiled.run.notes["status"]
    report = ember.explain(compiled, budget_seconds=0.01)
    assert report.timing == "in sequence" and all(k.seconds > 0 for k in report.kernels)
