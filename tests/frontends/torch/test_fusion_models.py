"""Fusion on real models (phase 4's structural acceptance): every convolution of ResNet-50
and MobileNetV2 is one kernel with its batch-norm (folded into the weights), its
activation and its residual add; every softmax and layer-norm of BERT is one kernel.
The graphs are checked after the compiled path's passes, without running LLVM (the
compiled model tests check values)."""

from __future__ import annotations

from collections import Counter

import pytest

from ember.driver.pass_manager import PassManager
from ember.graph.passes import DEFAULT_PIPELINE
from ember.loops.lower import lower_graph
from ember.target import Target
from tests.frontends.torch.test_models import MODELS

HOST = Target.host()

torch = pytest.importorskip("torch")


def fused_graph(name: str):
    from ember.frontends.torch.export import capture_program, import_program

    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    program, _ = capture_program(model.eval(), (), inputs)
    graph = import_program(program)
    return PassManager([*DEFAULT_PIPELINE, "fuse", "dce"]).run(graph)


def members(op):
    return [m.name for m in op.regions[0].ops if m.name != "constant"]


def top_level(graph):
    return [op for op in graph.ops if op.name != "constant"]


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_each_convolution_is_one_kernel_with_its_epilogue(name) -> None:
    graph = fused_graph(name)
    ops = top_level(graph)
    # Batch-norm is gone (folded), and no elementwise op or pad is left on its own.
    assert not [op.name for op in ops if op.name not in ("fused", "conv", "max_pool", "reshape")]
    convs = [op for op in ops if op.name == "conv"]
    fused = [op for op in ops if op.name == "fused" and "conv" in members(op)]
    for op in fused:
        names = members(op)
        assert names[0] == "conv" and names.count("conv") == 1
        assert set(names[1:]) <= {"add", "max", "min"}  # residual, relu / relu6
    # Convolutions left alone have no consumer to fuse: their batch-norm was folded away.
    for conv in convs:
        assert all(u.name in ("fused", "conv", "reshape") for u in ops if conv.result in
                   u.operands)
    kernels = len(lower_graph(graph, target=HOST).kernels)
    assert kernels == len(ops)
    print(f"{name}: {kernels} kernels, {len(fused)} fused convolutions,"
          f" {len(convs)} alone")


def test_bert_softmax_and_layer_norm_are_one_kernel_each() -> None:
    graph = fused_graph("bert")
    ops = top_level(graph)
    # No reduction is left alone: each sits in a fused kernel.
    assert not [op for op in ops if op.name.startswith("reduce_")]
    rows = [members(op) for op in ops if op.name == "fused" and op.attrs["kind"] == "row"]
    softmax = [m for m in rows if "exp" in m and "reduce_max" in m]
    layer_norm = [m for m in rows if "rsqrt" in m]
    assert len(softmax) == 12  # one per layer
    assert len(layer_norm) == 25  # the embeddings' and two per layer
    counts = Counter(op.name for op in ops)
    print(f"bert: {len(ops)} kernels: {dict(counts)}")
