"""The model commands of the `ember` command line: compile, run, bench, tune, explain,
export, ir (and merge-tuning, which takes tuning databases).

Each takes a model file: an ONNX model (`.onnx`) or a graph IR file (`.ir`, the text form).
Inputs come from `--input NAME=FILE.npy` or are random (normal floats, zero integers);
`--shape NAME=1,3,224,224` fixes an ONNX input's symbolic dims. Every failure is one line
on stderr and a non-zero exit (ember/cli.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import EmberError, ShapeError
from ember.target import PRESETS


# -- loading a model -----------------------------------------------------------------------------
def _shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in items:
        name, _, dims = item.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            raise EmberError(f"--shape {item}: expected NAME=D0,D1,...") from None
    return shapes


def _arrays(items: list[str]) -> dict[str, np.ndarray]:
    arrays = {}
    for item in items:
        name, _, file = item.partition("=")
        if not file:
            raise EmberError(f"--input {item}: expected NAME=FILE.npy")
        try:
            arrays[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise EmberError(f"cannot read input {name} from {file}: {e}") from None
    return arrays


def load_graph(args: argparse.Namespace):
    """The graph of the model file, specialized to the given shapes and input values."""
    path = Path(args.model)
    if not path.exists():
        raise EmberError(f"no such file: {path}")
    given = _arrays(getattr(args, "input", []) or [])
    if path.suffix == ".ir":
        from ember.cli import _read_graph

        return _read_graph(str(path)), given
    if path.suffix != ".onnx":
        raise EmberError(f"{path}: expected an ONNX model (.onnx) or graph IR (.ir)")
    from ember.frontends.onnx.importer import Importer, load_model

    model = load_model(str(path))
    shapes = {**{n: a.shape for n, a in given.items()}, **_shapes(args.shape or [])}
    importer = Importer(model, shapes, given)
    importer.check_supported()
    try:
        return importer.run(), given
    except ShapeError as e:
        if "symbolic dim" in str(e):
            raise ShapeError(f"{e} (on the command line: --shape NAME=D0,D1,...)") from None
        raise


def make_inputs(graph, given: dict[str, np.ndarray], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for i, value in enumerate(graph.inputs):
        name = value.name or f"input{i}"
        if name in given:
            arrays.append(given[name])
        elif value.dtype.is_float:
            arrays.append(rng.standard_normal(value.shape).astype(value.dtype.np))
        else:
            arrays.append(np.zeros(value.shape, value.dtype.np))
    return arrays


def _compiled(graph, config=None):
    from ember.api.compile import compile as ember_compile
    from ember.config import Config

    return ember_compile(graph, config=config or Config(executor="cpu"))


# -- commands ----------------------------------------------------------------------------------
def compile_command(args: argparse.Namespace) -> int:
    from ember.driver import pipeline
    from ember.explain import explain

    graph, _ = load_graph(args)
    builds = pipeline.stats.builds
    start = time.perf_counter()
    compiled = _compiled(graph)
    seconds = time.perf_counter() - start
    report = explain(compiled.run)
    cold = pipeline.stats.builds > builds
    ops = sum(1 for op in graph.walk() if op.name != "constant")
    print(f"{args.model}: {len(graph.inputs)} inputs, {len(graph.outputs)} outputs,"
          f" {ops} graph ops")
    print(f"compiled in {seconds:.2f} s ({'built' if cold else 'from the cache'}):"
          f" {len(report.kernels)} kernels,"
          f" {sum(1 for k in report.kernels if len(k.ops) > 1)} fused")
    for stage, t in report.timings.items():
        print(f"  {stage:<14} {t:.2f} s")
    print(f"arena: {compiled.run.plan.arena_size / 2**20:.1f} MiB;"
          f" `ember explain {args.model}` lists the kernels")
    return 0


def run_command(args: argparse.Namespace) -> int:
    from ember.graph.interp import interpret

    graph, given = load_graph(args)
    inputs = make_inputs(graph, given, args.seed)
    outputs = _compiled(graph)(*inputs)
    worst = 0.0
    if args.check:
        for got, want in zip(outputs, interpret(graph, inputs)):
            if got.dtype.kind in "fc" or got.dtype.name == "bfloat16":
                diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
                scale = np.abs(want.astype(np.float64)) * args.rtol + args.atol
                if not np.all((diff <= scale) | (np.isnan(got) & np.isnan(want))):
                    raise EmberError(f"output differs from the reference interpreter by up to"
                                     f" {float(np.nanmax(diff)):.3g}")
                worst = max(worst, float(np.nanmax(diff)) if diff.size else 0.0)
            elif not np.array_equal(got, want):
                raise EmberError("an integer output differs from the reference interpreter")
    for i, (value, out) in enumerate(zip(graph.outputs, outputs)):
        name = value.name or f"output{i}"
        flat = out.reshape(-1)
        head = ", ".join(f"{v:.4g}" if out.dtype.kind == "f" else str(v) for v in flat[:6])
        print(f"{name}: {out.dtype}{list(out.shape)} [{head}{', ...' if flat.size > 6 else ''}]")
        if args.save:
            Path(args.save).mkdir(parents=True, exist_ok=True)
            np.save(Path(args.save) / f"{name}.npy", out)
    if args.check:
        print(f"matches the reference interpreter (max abs difference {worst:.3g})")
    return 0


def _median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def bench_command(args: argparse.Namespace) -> int:
    graph, given = load_graph(args)
    inputs = make_inputs(graph, given)
    compiled = _compiled(graph)
    ember_ms = _median_ms(lambda: compiled(*inputs), args.repeat)
    print(f"ember        {ember_ms:9.3f} ms   {1e3 / ember_ms:9.1f} inferences/s")
    if Path(args.model).suffix == ".onnx":
        try:
            import onnxruntime
        except ImportError:
            print("onnxruntime  not installed")
        else:
            session = onnxruntime.InferenceSession(args.model,
                                                   providers=["CPUExecutionProvider"])
            feeds = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
            ort_ms = _median_ms(lambda: session.run(None, feeds), args.repeat)
            print(f"onnxruntime  {ort_ms:9.3f} ms   {1e3 / ort_ms:9.1f} inferences/s"
                  f"   (ember is {ort_ms / ember_ms:.2f}x its speed)")
    return 0


def _tuning_db(path: str | None):
    from ember.config import Config
    from ember.loops.tune import TuningDatabase
    from ember.util.files import cache_dir

    return TuningDatabase(path or Config().tuning_db or cache_dir() / "tuning.json")


def tune_command(args: argparse.Namespace) -> int:
    """Time the model with the default schedules, tune it, time it again."""
    from ember.config import Config

    graph, given = load_graph(args)
    inputs = make_inputs(graph, given)
    database = _tuning_db(args.db)
    known = set(database.entries)
    default = _compiled(graph)
    before = _median_ms(lambda: default(*inputs), args.repeat)
    config = Config(executor="cpu", disk_cache=False, tune=True, tune_budget=args.budget,
                    tune_executor=args.executor, tuning_db=str(database.path))
    start = time.perf_counter()
    tuned = _compiled(graph, config)
    seconds = time.perf_counter() - start
    after = _median_ms(lambda: tuned(*inputs), args.repeat)
    found = set(_tuning_db(args.db).entries) - known
    print(f"tuned {len(found)} kernels in {seconds:.0f} s ({args.executor}); the database:"
          f" {database.path}")
    print(f"default schedules {before:9.3f} ms\ntuned             {after:9.3f} ms"
          f"   ({before / after:.2f}x)")
    return 0


def merge_tuning_command(args: argparse.Namespace) -> int:
    database = _tuning_db(args.db)
    for path in args.files:
        taken = database.merge(path)
        print(f"{path}: {taken} records taken")
    print(f"{database.path}: {len(database.entries)} records")
    return 0


def explain_command(args: argparse.Namespace) -> int:
    from ember.explain import explain

    graph, given = load_graph(args)
    compiled = _compiled(graph)
    compiled(*make_inputs(graph, given))
    print(explain(compiled.run, measure=not args.no_time))
    if args.svg:
        from ember.driver.pass_manager import run_passes
        from ember.graph.dot import render_svg
        from ember.graph.passes import DEFAULT_PIPELINE

        fused = run_passes(graph, [*DEFAULT_PIPELINE, "fuse", "dce"])
        print(f"drew {render_svg(fused, args.svg)}: one colour per kernel")
    return 0


def export_command(args: argparse.Namespace) -> int:
    from ember.config import Config
    from ember.driver.pipeline import lower_to_program, resolve
    from ember.runtime.aot import write_library

    config = resolve(Config(executor="cpu", target=args.target))  # a bad target fails now
    target = config.target
    graph, _ = load_graph(args)
    program, plan = lower_to_program(graph, config)
    out = write_library(program, plan, args.output, target, args.name,
                        [v.name or f"input{i}" for i, v in enumerate(graph.inputs)],
                        [v.name or f"output{i}" for i, v in enumerate(graph.outputs)])
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    print(f"wrote {out}/ for {target.name}: {files}")
    return 0


STAGES = ("graph", "optimized", "fused", "loops", "llvm", "asm")


def ir_command(args: argparse.Namespace) -> int:
    from ember.config import Config
    from ember.driver.pass_manager import run_passes
    from ember.driver.pipeline import lower_to_program, resolve
    from ember.graph.passes import DEFAULT_PIPELINE
    from ember.graph.text import print_graph

    graph, _ = load_graph(args)
    stage: Any = args.stage
    if stage == "graph":
        text = print_graph(graph, constants="elide")
    elif stage in ("optimized", "fused"):
        passes = DEFAULT_PIPELINE + (["fuse", "dce"] if stage == "fused" else [])
        text = print_graph(run_passes(graph, passes), constants="elide")
    else:
        from ember.codegen import vmath
        from ember.codegen.cpu import assembly_text, llvm_ir_text
        from ember.codegen.llvm import program_module
        from ember.loops.text import print_program

        config = resolve(Config(executor="cpu"))
        program, plan = lower_to_program(graph, config)
        if stage == "loops":
            text = print_program(program, constants="elide")
        else:
            with vmath.scaling_by_ldexp(config.target.vector_ldexp):  # as compiles do
                module = program_module(program, plan.offsets)
            text = llvm_ir_text(module, config.target) if stage == "llvm" else \
                assembly_text(module, config.target)
    sys.stdout.write(text)
    return 0


def add_model_commands(sub: Any) -> None:
    def model_parser(name: str, help: str, inputs: bool = True):
        p = sub.add_parser(name, help=help)
        p.add_argument("model", help="an ONNX model (.onnx) or graph IR (.ir)")
        p.add_argument("--shape", action="append", metavar="NAME=D0,D1,..",
                       help="the concrete shape of an input with symbolic dims")
        if inputs:
            p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                           help="an input's value (default: random)")
        return p

    model_parser("compile", "compile a model (to the cache) and summarize"
                 ).set_defaults(run=compile_command)
    run = model_parser("run", "run a model on random or .npy inputs, checked against the"
                              " reference interpreter")
    run.add_argument("--no-check", dest="check", action="store_false",
                     help="skip the check against the reference interpreter")
    run.add_argument("--rtol", type=float, default=1e-4)
    run.add_argument("--atol", type=float, default=1e-4)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--save", metavar="DIR", help="write each output as DIR/NAME.npy")
    run.set_defaults(run=run_command)
    bench = model_parser("bench", "latency and throughput, against ONNX Runtime when installed")
    bench.add_argument("--repeat", type=int, default=20)
    bench.set_defaults(run=bench_command)
    explain = model_parser("explain", "each kernel: its graph ops, time, GFLOP/s, GB/s and"
                                      " roofline fraction")
    explain.add_argument("--svg", metavar="FILE", help="draw the graph, one colour per kernel")
    explain.add_argument("--no-time", action="store_true", help="skip timing the kernels")
    explain.set_defaults(run=explain_command)
    tune = model_parser("tune", "search the model's schedules on this machine or a Ray"
                                " cluster; time it before and after")
    tune.add_argument("--budget", type=float, default=10.0,
                      help="seconds of search per kernel the database lacks (default 10)")
    tune.add_argument("--executor", default="local",
                      help="where to measure: local, ray (RAY_ADDRESS, else a local"
                           " instance) or ray:ADDRESS")
    tune.add_argument("--db", metavar="FILE", help="the tuning database (default:"
                      " EMBER_TUNING_DB, else tuning.json in the cache folder)")
    tune.add_argument("--repeat", type=int, default=20)
    tune.set_defaults(run=tune_command)
    merge = sub.add_parser("merge-tuning", help="fold other machines' tuning databases into"
                                                " this one's")
    merge.add_argument("files", nargs="+", help="tuning database files (JSON)")
    merge.add_argument("--db", metavar="FILE", help="the database to merge into (default:"
                       " EMBER_TUNING_DB, else tuning.json in the cache folder)")
    merge.set_defaults(run=merge_tuning_command)
    export = model_parser("export", "write a shared library, C header and example", False)
    export.add_argument("-o", "--output", required=True, help="the output folder")
    export.add_argument("--target", default="host",
                        help="host or a preset: " + ", ".join(PRESETS))
    export.add_argument("--name", default="model", help="the C prefix and library name")
    export.set_defaults(run=export_command)
    ir = model_parser("ir", "print a stage of the model's compilation", False)
    ir.add_argument("--stage", default="fused", choices=STAGES)
    ir.set_defaults(run=ir_command)
