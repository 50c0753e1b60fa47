"""Reductions: sum, prod, max and min over a set of axes; argmax and argmin along one axis.

Reducing over an empty axis gives the reduction's identity (0, 1, the lowest or highest
value of the dtype), so every reduction is defined on every shape. Integer sums and
products wrap in the input dtype, as the compiled code does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ember.dtypes import NUMERIC_TYPES, DType
from ember.errors import ShapeError
from ember.graph.ir import TensorType
from ember.graph.ops.common import axis_of, normalize_axes, require_dtype
from ember.graph.ops.registry import Attr, define


def reduced_shape(shape: Sequence[int], axes: Sequence[int], keepdims: bool) -> tuple[int, ...]:
    """`shape` with `axes` (normalized) dropped, or kept as 1 when `keepdims`."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_infer(types, attrs):
    (x,) = types
    require_dtype(x, NUMERIC_TYPES)
    axes = normalize_axes(attrs["axes"], x.rank)
    return x.with_shape(reduced_shape(x.shape, axes, attrs["keepdims"]))


def _extreme(dtype: np.dtype, highest: bool):
    """The identity of min (highest) or max (not highest) in `dtype`."""
    if dtype.kind == "f":
        return np.inf if highest else -np.inf
    info = np.iinfo(dtype)
    return info.max if highest else info.min


def _reducer(kind: str):
    def reference(x, axes, keepdims):
        axes = normalize_axes(axes, x.ndim)
        if kind in ("sum", "prod"):
            # dtype= keeps small integers from widening, so sums wrap like compiled code.
            fn = np.sum if kind == "sum" else np.prod
            return fn(x, axis=axes, keepdims=keepdims, dtype=x.dtype)
        fn = np.max if kind == "max" else np.min
        return fn(x, axis=axes, keepdims=keepdims, initial=_extreme(x.dtype, kind == "min"))

    return reference


REDUCTIONS = {
    "reduce_sum": ("sum", "sum over `axes`; empty axes give 0"),
    "reduce_prod": ("prod", "product over `axes`; empty axes give 1"),
    "reduce_max": ("max", "maximum over `axes` (NaN wins); empty axes give the lowest value"),
    "reduce_min": ("min", "minimum over `axes` (NaN wins); empty axes give the highest value"),
}

for _name, (_kind, _summary) in REDUCTIONS.items():
    define(_name, arity=1, infer=_reduce_infer, reference=_reducer(_kind),
           attrs={"axes": Attr("ints"), "keepdims": Attr("bool", False)},
           traits=("pure",), summary=_summary, family="reduce", category="reduction")


def _arg_infer(types, attrs):
    (x,) = types
    require_dtype(x, NUMERIC_TYPES)
    axis = axis_of(x, attrs["axis"])
    if x.shape[axis] == 0:
        raise ShapeError(f"cannot take the index of an extreme along axis {axis} of length 0"
                         f" in {x}")
    return TensorType(DType.i64, reduced_shape(x.shape, (axis,), attrs["keepdims"]))


def _arg_reducer(fn):
    def reference(x, axis, keepdims, select_last_index):
        axis = axis % x.ndim
        if not select_last_index:
            return fn(x, axis=axis, keepdims=keepdims)
        # NumPy returns the first of equal extremes; searching the reversed axis finds the last.
        return x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis, keepdims=keepdims)

    return reference


for _name, _fn, _what in (("argmax", np.argmax, "largest"), ("argmin", np.argmin, "smallest")):
    define(_name, arity=1, infer=_arg_infer, reference=_arg_reducer(_fn),
           attrs={"axis": Attr("int", 0), "keepdims": Attr("bool", False),
                  "select_last_index": Attr("bool", False)},
           traits=("pure",), family="reduce",
           summary=f"i64 index of the {_what} element along `axis` (NaN wins; first on ties)")
