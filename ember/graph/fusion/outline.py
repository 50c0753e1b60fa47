"""Outlining: a group of ops becomes one `graph.fused` op whose region holds copies of them.

The region is isolated: its arguments are the values the group reads from outside (one-
element constants are copied in instead, so that kernels see them as literals), and it
yields the values that something outside the group reads. Uses of those values elsewhere
are redirected to the fused op's results, and the body is re-sorted topologically (a user
of an early member may sit before the group's last member).
"""

from __future__ import annotations

from collections.abc import Sequence

from ember.graph.fusion.policy import FusionPlan
from ember.graph.ir import Graph, Op, Region, Value, replace_uses


def _is_scalar_constant(value: Value) -> bool:
    producer = value.producer
    return producer is not None and producer.name == "constant" and value.type.numel == 1


def outline(graph: Graph, region: Region, ops: Sequence[Op], plan: FusionPlan,
            users: dict[Value, list[Op]]) -> Op:
    """Replace `ops` (in program order) of `region` by one fused op; returns it."""
    members = set(ops)
    inputs: list[Value] = []
    constants: list[Op] = []
    for op in ops:
        for value in op.operands:
            if value.producer in members or value in inputs:
                continue
            if _is_scalar_constant(value):
                if value.producer not in constants:
                    constants.append(value.producer)
            else:
                inputs.append(value)
    escaping = set(region.outputs)
    outputs = [r for op in ops for r in op.results
               if r in escaping or any(u not in members for u in users.get(r, ()))]

    body = Region([v.type for v in inputs], [v.name for v in inputs])
    mapping: dict[Value, Value] = dict(zip(inputs, body.args))
    for op in [*constants, *ops]:
        copy = Op(op.name, [mapping[v] for v in op.operands], dict(op.attrs),
                  [r.type for r in op.results], (), op.loc, [r.name for r in op.results])
        mapping.update(zip(op.results, copy.results))
        body.ops.append(copy)
    body.outputs = [mapping[v] for v in outputs]

    root = plan.root or ops[-1]
    fused = Op("fused", inputs, {"kind": plan.kind}, [v.type for v in outputs], [body],
               root.loc, [v.name for v in outputs])
    replace = dict(zip(outputs, fused.results))
    replace_uses(graph.body, replace)
    first = next(i for i, op in enumerate(region.ops) if op in members)
    region.ops = [fused if op is ops[-1] else op for op in region.ops if op not in members
                  or op is ops[-1]]
    # Only an op between the group's first member and its last can read the fused op
    # before it: re-sort when one does (each fusion re-sorting the whole graph made fusing
    # a graph of n ops O(n^2)).
    results = set(fused.results)
    between = region.ops[first:region.ops.index(fused, first)]
    if any(results.intersection(_reads(op)) for op in between):
        region.ops = _topological(region.ops)
    return fused


def _topological(ops: list[Op]) -> list[Op]:
    """`ops` in an order where each op follows the producers of what it reads (stable)."""
    produced_here = {r: op for op in ops for r in op.results}
    placed: set[Op] = set()
    order: list[Op] = []

    # A depth-first walk, each op entered once: an op that many others read, pushed again
    # for each before it was placed, was expanded again each time (a DAG of diamonds made
    # the stack grow exponentially: 11 GB on a random graph of the property tests).
    entered: set[Op] = set()
    for start in ops:
        stack = [(start, False)]
        while stack:
            op, expanded = stack.pop()
            if expanded:
                placed.add(op)
                order.append(op)
                continue
            if op in entered:  # (placed, or being placed: a DAG has no cycle back to it)
                continue
            entered.add(op)
            stack.append((op, True))
            stack.extend((dep, False) for dep in _producers(op, produced_here)
                         if dep not in entered)
    return order


def _reads(op: Op) -> set[Value]:
    """The values `op` (or an op in its regions) reads."""
    used = set(op.operands)
    for region in op.regions:
        for inner in region.walk():
            used.update(inner.operands)
    return used


def _producers(op: Op, produced_here: dict) -> list[Op]:
    """The ops of `produced_here` whose results `op` (or an op in its regions) reads."""
    return [produced_here[v] for v in _reads(op) if v in produced_here]
