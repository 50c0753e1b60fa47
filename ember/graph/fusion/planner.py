"""Choosing fusion groups: candidates ranked by the bytes they save, merged greedily while
`can_fuse` agrees.

A group starts as one op. Every producer-consumer edge between fusable ops is a candidate,
worth the bytes of the value that would stop crossing memory; so is every pair of
injective groups that read the same value (siblings: one nest reads it once). Candidates
are tried epilogues first (edges out of a contraction or reduction), then from the most
bytes down; a merge is accepted when the union still lowers to one kernel (`classify`),
inlining recomputes nothing expensive, and no path leaves the union and comes back,
through other ops or through other groups (which would make the fused op depend on
itself). Merging can make an earlier refusal legal (a value whose last outside user
joined), so the sweep repeats until nothing changes.

`EMBER_FUSION_FUEL=N` stops after N merges, to bisect a wrong fusion.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ember.graph.fusion.policy import Decision, Refusal, category, classify, recomputed
from ember.graph.ir import Op, Region, Value
from ember.graph.symbolic import size_hint


def fusion_fuel() -> int | None:
    """The merge budget from EMBER_FUSION_FUEL (None: unlimited)."""
    text = os.environ.get("EMBER_FUSION_FUEL")
    return int(text) if text not in (None, "") else None


def _uses(op: Op) -> set[Value]:
    """The values `op` reads, including those its nested regions capture."""
    used = set(op.operands)
    for region in op.regions:
        for inner in region.walk():
            used.update(inner.operands)
        used.update(region.outputs)
    return used


@dataclass
class Group:
    ops: list[Op]  # in program order

    @property
    def members(self) -> set[Op]:
        return set(self.ops)


class FusionPlanner:
    """Groups the ops of one region (its nested regions are planned on their own)."""

    def __init__(self, region: Region, fuel: int | None = None):
        self.region = region
        self.position = {op: i for i, op in enumerate(region.ops)}
        self.users: dict[Value, list[Op]] = {}
        for op in region.ops:
            for value in _uses(op):
                self.users.setdefault(value, []).append(op)
        self.escaping = set(region.outputs)
        self.group_of: dict[Op, Group] = {op: Group([op]) for op in region.ops
                                          if category(op) != "opaque"}
        self.merged: list[Group] = []  # the groups of two or more ops, made by merges
        self.fuel = fuel
        self.merges = 0
        self.log: list[tuple[str, Decision]] = []

    # -- the decision ------------------------------------------------------------------------
    def outputs(self, members: set[Op]) -> list[Value]:
        """The values of `members` that something outside them reads."""
        return [r for op in sorted(members, key=self.position.__getitem__) for r in op.results
                if r in self.escaping or any(u not in members for u in self.users.get(r, ()))]

    def can_fuse(self, a: Group, b: Group) -> Decision:
        """Whether groups `a` and `b` may become one kernel, and what that saves."""
        members = a.members | b.members
        ops = sorted(members, key=self.position.__getitem__)
        outputs = self.outputs(members)
        plan = classify(ops, outputs)
        if isinstance(plan, Refusal):
            return Decision(None, plan.reason)
        expensive = recomputed(plan, [op for op in ops if op.result not in outputs])
        if expensive is not None:
            return Decision(None, f"{expensive.where()} would be recomputed for every element"
                                  " that reads its broadcast value")
        if self.creates_cycle(members):
            return Decision(None, "a path leaves the group and comes back (a cycle)")
        before = self.outputs(a.members) + self.outputs(b.members)
        saved = sum(v.type.nbytes for v in before if v not in outputs)
        return Decision(plan, bytes_saved=saved)

    def creates_cycle(self, members: set[Op]) -> bool:
        """Whether a path leaves `members` and comes back: through ops outside them, or
        through another group, which becomes one op too (entered at any of its members, it
        is left from any)."""
        last = max(self.position[op] for op in members)
        # A path only moves forward in program order, except across another group: only a
        # group with members on both sides of `last` can carry it back, so the search ends
        # past the last member of any such group.
        bound = last
        for group in self.merged:
            if group.ops[0] not in members and self.position[group.ops[0]] <= last \
                    < self.position[group.ops[-1]]:
                bound = max(bound, self.position[group.ops[-1]])
        stack = [u for op in members for r in op.results for u in self.users.get(r, ())
                 if u not in members]
        seen: set[Op] = set()
        while stack:
            op = stack.pop()
            if op in seen or self.position[op] > bound:
                continue
            group = self.group_of.get(op)
            for mate in group.ops if group is not None else (op,):
                seen.add(mate)
                for r in mate.results:
                    for user in self.users.get(r, ()):
                        if user in members:
                            return True
                        stack.append(user)
        return False

    # -- the search ----------------------------------------------------------------------------
    def candidates(self) -> list[tuple[int, Op, Op]]:
        """(bytes, a, b) for each producer-consumer edge and each pair of sibling readers."""
        found = []
        for op in self.region.ops:
            if op not in self.group_of:
                continue
            for value in op.operands:
                producer = value.producer
                if producer in self.group_of:
                    found.append((size_hint(value.type.nbytes), producer, op))
        for value, users in self.users.items():
            readers = [u for u in dict.fromkeys(users) if u in self.group_of]
            for a, b in zip(readers, readers[1:]):
                found.append((size_hint(value.type.nbytes), a, b))
        # Epilogues first: a contraction's or reduction's result is worth the most to keep
        # in registers, and an injective group that took its consumer first would shut the
        # epilogue out. Then by bytes; program order among equals (a stable sort).
        found.sort(key=lambda c: (category(c[1]) not in ("contraction", "reduction"), -c[0]))
        return found

    def run(self) -> list[list[Op]]:
        """The groups of two or more ops, each in program order."""
        candidates = self.candidates()
        changed = True
        while changed:
            changed = False
            for _, x, y in candidates:
                a, b = self.group_of[x], self.group_of[y]
                if a is b:
                    continue
                if self.fuel is not None and self.merges >= self.fuel:
                    return self.groups()
                decision = self.can_fuse(a, b)
                self.log.append((f"{x.where()} + {y.where()}", decision))
                if decision:
                    self.merge(a, b)
                    changed = True
        return self.groups()

    def merge(self, a: Group, b: Group) -> None:
        merged = Group(sorted(a.members | b.members, key=self.position.__getitem__))
        for op in merged.ops:
            self.group_of[op] = merged
        self.merged = [g for g in self.merged if g is not a and g is not b] + [merged]
        self.merges += 1

    def groups(self) -> list[list[Op]]:
        unique = {id(g): g for g in self.group_of.values()}
        return [g.ops for g in unique.values() if len(g.ops) > 1]


def plan_groups(region: Region, fuel: int | None = None) -> tuple[list[list[Op]], int]:
    """The fusion groups of `region` and the number of merges made."""
    planner = FusionPlanner(region, fuel)
    groups = planner.run()
    return groups, planner.merges


def describe(ops: Sequence[Op]) -> str:
    return " + ".join(op.name for op in ops)
