"""`make demo`: the compiler at work.

1. A transformer block built as graph IR: its text, the pass pipeline with timings, and
   the reference interpreter against NumPy (`run_ir_demo`).
2. ResNet-50 (built from its `transformers` config, random weights) compiled through the
   loop IR and LLVM, checked against PyTorch, with compile time, latency against PyTorch
   eager and the kernel count (`run_model_demo`).
"""

from __future__ import annotations

import time

import numpy as np

from ember import Builder, DType, interpret, parse_graph, print_graph
from ember.driver.pass_manager import PassManager
from ember.graph.passes import DEFAULT_PIPELINE

SEQ, DIM, HIDDEN = 8, 16, 32


def build_block(rng: np.random.Generator):
    """Self-attention + MLP with pre-layer-norm, the shape of a GPT-2 block."""
    weights = {name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
               for name, shape in [("wq", (DIM, DIM)), ("wk", (DIM, DIM)), ("wv", (DIM, DIM)),
                                   ("w1", (DIM, HIDDEN)), ("w2", (HIDDEN, DIM))]}
    b = Builder("block")
    x = b.input("x", DType.f32, (SEQ, DIM))
    w = {k: b.constant(v, name=k) for k, v in weights.items()}
    h = b.layer_norm(x, epsilon=1e-5)
    q, k, v = (b.matmul(h, w[n]) for n in ("wq", "wk", "wv"))
    attn = b.sdpa(q, k, v, is_causal=True)
    x = b.add(x, attn)
    h = b.layer_norm(x, epsilon=1e-5)
    x = b.add(x, b.matmul(b.gelu(b.matmul(h, w["w1"]), approximate="tanh"), w["w2"]))
    b.output(x)
    return b.build(), weights


def numpy_block(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    def layer_norm(t):
        mean = t.mean(-1, keepdims=True)
        return (t - mean) / np.sqrt(t.var(-1, keepdims=True) + 1e-5)

    def gelu_tanh(t):
        return 0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t**3)))

    h = layer_norm(x)
    q, k, v = h @ w["wq"], h @ w["wk"], h @ w["wv"]
    scores = q @ k.T / np.sqrt(DIM) + np.triu(np.full((SEQ, SEQ), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    x = x + (p / p.sum(-1, keepdims=True)) @ v
    return x + gelu_tanh(layer_norm(x) @ w["w1"]) @ w["w2"]


def run_demo() -> None:
    run_ir_demo()
    run_model_demo()


def run_ir_demo() -> None:
    rng = np.random.default_rng(0)
    graph, weights = build_block(rng)
    text = print_graph(graph, constants="elide")
    print("== graph IR as built (constants elided) ==")
    print(text)
    assert print_graph(parse_graph(print_graph(graph))) == print_graph(graph)

    x = rng.standard_normal((SEQ, DIM)).astype(np.float32)
    before = interpret(graph, [x])[0]
    ops_built = sum(1 for _ in graph.walk())
    manager = PassManager(DEFAULT_PIPELINE, verify_each=True)
    start = time.perf_counter()
    optimized = manager.run(graph)
    elapsed = time.perf_counter() - start
    print(f"== after {','.join(DEFAULT_PIPELINE)} ({elapsed * 1e3:.1f} ms) ==")
    print(print_graph(optimized, constants="elide"))
    print(manager.timing_report())

    after = interpret(optimized, [x])[0]
    want = numpy_block(x.astype(np.float64), {k: v.astype(np.float64) for k, v in weights.items()})
    print(f"\nops: {ops_built} as built (composites included),"
          f" {sum(1 for _ in optimized.walk())} primitive ops after the pipeline")
    err_ref = float(np.max(np.abs(before - want)))
    err_opt = float(np.max(np.abs(after - want)))
    print(f"max |interpreter - numpy| = {err_ref:.2e} (as built), {err_opt:.2e} (optimized)")
    if err_ref > 1e-4 or err_opt > 1e-4:
        raise SystemExit("demo: results disagree with NumPy")
    print("demo: OK")


def _median_ms(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return sorted(times)[len(times) // 2]


def run_model_demo() -> None:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import ResNetConfig, ResNetModel

    import ember
    from ember.driver import pipeline

    torch.manual_seed(0)
    model = ResNetModel(ResNetConfig()).eval()
    x = torch.randn(1, 3, 224, 224)
    print("\n== ResNet-50 (transformers config, random weights) through the compiled path ==")
    start = time.perf_counter()
    compiled = ember.compile(model, (x,), config=ember.Config(executor="cpu", disk_cache=False),
                             strict=True)
    compile_s = time.perf_counter() - start
    with torch.no_grad():
        want = model(x).pooler_output
        got = compiled(x).pooler_output
        ember_ms, eager_ms = (_median_ms(lambda f=f: f(x)) for f in (compiled, model))
    error = float((got - want).abs().max() / want.abs().max())
    print(f"compile: {compile_s:.1f} s   kernels: {pipeline.last_build.get('kernels')}"
          f"   stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in
                                      pipeline.last_build.get("timings", {}).items()))
    print(f"latency: Ember {ember_ms:.0f} ms, PyTorch eager {eager_ms:.0f} ms"
          f" (Ember takes {ember_ms / eager_ms:.2f}x eager's time; fused kernels, blocked"
          f" GEMM and implicit-GEMM convolutions; see docs/benchmarks.md)")
    print(f"max relative difference to PyTorch: {error:.1e}")
    if error > 1e-3:
        raise SystemExit("demo: ResNet-50 disagrees with PyTorch")
    print("demo: ResNet-50 OK")
