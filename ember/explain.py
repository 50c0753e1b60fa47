"""`ember.explain(compiled)`: what the compiler made of a model, kernel by kernel.

    report = ember.explain(fast)      # fast = ember.compile(model) after one call
    print(report)                     # a table: kernel, graph ops, bytes moved
    report.kernels[0].ops             # ['conv', 'add', 'relu']

Each kernel row names the graph ops it computes (several when they were fused) and the
bytes its parameters span: what one call reads and writes at least.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.errors import EmberError


@dataclass(frozen=True)
class KernelInfo:
    name: str
    ops: list[str]  # graph op names, in program order
    origin: str  # the fused op (or op) and where it came from
    bytes: int


@dataclass(frozen=True)
class Report:
    kernels: list[KernelInfo]
    timings: dict[str, float]  # seconds per compile stage, when this process built it

    @property
    def total_bytes(self) -> int:
        return sum(k.bytes for k in self.kernels)

    def __str__(self) -> str:
        rows = [(k.name, " + ".join(k.ops), _size(k.bytes)) for k in self.kernels]
        head = ("kernel", "graph ops", "bytes")
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]

        def line(cells) -> str:
            a, b, c = cells
            return f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}"

        out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
        fused = sum(1 for k in self.kernels if len(k.ops) > 1)
        ops = sum(len(k.ops) for k in self.kernels)
        out.append(f"{len(self.kernels)} kernels ({fused} fused) for {ops} graph ops;"
                   f" {_size(self.total_bytes)} moved at least")
        return "\n".join(out)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def explain(compiled: Any) -> Report:
    """The report of a compiled model: `ember.compile(...)`'s result (called at least once,
    so that it has specialized), or an Executable."""
    executable = _latest_executable(compiled)
    table = executable.notes.get("kernel_table")
    if table is None:
        raise EmberError("this executable carries no kernel table (built by an older Ember?)")
    kernels = [KernelInfo(k["name"], list(k["ops"]), k["origin"], int(k["bytes"]))
               for k in table]
    return Report(kernels, dict(executable.notes.get("timings", {})))


def _latest_executable(obj: Any) -> Any:
    from ember.runtime.executable import Executable

    seen = obj
    for _ in range(8):  # unwrap: module -> specialization -> runner -> executable
        if isinstance(obj, Executable):
            return obj
        if hasattr(obj, "specializations"):  # an ONNX EmberRep: newest first
            obj = obj.specializations[0].run if obj.specializations else None
        elif hasattr(obj, "cache") and hasattr(obj, "specialize"):  # a CompiledModule
            obj = next(reversed(obj.cache.values()), None)
        elif hasattr(obj, "graph_runner"):
            obj = obj.graph_runner
        elif hasattr(obj, "run"):
            obj = obj.run
        else:
            obj = None
        if obj is None:
            break
    raise EmberError(f"nothing compiled to explain in {type(seen).__name__}: compile it with"
                     " the cpu executor and call it once (explain reports the newest"
                     " specialization)")
