"""Running a pipeline of passes with the instruments every compiler engineer wants:
print after a pass or after all, dump every stage to a folder, verify after each pass,
time each pass, and dump a reproducer when a pass fails.

Environment: EMBER_VERIFY=1 verifies after every pass; EMBER_DUMP=dir writes the IR
after every pass to `dir/NN-<pass>.ir`; EMBER_REPRO_DIR (default: a temp folder) is
where reproducers go.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ember.errors import EmberError, PassError
from ember.graph.ir import Graph
from ember.graph.passes import GraphPass, get_pass
from ember.graph.symbolic import SymbolicShapeError
from ember.graph.text import parse_graph, print_graph
from ember.graph.text.printer import format_constant_table
from ember.graph.verify import verify_graph
from ember.util.files import write_atomically


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "no")


@dataclass
class PassTiming:
    name: str
    seconds: float


@dataclass
class PassManager:
    """Runs `passes` (names or GraphPass objects) in order over a graph."""

    passes: Sequence[str | GraphPass]
    verify_each: bool = field(default_factory=lambda: _env_flag("EMBER_VERIFY"))
    print_after: Sequence[str] = ()
    print_after_all: bool = False
    dump_dir: str | None = field(default_factory=lambda: os.environ.get("EMBER_DUMP") or None)
    print_stream: TextIO | None = None
    constants_mode: str = "elide"  # how dumps and prints show the constant table
    timings: list[PassTiming] = field(default_factory=list)
    # Binds a target's options to the passes that take them (`Backend.configure`).
    configure: Callable[[GraphPass], GraphPass] = lambda graph_pass: graph_pass

    def __post_init__(self) -> None:
        self.pipeline = [self.configure(get_pass(p)) if isinstance(p, str) else p
                         for p in self.passes]

    def run(self, graph: Graph) -> Graph:
        verify_graph(graph)
        self._dump(0, "input", graph)
        # A failing pass's reproducer is the graph it was given: the passes before it
        # replayed on the input (printed once; the table is shared, not copied).
        given = (print_graph(graph, constants="omit"), dict(graph.constants))
        for index, graph_pass in enumerate(self.pipeline, start=1):
            start = time.perf_counter()
            try:
                graph = graph_pass.run(graph)
                if self.verify_each:
                    verify_graph(graph)
            except SymbolicShapeError:  # a size needed as a number: the caller specializes
                raise
            except Exception as e:  # noqa: BLE001  (an internal error gets a reproducer too)
                path = self._reproducer(index, given, e)
                what = str(e) if isinstance(e, EmberError) else f"internal error: {e!r}"
                raise PassError(f"pass '{graph_pass.name}' failed: {what}\n"
                                f"  reproducer: {path}") from e
            self.timings.append(PassTiming(graph_pass.name, time.perf_counter() - start))
            if self.print_after_all or graph_pass.name in self.print_after:
                stream = self.print_stream or sys.stderr
                stream.write(f"// ----- IR after {graph_pass.name} -----\n")
                stream.write(print_graph(graph, constants=self.constants_mode))
            self._dump(index, graph_pass.name, graph)
        verify_graph(graph)
        return graph

    def _dump(self, index: int, name: str, graph: Graph) -> None:
        if self.dump_dir:
            path = Path(self.dump_dir) / f"{index:02d}-{name}.ir"
            write_atomically(path, print_graph(graph, constants=self.constants_mode))

    def _reproducer(self, index: int, given: tuple[str, dict], error: Exception) -> Path:
        """The reproducer of the `index`-th pass's failure on the graph `given` to the
        pipeline: that pass replayed on what the passes before it made of the graph, or,
        when replaying those fails, the pipeline up to it on the given graph."""
        body, constants = given
        text = body + format_constant_table(constants)
        names = [p.name for p in self.pipeline]
        failing, before = names[index - 1], self.pipeline[:index - 1]
        replay = failing
        try:
            graph = parse_graph(text)
            for graph_pass in before:
                graph = graph_pass.run(graph)
            text = print_graph(graph, constants="omit") + format_constant_table(graph.constants)
        except Exception:  # noqa: BLE001  (the whole pipeline reproduces it, then)
            replay = ",".join(names[:index])
        return write_reproducer(f"pass '{failing}' (pipeline {','.join(names)})", text, error,
                                f"python -m ember opt {{input}} -p {replay}")

    def timing_report(self) -> str:
        total = sum(t.seconds for t in self.timings) or 1e-12
        lines = [f"{'pass':<16}{'ms':>10}{'%':>7}"]
        for t in self.timings:
            lines.append(f"{t.name:<16}{t.seconds * 1e3:>10.2f}{100 * t.seconds / total:>7.1f}")
        lines.append(f"{'total':<16}{total * 1e3:>10.2f}")
        return "\n".join(lines)


def write_reproducer(stage: str, graph_text: str, error: Exception, replay: str) -> Path:
    """A folder holding the IR a stage failed on, the stage and error, and the command that
    replays it (`{input}` in `replay` names the IR file). EMBER_REPRO_DIR (default: a temp
    folder) is where it goes."""
    root = Path(os.environ.get("EMBER_REPRO_DIR") or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in stage.split(" (")[0]).strip("-")[:40]
    folder = Path(tempfile.mkdtemp(prefix=f"ember-repro-{slug}-", dir=root))
    write_atomically(folder / "input.ir", graph_text)
    write_atomically(folder / "README.txt",
                     f"{stage} failed:\n{type(error).__name__}: {error}\n\n"
                     f"replay: {replay.format(input=folder / 'input.ir')}\n")
    return folder


def run_passes(graph: Graph, passes: Sequence[str], **options) -> Graph:
    """Run the named passes over `graph` (options as for PassManager)."""
    return PassManager(passes, **options).run(graph)
