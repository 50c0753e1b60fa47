"""Fusion: the policy's decisions (and their reasons), the planner's groups, outlining,
and values: a fused graph computes what the unfused one does, in the interpreter, through
the loop IR and compiled."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import ember
from ember import Builder, interpret, parse_graph, print_graph, verify_graph
from ember.driver.pass_manager import run_passes
from ember.errors import VerificationError
from ember.graph.fusion import FusionPlanner, classify
from ember.graph.passes import DEFAULT_PIPELINE
from ember.loops.interp import run_program
from ember.loops.lower import lower_graph
from ember.loops.verify import verify_program
from ember.target import Target
from tests.graph.random_graphs import random_graphs

HOST = Target.host()

PIPELINE = [*DEFAULT_PIPELINE, "fuse", "dce"]


def fused_ops(graph):
    return [op for op in graph.ops if op.name == "fused"]


def kinds(graph):
    return [op.attrs["kind"] for op in fused_ops(graph)]


def check_values(graph, inputs, compiled=True, rtol=1e-5, atol=1e-6):
    """The fused graph against the unfused one: interpreter, loop IR, compiled code."""
    want = interpret(graph, inputs)
    fused = run_passes(parse_graph(print_graph(graph)), PIPELINE, verify_each=True)
    for got in (interpret(fused, inputs),
                run_program(verify_program(lower_graph(fused, target=HOST)), inputs)):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    if compiled:
        run = ember.compile(graph, config=ember.Config(executor="cpu"))
        for g, w in zip(run(*inputs), want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return fused


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- graphs ------------------------------------------------------------------------------


def elementwise_chain():
    b = Builder("chain")
    x, w = b.input("x", "f32", (4, 16)), b.input("w", "f32", (16,))
    c = b.input("c", "f32", (4, 1))
    b.output(b.relu(b.add(b.mul(x, w), c)))
    return b.build(), [rand(4, 16), rand(16, seed=1), rand(4, 1, seed=2)]


def softmax_graph(shape=(6, 32), axis=-1):
    b = Builder("softmax")
    x = b.input("x", "f32", shape)
    b.output(b.softmax(x, axis=axis))
    return b.build(), [rand(*shape)]


def layer_norm_graph():
    b = Builder("ln")
    x = b.input("x", "f32", (3, 5, 24))
    g, s = b.input("g", "f32", (24,)), b.input("s", "f32", (24,))
    b.output(b.layer_norm(x, g, s, axis=-1, epsilon=1e-5))
    return b.build(), [rand(3, 5, 24), rand(24, seed=1), rand(24, seed=2)]


def matmul_epilogue():
    b = Builder("linear")
    x, w = b.input("x", "f32", (8, 32)), b.input("w", "f32", (32, 16))
    bias, r = b.input("b", "f32", (16,)), b.input("r", "f32", (8, 16))
    b.output(b.add(b.gelu(b.add(b.matmul(x, w), bias)), r))
    return b.build(), [rand(8, 32), rand(32, 16, seed=1), rand(16, seed=2), rand(8, 16, seed=3)]


def conv_bn_relu(residual=True):
    rng = np.random.default_rng(0)
    b = Builder("block")
    x = b.input("x", "f32", (1, 4, 9, 9))
    w = b.constant(rng.standard_normal((6, 4, 3, 3)).astype(np.float32), name="w")
    y = b.conv(x, w, pads=(1, 1, 1, 1))
    mean = b.constant(rng.standard_normal((6, 1, 1)).astype(np.float32), name="mean")
    scale = b.constant(rng.uniform(0.5, 2, (6, 1, 1)).astype(np.float32), name="scale")
    shift = b.constant(rng.standard_normal((6, 1, 1)).astype(np.float32), name="shift")
    y = b.add(b.mul(b.sub(y, mean), scale), shift)
    if residual:
        y = b.add(y, b.input("skip", "f32", (1, 6, 9, 9)))
    b.output(b.relu(y))
    inputs = [rand(1, 4, 9, 9)] + ([rand(1, 6, 9, 9, seed=1)] if residual else [])
    return b.build(), inputs


# -- kinds and values ----------------------------------------------------------------------


def test_elementwise_chain_is_one_injective_kernel() -> None:
    fused = check_values(*elementwise_chain())
    assert kinds(fused) == ["injective"]
    assert [op.name for op in fused.ops if op.name != "constant"] == ["fused"]


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_is_one_row_kernel(axis) -> None:
    fused = check_values(*softmax_graph(axis=axis))
    assert kinds(fused) == ["row"]
    assert len([op for op in fused.ops if op.name != "constant"]) == 1


def test_softmax_row_computes_each_exp_once() -> None:
    """The output pass reads back the exps the sum pass stored, and multiplies by the
    sum's reciprocal; the rows still run on a thread team (each owns its output row)."""
    from ember.loops.ir import Binary, Const, For, Unary, walk_expr, walk_stmts
    from ember.loops.schedule import schedule_program

    graph, inputs = softmax_graph(shape=(64, 512))
    fused = check_values(graph, inputs)
    (kernel,) = schedule_program(lower_graph(fused, HOST), HOST).kernels
    exprs = [x for s in walk_stmts(kernel.body) if hasattr(s, "value")
             for x in walk_expr(s.value)]
    assert sum(isinstance(x, Unary) and x.op == "exp" for x in exprs) == 1
    # The only division left is the reciprocal's, 1 / sum, once per row.
    assert not any(isinstance(x, Binary) and x.op == "div" and not isinstance(x.a, Const)
                   for x in exprs)
    assert kernel.body[0].kind == "parallel" and isinstance(kernel.body[0], For)


def test_layer_norm_is_one_row_kernel() -> None:
    fused = check_values(*layer_norm_graph())
    assert kinds(fused) == ["row"]
    assert len([op for op in fused.ops if op.name != "constant"]) == 1


def test_matmul_takes_its_epilogue_but_no_producer() -> None:
    fused = check_values(*matmul_epilogue(), rtol=1e-4, atol=1e-5)
    assert kinds(fused) == ["contraction"]
    (op,) = fused_ops(fused)
    members = [m.name for m in op.regions[0].ops if m.name != "constant"]
    assert members[0] == "matmul" and "tanh" in members or "erf" in members


@pytest.mark.parametrize("residual", [False, True])
def test_conv_batch_norm_relu_is_one_kernel(residual) -> None:
    graph, inputs = conv_bn_relu(residual)
    fused = check_values(graph, inputs, rtol=1e-4, atol=1e-5)
    (op,) = fused_ops(fused)
    members = [m.name for m in op.regions[0].ops if m.name != "constant"]
    # The batch-norm went into the weights; the residual add and relu are the epilogue.
    assert members == ["conv", *(["add"] if residual else []), "max"]
    assert [o.name for o in fused.ops if o.name != "constant"] == ["fused"]


def test_reduction_with_producer_and_epilogue() -> None:
    b = Builder("mean_exp")
    x = b.input("x", "f32", (5, 7))
    b.output(b.reduce_mean(b.exp(x), axes=(0,), keepdims=False))
    fused = check_values(b.build(), [rand(5, 7)])
    assert kinds(fused) == ["reduction"]


def test_siblings_reading_one_input_share_a_nest() -> None:
    b = Builder("siblings")
    x = b.input("x", "f32", (8, 8))
    b.output(b.exp(x), b.tanh(x))
    fused = check_values(b.build(), [rand(8, 8)])
    assert kinds(fused) == ["injective"] and len(fused_ops(fused)[0].results) == 2


def test_transpose_is_absorbed_as_index_arithmetic() -> None:
    b = Builder("t")
    x, y = b.input("x", "f32", (4, 6)), b.input("y", "f32", (6, 4))
    b.output(b.add(b.transpose(x, perm=(1, 0)), y))
    fused = check_values(b.build(), [rand(4, 6), rand(6, 4, seed=1)])
    assert kinds(fused) == ["injective"]


# -- decisions and their reasons -----------------------------------------------------------


def _planner(graph):
    return FusionPlanner(graph.body)


def test_contraction_refuses_a_producer() -> None:
    b = Builder("g")
    x, w = b.input("x", "f32", (4, 4)), b.input("w", "f32", (4, 4))
    e = b.exp(x)
    b.output(b.matmul(e, w))
    graph = b.build()
    planner = _planner(graph)
    exp, matmul = graph.ops
    decision = planner.can_fuse(planner.group_of[exp], planner.group_of[matmul])
    assert not decision and "contractions take no producers" in decision.reason


def test_two_contractions_are_refused() -> None:
    b = Builder("g")
    x, w = b.input("x", "f32", (4, 4)), b.input("w", "f32", (4, 4))
    b.output(b.matmul(b.matmul(x, w), w))
    graph = b.build()
    result = classify(graph.ops, graph.outputs)
    assert not result and "two contractions" in result.reason


def test_outputs_of_two_shapes_are_refused() -> None:
    b = Builder("g")
    x = b.input("x", "f32", (4, 4))
    e = b.exp(x)
    b.output(e, b.reshape(e, shape=(16,)))
    graph = b.build()
    result = classify(graph.ops, graph.outputs)
    assert not result and "different shapes" in result.reason


def test_expensive_broadcast_producer_is_not_recomputed() -> None:
    b = Builder("g")
    x, v = b.input("x", "f32", (64, 64)), b.input("v", "f32", (64,))
    b.output(b.add(x, b.exp(v)))
    graph = b.build()
    planner = _planner(graph)
    exp, add = graph.ops
    decision = planner.can_fuse(planner.group_of[exp], planner.group_of[add])
    assert not decision and "recomputed" in decision.reason


def test_a_path_through_an_outside_op_is_a_cycle() -> None:
    b = Builder("g")
    x, w = b.input("x", "f32", (4, 4)), b.input("w", "f32", (4, 4))
    e = b.exp(x)
    m = b.matmul(e, w)  # opaque to the group of exp and add: a path e -> m -> add
    b.output(b.add(e, m))
    graph = b.build()
    planner = _planner(graph)
    exp, _, add = graph.ops
    decision = planner.can_fuse(planner.group_of[exp], planner.group_of[add])
    assert not decision
    assert "cycle" in decision.reason or "no producers" in decision.reason


def test_a_path_through_another_group_is_a_cycle() -> None:
    """Each group alone is convex, yet together they would read each other: b1 -> m ->
    a2, and a1 -> b2. Fused, {a1, a2} and {b1, b2} would each wait for the other."""
    b = Builder("g")
    x, w = b.input("x", "f32", (4, 4)), b.input("w", "f32", (4, 4))
    a1 = b.exp(x)
    b1 = b.neg(x)
    m = b.matmul(b1, w)
    a2 = b.add(a1, m)
    b2 = b.mul(b1, a1)
    b.output(a2, b2)
    graph = b.build()
    planner = _planner(graph)
    op_a1, op_b1, _, op_a2, op_b2 = graph.ops
    assert planner.can_fuse(planner.group_of[op_a1], planner.group_of[op_a2])
    planner.merge(planner.group_of[op_a1], planner.group_of[op_a2])
    decision = planner.can_fuse(planner.group_of[op_b1], planner.group_of[op_b2])
    assert not decision and "cycle" in decision.reason


def test_groups_around_an_if_fuse_without_a_cycle() -> None:
    """Found by test_passes_preserve_values (fuse alone, before dce): the group that reads
    the `if`'s result also feeds the group that computes its condition."""
    text = """
graph @g(%x: f32[]) -> (f32[]) {
  %0 = graph.add %x, %x : f32[]
  %1 = graph.cast %x {to = f16} : f16[]
  %2 = graph.cast %1 {to = f32} : f32[]
  %3 = graph.cast %x {to = f16} : f16[]
  %4 = graph.cast %3 {to = f32} : f32[]
  %5 = graph.reduce_sum %x {axes = []} : f32[]
  %6 = graph.constant {value = dense<f32[] [0.0]>} : f32[]
  %7 = graph.gt %5, %6 : bool[]
  %8 = graph.if %7 : f32[] {
    %9 = graph.neg %x : f32[]
    yield %9
  } {
    %10 = graph.constant {value = dense<f32[] [0.5]>} : f32[]
    %11 = graph.mul %x, %10 : f32[]
    %12 = graph.neg %11 : f32[]
    yield %12
  }
  %13 = graph.lt %0, %8 : bool[]
  %14 = graph.where %13, %0, %8 : f32[]
  %15 = graph.add %x, %0 : f32[]
  return %x
}"""
    fused = run_passes(parse_graph(text), ["fuse"], verify_each=True)
    assert fused_ops(fused)  # (it still fuses: just not into two groups that wait on each other)
    x = np.array(0.125, np.float32)
    np.testing.assert_array_equal(interpret(fused, [x])[0], x)


def test_fuel_caps_the_merges(monkeypatch) -> None:
    graph, _ = elementwise_chain()
    text = print_graph(graph)
    monkeypatch.setenv("EMBER_FUSION_FUEL", "0")
    assert not fused_ops(run_passes(parse_graph(text), PIPELINE))
    monkeypatch.setenv("EMBER_FUSION_FUEL", "1")
    (op,) = fused_ops(run_passes(parse_graph(text), PIPELINE))
    assert len([m for m in op.regions[0].ops if m.name != "constant"]) == 2


# -- the fused op in text ------------------------------------------------------------------


def test_fused_text_round_trips_and_is_checked() -> None:
    fused = run_passes(*softmax_graph()[:1], PIPELINE)
    text = print_graph(fused)
    assert print_graph(parse_graph(text)) == text
    with pytest.raises(ember.ParseError, match="is a row kernel, not injective"):
        parse_graph(text.replace('kind = "row"', 'kind = "injective"'))


def test_fused_region_is_isolated() -> None:
    text = """graph @g(%x: f32[4]) -> (f32[4]) {
  %0 = graph.fused {kind = "injective"} : f32[4] {
    %1 = graph.exp %x : f32[4]
    yield %1
  }
  return %0
}
"""
    with pytest.raises(VerificationError, match="outside its region"):
        verify_graph(parse_graph(text))


# -- random graphs ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_graphs())
def test_fusion_preserves_values_of_random_graphs(case) -> None:
    graph, inputs = case
    want = interpret(graph, inputs)
    fused = run_passes(parse_graph(print_graph(graph)), PIPELINE, verify_each=True)
    # The interpreter runs a fused op's region op by op: exactly the same values.
    for g, w in zip(interpret(fused, inputs), want):
        np.testing.assert_array_equal(g, w)
    try:
        program = verify_program(lower_graph(fused, target=HOST))
    except ember.UnsupportedOpError:
        return  # an op the loop IR does not have (not fusion's concern)
    for g, w in zip(run_program(program, inputs), want):
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, w)


def test_zero_pad_absorbed_into_conv_keeps_values() -> None:
    rng = np.random.default_rng(0)
    b = Builder("padded")
    x = b.input("x", "f32", (1, 3, 6, 7))
    w = b.constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), name="w")
    padded = b.pad(x, pads=(0, 0, 1, 0, 0, 0, 2, 1))
    b.output(b.relu(b.conv(padded, w, pads=(1, 1, 0, 0))))
    fused = check_values(b.build(), [rand(1, 3, 6, 7)], rtol=1e-4, atol=1e-5)
    assert not [op for op in fused.walk() if op.name == "pad"]


def test_ordering_a_region_reads_each_ops_producers_once(monkeypatch) -> None:
    """Found by the property tests (a random graph took 11 GB and never finished): putting a
    region back in order after outlining expanded an op again for every op that read it
    before it was placed, exponential in a chain of diamonds. Each op is expanded once."""
    from ember.graph.fusion import outline

    b = Builder("diamonds")
    x = b.input("x", ember.DType.f32, (4,))
    for _ in range(12):  # x -> (exp, neg) -> add: 2**12 expansions before, one each now
        x = b.add(b.exp(x), b.neg(x))
    b.output(x)
    ops = b.build().body.ops
    calls = []
    producers = outline._producers
    monkeypatch.setattr(outline, "_producers", lambda op, made: calls.append(op) or
                        producers(op, made))
    order = outline._topological(list(reversed(ops)))
    assert len(calls) == len(ops) and len(order) == len(ops)
    position = {op: k for k, op in enumerate(order)}
    assert all(position[v.producer] < position[op] for op in order for v in op.operands
               if v.producer in position)


def test_outlining_reorders_only_when_a_reader_sits_inside_the_group(monkeypatch) -> None:
    """A fused op takes its last member's place: the region is re-sorted only when an op
    between the group's first member and its last reads what the group makes (each
    fusion re-sorting the whole graph made fusing O(n^2) in its ops)."""
    from ember.graph.fusion import outline
    from ember.graph.fusion.policy import FusionPlan
    from ember.graph.verify import verify_graph

    b = Builder("between")
    x = b.input("x", ember.DType.f32, (4,))
    e = b.exp(x)
    reader = b.neg(e)  # between the members, reading the first one
    n = b.sqrt(x)
    b.output(b.add(b.abs(n), reader))
    graph = b.build()
    ops = graph.body.ops
    sorts = []
    topological = outline._topological
    monkeypatch.setattr(outline, "_topological", lambda o: sorts.append(1) or topological(o))
    users = {v: [op for op in ops if v in op.operands] for op in ops for v in op.results}
    exp, sqrt = ops[0], ops[2]
    fused = outline.outline(graph, graph.body, [exp, sqrt], FusionPlan("injective", (4,)),
                            users)
    assert sorts == [1]
    position = {op: k for k, op in enumerate(graph.body.ops)}
    assert position[fused] < position[[op for op in graph.body.ops if op.name == "neg"][0]]
    verify_graph(graph)
    ops = graph.body.ops
    users = {v: [op for op in ops if v in op.operands] for op in ops for v in op.results}
    abs_, add = [op for op in ops if op.name in ("abs", "add")]
    outline.outline(graph, graph.body, [abs_, add], FusionPlan("injective", (4,)), users)
    assert sorts == [1]  # nothing between abs and add reads them
    verify_graph(graph)
