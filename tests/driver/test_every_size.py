"""Code compiled once for every size: a graph with symbolic sizes lowers to kernels that
take the sizes as arguments (ember/loops/ir.py's size variables), an entry that takes them
and the temps' offsets, and a SizedExecutable that binds them per call and packs the arena
per binding (ember/runtime/executable.py, memory_plan.py). Where a stage needs a size as a
number, the driver compiles per binding instead (SizeSpecialized) and says why."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from ember import Builder, DType, interpret
from ember.config import Config
from ember.driver import compile as compile_module
from ember.driver.compile import SizeSpecialized, executor_for
from ember.driver.pipeline import lower_to_program
from ember.errors import ShapeError
from ember.graph.bind import specialize
from ember.graph.symbolic import symbol
from ember.loops.ir import For, Var, binary, dim_expr
from ember.loops.simplify import simplify_binary
from ember.loops.text import parse_program, print_program
from ember.runtime.executable import SizedExecutable
from ember.runtime.memory_plan import plan_memory
from tests.graph.random_graphs import random_graphs

B, S = symbol("b"), symbol("s")
RNG = np.random.default_rng(0)
CPU = Config(executor="cpu", disk_cache=False)


def _mlp(bound: int | None = None):
    g = Builder("mlp")
    x = g.input("x", DType.f32, (B, 64))
    w1 = g.constant(RNG.standard_normal((64, 48)).astype(np.float32))
    w2 = g.constant(RNG.standard_normal((48, 10)).astype(np.float32))
    h = g.relu(g.matmul(x, w1))
    g.output(g.softmax(g.matmul(h, w2), axis=1))
    graph = g.build()
    if bound is not None:
        graph.size_bounds = {"b": bound}
    return graph


def _attention_block():
    """Layer norm, a projection and attention over a sequence of ?s (BERT's shapes)."""
    g = Builder("block")
    x = g.input("x", DType.f32, (B, S, 32))
    w = g.constant(RNG.standard_normal((32, 32)).astype(np.float32) / 6)
    h = g.layer_norm(x, axis=-1)
    q = g.reshape(g.matmul(h, w), shape=(B, S, 2, 16))
    q = g.transpose(q, perm=(0, 2, 1, 3))
    scores = g.mul(g.matmul(q, g.transpose(q, perm=(0, 1, 3, 2))), g.constant(
        np.float32(0.25)))
    g.output(g.matmul(g.softmax(scores, axis=-1), q))
    return g.build()


def _masked_attention():
    """graph.attention over ?s keys with a mask that hides every key of some rows."""
    g = Builder("att")
    ins = [g.input("q", "f32", (2, S, 16)), g.input("kt", "f32", (2, 16, S)),
           g.input("v", "f32", (2, S, 24)), g.input("m", "f32", (1, S, S))]
    g.output(g.op("attention", ins, {"empty_rows_zero": True, "scale": 0.25}).result)
    return g.build()


def test_attention_blocks_keys_known_at_call_time() -> None:
    """Whole blocks of keys, those past the end masked, for every length (the schedule's
    blocks are 128 keys: lengths below, at and past one and two blocks)."""
    graph = _masked_attention()
    run = executor_for(graph, CPU)
    assert run.generic is not None, run.why_specialized
    for s in (1, 7, 256, 300, 513):
        arrays = [RNG.standard_normal(shape).astype(np.float32)
                  for shape in [(2, s, 16), (2, 16, s), (2, s, 24), (1, s, s)]]
        arrays[3] = np.where(RNG.random((1, s, s)) < 0.3, -np.inf, 0).astype(np.float32)
        arrays[3][0, 0, :] = -np.inf  # a row that sees no key
        np.testing.assert_allclose(run(*arrays)[0], interpret(graph, arrays)[0],
                                   rtol=1e-4, atol=1e-5)


def _check(run, graph, shapes, atol=1e-4):
    for shape in shapes:
        x = RNG.standard_normal(shape).astype(np.float32)
        want = interpret(graph, [x])
        got = run(x)
        for w, o in zip(want, got):
            np.testing.assert_allclose(o, w, rtol=1e-4, atol=atol)


def test_one_compile_serves_every_batch() -> None:
    graph = _mlp()
    run = executor_for(graph, CPU)
    assert isinstance(run, SizeSpecialized) and isinstance(run.generic, SizedExecutable)
    _check(run, graph, [(b, 64) for b in (1, 2, 3, 17, 64, 5, 2)])
    assert run.compilations == 1
    assert run.generic.bindings == 6  # one per new batch: its outputs' shapes and arena


def test_a_matmul_of_columns_known_at_call_time_is_compiled_per_size() -> None:
    """Scores q @ k^T of ?s columns, written out (not an attention op): the matmul's panels
    need the columns as a number, and a plain nest would be many times slower, so the
    graph is compiled per size, and says why."""
    graph = _attention_block()
    run = executor_for(graph, CPU)
    assert run.generic is None and "columns" in run.why_specialized
    _check(run, graph, [(1, 7, 32), (2, 64, 32), (1, 7, 32)])
    assert run.compilations == 2


def test_only_the_sizes_a_stage_needs_as_numbers_are_fixed() -> None:
    """The matmul needs its columns (?s) as a number, not the batch: the graph is compiled
    per sequence length, each once for every batch."""
    graph = _attention_block()
    run = executor_for(graph, CPU)
    assert run.fixed == ("s",)
    _check(run, graph, [(1, 7, 32), (3, 7, 32), (5, 7, 32), (2, 9, 32), (4, 9, 32)])
    assert run.compilations == 2
    nested = run.runners[(7,)]
    assert isinstance(nested, SizeSpecialized) and nested.generic is not None
    assert nested.graph.inputs[0].type.shape[1] == 7


def test_a_size_that_runs_long_gets_code_of_its_own(monkeypatch) -> None:
    """Once a size's calls have run as long as the code of every size took to compile
    (here: taken to be 2 ms), the size gets code of its own, and the others keep the code
    of every size."""
    monkeypatch.setattr(compile_module, "_compile_seconds", lambda runner, measured: 2e-3)
    graph = _mlp()
    run = executor_for(graph, CPU)
    x, y = (RNG.standard_normal((n, 64)).astype(np.float32) for n in (3, 5))
    # (The size's code compiles beside the calls: on a loaded machine, after many of them.)
    deadline = time.monotonic() + 60
    while not run.hot and time.monotonic() < deadline:
        run(x)
    assert list(run.hot) == [(3,)] and run.hot_compilations == 1
    assert type(run.hot[(3,)]) is not SizedExecutable and run.compilations == 1
    for a in (x, y):
        np.testing.assert_allclose(run(a)[0], interpret(graph, [a])[0], rtol=1e-4, atol=1e-5)
    assert run.runner([y.shape]) is run.generic


def test_kernels_take_the_sizes_they_read() -> None:
    program, plan = lower_to_program(_mlp(), CPU, every_size=True)
    assert program.sizes == ("b",)
    matmul = program.kernels[0]
    assert matmul.sizes == ("b",) and "?b" in print_program(program)
    assert plan.symbolic and "per binding" in plan.report()
    assert print_program(parse_program(print_program(program))) == print_program(program)


def test_the_arena_of_a_binding_is_the_specialized_plan() -> None:
    graph = _mlp()
    program, plan = lower_to_program(graph, CPU, every_size=True)
    assert plan.symbolic
    for env in ({"b": 1}, {"b": 7}, {"b": 64}):
        bound = plan.bind(env)
        fixed = plan_memory(lower_to_program(specialize(graph, env), CPU)[0])
        assert bound.arena_size == fixed.arena_size
        assert set(bound.offsets) == set(fixed.offsets)


def test_shapes_that_do_not_fit_are_shape_errors() -> None:
    run = executor_for(_mlp(bound=32), CPU)
    with pytest.raises(ShapeError, match=r"input 0 \(%x\): dim 1 is 63, expected 64"):
        run(np.zeros((2, 63), np.float32))
    with pytest.raises(ShapeError, match=r"\?b is 33 .* above its bound 32"):
        run(np.zeros((33, 64), np.float32))
    exe = run.generic
    with pytest.raises(ShapeError, match="dim 1 is 8, expected 64"):
        exe(np.zeros((2, 8), np.float32))
    with pytest.raises(ShapeError, match="expected f32"):
        exe(np.zeros((2, 64), np.int32))
    with pytest.raises(ShapeError, match="compiled for every size"):
        exe.run_addresses([0])


def test_out_buffers_of_the_bound_shapes() -> None:
    graph = _mlp()
    exe = executor_for(graph, CPU).generic
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    out = np.empty((3, 10), np.float32)
    assert exe(x, out=[out])[0] is out
    np.testing.assert_allclose(out, interpret(graph, [x])[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(ShapeError, match="expected f32\\[3,10\\]"):
        exe(x, out=[np.empty((4, 10), np.float32)])


def test_a_stage_that_needs_a_number_compiles_per_binding() -> None:
    g = Builder("padded")
    x = g.input("x", DType.f32, (B, 8))
    g.output(g.pad(x, pads=[1, 0, 1, 0]))  # (its lowering needs ?b as a number)
    graph = g.build()
    run = executor_for(graph, CPU)
    assert run.generic is None and "call time" in run.why_specialized
    _check(run, graph, [(4, 8), (5, 8), (4, 8)])
    assert run.compilations == 2


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_graphs(symbolic=True))
def test_random_graphs_of_every_size_match_the_interpreter(case) -> None:
    """Random graphs whose inputs lead with ?n, compiled once and run at the drawn ?n and
    at a larger one, compute what the interpreter computes."""
    graph, inputs = case
    run = executor_for(graph, CPU)
    n = inputs[0].shape[0] if inputs and inputs[0].ndim else 1
    for arrays in (inputs, [RNG.standard_normal((n + 3, *a.shape[1:])).astype(a.dtype)
                            if a.ndim else a for a in inputs]):
        want = interpret(graph, arrays)
        got = run(*arrays)
        for w, o in zip(want, got):
            np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_explain_reports_code_of_every_size_at_its_latest_call() -> None:
    import ember

    compiled = ember.compile(_mlp(), config=CPU)
    with pytest.raises(ember.EmberError, match="call it once"):
        ember.explain(compiled, budget_seconds=0.01)
    compiled(np.ones((7, 64), np.float32))
    report = ember.explain(compiled, budget_seconds=0.01)
    matmul = next(k for k in report.kernels if "matmul" in k.ops)
    assert matmul.bytes == 4 * (7 * 64 + 64 * 48 + 7 * 48) and matmul.seconds > 0


def test_a_batch_loop_is_fused_with_its_heads_before_it_runs_in_parallel() -> None:
    """A parallel loop over ?b would leave the team idle for a batch of 1: the default
    schedule fuses it with the constant loop it holds, so that the team shares both."""
    g = Builder("heads")
    x = g.input("x", DType.f32, (B, 12, 256, 64))
    g.output(g.exp(x))
    program, _ = lower_to_program(g.build(), CPU, every_size=True)
    loops = [s for s in program.kernels[0].walk() if isinstance(s, For)]
    parallel = [s for s in loops if s.kind == "parallel"]
    assert len(parallel) == 1 and parallel[0].stop == dim_expr(B * 12)
    run = executor_for(g.build(), CPU)
    _check(run, g.build(), [(1, 12, 256, 64), (3, 12, 256, 64)])


def test_reshapes_that_regroup_a_batch_leave_no_division_in_the_index() -> None:
    """[?b*?s, E] read as [?b, ?s, E] and back (a fused GELU between two matmuls): the
    shared trailing dim maps one to one and floor division's identity removes the rest,
    so that the kernel vectorizes."""
    g = Builder("regroup")
    x = g.input("x", DType.f32, (B * S, 32))
    y = g.tanh(g.reshape(x, shape=(B, S, 32)))
    g.output(g.reshape(y, shape=(B * S, 32)))
    program, _ = lower_to_program(g.build(), CPU, every_size=True)
    kernel, = program.kernels
    text = print_program(program)
    assert "floordiv" not in text and "mod(" not in text
    assert any(isinstance(s, For) and s.kind == "vectorized" for s in kernel.walk())
    assert simplify_binary("add", binary("mul", binary("floordiv", Var("i"), dim_expr(S)),
                                         dim_expr(S)),
                           binary("mod", Var("i"), dim_expr(S))) == Var("i")


def test_a_cnn_over_a_batch_known_at_call_time_keeps_its_conv_and_pool_steps() -> None:
    """Convs (implicit GEMM, and packed weights), pooling and a linear head over ?b: each
    nest gets its schedule step (unrolled register tiles), not a plain nest."""
    g = Builder("cnn")
    x = g.input("x", DType.f32, (B, 8, 16, 16))
    w1 = g.constant(RNG.standard_normal((32, 8, 3, 3)).astype(np.float32) / 8)
    w2 = g.constant(RNG.standard_normal((32, 32, 1, 1)).astype(np.float32) / 6)
    h = g.relu(g.conv(x, w1, pads=[1, 1, 1, 1]))
    h = g.max_pool(h, kernel=[2, 2], strides=[2, 2])
    h = g.relu(g.conv(h, w2))
    g.output(g.reduce_mean(h, axes=[2, 3]))
    graph = g.build()
    program, _ = lower_to_program(graph, CPU, every_size=True)
    for kernel in program.kernels:
        if any(op in kernel.origin for op in ("conv", "max_pool")):
            assert any(isinstance(s, For) and s.kind == "unrolled" for s in kernel.walk()), \
                kernel.origin
    run = executor_for(graph, CPU)
    assert run.generic is not None, run.why_specialized
    _check(run, graph, [(1, 8, 16, 16), (3, 8, 16, 16)])
