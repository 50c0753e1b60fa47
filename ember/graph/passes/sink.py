"""Rematerialization into branches: an array that a branch of an `if` reads from outside,
made by cheap elementwise ops, is computed again inside the branch.

Fusion works within a region, so a branch that reads an array computed outside reads it
from memory: the op outside stores it whole for the branch (CSE merges an op in a branch
with its equal outside, which makes this common: a scripted loop's `if` on a test that
the update reuses). Computed again inside, the branch's fused kernels take it in, and
the store outside goes when nothing else there reads it (a Mandelbrot step stored z^2
twice, the test and its i32 cast for its branch: 17 of its 50 MB a step).

Legal because the ops are pure and their operands are visible in the branch; a clone of
an op whose operands are cheap elementwise arrays too brings them along (a chain, at most
MAX_CLONES ops a branch). Not into loop bodies: a value from outside a loop is the same
every iteration, and computing it again each time is the opposite of hoisting. Inside a
loop body, its own ops are sunk into its branches.
"""

from __future__ import annotations

import math
from collections import ChainMap

from ember.graph.ir import Graph, Op, Region, Value, replace_uses
from ember.graph.passes import graph_pass

MAX_CLONES = 32  # ops computed again in one branch


def sinkable(op: Op) -> bool:
    """A cheap elementwise op: pure, no regions, nothing transcendental or expensive."""
    traits = op.opdef.traits
    return not op.regions and "elementwise" in traits and "pure" in traits and \
        "transcendental" not in traits and "expensive" not in traits and len(op.results) == 1


def _array(value: Value) -> bool:
    """Whether `value` holds more than one element (a scalar costs nothing to read)."""
    shape = value.type.shape
    return not all(isinstance(d, int) for d in shape) or math.prod(shape) > 1


class _Branch:
    """The clones made for one branch, in an order that computes operands first."""

    def __init__(self, producers: ChainMap):
        self.producers = producers  # value -> the op outside that makes it
        self.clones: dict[Value, Value] = {}
        self.ops: list[Op] = []

    def inside(self, value: Value, top: bool = True) -> Value:
        """`value` as the branch reads it: a clone of its producer where that pays."""
        if value in self.clones:
            return self.clones[value]
        op = self.producers.get(value)
        if op is None or not sinkable(op) or (top and not _array(value)) or \
                len(self.ops) >= MAX_CLONES:
            return value
        clone = Op(op.name, [self.inside(v, top=False) for v in op.operands], dict(op.attrs),
                   [op.result.type], loc=op.loc)
        self.ops.append(clone)
        self.clones[value] = clone.result
        return clone.result


def _outside_reads(branch: Region) -> list[Value]:
    """Values the branch (its nested regions included) reads that it does not define."""
    own = set(branch.args)
    for op in branch.walk():
        own.update(op.results)
        own.update(arg for inner in op.regions for arg in inner.args)
    reads = [v for op in branch.walk()
             for v in (*op.operands, *(v for inner in op.regions for v in inner.outputs))]
    return list(dict.fromkeys(v for v in (*reads, *branch.outputs) if v not in own))


def _sink(region: Region, producers: ChainMap) -> int:
    """Sink into the branches of `region`'s ifs (and theirs); returns the ops cloned."""
    cloned = 0
    for op in region.ops:
        if op.name == "if":
            for branch in op.regions:
                made = _Branch(producers)
                replaced = {v: made.inside(v) for v in _outside_reads(branch)}
                replaced = {v: new for v, new in replaced.items() if new is not v}
                if replaced:
                    replace_uses(branch, replaced)
                    branch.ops[:0] = made.ops
                    cloned += len(made.ops)
                cloned += _sink(branch, producers.new_child())
        elif op.regions:  # a loop body (or another region): its own ops only
            for inner in op.regions:
                cloned += _sink(inner, ChainMap())
        for r in op.results:
            producers[r] = op
    return cloned


@graph_pass("sink_into_branches",
            "compute cheap elementwise arrays again inside the if branches that read them")
def sink_into_branches(graph: Graph) -> Graph:
    _sink(graph.body, ChainMap())
    return graph
