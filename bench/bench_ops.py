"""Op-level benchmark: fused kernels against PyTorch eager, torch.compile and ONNX Runtime,
side by side in one run, with the machine's copy bandwidth measured in the same run.

    python bench/bench_ops.py [--repeat 20] [--threads 2] [--only TEXT] [--no-record]

Rows: relu(x * w + b) on 16M floats (the fused elementwise kernel: Ember both into a
preallocated output, `out=`, and called the ordinary way), softmax 256x4096, layer-norm
512x768, a 3x3 convolution 1x64x56x56 (64 filters; its filter an input, then a constant
to every peer, which Ember computes by Winograd's F(2x2, 3x3)) and linear 128x768x3072 +
GELU (its weights constants to every peer, as in a deployed model; the bytes of rows with
constant weights count x and y), and scaled dot-product attention, 12 heads of 64 at
sequence 128 (one kernel with an online softmax); then the kernel classes behind the
model zoo's cliffs: attention at ViT's, Swin's and SegFormer's shapes, MobileNetV2's
depthwise and 1x1 convolutions with ReLU6, and shallow matmuls (`--only TEXT` runs the
rows whose names contain it). Each
row reports milliseconds, the GB/s of the minimal traffic (each input read once, the
output written once) and, for Ember's `out=` call, the fraction of the copy bandwidth (a
copy into a preallocated array of the same bytes); the convolution, the linear layer and
attention also their GFLOP/s and fraction of the FMA peak. Ratios matter, not absolute times: the
machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ember  # noqa: E402
from bench.bench_models import machine, median_ms, publish  # noqa: E402


def ort_session(model, threads: int):
    try:
        import onnxruntime
    except ImportError:
        return None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])


def onnx_model(nodes, inputs, output, opset=17, initializers=()):
    from onnx import TensorProto, helper, numpy_helper

    def info(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))

    graph = helper.make_graph(nodes, "bench", [info(n, s) for n, s in inputs],
                              [info(*output)],
                              [numpy_helper.from_array(a, n) for n, a in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


# Each case: (name, input arrays, ember graph builder, torch function, onnx model)
def relu_affine_case(n: int):
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    g = ember.Builder("relu_affine")
    gx, gw, gb = (g.input(k, "f32", (n,)) for k in "xwb")
    g.output(g.relu(g.add(g.mul(gx, gw), gb)))
    from onnx import helper

    nodes = [helper.make_node("Mul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
             helper.make_node("Relu", ["u"], ["y"])]
    model = onnx_model(nodes, [(k, (n,)) for k in "xwb"], ("y", (n,)))
    return (f"relu(x*w+b) {n // (1 << 20)}M", [x, w, b], g.build(),
            lambda x, w, b: torch.relu(x * w + b), model)


def softmax_case(rows: int, cols: int):
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    g = ember.Builder("softmax")
    g.output(g.softmax(g.input("x", "f32", x.shape), axis=-1))
    from onnx import helper

    model = onnx_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                       [("x", x.shape)], ("y", x.shape))
    return (f"softmax {rows}x{cols}", [x], g.build(), lambda x: torch.softmax(x, -1), model)


def layer_norm_case(rows: int, cols: int):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    gamma, beta = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(
        np.float32)
    g = ember.Builder("layer_norm")
    gx = g.input("x", "f32", x.shape)
    gg, gb = g.input("g", "f32", (cols,)), g.input("b", "f32", (cols,))
    g.output(g.layer_norm(gx, gg, gb, axis=-1, epsilon=1e-5))
    from onnx import helper

    model = onnx_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                                         epsilon=1e-5)],
                       [("x", x.shape), ("g", (cols,)), ("b", (cols,))], ("y", x.shape))
    return (f"layer-norm {rows}x{cols}", [x, gamma, beta], g.build(),
            lambda x, g, b: torch.nn.functional.layer_norm(x, (cols,), g, b, 1e-5), model)


def conv3x3_case(channels: int, size: int, constant: bool = False):
    """A 3x3 convolution, padding 1, batch 1 (ResNet's most common shape at 64x56x56). With
    `constant`, the filter is a constant to every peer (an ONNX initializer, closed over by
    torch), as in a deployed model: Ember then computes it by Winograd's F(2x2, 3x3) and
    ONNX Runtime packs it ahead of the calls; otherwise it is an input, and Ember's conv
    is the direct implicit GEMM."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    w = (rng.standard_normal((channels, channels, 3, 3)) / 24).astype(np.float32)
    g = ember.Builder("conv3x3")
    image = g.input("x", "f32", x.shape)
    filters = g.constant(w) if constant else g.input("w", "f32", w.shape)
    g.output(g.conv(image, filters, pads=(1, 1, 1, 1)))
    from onnx import helper

    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    flops = 2 * channels * channels * 9 * size * size
    name = f"conv 3x3 {channels}x{size}x{size}"
    if constant:
        model = onnx_model([node], [("x", x.shape)], ("y", x.shape), initializers=[("w", w)])
        wt = torch.from_numpy(w)
        return (f"{name}, constant filter", [x], g.build(),
                lambda x: torch.nn.functional.conv2d(x, wt, padding=1), model, flops)
    model = onnx_model([node], [("x", x.shape), ("w", w.shape)], ("y", x.shape))
    return (name, [x, w], g.build(),
            lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), model, flops)


def linear_gelu_case(rows: int, inner: int, cols: int):
    """x @ W + b, then GELU (erf): a transformer's feed-forward up-projection. W and b are
    the layer's weights, constants to every peer (ONNX initializers, closed over by torch),
    as in a deployed model: Ember and ONNX Runtime both pack W once, ahead of the calls."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, inner)).astype(np.float32)
    w = (rng.standard_normal((inner, cols)) / np.sqrt(inner)).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    g = ember.Builder("linear_gelu")
    g.output(g.gelu(g.add(g.matmul(g.input("x", "f32", x.shape), g.constant(w)),
                          g.constant(b))))
    from onnx import helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]),
             helper.make_node("Add", ["t", "b"], ["u"]),
             helper.make_node("Gelu", ["u"], ["y"])]
    model = onnx_model(nodes, [("x", x.shape)], ("y", (rows, cols)), opset=20,
                       initializers=[("w", w), ("b", b)])
    wt, bt = torch.from_numpy(w), torch.from_numpy(b)
    return (f"linear {rows}x{inner}x{cols} + GELU", [x], g.build(),
            lambda x: torch.nn.functional.gelu(x @ wt + bt), model, 2 * rows * inner * cols)


def attention_case(heads: int, length: int, dim: int, keys: int | None = None):
    """Scaled dot-product attention, batch 1 (BERT-base's heads at sequence 128; `keys`:
    fewer keys than queries, as SegFormer's reduced ones): softmax(q @ k^T / sqrt(d)) @ v.
    Ember forms one kernel with an online softmax; PyTorch calls its own fused kernel; ONNX
    Runtime gets the MatMul, Softmax, MatMul graph that exporters write (opset 17 has no
    Attention op)."""
    keys = keys or length
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, heads, length, dim)).astype(np.float32)
    k, v = (rng.standard_normal((1, heads, keys, dim)).astype(np.float32) for _ in range(2))
    g = ember.Builder("attention")
    g.output(g.sdpa(*(g.input(n, "f32", a.shape) for n, a in zip("qkv", (q, k, v)))))
    from onnx import helper

    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["x"]),
             helper.make_node("Softmax", ["x"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    scale = np.array(1 / np.sqrt(dim), np.float32)
    model = onnx_model(nodes, [(n, a.shape) for n, a in zip("qkv", (q, k, v))],
                       ("y", q.shape), initializers=[("scale", scale)])
    name = f"attention {heads}x{length}x{dim}" + (f", {keys} keys" if keys != length else "")
    return (name, [q, k, v], g.build(),
            lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v), model,
            4 * heads * length * keys * dim)


def relu6_conv_model(conv, x_shape: tuple, y_shape: tuple, w: np.ndarray, bias: np.ndarray):
    """An ONNX model of `conv` (x, w, b -> c) then Clip(c, 0, 6), its weights initializers."""
    from onnx import helper

    nodes = [conv, helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    return onnx_model(nodes, [("x", x_shape)], ("y", y_shape),
                      initializers=[("w", w), ("b", bias), ("lo", np.array(0, np.float32)),
                                    ("hi", np.array(6, np.float32))])


def depthwise_case(channels: int, size: int, stride: int):
    """A depthwise 3x3 convolution, padding 1, with its bias and ReLU6 (MobileNetV2's), the
    filter and bias constants to every peer."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    w = (rng.standard_normal((channels, 1, 3, 3)) / 3).astype(np.float32)
    bias = rng.standard_normal(channels).astype(np.float32)
    g = ember.Builder("depthwise")
    y = g.conv(g.input("x", "f32", x.shape), g.constant(w), g.constant(bias),
               strides=(stride, stride), pads=(1, 1, 1, 1), groups=channels)
    g.output(g.clip(y, min=0.0, max=6.0))
    from onnx import helper

    out = size // stride
    model = relu6_conv_model(helper.make_node(
        "Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[stride, stride],
        group=channels), x.shape, (1, channels, out, out), w, bias)
    wt, bt = torch.from_numpy(w), torch.from_numpy(bias)
    return (f"depthwise 3x3 {channels}x{size}x{size} /{stride} + ReLU6", [x], g.build(),
            lambda x: torch.clamp(torch.nn.functional.conv2d(
                x, wt, bt, stride=stride, padding=1, groups=channels), 0, 6), model,
            2 * channels * 9 * out * out)


def pointwise_case(inputs: int, outputs: int, size: int):
    """A 1x1 convolution with its bias and ReLU6 (MobileNetV2's expansions), the filter and
    bias constants to every peer."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, inputs, size, size)).astype(np.float32)
    w = (rng.standard_normal((outputs, inputs, 1, 1)) / np.sqrt(inputs)).astype(np.float32)
    bias = rng.standard_normal(outputs).astype(np.float32)
    g = ember.Builder("pointwise")
    y = g.conv(g.input("x", "f32", x.shape), g.constant(w), g.constant(bias))
    g.output(g.clip(y, min=0.0, max=6.0))
    from onnx import helper

    model = relu6_conv_model(helper.make_node("Conv", ["x", "w", "b"], ["c"]), x.shape,
                             (1, outputs, size, size), w, bias)
    wt, bt = torch.from_numpy(w), torch.from_numpy(bias)
    return (f"conv 1x1 {inputs}->{outputs} at {size}x{size} + ReLU6", [x], g.build(),
            lambda x: torch.clamp(torch.nn.functional.conv2d(x, wt, bt), 0, 6), model,
            2 * inputs * outputs * size * size)


def matmul_case(m: int, k: int, n: int):
    """A matmul of two inputs (a shallow one, K small: SegFormer's and LeViT's)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    g = ember.Builder("matmul")
    g.output(g.matmul(g.input("a", "f32", a.shape), g.input("b", "f32", b.shape)))
    from onnx import helper

    model = onnx_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                       [("a", a.shape), ("b", b.shape)], ("y", (m, n)))
    return (f"matmul {m}x{k}x{n}", [a, b], g.build(), lambda a, b: a @ b, model, 2 * m * k * n)


def fma_peak(threads: int) -> float:
    """The FMA peak on `threads` threads, GFLOP/s (measured once per machine and cached)."""
    from ember.runtime.machine import measure
    from ember.target import Target

    return measure(Target.host()).peak_gflops_one_thread * threads


def copy_gbps(nbytes: int, repeat: int) -> float:
    """Copy bandwidth (read + write) into a preallocated array, the roof of one pass: the
    faster of NumPy's copy (one thread) and PyTorch's (which uses the threads it has)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    numpy_ms = median_ms(lambda: np.copyto(dst, src), repeat)
    tsrc, tdst = torch.from_numpy(src), torch.from_numpy(dst)
    torch_ms = median_ms(lambda: tdst.copy_(tsrc), repeat)
    return 2 * nbytes / min(numpy_ms, torch_ms) / 1e6


def bench_case(case, repeat: int, threads: int) -> dict:
    name, arrays, graph, torch_fn, model, *flops = case
    tensors = [torch.from_numpy(a) for a in arrays]
    compiled = ember.compile(graph, config=ember.Config(executor="cpu", disk_cache=False))
    want = torch_fn(*tensors).numpy()
    got = compiled(*arrays)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    out = [np.empty_like(want)]
    row = {"name": name, "bytes": sum(a.nbytes for a in arrays) + want.nbytes,
           "flops": flops[0] if flops else None}
    row["ember_out"] = median_ms(lambda: compiled.run(*arrays, out=out), repeat)
    row["ember"] = median_ms(lambda: compiled(*arrays), repeat)
    with torch.no_grad():
        row["eager"] = median_ms(lambda: torch_fn(*tensors), repeat)
        try:
            inductor = torch.compile(torch_fn)
            row["inductor"] = median_ms(lambda: inductor(*tensors), repeat)
        except Exception as e:  # noqa: BLE001  (a peer failing is reported, not fatal)
            print(f"  torch.compile: {type(e).__name__}: {e}", file=sys.stderr)
            row["inductor"] = None
    session = ort_session(model, threads)
    if session is not None:
        feeds = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
        row["ort"] = median_ms(lambda: session.run(None, feeds), repeat)
    else:
        row["ort"] = None
    kernels = ember.explain(compiled).kernels
    row["kernels"] = len(kernels)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default="", help="the rows whose names contain this")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["EMBER_NUM_THREADS"] = str(args.threads)  # the run's, not an inherited one
    cases = [relu_affine_case(1 << 24), softmax_case(256, 4096), layer_norm_case(512, 768),
             conv3x3_case(64, 56), conv3x3_case(64, 56, constant=True),
             linear_gelu_case(128, 768, 3072), attention_case(12, 128, 64),
             # The kernel classes of the zoo's cliffs (docs/benchmarks.md, stop 40).
             attention_case(12, 197, 64), attention_case(192, 49, 32),
             attention_case(1, 3136, 32, keys=49), depthwise_case(144, 56, 2),
             depthwise_case(576, 14, 1), pointwise_case(16, 96, 112),
             pointwise_case(32, 192, 28), matmul_case(3136, 32, 128),
             matmul_case(12544, 16, 96)]
    cases = [case for case in cases if args.only in case[0]]
    rows = []
    for case in cases:
        print(f"benchmarking {case[0]} ...", file=sys.stderr)
        rows.append(bench_case(case, args.repeat, args.threads))
    copy = copy_gbps(max(r["bytes"] for r in rows) // 2, args.repeat)
    peak = fma_peak(args.threads)

    def ms(v):
        return f"{v:.3f}" if v is not None else "n/a"

    def ratio(a, b):
        return f"{b / a:.2f}x" if a and b else "n/a"

    lines = [f"### {datetime.date.today()}: fused ops, f32, {args.threads} threads"
             f" (median of {args.repeat})", "", f"Machine: {machine()}.", "",
             f"Copy into a preallocated array (the same run, the faster of NumPy and PyTorch):"
             f" {copy:.1f} GB/s (read + write).",
             "",
             f"FMA peak (measured by ember.runtime.machine): {peak:.0f} GFLOP/s on"
             f" {args.threads} threads.",
             "",
             "| op | kernels | Ember out= ms | Ember ms | eager ms | torch.compile ms |"
             " ONNX Runtime ms | Ember out= GB/s | of copy | Ember GFLOP/s | of peak |"
             " speed-up vs ORT | vs torch.compile |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gbps = r["bytes"] / r["ember_out"] / 1e6
        gflops = r["flops"] / r["ember_out"] / 1e6 if r["flops"] else None
        compute = f"{gflops:.1f} | {gflops / peak:.0%}" if gflops else "n/a | n/a"
        lines.append(f"| {r['name']} | {r['kernels']} | {ms(r['ember_out'])} | {ms(r['ember'])}"
                     f" | {ms(r['eager'])} | {ms(r['inductor'])} | {ms(r['ort'])} |"
                     f" {gbps:.1f} | {gbps / copy:.0%} | {compute} |"
                     f" {ratio(r['ember'], r['ort'])} | {ratio(r['ember'], r['inductor'])} |")
    lines += ["", "Speed-ups compare Ember called the ordinary way (a fresh output array per"
              " call) with the peer; above 1x, Ember is faster. GB/s and GFLOP/s are of the"
              " `out=` call; the copy and the FMA peak are the roofs."]
    publish(lines, not args.no_record)


if __name__ == "__main__":
    main()
