"""Every primitive graph op (one without a decomposition) has a lowering to loops, so an
op that is defined but not lowered fails here rather than when a model first uses it."""

from __future__ import annotations

from ember.graph.ops import all_opdefs
from ember.loops.lower.core import find_lowering, lowered_ops

# Primitive ops that the program lowering handles itself instead of a registered lowering.
LOWERED_ELSEWHERE = {
    "constant": "becomes a program buffer of kind constant (loops/lower/program.py)",
    "if": "becomes a ProgramIf step over its regions' steps (loops/lower/program.py)",
    "loop": "becomes a ProgramLoop step over its region's steps (loops/lower/program.py)",
    "fused": "its region becomes one kernel (loops/lower/fused.py)",
}


def test_every_primitive_op_has_a_lowering() -> None:
    missing = [d.name for d in all_opdefs() if not d.is_composite
               and d.name not in LOWERED_ELSEWHERE and find_lowering(d.name) is None]
    assert not missing, ("primitive ops without a lowering (add one under"
                         f" ember/loops/lower/ops/): {missing}")


def test_ops_lowered_elsewhere_are_primitive_ops_without_a_lowering() -> None:
    primitive = {d.name for d in all_opdefs() if not d.is_composite}
    stale = [name for name in LOWERED_ELSEWHERE
             if name not in primitive or find_lowering(name) is not None]
    assert not stale, f"LOWERED_ELSEWHERE names ops it need not: {stale}"


def test_every_lowering_is_of_a_defined_op() -> None:
    defined = {d.name for d in all_opdefs()}
    assert not [name for name in lowered_ops() if name not in defined]
