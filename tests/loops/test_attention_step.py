"""Attention through the scheduling stage (ember/loops/schedules/attention.py): the lowering
writes the plain nest, an online softmax one key at a time, which `match_attention` reads
back exactly or not at all, and the `attention` step rebuilds in blocks of keys and groups
of rows; any parameters give the interpreter's values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import ember
from ember import Builder
from ember.codegen import cpu
from ember.codegen.llvm import kernel_module
from ember.dtypes import DType
from ember.errors import ScheduleError
from ember.loops.ir import Const, For, walk_stmts
from ember.loops.lower import lower_graph
from ember.loops.primitives import PRIMITIVES
from ember.loops.schedules import attention as att
from ember.loops.schedules.gemm import register_tile
from ember.loops.text import print_kernel
from ember.target import Target

HOST = Target.host()
F32 = DType.f32
RNG = np.random.default_rng(41)


def attention_graph(b=2, rows=5, dim=4, keys=37, width=6, mask=False, scale=None,
                    empty_rows_zero=True):
    g = Builder("att")
    ins = [g.input("q", "f32", (b, rows, dim)), g.input("kt", "f32", (b, dim, keys)),
           g.input("v", "f32", (b, keys, width))]
    if mask:
        ins.append(g.input("m", "f32", (1, rows, keys)))  # broadcast over the batch
    attrs = {"empty_rows_zero": empty_rows_zero, **({"scale": scale} if scale else {})}
    g.output(g.op("attention", ins, attrs).result)
    return g.build()


def inputs(graph) -> list[np.ndarray]:
    arrays = [RNG.standard_normal(v.shape).astype(np.float32) for v in graph.inputs]
    if len(arrays) == 4:  # a mask with a row that sees no key
        arrays[3] = np.where(RNG.random(arrays[3].shape) < 0.3, -np.inf, 0).astype(np.float32)
        arrays[3][0, 1, :] = -np.inf
    return arrays


def plain_kernel(graph):
    kernel, = lower_graph(graph, target=HOST).kernels
    return kernel


def run(kernel, arrays) -> np.ndarray:
    """The kernel compiled for the host, run on `arrays`."""
    out = np.zeros(kernel.params[-1].shape, np.float32)
    jit = cpu.compile_module(kernel_module([kernel]), target=HOST)
    jit.kernel(kernel.name, len(arrays) + 1)(*(a.ctypes.data for a in [*arrays, out]))
    return out


@pytest.mark.parametrize("mask, scale", [(False, None), (True, None), (False, 0.5),
                                         (True, 0.25)])
def test_the_lowering_writes_the_plain_nest_and_the_matcher_reads_it(mask, scale) -> None:
    graph = attention_graph(mask=mask, scale=scale)
    kernel = plain_kernel(graph)
    assert not any(isinstance(s, For) and s.kind != "serial" for s in walk_stmts(kernel.body))
    (loop, nest), = att.nests(kernel)
    assert loop == kernel.body[0].var.name
    a = nest.attention
    assert (a.batch, a.rows, a.dim, a.keys, a.width) == ((2,), 5, 4, 37, 6)
    assert (a.mask is not None) == mask and a.empty_rows_zero
    arrays = inputs(graph)
    np.testing.assert_allclose(run(kernel, arrays), ember.interpret(graph, arrays)[0],
                               rtol=1e-5, atol=1e-6)


def test_a_nest_that_differs_anywhere_is_not_attention() -> None:
    """The matcher writes back what it read off and compares: a changed statement (here the
    running max kept as the score instead of the new maximum) is some other nest."""
    kernel = plain_kernel(attention_graph())
    row = kernel.body[0].body[0]
    keys = row.body[3]
    top_again = keys.body[-1]
    changed = dataclasses.replace(top_again, value=keys.body[0].value)  # top = 0
    keys = dataclasses.replace(keys, body=[*keys.body[:-1], changed])
    row = dataclasses.replace(row, body=[*row.body[:3], keys, row.body[4]])
    outer = dataclasses.replace(kernel.body[0], body=[row])
    assert att.nests(dataclasses.replace(kernel, body=[outer])) == []


@pytest.mark.parametrize("key_block, row_group, tile, lanes", [
    (256, 4, 64, 16), (8, 2, 16, 8), (37, 3, 8, 8), (5, 1, 4, 4), (64, 8, 32, 8),
    (64, 6, 16, 1)])
@pytest.mark.parametrize("mask", [False, True])
def test_the_step_computes_the_plain_nests_values(key_block, row_group, tile, lanes,
                                                  mask) -> None:
    """Blocks that divide the keys or not, groups past the rows, tiles past the width; a
    block that is not a whole number of vectors is scored in whole ones."""
    graph = attention_graph(mask=mask, scale=0.7)
    kernel = plain_kernel(graph)
    loop = kernel.body[0].var.name
    step, _ = PRIMITIVES["attention"]
    scheduled = step(kernel, loop, key_block, row_group, tile, lanes)
    assert any(isinstance(s, For) and s.kind == "vectorized" for s in walk_stmts(scheduled.body))
    group = min(row_group, 5)
    shapes = {b.shape for b in scheduled.locals}
    scored = -(-min(key_block, 37) // lanes) * lanes
    assert (group, scored) in shapes and (group, 6) in shapes
    arrays = inputs(graph)
    np.testing.assert_allclose(run(scheduled, arrays), run(kernel, arrays), rtol=1e-5,
                               atol=1e-6)


def test_the_step_refuses_what_it_cannot_schedule() -> None:
    kernel = plain_kernel(attention_graph())
    step, _ = PRIMITIVES["attention"]
    with pytest.raises(ScheduleError, match="not the outermost loop of a plain attention"):
        step(kernel, kernel.body[0].body[0].var.name, 64, 4, 16, 8)  # an inner loop
    with pytest.raises(ScheduleError, match="row_group must be positive"):
        step(kernel, kernel.body[0].var.name, 64, 0, 16, 8)
    with pytest.raises(ScheduleError, match="not a whole number of vectors of 8"):
        step(kernel, kernel.body[0].var.name, 64, 4, 12, 8)


def test_the_compiled_kernel_has_the_default_schedule_and_its_values() -> None:
    """The default step: key blocks of 256, and the GEMM micro-kernel's register tile
    (rows by vectors) in the registers: 6 x 2 with AVX2's 16, 6 x 4 with AVX-512's 32 on
    two FMA units."""
    graph = attention_graph(b=1, rows=9, dim=8, keys=300, width=20, mask=True)
    arrays = inputs(graph)
    config = ember.Config(executor="cpu", disk_cache=False)
    got, = ember.compile(graph, config=config)(*arrays)
    np.testing.assert_allclose(got, ember.interpret(graph, arrays)[0], rtol=1e-4, atol=1e-5)
    kernel = plain_kernel(graph)
    (_, nest), = att.nests(kernel)
    rows, lanes = register_tile(HOST)
    assert att.default_parameters(nest, HOST) == {
        "key_block": 256, "row_group": min(rows, 8), "tile_vectors": lanes // HOST.lanes(F32)}
    assert att.step_arguments(nest, att.default_parameters(nest, HOST), HOST) == \
        (256, min(rows, 8), lanes, HOST.lanes(F32))
    for preset, tile in (("znver3", (6, 2)), ("sapphirerapids", (6, 4))):
        values = att.default_parameters(nest, Target.named(preset))
        assert (values["row_group"], values["tile_vectors"]) == tile
        rows, vectors = tile  # accumulators, the vectors of kt and a broadcast of q
        assert rows * vectors + vectors + 1 <= Target.named(preset).vector_registers


@pytest.mark.parametrize("keys", [197, 257, 300])
def test_keys_not_a_whole_number_of_tiles_get_constant_counts_and_threads(keys) -> None:
    """ViT's 197 keys fit one block of 197: 6 whole tiles and one of 5; DINOv2's 257 are a
    block of 256 and one of 1. Every block's and tile's lanes are a constant count (a count
    computed per tile masked every lane: 7x slower), and the heads run in parallel (the
    verifier sees each thread write the scores before reading them)."""
    graph = attention_graph(b=12, rows=9, dim=8, keys=keys, width=16)
    arrays = inputs(graph)
    compiled = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))
    np.testing.assert_allclose(compiled(*arrays)[0], ember.interpret(graph, arrays)[0],
                               rtol=1e-4, atol=1e-5)
    kernel = plain_kernel(graph)
    (loop, nest), = att.nests(kernel)
    lanes = HOST.lanes(DType.f32)
    scheduled = PRIMITIVES["attention"][0](kernel, loop, 256, 4, 4 * lanes, lanes)
    assert not [s for s in walk_stmts(scheduled.body) if isinstance(s, For) and
                s.kind == "vectorized" and not isinstance(s.stop, Const)]
    assert "parallel" in ember.explain(compiled, measure=False).kernels[0].schedule


def test_weights_below_the_smallest_normal_float_are_zero() -> None:
    """A mask of -100 (Swin's shifted windows) makes weights of exp(-100): denormals,
    each product a microcode assist on Intel cores. The scheduled softmax makes them 0,
    which no sum of the row can show: the values are the interpreter's."""
    graph = attention_graph(b=2, rows=7, dim=8, keys=49, width=16, mask=True)
    arrays = inputs(graph)
    arrays[3] = np.where(RNG.random(arrays[3].shape) < 0.5, -100.0, 0).astype(np.float32)
    got, = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))(*arrays)
    np.testing.assert_allclose(got, ember.interpret(graph, arrays)[0], rtol=1e-5, atol=1e-6)
    kernel = plain_kernel(graph)
    (loop, nest), = att.nests(kernel)
    scheduled = att.attention(kernel, loop, *att.step_arguments(
        nest, att.default_parameters(nest, HOST), HOST))
    assert print_kernel(scheduled).count("-87.33654") == 2  # the weights and corrections
