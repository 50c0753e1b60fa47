"""Checks on values: ops that return their operand unchanged and fail the run when it holds
a value the op after them cannot compute with (ember/graph/passes/checks.py puts them in
front of gathers, scatters and integer divisions).

The reference raises (an InterpreterError); compiled code writes the program's status
word, and the call raises a DataError naming the checked op (docs/reliability.md).
"""

from __future__ import annotations

import numpy as np

from ember.dtypes import INT_TYPES
from ember.errors import ShapeError
from ember.graph.ops.common import require_dtype
from ember.graph.ops.registry import Attr, define
from ember.graph.ops.shape import INDEX_TYPES, _in_range


def index_dims(indices_shape, data_shape, axis: int, nd: bool) -> tuple:
    """The sizes of the axes that `indices` address: data's axis `axis` for every element,
    or with `nd` the axes from `axis` on, one for each position along indices' last dim."""
    return tuple(data_shape[axis:axis + indices_shape[-1]]) if nd else (data_shape[axis],)


def _check_index_infer(types, attrs):
    (indices,) = types
    require_dtype(indices, INDEX_TYPES, "indices")
    dims, nd = attrs["dims"], attrs["nd"]
    if not dims or not nd and len(dims) != 1 or nd and (
            indices.rank < 1 or indices.shape[-1] != len(dims)):
        raise ShapeError(f"indices {indices} address one axis ({len(dims)} dims given), or with"
                         " nd an axis per position along their last dim")
    return indices


def _check_index_reference(indices, dims, nd):
    for j, dim in enumerate(dims):
        _in_range(indices[..., j] if nd else indices, int(dim))
    return indices


define("check_index", arity=1, attrs={"dims": Attr("ints"), "nd": Attr("bool", False)},
       infer=_check_index_infer, reference=_check_index_reference, traits=("pure",),
       family="checks",
       summary="indices, failing the run if one is outside [-dim, dim) of the axis it"
               " addresses: dims[0], or with nd dims[j] for indices[..., j]")


def _nonzero_reference(x):
    if not np.all(x):
        raise ZeroDivisionError("integer division by zero")
    return x


define("check_nonzero", arity=1, infer=lambda types, attrs: _integer(types[0]),
       reference=_nonzero_reference, traits=("pure",), family="checks",
       summary="x (an integer divisor), failing the run if an element is zero")


def _integer(t):
    require_dtype(t, INT_TYPES, "divisor")
    return t
