"""The pattern-rewrite driver: tables of local rewrites applied to a fixed point.

A pattern is a function `(op, builder) -> list[Value] | None` registered for an op name
(or for every op, under `ANY`). It may create new ops with `builder` (they land just
before `op`) and returns the values that replace op's results, or None to decline.
Tables compose with `+`. The driver owns the traversal: it sweeps every region in
program order, remaps uses of replaced values, and repeats until nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ember.errors import PassError
from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Region, Value

ANY = "*"
Pattern = Callable[[Op, Builder], "list[Value] | None"]


@dataclass
class PatternTable:
    patterns: dict[str, list[Pattern]] = field(default_factory=dict)

    def add(self, opname: str, pattern: Pattern) -> Pattern:
        self.patterns.setdefault(opname, []).append(pattern)
        return pattern

    def on(self, *opnames: str) -> Callable[[Pattern], Pattern]:
        """Decorator: register the pattern for each of `opnames`."""

        def register(pattern: Pattern) -> Pattern:
            for name in opnames:
                self.add(name, pattern)
            return pattern

        return register

    def __add__(self, other: PatternTable) -> PatternTable:
        merged: dict[str, list[Pattern]] = {k: list(v) for k, v in self.patterns.items()}
        for name, patterns in other.patterns.items():
            merged.setdefault(name, []).extend(patterns)
        return PatternTable(merged)

    def for_op(self, opname: str) -> Iterable[Pattern]:
        yield from self.patterns.get(opname, ())
        yield from self.patterns.get(ANY, ())


def apply_patterns(graph: Graph, table: PatternTable, max_sweeps: int = 100) -> int:
    """Rewrite `graph` in place until no pattern applies; returns the number of rewrites."""
    total = 0
    for _ in range(max_sweeps):
        driver = _Sweep(graph, table)
        driver.region(graph.body)
        if not driver.rewrites:
            return total
        total += driver.rewrites
    raise PassError(f"pattern rewriting did not converge in {max_sweeps} sweeps")


class _Sweep:
    def __init__(self, graph: Graph, table: PatternTable):
        self.graph = graph
        self.table = table
        self.replaced: dict[Value, Value] = {}
        self.rewrites = 0

    def resolve(self, value: Value) -> Value:
        while value in self.replaced:
            value = self.replaced[value]
        return value

    def region(self, region: Region) -> None:
        old_ops, region.ops = region.ops, []
        builder = Builder(graph=self.graph, region=region)
        for op in old_ops:
            op.operands = [self.resolve(v) for v in op.operands]
            for inner in op.regions:
                self.region(inner)
            replacement = self.rewrite(op, builder)
            if replacement is None:
                region.ops.append(op)
                continue
            self.rewrites += 1
            for old, new in zip(op.results, replacement):
                if old.type != new.type:
                    raise PassError(f"a rewrite of {op.where()} replaced a {old.type} value"
                                    f" with a {new.type} one")
                self.replaced[old] = new
        region.outputs = [self.resolve(v) for v in region.outputs]

    def rewrite(self, op: Op, builder: Builder) -> list[Value] | None:
        for pattern in self.table.for_op(op.name):
            builder.loc = op.loc
            mark = len(builder.region.ops)
            result = pattern(op, builder)
            if result is not None and list(result) != op.results:
                return list(result)
            del builder.region.ops[mark:]  # a pattern that declines leaves nothing behind
        return None
