"""`graph.fused`: a group of ops that lowers to one kernel (made by the `fuse` pass).

Its region is isolated from above: the arguments stand for the operands, the region
yields the results. The `kind` attribute names the shape of the kernel (injective,
reduction, row, contraction; see ember/graph/fusion/policy.py) and must agree with what the
region holds, so hand-written IR is checked like the pass's output.
"""

from __future__ import annotations

from ember.errors import ShapeError
from ember.graph.ops.registry import Attr, define


def _fused_infer(types, attrs, regions):
    from ember.graph.fusion.policy import KINDS, Refusal, classify

    (body,) = regions
    if body.arg_types != list(types):
        raise ShapeError("region arguments (" + ", ".join(map(str, body.arg_types)) + ") do"
                         " not match the operands (" + ", ".join(map(str, types)) + ")")
    if attrs["kind"] not in KINDS:
        raise ShapeError(f"unknown fusion kind '{attrs['kind']}' (kinds: {', '.join(KINDS)})")
    ops = [op for op in body.ops if op.name != "constant"]
    plan = classify(ops, body.outputs)
    if isinstance(plan, Refusal):
        raise ShapeError(f"the region is not one kernel: {plan.reason}")
    if plan.kind != attrs["kind"]:
        raise ShapeError(f"the region is a {plan.kind} kernel, not {attrs['kind']}")
    return body.output_types


define("fused", arity=(0, None), num_regions=1, infer=_fused_infer, reference=None,
       attrs={"kind": Attr("str")}, traits=frozenset({"isolated"}),
       summary="a group of ops that becomes one kernel; runs its region on the operands",
       family="fusion")
