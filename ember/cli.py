"""The `ember` command (also `python -m ember`).

Model commands (ember/commands.py): `compile`, `run`, `bench`, `explain`, `export`, `ir`,
each on an ONNX model or a graph IR file. IR workbench: `opt` parses a graph IR file, runs
the named passes and prints the result, so that every pass can be tested from text (see
tests/ir/); `lower` prints the loop IR. `ops`, `passes` and `demo` say what exists.

Every error is one line on stderr and exit status 1 (2 for bad arguments); `--verbose`
adds the details (a reproducer's path when a pass failed, the multi-line diagnostics).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ember.errors import EmberError
from ember.target import PRESETS


def _read_graph(file: str):
    """The graph IR in `file` ("-" for standard input), parsed."""
    from ember.graph.text import parse_graph

    source = "<stdin>" if file == "-" else file
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as e:
        raise EmberError(f"cannot read {source}: {e.strerror}") from None
    return parse_graph(text, source)


def _backend(args: argparse.Namespace):
    from ember.config import Config
    from ember.driver.backend import backend_for
    from ember.driver.pipeline import resolve

    return backend_for(resolve(Config(target=args.target)).target)


def _opt(args: argparse.Namespace) -> int:
    from ember.driver.pass_manager import PassManager
    from ember.graph.text import print_graph

    graph = _read_graph(args.file)
    passes = [p for p in (args.passes or "").split(",") if p]
    manager = PassManager(passes, configure=_backend(args).configure,
                          print_after_all=args.print_after_all,
                          print_after=args.print_after.split(",") if args.print_after else (),
                          constants_mode=args.constants, print_stream=sys.stdout)
    if args.verify_each:
        manager.verify_each = True
    if args.dump:
        manager.dump_dir = args.dump
    graph = manager.run(graph)
    output = print_graph(graph, constants=args.constants)
    if args.output:
        Path(args.output).write_text(output)
    else:
        sys.stdout.write(output)
    if args.timing:
        sys.stderr.write(manager.timing_report() + "\n")
    return 0


def _lower(args: argparse.Namespace) -> int:
    from ember.driver.pass_manager import run_passes
    from ember.graph.passes import DEFAULT_PIPELINE
    from ember.loops.lower import lower_graph
    from ember.loops.text import print_program
    from ember.loops.verify import verify_program

    graph = _read_graph(args.file)
    if args.schedule or args.schedules:
        return _lower_scheduled(args, graph)
    passes = DEFAULT_PIPELINE if args.passes is None else [p for p in args.passes.split(",") if p]
    backend = _backend(args)
    optimized = run_passes(graph, passes, configure=backend.configure)
    program = verify_program(lower_graph(optimized, backend.target))
    sys.stdout.write(print_program(program, constants=args.constants))
    return 0


def _lower_scheduled(args: argparse.Namespace, graph) -> int:
    """The compile's loop IR, scheduled (every graph pass of a compile, fusion included),
    with each tunable kernel's schedule as a comment, or written to a file; `--schedules`
    gives such a file back."""
    import json

    from ember.config import Config
    from ember.driver.pipeline import lower_to_program, resolve
    from ember.loops.text import print_program

    config = resolve(Config(target=args.target, schedules=args.schedules))
    chosen: dict[str, dict] = {}
    program, _ = lower_to_program(graph, config, schedules=chosen)
    sys.stdout.write(print_program(program, constants=args.constants))
    text = json.dumps(chosen, indent=1, sort_keys=True) + "\n"
    if args.schedule and args.schedule != "-":
        Path(args.schedule).write_text(text)
    elif args.schedule:
        sys.stdout.write("// schedules (kernel key: parameters):\n")
        sys.stdout.write("".join(f"// {line}\n" for line in text.splitlines()))
    return 0


def _list_passes(args: argparse.Namespace) -> int:
    from ember.graph.passes import DEFAULT_PIPELINE, all_passes

    for p in all_passes():
        print(f"{p.name:<14} {p.summary}")
    print(f"\ndefault pipeline: {','.join(DEFAULT_PIPELINE)}")
    return 0


def _list_ops(args: argparse.Namespace) -> int:
    from ember.graph.ops import all_opdefs

    for d in all_opdefs():
        print(f"{d.family:<12} graph.{d.name:<20} {d.summary}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ember.demo import run_demo

    run_demo()
    return 0


TARGET_HELP = "host (default) or a preset: " + ", ".join(PRESETS)


def build_parser() -> argparse.ArgumentParser:
    from ember.commands import add_model_commands

    parser = argparse.ArgumentParser(prog="ember", description="Ember, an ML compiler")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="on an error, print every line of it (reproducer paths too)")
    sub = parser.add_subparsers(dest="command", required=True)
    add_model_commands(sub)

    opt = sub.add_parser("opt", help="parse graph IR, run passes, print the result")
    opt.add_argument("file", help="a graph IR file, or - for standard input")
    opt.add_argument("-p", "--passes", default="", help="comma-separated pass names")
    opt.add_argument("-o", "--output", help="write the result here instead of stdout")
    opt.add_argument("--print-after-all", action="store_true", help="print IR after each pass")
    opt.add_argument("--print-after", default="", help="comma-separated passes to print after")
    opt.add_argument("--verify-each", action="store_true", help="verify after every pass")
    opt.add_argument("--dump", help="write the IR after every pass into this folder")
    opt.add_argument("--timing", action="store_true", help="report the time of each pass")
    opt.add_argument("--constants", default="table", choices=("table", "inline", "elide"),
                     help="how to print large constants")
    opt.add_argument("--target", default=None, help=TARGET_HELP)
    opt.set_defaults(run=_opt)

    lower = sub.add_parser("lower", help="lower graph IR to loop IR and print it")
    lower.add_argument("file", help="a graph IR file, or - for standard input")
    lower.add_argument("-p", "--passes", default=None,
                       help="graph passes to run first (default: the default pipeline)")
    lower.add_argument("--constants", default="elide", choices=("table", "elide", "omit"))
    lower.add_argument("--target", default=None, help=TARGET_HELP)
    lower.add_argument("--schedule", nargs="?", const="-", default=None, metavar="FILE",
                       help="schedule as a compile does, and show each tunable kernel's"
                            " schedule (or write them to FILE, to edit and give back)")
    lower.add_argument("--schedules", default=None, metavar="FILE",
                       help="lower with the schedules in FILE (from --schedule or"
                            " EMBER_DUMP's schedules.json)")
    lower.set_defaults(run=_lower)

    sub.add_parser("passes", help="list the graph passes").set_defaults(run=_list_passes)
    sub.add_parser("ops", help="list the ops").set_defaults(run=_list_ops)
    sub.add_parser("demo", help="build, optimize and run a small model").set_defaults(run=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except EmberError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        if args.verbose:
            print("error: " + "\n".join(lines or [type(e).__name__]), file=sys.stderr)
        else:  # one line: the details joined, long ones cut
            text = " ".join(line for line in lines if not line.startswith("reproducer:"))
            cut = text if len(text) <= 300 else text[:297] + "..."
            print(f"error: {cut or type(e).__name__}", file=sys.stderr)
        return 1
