"""graph.attention: its type rules, its reference, the fuse_attention pass that forms it
from what torch.export makes of scaled dot-product attention and from the sdpa composite,
and its kernel (an online
softmax over blocks of keys, ember/loops/schedules/attention.py) against the reference:
masks, rows whose keys are all masked, key counts that are not a multiple of the block,
query rows that are not a multiple of the row group."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember import Builder, interpret
from ember.driver.pass_manager import run_passes
from ember.errors import ShapeError

RNG = np.random.default_rng(8)
CPU = ember.Config(executor="cpu", disk_cache=False)


def attention_graph(b, l, d, s, e, mask=None, empty_rows_zero=True):
    g = Builder("att")
    ins = [g.input("q", "f32", (b, l, d)), g.input("kt", "f32", (b, d, s)),
           g.input("v", "f32", (b, s, e))]
    if mask is not None:
        ins.append(g.input("m", "f32", (mask, l, s)))
    g.output(g.op("attention", ins, {"empty_rows_zero": empty_rows_zero}).result)
    return g.build()


def inputs_for(graph, masked_row: bool = True):
    arrays = [RNG.standard_normal(v.shape).astype(np.float32) for v in graph.inputs]
    if len(arrays) == 4:
        mask = np.where(RNG.random(arrays[3].shape) < 0.3, -np.inf, 0).astype(np.float32)
        if masked_row:
            mask[..., 1, :] = -np.inf  # a query row that sees no key
        arrays[3] = mask
    return arrays


def numpy_attention(q, kt, v, mask=None):
    scores = (q.astype(np.float64) @ kt) + (0 if mask is None else mask)
    with np.errstate(invalid="ignore"):
        w = np.exp(scores - scores.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
    return np.nan_to_num(w) @ v


@pytest.mark.parametrize("shape, mask", [
    ((2, 3, 4, 5, 6), 1),          # smaller than a block and a row group
    ((3, 9, 16, 70, 8), 3),        # keys past a block, rows past a group, a mask per batch
    ((12, 32, 64, 128, 64), 1),    # BERT's heads
    ((2, 5, 8, 64, 16), None),     # no mask
    ((2, 6, 40, 300, 130), 1),     # a partial second block of keys, a partial tile of columns
    ((1, 4, 16, 512, 64), None),   # two whole blocks of keys
])
def test_kernel_matches_the_reference(shape, mask) -> None:
    graph = attention_graph(*shape, mask=mask)
    arrays = inputs_for(graph)
    want = interpret(graph, arrays)[0]
    np.testing.assert_allclose(want, numpy_attention(*arrays), rtol=1e-4, atol=1e-5)
    got = ember.compile(graph, config=CPU)(*arrays)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if mask is not None:
        assert (got[:, 1] == 0).all()  # the row with every key masked


@pytest.mark.parametrize("mask", [None, (1, 3), (2, 1), (2, 3)])
def test_kernel_on_two_batch_dims_with_a_scale(mask) -> None:
    """[N, H, L, D] operands with a scale, the mask's batch dims 1 or the operands'."""
    g = Builder("att4")
    ins = [g.input("q", "f32", (2, 3, 10, 8)), g.input("kt", "f32", (2, 3, 8, 70)),
           g.input("v", "f32", (2, 3, 70, 5))]
    if mask is not None:
        ins.append(g.input("m", "f32", (*mask, 10, 70)))
    g.output(g.op("attention", ins, {"scale": 0.3}).result)
    graph = g.build()
    arrays = inputs_for(graph, masked_row=False)
    want = interpret(graph, arrays)[0]
    scores = 0.3 * (arrays[0].astype(np.float64) @ arrays[1])
    if mask is not None:
        scores = scores + arrays[3]
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(want, (weights / weights.sum(-1, keepdims=True)) @ arrays[2],
                               rtol=1e-4, atol=1e-5)
    got = ember.compile(graph, config=CPU)(*arrays)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_block_without_keys_leaves_the_row_to_later_blocks() -> None:
    """A row whose first block of keys is all masked starts its softmax in the second."""
    graph = attention_graph(1, 4, 8, 600, 16, mask=1)
    arrays = inputs_for(graph, masked_row=False)
    arrays[3][0, 2, :400] = -np.inf
    got = ember.compile(graph, config=CPU)(*arrays)[0]
    np.testing.assert_allclose(got, numpy_attention(*arrays), rtol=1e-4, atol=1e-5)


def test_a_row_without_keys_is_nan_unless_empty_rows_zero() -> None:
    graph = attention_graph(1, 3, 4, 5, 2, mask=1, empty_rows_zero=False)
    arrays = inputs_for(graph)
    got, want = ember.compile(graph, config=CPU)(*arrays)[0], interpret(graph, arrays)[0]
    assert np.isnan(got[0, 1]).all() and np.isnan(want[0, 1]).all()
    np.testing.assert_allclose(got[0, [0, 2]], want[0, [0, 2]], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shapes, message", [
    (((2, 3, 4), (2, 5, 6), (2, 6, 7)), "attention needs q"),
    (((2, 3, 4), (2, 4, 6), (2, 6, 7), (2, 3, 5)), "the mask must be"),
    (((3, 4), (4, 6), (6, 7)), "at least 3"),
    (((2, 3, 4), (2, 4, 6), (2, 1, 6, 7)), "one rank"),
    (((2, 2, 3, 4), (2, 2, 4, 6), (2, 2, 6, 7), (3, 1, 3, 6)), r"the mask must be \[\*B or 1s"),
    (((2, 2, 3, 4), (2, 2, 4, 6), (2, 2, 6, 7), (2, 3, 6)), "the mask must be"),
])
def test_type_errors(shapes, message) -> None:
    g = Builder("bad")
    ins = [g.input(f"x{i}", "f32", s) for i, s in enumerate(shapes)]
    with pytest.raises(ShapeError, match=message):
        g.op("attention", ins)


def test_the_pass_forms_attention_from_exported_sdpa() -> None:
    """torch.export's F.scaled_dot_product_attention with a boolean mask (the 'safe'
    softmax that gives 0 for rows that see no key): one graph.attention, same values."""
    torch = pytest.importorskip("torch")

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, keep):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    q, k, v = (torch.randn(1, 4, 16, 8) for _ in range(3))
    keep = torch.rand(1, 1, 16, 16) > 0.3
    keep[..., 2, :] = False
    graph = ember.torch.export(Attention(), (q, k, v, keep))
    arrays = [t.numpy() for t in (q, k, v, keep)]
    want = interpret(graph, arrays)[0]
    fused = run_passes(graph, ["fuse_attention", "dce"])
    names = [op.name for op in fused.walk()]
    assert names.count("attention") == 1 and "softmax" not in names
    np.testing.assert_allclose(interpret(fused, arrays)[0], want, rtol=1e-5, atol=1e-6)
    config = ember.Config(executor="cpu", disk_cache=False, fuse_attention=True)
    np.testing.assert_allclose(ember.compile(graph, config=config)(*arrays)[0], want,
                               rtol=1e-4, atol=1e-5)


def test_the_pass_leaves_other_matmuls_alone() -> None:
    g = Builder("mm")
    a, b, c = g.input("a", "f32", (2, 3, 4)), g.input("b", "f32", (2, 4, 5)), g.input(
        "c", "f32", (2, 5, 6))
    g.output(g.matmul(g.relu(g.matmul(a, b)), c))
    graph = run_passes(g.build(), ["fuse_attention"])
    assert [op.name for op in graph.walk()].count("attention") == 0


@pytest.mark.parametrize("shapes, mask, causal, scale", [
    (((2, 3, 10, 8), (2, 3, 12, 8), (2, 3, 12, 5)), None, False, math.nan),
    (((2, 3, 10, 8), (2, 3, 12, 8), (2, 3, 12, 5)), None, True, math.nan),
    (((2, 3, 10, 8), (2, 3, 12, 8), (2, 3, 12, 5)), ("bool", (10, 12)), False, math.nan),
    (((2, 3, 10, 8), (2, 3, 12, 8), (2, 3, 12, 5)), ("f32", (2, 1, 1, 12)), False, 0.5),
    (((2, 3, 10, 8), (1, 3, 12, 8), (2, 3, 12, 5)), ("f32", (3, 10, 12)), False, 0.3),
    (((10, 8), (12, 8), (12, 5)), ("f32", (12,)), False, math.nan),
])
def test_the_pass_forms_attention_from_sdpa(shapes, mask, causal, scale) -> None:
    """The sdpa composite (ONNX's Attention, torch.compile's graphs): one graph.attention
    over the batch dims, with broadcast k, masks shared by heads or not, causal, and a
    boolean mask whose all-false row gives NaN as the composite does."""
    g = Builder("sdpa")
    ins = [g.input(name, "f32", shape) for name, shape in zip("qkv", shapes)]
    if mask is not None:
        ins.append(g.input("m", mask[0], mask[1]))
    g.output(g.sdpa(*ins, is_causal=causal, scale=scale))
    graph = g.build()
    arrays = [RNG.standard_normal(v.shape).astype(np.float32) for v in graph.inputs]
    if mask is not None and mask[0] == "bool":
        arrays[3] = RNG.random(mask[1]) < 0.7
        arrays[3][4] = False
    want = interpret(graph, arrays)[0]
    fused = run_passes(graph, ["fuse_attention", "dce"])
    names = [op.name for op in fused.walk()]
    assert names.count("attention") == 1 and "sdpa" not in names
    np.testing.assert_allclose(interpret(fused, arrays)[0], want, rtol=1e-5, atol=1e-6)
    got = ember.compile(graph, config=CPU)(*arrays)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.isnan(got).sum() == np.isnan(want).sum() == (30 if mask and mask[0] == "bool"
                                                            else 0)


@pytest.mark.parametrize("mask_shape", [None, (1, 1, 6, 9), (2, 1, 6, 9), (2, 3, 6, 9), (9,)])
def test_the_pass_forms_attention_from_4d_matmuls(mask_shape) -> None:
    """What ONNX exports of BERT hold: softmax(q @ kt + mask) @ v on [N, H, L, D], the mask
    broadcast over heads or batch or neither."""
    g = Builder("onnx_style")
    q, kt, v = (g.input(n, "f32", s) for n, s in (("q", (2, 3, 6, 4)), ("kt", (2, 3, 4, 9)),
                                                   ("v", (2, 3, 9, 5))))
    scores = g.matmul(q, kt)
    if mask_shape is not None:
        scores = g.add(scores, g.input("m", "f32", mask_shape))
    g.output(g.matmul(g.softmax(scores, axis=-1), v))
    graph = g.build()
    arrays = [RNG.standard_normal(v.shape).astype(np.float32) for v in graph.inputs]
    want = interpret(graph, arrays)[0]
    fused = run_passes(graph, ["fuse_attention", "dce"])
    names = [op.name for op in fused.walk()]
    assert names.count("attention") == 1 and "softmax" not in names
    np.testing.assert_allclose(interpret(fused, arrays)[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ember.compile(graph, config=CPU)(*arrays)[0], want,
                               rtol=1e-4, atol=1e-5)
