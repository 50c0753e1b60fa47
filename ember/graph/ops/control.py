"""Structured control flow: `if` with two regions, `loop` with a body region.

Regions see the values of enclosing regions (implicit capture, as in MLIR's scf), so
frontends need not thread every outer value through.
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.errors import ShapeError
from ember.graph.ops.common import require_scalar
from ember.graph.ops.registry import Attr, define


def _types_str(types) -> str:
    return "(" + ", ".join(str(t) for t in types) + ")"


def _if_infer(types, attrs, regions):
    require_scalar(types[0], DType.bool, "condition")
    then_region, else_region = regions
    for which, region in (("then", then_region), ("else", else_region)):
        if region.args:
            raise ShapeError(f"the {which} region takes no arguments, got {len(region.args)}")
    if then_region.output_types != else_region.output_types:
        raise ShapeError(
            f"then region yields {_types_str(then_region.output_types)} but else region"
            f" yields {_types_str(else_region.output_types)}"
        )
    return then_region.output_types


define("if", arity=(1, 1), num_regions=2, infer=_if_infer, reference=None,
       summary="run the then or the else region by a bool scalar; yields their outputs",
       family="control")


def _loop_infer(types, attrs, regions):
    """loop(trip_count, cond, carried...) body(i, carried...) -> (cond, carried..., scans...)."""
    (body,) = regions
    require_scalar(types[0], DType.i64, "trip count")
    require_scalar(types[1], DType.bool, "initial condition")
    carried = types[2:]
    num_scan, scan_length = attrs["num_scan"], attrs["scan_length"]
    if num_scan < 0 or scan_length < 0:
        raise ShapeError("num_scan and scan_length must be non-negative")
    want_args = [types[0], *carried]
    if body.arg_types != want_args:
        raise ShapeError(
            f"body region takes {_types_str(body.arg_types)}, expected (iteration,"
            f" carried...) = {_types_str(want_args)}"
        )
    outs = body.output_types
    if len(outs) != 1 + len(carried) + num_scan:
        raise ShapeError(
            f"body region yields {len(outs)} values, expected 1 condition +"
            f" {len(carried)} carried + {num_scan} scan outputs"
        )
    require_scalar(outs[0], DType.bool, "yielded condition")
    if outs[1 : 1 + len(carried)] != list(carried):
        raise ShapeError(
            f"body yields carried values {_types_str(outs[1:1 + len(carried)])}, expected"
            f" {_types_str(carried)}"
        )
    scans = [t.with_shape((scan_length, *t.shape)) for t in outs[1 + len(carried):]]
    return [*carried, *scans]


define("loop", arity=(2, None), num_regions=1, infer=_loop_infer, reference=None,
       attrs={"num_scan": Attr("int", 0), "scan_length": Attr("int", 0)},
       summary="run the body while i < trip_count and cond; carried values flow between"
               " iterations, scan outputs are stacked (exactly scan_length iterations)",
       family="control")
