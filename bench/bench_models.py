"""Side-by-side model latency: Ember (compiled) against PyTorch eager and ONNX Runtime.

    python bench/bench_models.py [--models mlp,bert,resnet50] [--repeat 5] [--threads 2]

Prints one table (median latency, ratio to PyTorch eager, Ember's compile time and kernel
count) and appends it, with the machine's details, to docs/benchmarks.md. Each model runs
in a process of its own. Ratios, not absolute times, are the result: this machine's
timings are noisy.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ember  # noqa: E402
from ember.driver import pipeline  # noqa: E402
from ember.runtime.cache import wait_for_writes  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 10))

    def forward(self, x):
        return self.net(x)


def make_model(name: str):
    """(module, example inputs) built from configs: random weights, nothing downloaded."""
    torch.manual_seed(0)
    if name == "mlp":
        return MLP().eval(), (torch.randn(1, 784),)
    if name == "bert":
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig()).eval()
        return model, (torch.randint(0, 30000, (1, 128)),)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2Model

        model = GPT2Model(GPT2Config(use_cache=False)).eval()
        return model, (torch.randint(0, 50000, (1, 128)),)
    if name == "resnet50":
        from transformers import ResNetConfig, ResNetModel

        return ResNetModel(ResNetConfig()).eval(), (torch.randn(1, 3, 224, 224),)
    if name == "mobilenet_v2":
        from transformers import MobileNetV2Config, MobileNetV2Model

        return MobileNetV2Model(MobileNetV2Config()).eval(), (torch.randn(1, 3, 224, 224),)
    raise SystemExit(f"unknown model {name}")


class FirstOutput(torch.nn.Module):
    """The model's first output only, called positionally (what the ONNX exporter needs);
    inputs past the model's own are passed by the names in `keywords`."""

    def __init__(self, model, keywords: tuple[str, ...] = ()):
        super().__init__()
        self.model = model
        self.keywords = keywords

    def forward(self, *inputs):
        own = len(inputs) - len(self.keywords)
        out = self.model(*inputs[:own], **dict(zip(self.keywords, inputs[own:])))
        return out if isinstance(out, torch.Tensor) else out[0]


def onnx_export_inputs(name: str, inputs: tuple) -> tuple[tuple[str, ...], tuple]:
    """Keyword inputs the ONNX export of a model adds to its own. GPT-2 given no attention
    mask looks for packed sequences with `torch.diff`, which the TorchScript exporter cannot
    export; with a mask of ones it takes the other path and computes the same outputs."""
    if name == "gpt2":
        return ("attention_mask",), (torch.ones_like(inputs[0]),)
    return (), ()


def median_ms(fn, repeat: int, round_s: float = 0.02) -> float:
    """The median over `repeat` rounds of the time per call. A round makes as many calls as
    fill `round_s` (at least one), and a round of warm-up comes first: single calls of a
    50-us model after one warm-up call measured anywhere from 0.05 to 0.12 ms."""
    start = time.perf_counter()
    fn()
    calls = max(1, int(round_s / max(time.perf_counter() - start, 1e-6)))
    for _ in range(calls):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return 1e3 * statistics.median(times)


def onnxruntime_ms(name: str, model, inputs, repeat: int, threads: int) -> float | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    keywords, extra = onnx_export_inputs(name, inputs)
    with torch.no_grad():
        expected = FirstOutput(model)(*inputs).numpy()
    inputs = inputs + extra
    buffer = io.BytesIO()
    # The wrapper is put in eval mode: the exporter restores the mode it found, and a new
    # module is in training mode, which would turn the model's dropout on afterwards.
    with torch.no_grad():
        torch.onnx.export(FirstOutput(model, keywords).eval(), inputs, buffer, dynamo=False,
                          opset_version=17)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(buffer.getvalue(), options,
                                           providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    got = session.run(None, feeds)[0]
    if not np.allclose(got, expected, rtol=1e-3, atol=1e-3):
        raise RuntimeError(f"ONNX Runtime's output differs from eager's by "
                           f"{np.abs(got - expected).max():.3g}")
    return median_ms(lambda: session.run(None, feeds), repeat)


def bench(name: str, repeat: int, threads: int) -> dict:
    model, inputs = make_model(name)
    with torch.no_grad():
        eager = median_ms(lambda: model(*inputs), repeat)
        builds = pipeline.stats.builds
        start = time.perf_counter()
        compiled = ember.compile(model, inputs, config=ember.Config(executor="cpu"))
        compile_s = time.perf_counter() - start
        assert pipeline.stats.builds > builds  # cold: the bench's cache folder starts empty
        # Warm: a new compile of the same module with nothing in memory, as a new process
        # would do it (found on disk by the module's fingerprint, no trace, no stage).
        # (The cold compile's entry is written while the model runs; a new process finds
        # it whole.)
        wait_for_writes()
        pipeline.clear_memory_cache()
        disk_hits = pipeline.stats.disk_hits
        start = time.perf_counter()
        compiled = ember.compile(model, inputs, config=ember.Config(executor="cpu"))
        warm_s = time.perf_counter() - start
        assert pipeline.stats.disk_hits > disk_hits
        ember_ms = median_ms(lambda: compiled(*inputs), repeat)
        memory = footprint(compiled)
        try:
            start = time.perf_counter()
            inductor = torch.compile(model)
            inductor(*inputs)
            inductor_compile = time.perf_counter() - start
            inductor_ms = median_ms(lambda: inductor(*inputs), repeat)
        except Exception as e:  # noqa: BLE001  (a peer failing is reported, not fatal)
            print(f"  torch.compile: {type(e).__name__}: {e}", file=sys.stderr)
            inductor_ms = inductor_compile = None
    try:
        ort = onnxruntime_ms(name, model, inputs, repeat, threads)
    except Exception as e:  # noqa: BLE001  (a peer failing to export is reported, not fatal)
        print(f"  onnxruntime: {type(e).__name__}: {e}", file=sys.stderr)
        ort = None
    return {"model": name, "eager": eager, "ember": ember_ms, "ort": ort,
            "compile": compile_s, "warm": warm_s, "memory": memory, "inductor": inductor_ms,
            "inductor_compile": inductor_compile}


def bench_in_child(name: str, repeat: int, threads: int) -> dict:
    """`bench` in a process of its own: what a model leaves behind (torch.compile's
    compile workers, the peers' thread pools, hundreds of MB of weights) does not share
    the cores with the next. In one process, MobileNetV2 after BERT and GPT-2 on 2 threads
    took 10 ms in Ember and 6.6 in ONNX Runtime, against 4.6-4.8 and 3.5-3.8 alone."""
    command = [sys.executable, __file__, "--one", name, "--repeat", str(repeat),
               "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    sys.stderr.write(done.stderr[-2000:] if done.returncode else "")
    if done.returncode:
        raise SystemExit(f"benchmarking {name} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def geomean(peer: str, rows: list[dict]) -> str:
    ratios = [r[peer] / r["ember"] for r in rows if r[peer]]
    if not ratios:
        return "n/a"
    return f"{statistics.geometric_mean(ratios):.2f}x ({len(ratios)} models)"


def footprint(compiled) -> float:
    """MiB Ember holds to run the model: its constants (weights, after folding), the arena
    of temps (the static memory plan) and the outputs."""
    from ember.explain import _latest_executable

    exe = _latest_executable(compiled)
    constants = sum(c.nbytes for c in exe.constants)
    outputs = sum(b.nbytes for b in exe.interface.outputs)
    return (constants + exe.plan.arena_size + outputs) / 2**20


def publish(lines: list[str], record_it: bool) -> None:
    """Print a results table made of `lines`, and append it to docs/benchmarks.md unless
    asked not to (`--no-record`)."""
    table = "\n".join(lines) + "\n"
    print(table)
    if record_it:
        record(table)


def record(table: str) -> None:
    """Append a results table to docs/benchmarks.md (every bench script records here)."""
    doc = ROOT / "docs" / "benchmarks.md"
    if not doc.exists():
        doc.write_text("# Benchmarks\n\nResults appended by `make bench`"
                       " (bench/). Ratios matter, not absolute times.\n")
    with doc.open("a") as f:
        f.write("\n" + table)


def machine() -> str:
    cpu = platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in
                   Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from llvmlite import binding

    return (f"{cpu} (LLVM: {binding.get_host_cpu_name()}), {os.cpu_count()} cores,"
            f" Python {platform.python_version()}, torch {torch.__version__},"
            f" numpy {np.__version__}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,bert,gpt2,resnet50,mobilenet_v2")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)  # (a child's model)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["EMBER_NUM_THREADS"] = str(args.threads)
    if args.one:  # a child: compiles cold into a cache folder of its own
        cache = tempfile.mkdtemp(prefix="ember-bench-")
        os.environ["EMBER_CACHE_DIR"] = cache
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
        print(json.dumps(bench(args.one, args.repeat, args.threads)))
        return
    rows = []
    for name in args.models.split(","):
        print(f"benchmarking {name} ...", file=sys.stderr)
        rows.append(bench_in_child(name, args.repeat, args.threads))
    lines = [f"### {datetime.date.today()}: models, batch 1, f32, {args.threads} threads"
             f" (median of {args.repeat})", "", f"Machine: {machine()}.", "",
             "| model | PyTorch eager ms | torch.compile ms | ONNX Runtime ms | Ember ms |"
             " speed-up vs eager | vs torch.compile | vs ORT | Ember compile s cold |"
             " warm | torch.compile compile s | Ember MiB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def num(v, digits=2):
        return f"{v:.{digits}f}" if v is not None else "n/a"

    def speedup(peer, r):
        return f"{r[peer] / r['ember']:.2f}x" if r[peer] else "n/a"

    for r in rows:
        lines.append(f"| {r['model']} | {r['eager']:.2f} | {num(r['inductor'])} |"
                     f" {num(r['ort'])} | {r['ember']:.2f} | {speedup('eager', r)} |"
                     f" {speedup('inductor', r)} | {speedup('ort', r)} | {r['compile']:.1f} |"
                     f" {r['warm']:.2f} | {num(r['inductor_compile'], 1)} |"
                     f" {r['memory']:.0f} |")
    lines += ["", "Speed-ups are the peer's time over Ember's (above 1x, Ember is faster)."
              " Geometric means of the speed-ups over the models that have the peer: "
              + ", ".join(f"{label} {geomean(peer, rows)}" for peer, label in
                          (("eager", "vs eager"), ("inductor", "vs torch.compile"),
                           ("ort", "vs ONNX Runtime"))) + ".",
              "Cold compile: an empty cache (torch.export included); warm: the same module"
              " compiled again with nothing in memory, found on disk by its fingerprint."]
    publish(lines, not args.no_record)


if __name__ == "__main__":
    main()
