"""AArch64 exports of a small CNN (conv, relu, max-pool, linear, softmax) and a small
transformer block (layer norms, two-head attention with softmax, a GELU MLP): lowered for
NEON, their kernels' LLVM vectors are NEON's 128-bit registers (or whole numbers of them,
in register tiles), where Sapphire Rapids gets 512-bit ones; cross-compiled and run under
qemu, they give the reference interpreter's outputs."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ember
from ember.codegen.cpu import llvm_ir_text
from ember.codegen.llvm import program_module
from ember.driver.pipeline import lower_to_program
from ember.loops.ir import For, Kernel, walk_stmts
from ember.target import Target
from tests.runtime.test_aot import QEMU, assert_close, build_main, needs_cross, run_main

AARCH64 = Target.named("aarch64-linux-gnu")
SAPPHIRE = Target.named("sapphirerapids")


def cnn_graph() -> ember.Graph:
    """Two conv3x3 + relu + maxpool2 stages on a 3x16x16 image, a linear layer, softmax."""
    rng = np.random.default_rng(0)
    b = ember.Builder("cnn")

    def stage(h, cin, cout):
        w = (rng.standard_normal((cout, cin, 3, 3)) / (3 * np.sqrt(cin))).astype(np.float32)
        bias = (rng.standard_normal(cout) / 10).astype(np.float32)
        h = b.relu(b.conv(h, b.constant(w), b.constant(bias), pads=(1, 1, 1, 1)))
        return b.max_pool(h, kernel=(2, 2), strides=(2, 2))

    h = stage(stage(b.input("x", "f32", (1, 3, 16, 16)), 3, 8), 8, 16)
    w = (rng.standard_normal((256, 10)) / 16).astype(np.float32)
    logits = b.add(b.matmul(b.reshape(h, shape=(1, 256)), b.constant(w)),
                   b.constant(np.full(10, 0.1, np.float32)))
    b.output(b.softmax(logits, axis=-1))
    return b.build()


def transformer_graph(seq: int = 8, d: int = 32, heads: int = 2, ff: int = 64) -> ember.Graph:
    """A pre-norm block: x + attention(layer_norm(x)), then + mlp(layer_norm(.)) with GELU."""
    rng = np.random.default_rng(1)
    b = ember.Builder("block")

    def weight(*shape):
        return b.constant((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    def norm(x):
        scale = b.constant((1 + rng.standard_normal(d) / 10).astype(np.float32))
        shift = b.constant((rng.standard_normal(d) / 10).astype(np.float32))
        return b.layer_norm(x, scale, shift, axis=-1, epsilon=1e-5)

    def split(t):  # [seq, d] -> [heads, seq, d / heads]
        return b.transpose(b.reshape(t, shape=(seq, heads, d // heads)), perm=(1, 0, 2))

    x = b.input("x", "f32", (seq, d))
    h = norm(x)
    q, k, v = (split(b.matmul(h, weight(d, d))) for _ in range(3))
    scores = b.mul(b.matmul(q, b.transpose(k, perm=(0, 2, 1))), 1 / np.sqrt(d // heads))
    attention = b.matmul(b.softmax(scores, axis=-1), v)
    merged = b.reshape(b.transpose(attention, perm=(1, 0, 2)), shape=(seq, d))
    x = b.add(x, b.matmul(merged, weight(d, d)))
    hidden = b.gelu(b.add(b.matmul(norm(x), weight(d, ff)), weight(1, ff)))
    b.output(b.add(x, b.matmul(hidden, weight(ff, d))))
    return b.build()


MODELS = {"cnn": (cnn_graph, (1, 3, 16, 16)), "transformer": (transformer_graph, (8, 32))}


# -- the LLVM IR's vector types ------------------------------------------------------------
def bits(lanes: str, element: str) -> int:
    """The width of <lanes x element>; an i1 mask counts one bit a lane, a pointer 64."""
    size = {"half": 16, "bfloat": 16, "float": 32, "double": 64, "ptr": 64}.get(element)
    return int(lanes) * (size if size is not None else int(element.removeprefix("i")))


def vector_types(ir_text: str) -> set[tuple[int, str]]:
    """Every <lanes x element> in `ir_text`, as (lanes, element)."""
    return {(int(n), t) for n, t in re.findall(r"<(\d+) x (\w+)>", ir_text)}


def functions(ir_text: str) -> dict[str, str]:
    """The body of each function the module defines, by name (declarations left out)."""
    return {m[1]: m[0] for m in re.finditer(r'^define [^@]*@"?([\w.$]+)"?\(.*?^}$', ir_text,
                                            re.M | re.S)}


def register_tiled(kernel: Kernel) -> bool:
    """Whether a kernel keeps a tile of several vectors in registers (an unrolled loop over
    a vectorized one: GEMM, conv and pool tiles, transposed blocks)."""
    return any(s.kind == "unrolled" and any(isinstance(t, For) and t.kind == "vectorized"
                                            for t in s.body)
               for s in walk_stmts(kernel.body) if isinstance(s, For))


def lowered_ir(name: str, target: Target) -> tuple[dict[str, Kernel], dict[str, str]]:
    """The model's kernels lowered for `target`, and its unoptimized LLVM IR by function."""
    program, plan = lower_to_program(MODELS[name][0](),
                                     ember.Config(executor="cpu", target=target.name))
    text = llvm_ir_text(program_module(program, plan.offsets), target, optimized=False)
    return {k.name: k for k in program.kernels}, functions(text)


def kernel_of(function: str, kernels: dict[str, Kernel]) -> Kernel | None:
    """The kernel an LLVM function was emitted for (a parallel loop's body is outlined as
    <kernel>.parallelN); None for the program's entry."""
    return kernels.get(function.split(".", 1)[0])


def test_vector_bits_counts_masks_by_lanes() -> None:
    """<4 x float> is 128 bits, <16 x i1> 16, <8 x half> 128, <2 x ptr> 128."""
    assert [bits(*v) for v in (("4", "float"), ("16", "i1"), ("8", "half"), ("2", "ptr"),
                               ("16", "i8"), ("2", "double"))] == [128, 16, 128, 128, 128, 128]


@pytest.mark.parametrize("name", MODELS)
def test_aarch64_plain_kernels_use_one_neon_register_per_vector(name) -> None:
    """For NEON, kernels without register tiles (pads, norms, softmax, reshapes) have only
    vectors of at most 128 bits, <4 x float> among them."""
    kernels, bodies = lowered_ir(name, AARCH64)
    plain = {f: body for f, body in bodies.items()
             if (k := kernel_of(f, kernels)) is not None and not register_tiled(k)}
    assert plain, "expected kernels that the default schedule vectorizes"
    wide = {f: sorted(v for v in vector_types(body) if bits(*v) > 128)
            for f, body in plain.items()}
    assert not any(wide.values()), {f: v for f, v in wide.items() if v}
    assert any((4, "float") in vector_types(body) for body in plain.values())


@pytest.mark.parametrize("name", MODELS)
def test_aarch64_float_vectors_are_whole_neon_registers(name) -> None:
    """Every float vector, register tiles' included, is at most one NEON register or a whole
    number of them (a tile of nr lanes is nr / 4 registers: LLVM splits it, never pads)."""
    _, bodies = lowered_ir(name, AARCH64)
    odd = {f: sorted(n for n, t in vector_types(body) if t == "float" and n > 4 and n % 4)
           for f, body in bodies.items()}
    assert not any(odd.values()), {f: v for f, v in odd.items() if v}


@pytest.mark.parametrize("name", MODELS)
def test_sapphirerapids_gets_avx512_vectors_where_aarch64_gets_neon(name) -> None:
    """The same model for Sapphire Rapids has <16 x float>, in its plain kernels too."""
    kernels, bodies = lowered_ir(name, SAPPHIRE)
    plain = [body for f, body in bodies.items()
             if (k := kernel_of(f, kernels)) is not None and not register_tiled(k)]
    assert any((16, "float") in vector_types(body) for body in plain)
    widest = max(bits(*v) for body in plain for v in vector_types(body))
    assert widest == 512


# -- running under qemu ---------------------------------------------------------------------
@needs_cross
@pytest.mark.parametrize("name", MODELS)
def test_aarch64_export_runs_under_qemu_like_the_interpreter(name, tmp_path) -> None:
    """The AArch64 library, run by the example program under qemu, gives interpret's."""
    build, shape = MODELS[name]
    graph = build()
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    want = ember.interpret(graph, [x])
    out = ember.export(graph, [x], tmp_path, target="aarch64-linux-gnu")
    build_main(out, "aarch64-linux-gnu-gcc")
    assert_close(run_main(out, [x], QEMU), want, atol=1e-5)
