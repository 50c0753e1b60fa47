"""The device check of the NVIDIA backend: one script for a machine with one NVIDIA GPU,
done in under 5 minutes, one markdown table per section.

    python bench/gpu_check.py                 # on the GPU machine
    python bench/gpu_check.py --dry           # compile everything for the GPU and stop (no GPU)
    python bench/gpu_check.py --sections correctness,timing --deadline 120

Sections, in order (a global deadline, 270 s by default, stops adding rows; a row still
running 20 s past it is interrupted, so the script ends):
  runtime      tests/runtime/test_cuda_runtime.py under pytest: hand-written PTX through the
               CUDA runtime (host arrays, loops, graphs, torch CUDA tensors), no codegen
  correctness  small models (MLP, CNN, tiny BERT and GPT-2 from transformers configs, no
               downloads) compiled for the GPU against the same compiled for this CPU:
               max |gpu - cpu| / max |cpu| <= 1e-3, on NumPy arrays and on CUDA tensors
  onnx         an even sample of the ratchet's `cpu:node/` cases (each passes on the CPU)
               run on the GPU against the case's expected outputs, within --onnx-seconds
  timing       matmul 1024/4096 f32 against torch.matmul (TFLOP/s), add on 64M floats
               against torch's add and copy (GB/s), softmax and layer-norm rows
  models       BERT-base (seq 128) and ResNet-50 (224x224) from configs at batch 1 and 32:
               Ember against torch eager and torch.compile (Inductor)

Every entry that fails prints its error in its row (the traceback goes to stderr), and the
next runs. fp32 throughout, TF32 off for torch's matmuls and convolutions. Timings are
CUDA events around rounds of calls on torch's stream (medians). The report goes to stdout,
and to $OUT/gpu_check.md if $OUT is set (rewritten after every row).
"""

from __future__ import annotations

import time

START = time.perf_counter()  # (the deadline counts the imports too)

import argparse  # noqa: E402
import copy  # noqa: E402
import datetime  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ember  # noqa: E402
from ember.config import Config  # noqa: E402

SECTIONS = ("runtime", "correctness", "onnx", "timing", "models")
GRACE = 20.0  # seconds past the deadline before a running row is interrupted
TOLERANCE = 1e-3


class Deadline(BaseException):
    """The deadline passed while a row ran (a BaseException: no `except Exception` in the
    code under test swallows it)."""


class Report:
    """Sections of markdown tables, written out after every row."""

    def __init__(self, deadline: float, out: Path | None):
        self.deadline = deadline
        self.out = out
        self.header: list[str] = []
        self.tables: dict[str, tuple[list[str], list[list[str]]]] = {}

    def left(self) -> float:
        return self.deadline - (time.perf_counter() - START)

    def table(self, title: str, columns: list[str]) -> None:
        self.tables.setdefault(title, (columns, []))

    def row(self, title: str, cells: list) -> None:
        columns, rows = self.tables[title]
        cells = [_cell(c) for c in cells] + [""] * (len(columns) - len(cells))
        rows.append(cells)
        print(f"[{time.perf_counter() - START:5.0f}s] {title}: {' | '.join(cells)}",
              file=sys.stderr, flush=True)
        self.save()

    def run(self, title: str, name: str, fn, need: float = 0.0) -> None:
        """A row `[name, *fn()]`, or `[name, why not]`: too little time left, the deadline,
        or the error that `fn` raised."""
        if self.left() < need:
            self.row(title, [name, f"skipped: {self.left():.0f} s left, needs ~{need:.0f}"])
            return
        try:
            self.row(title, [name, *fn()])
        except Deadline:
            self.row(title, [name, "stopped at the deadline"])
        except Exception as e:  # noqa: BLE001  (an entry failing is reported, not fatal)
            traceback.print_exc()
            self.row(title, [name, f"**{type(e).__name__}**: {_short(e)}"])

    def markdown(self) -> str:
        text = ["# GPU check", "", *self.header, ""]
        for title, (columns, rows) in self.tables.items():
            text += [f"## {title}", "", "| " + " | ".join(columns) + " |",
                     "|" + "---|" * len(columns)]
            text += ["| " + " | ".join(r) + " |" for r in rows]
            text.append("")
        return "\n".join(text)

    def save(self) -> None:
        if self.out is not None:
            self.out.write_text(self.markdown())


def _cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _short(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + " …"


# -- compiling -------------------------------------------------------------------------------

class Fn(torch.nn.Module):
    """A function of tensors as a module (what export takes)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def compile_for(graph, config: Config):
    """(the executable, seconds to compile)."""
    start = time.perf_counter()
    executable = ember.compile(graph, config=config).run
    return executable, time.perf_counter() - start


def describe(executable) -> str:
    """Launches per call and PTX size of a GPU executable."""
    artifact = getattr(executable, "artifact", None)
    if artifact is None or "gpu" not in artifact.extra:
        return type(executable).__name__
    gpu = artifact.extra["gpu"]

    def launches(steps) -> int:
        n = 0
        for s in steps:
            if s[0] == "call":
                n += len(gpu["launches"][s[1]])
            elif s[0] == "if":
                n += max(launches(s[2]), launches(s[3]))
            else:
                n += launches(s[4])
        return n
    return f"{launches(gpu['steps'])} launches, PTX {len(artifact.objects[0]) / 1024:.0f} KB"


def release(*executables) -> None:
    for e in executables:
        close = getattr(e, "close", None)
        if close is not None:
            close()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def relative_error(got, want) -> float:
    """max |got - want| / max |want| over every output (ints and bools: 0 or inf)."""
    worst = 0.0
    for g, w in zip(got, want):
        g = g.detach().cpu().numpy() if isinstance(g, torch.Tensor) else np.asarray(g)
        w = w.detach().cpu().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
        if g.shape != w.shape:
            return float("inf")
        g, w = g.astype(np.float64), w.astype(np.float64)
        scale = max(float(np.max(np.abs(w), initial=0.0)), 1e-6)
        worst = max(worst, float(np.max(np.abs(g - w), initial=0.0)) / scale)
    return worst


def gpu_ms(fn, rounds: int = 10, round_s: float = 0.02) -> float:
    """Median ms per call over `rounds` rounds of CUDA-event-timed calls (each round as
    many calls as fill `round_s`, after a warm-up)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    calls = max(1, min(200, int(round_s / max(time.perf_counter() - start, 1e-6))))
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / calls)
    return statistics.median(times)


# -- sections ---------------------------------------------------------------------------------

def runtime_tests(report: Report) -> None:
    title = "runtime: hand-written PTX through ember/runtime/cuda.py"
    report.table(title, ["tests", "result", "seconds"])

    def run() -> list:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p",
                               "no:cacheprovider", "tests/runtime/test_cuda_runtime.py"],
                              cwd=ROOT, capture_output=True, text=True,
                              timeout=max(10.0, min(120.0, report.left())))
        lines = done.stdout.strip().splitlines()
        if done.returncode:
            sys.stderr.write(done.stdout[-4000:] + done.stderr[-2000:])
        skipped = [line for line in lines if "SKIPPED" in line]
        result = (lines[-1] if lines else done.stderr.strip()[-300:]) + \
            (f"; {'; '.join(skipped)}" if skipped else "")
        return [result, time.perf_counter() - start]

    report.run(title, "tests/runtime/test_cuda_runtime.py", run, need=15)


def small_model(name: str) -> tuple[torch.nn.Module, tuple]:
    """(model, example inputs), random weights, nothing downloaded."""
    torch.manual_seed(0)
    if name == "MLP":
        return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 10)), (torch.randn(8, 784),)
    if name == "CNN":
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
            torch.nn.Linear(32, 10)), (torch.randn(2, 3, 32, 32),)
    ids = torch.randint(0, 512, (2, 16))
    if name == "BERT":
        from transformers import BertConfig, BertModel

        return BertModel(BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=128,
                                    max_position_embeddings=64)), (ids,)
    from transformers import GPT2Config, GPT2Model

    # (at batch 2, GPT-2's SDPA path does not export: "Cannot view a tensor ...")
    return GPT2Model(GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2,
                                n_head=4, use_cache=False)), (ids[:1],)


SMALL_MODELS = {"MLP": "MLP 784-256-10, batch 8", "CNN": "CNN 2 convs, 2x3x32x32",
                "BERT": "tiny BERT (2 layers, 64 wide), 2x16",
                "GPT-2": "tiny GPT-2 (2 layers, 64 wide), 1x16"}


def correctness(report: Report, gpu: Config, cpu: Config, dry: bool) -> None:
    title = "correctness: GPU against CPU (max |gpu - cpu| / max |cpu|)"
    report.table(title, ["model", "host arrays", "CUDA tensors", "status", "GPU compile s",
                         "GPU code"])
    for key, name in SMALL_MODELS.items():
        def check(key=key) -> list:
            model, args = small_model(key)
            model = model.eval()
            with torch.no_grad():
                graph = ember.torch.export(model, args)
            run, seconds = compile_for(graph, gpu)
            if dry:
                return [None, None, "compiled", seconds, describe(run)]
            reference, _ = compile_for(graph, cpu)
            arrays = [a.numpy() for a in args]
            want = reference(*arrays)
            host = relative_error(run(*arrays), want)
            device = relative_error(run(*[a.cuda() for a in args]), want)
            release(run)
            ok = max(host, device) <= TOLERANCE
            return [host, device, "pass" if ok else "**FAIL**", seconds, describe(run)]

        report.run(title, name, check, need=10)


def onnx_cases(count: int) -> list[str]:
    """An even sample of the ratchet's node cases that pass on the CPU."""
    ratchet = ROOT / "tests" / "conformance" / "onnx" / "ratchet.txt"
    names = sorted(line.strip().removeprefix("cpu:node/") for line in
                   ratchet.read_text().splitlines() if line.startswith("cpu:node/"))
    step = max(1, len(names) // max(count, 1))
    return names[::step][:count]


def onnx_sample(report: Report, gpu: Config, dry: bool, count: int, seconds: float) -> None:
    from onnx.backend.test.runner import Runner

    from ember.conformance import onnx_suite
    from ember.frontends.onnx.importer import Importer

    title = "onnx: ratchet node cases on the GPU (against their expected outputs)"
    failures = "onnx: failures"
    report.table(title, ["cases", "passed", "wrong", "errors", "not run (time)", "seconds"])
    report.table(failures, ["case", "error"])
    names = onnx_cases(count)
    counts = {"pass": 0, "wrong": 0, "error": 0}
    start = time.perf_counter()
    stop = min(start + seconds, START + report.deadline)
    for name in names:
        if time.perf_counter() > stop:
            break
        try:
            case = onnx_suite.node_cases()[name]
            model = onnx_suite._model(case)
            inits = {t.name for t in model.graph.initializer}
            inputs_of = [i.name for i in model.graph.input if i.name not in inits]
            for inputs, expected in onnx_suite._data_sets(case):
                graph = Importer(model, input_values=dict(zip(inputs_of, inputs))).run()
                run, _ = compile_for(graph, gpu)
                if not dry:
                    with np.errstate(all="ignore"):
                        outputs = run(*inputs)
                    Runner.assert_similar_outputs(expected, list(outputs), rtol=case.rtol,
                                                  atol=case.atol)
                release(run)
            counts["pass"] += 1
        except Deadline:
            break
        except AssertionError as e:
            counts["wrong"] += 1
            report.row(failures, [name, f"wrong: {_short(e, 200)}"])
        except Exception as e:  # noqa: BLE001
            counts["error"] += 1
            report.row(failures, [name, f"{type(e).__name__}: {_short(e, 200)}"])
    done = sum(counts.values())
    report.row(title, [len(names), counts["pass"], counts["wrong"], counts["error"],
                       len(names) - done, time.perf_counter() - start])


def timing(report: Report, gpu: Config, dry: bool) -> None:
    title = "timing: kernels (fp32; ratio = torch ms / Ember ms)"
    report.table(title, ["op", "Ember ms", "torch ms", "Ember", "torch", "ratio",
                         "vs torch", "GPU code"])

    def entry(make, metric, torch_fn=None):
        """A row: `make()` gives (fn, example inputs); `metric(ms)` the throughput
        column's text; torch_fn runs torch's version (default: fn itself)."""
        def row() -> list:
            fn, inputs = make()
            run, _ = compile_for(ember.torch.export(Fn(fn), inputs), gpu)
            if dry:
                return [None, None, None, None, None, "compiled", describe(run)]
            xs = [x.cuda() for x in inputs]
            with torch.no_grad():
                base = torch_fn or fn
                err = relative_error(run(*xs), [base(*xs)])
                ember_ms = gpu_ms(lambda: run(*xs))
                torch_ms = gpu_ms(lambda: base(*xs))
            release(run)
            return [ember_ms, torch_ms, metric(ember_ms), metric(torch_ms),
                    torch_ms / ember_ms, f"err {err:.1e}", describe(run)]
        return row

    for n in (1024, 4096):
        flops = 2 * n ** 3
        report.run(title, f"matmul {n}x{n}x{n}", entry(
            lambda n=n: (torch.matmul, (torch.randn(n, n), torch.randn(n, n))),
            lambda ms, f=flops: f"{f / ms / 1e9:.1f} TFLOP/s"), need=15)
    n = 64 << 20

    def add_row() -> list:
        cells = entry(lambda: (torch.add, (torch.randn(n), torch.randn(n))),
                      lambda ms: f"{3 * 4 * n / ms / 1e6:.0f} GB/s")()
        if not dry:  # (cells: Ember ms, torch ms, Ember GB/s, torch GB/s, ...)
            x = torch.randn(n, device="cuda")
            y = torch.empty_like(x)
            copy_gbs = 2 * 4 * n / gpu_ms(lambda: y.copy_(x)) / 1e6
            cells[2] += f" ({3 * 4 * n / cells[0] / 1e6 / copy_gbs:.2f} of copy)"
            cells[3] += f" (copy {copy_gbs:.0f} GB/s)"
        return cells

    report.run(title, "add, 64M floats", add_row, need=15)
    rows, width = 16384, 1024
    norm = torch.nn.LayerNorm(width)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    report.run(title, f"softmax, {rows}x{width} rows", entry(
        lambda: (lambda x: torch.softmax(x, -1), (torch.randn(rows, width),)),
        lambda ms: f"{2 * 4 * rows * width / ms / 1e6:.0f} GB/s"), need=15)
    on_gpu: list = []  # torch's copy of the layer, on the GPU (made at its first call)

    def norm_torch(x):
        if not on_gpu:
            on_gpu.append(copy.deepcopy(norm).cuda())
        return on_gpu[0](x)

    report.run(title, f"layer norm, {rows}x{width} rows", entry(
        lambda: (norm, (torch.randn(rows, width),)),
        lambda ms: f"{2 * 4 * rows * width / ms / 1e6:.0f} GB/s", norm_torch), need=15)


def large_model(name: str, batch: int):
    torch.manual_seed(0)
    if name == "BERT-base":
        from transformers import BertConfig, BertModel

        return BertModel(BertConfig()).eval(), (torch.randint(0, 30000, (batch, 128)),)
    from transformers import ResNetConfig, ResNetModel

    return ResNetModel(ResNetConfig()).eval(), (torch.randn(batch, 3, 224, 224),)


def models(report: Report, gpu: Config, dry: bool) -> None:
    title = "models: end to end (fp32, TF32 off), ms per call"
    report.table(title, ["model", "Ember", "eager", "Inductor", "eager / Ember",
                         "Inductor / Ember", "Ember compile s", "err vs eager", "GPU code"])
    for batch in (1, 32):
        for name in ("BERT-base", "ResNet-50"):
            def row(name=name, batch=batch) -> list:
                model, args = large_model(name, batch)
                with torch.no_grad():
                    graph = ember.torch.export(model, args)
                run, seconds = compile_for(graph, gpu)
                if dry:
                    return [None, None, None, None, None, seconds, None, describe(run)]
                model = model.cuda()
                xs = [a.cuda() for a in args]
                cells = {}
                with torch.no_grad():
                    want = [t for t in model(*xs).to_tuple() if isinstance(t, torch.Tensor)]
                    for key, fn in (("ember", lambda: run(*xs)), ("eager", lambda: model(*xs))):
                        cells[key] = _guarded(lambda fn=fn: gpu_ms(fn, rounds=5))
                    err = _guarded(lambda: f"{relative_error(run(*xs), want):.1e}")
                    if report.left() > 60:
                        compiled = torch.compile(model, dynamic=False)
                        cells["inductor"] = _guarded(lambda: gpu_ms(lambda: compiled(*xs),
                                                                    rounds=5))
                    else:
                        cells["inductor"] = f"skipped: {report.left():.0f} s left"
                release(run)
                e = cells["ember"]
                ratios = [cells[k] / e if isinstance(cells[k], float) and isinstance(e, float)
                          else None for k in ("eager", "inductor")]
                return [e, cells["eager"], cells["inductor"], *ratios, seconds, err,
                        describe(run)]

            report.run(title, f"{name}, batch {batch}", row, need=40)


def _guarded(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return f"**{type(e).__name__}**: {_short(e, 150)}"


def machine(report: Report, gpu: Config, dry: bool) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip() or "?"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"- {now}; ember {commit} (and the working tree); torch {torch.__version__};"
             f" target {gpu.target}{'; --dry: compiled only, nothing ran' if dry else ''}"]
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        lines.append(f"- {p.name}, compute capability {p.major}.{p.minor},"
                     f" {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
    try:
        from cuda.bindings import driver as cu

        cu.cuInit(0)
        version = cu.cuDriverGetVersion()[1]
        lines.append(f"- CUDA driver API {version // 1000}.{version % 1000 // 10}")
    except Exception as e:  # noqa: BLE001
        lines.append(f"- CUDA driver: {type(e).__name__}: {_short(e, 120)}")
    report.header = lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry", action="store_true",
                        help="compile for the GPU target and stop (needs no GPU)")
    parser.add_argument("--target", default="sm_90")
    parser.add_argument("--deadline", type=float, default=270.0,
                        help="seconds from the start after which no row starts")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--onnx-cases", type=int, default=150)
    parser.add_argument("--onnx-seconds", type=float, default=45.0)
    args = parser.parse_args()
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)} (known: {', '.join(SECTIONS)})")
    if not args.dry and not torch.cuda.is_available():
        parser.error("no CUDA device visible to torch: run with --dry to compile only")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = Path(os.environ["OUT"]) / "gpu_check.md" if os.environ.get("OUT") else None
    report = Report(args.deadline, out)
    gpu = Config(target=args.target, executor="cpu", disk_cache=False)
    cpu = Config(executor="cpu", disk_cache=False)

    def interrupt(signum, frame):
        raise Deadline()

    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, report.left() + GRACE))
    try:
        machine(report, gpu, args.dry)
        if "runtime" in sections and not args.dry:
            runtime_tests(report)
        if "correctness" in sections:
            correctness(report, gpu, cpu, args.dry)
        if "onnx" in sections:
            onnx_sample(report, gpu, args.dry, args.onnx_cases, args.onnx_seconds)
        if "timing" in sections:
            timing(report, gpu, args.dry)
        if "models" in sections:
            models(report, gpu, args.dry)
    except Deadline:
        print("the deadline passed between rows", file=sys.stderr)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    report.header.append(f"- {time.perf_counter() - START:.0f} s in all"
                         f" (deadline {args.deadline:.0f} s)")
    report.save()
    print(report.markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
