"""Put a check in front of each op whose operands can hold values it cannot compute with:

    gather(x, i) {axis}        ->  gather(x, check_index(i) {dims = [x.shape[axis]]}) {axis}
    div(a, b: integers)        ->  div(a, check_nonzero(b))

Gathers and scatters (their indices: outside [-dim, dim) the reference raises IndexError,
PyTorch and ONNX Runtime fail the run) and integer div, mod and fmod (a divisor
of zero: PyTorch and Python raise ZeroDivisionError). The kernels of those ops clamp an
index into its axis and give 0 for a zero divisor, so that nothing reads out of bounds or
traps; the check makes such a run fail with a DataError naming the op, instead of
returning a value computed from a clamped index. A constant operand is checked here: one
that passes needs no check at run time (`x // 2`, a table of fixed indices).

A backend whose programs report a status word runs this pass (the CPU's; the GPU's code
keeps the clamped semantics: docs/reliability.md).
"""

from __future__ import annotations

import numpy as np

from ember.graph.builder import Builder
from ember.graph.ir import Graph, Op, Value
from ember.graph.ops.checks import index_dims
from ember.graph.passes import graph_pass
from ember.graph.rewrite import PatternTable, apply_patterns

checks = PatternTable()

# op -> (indices operand, data operand, the axis attribute (None: 0), nd)
INDEXED = {
    "gather": (1, 0, "axis", False),
    "gather_elements": (1, 0, "axis", False),
    "scatter_elements": (1, 0, "axis", False),
    "gather_nd": (1, 0, "batch_dims", True),
    "scatter_nd": (1, 0, None, True),
}
DIVISIONS = ("div", "mod", "fmod")


def _constant(graph: Graph, value: Value) -> np.ndarray | None:
    op = value.producer
    return graph.constant_data(op) if op is not None and op.name == "constant" else None


def _checked(value: Value) -> bool:
    return value.producer is not None and value.producer.name.startswith("check_")


def _with_operand(op: Op, b: Builder, index: int, value: Value) -> list[Value]:
    operands = list(op.operands)
    operands[index] = value
    return list(b.op(op.name, operands, dict(op.attrs), loc=op.loc).results)


@checks.on(*INDEXED)
def check_indices(op: Op, b: Builder) -> list[Value] | None:
    at, data_at, axis_attr, nd = INDEXED[op.name]
    indices, data = op.operands[at], op.operands[data_at]
    if _checked(indices) or 0 in indices.shape:
        return None
    axis = op.attrs[axis_attr] % data.type.rank if axis_attr else 0
    known = _constant(b.graph, indices)
    dims = index_dims(indices.shape, data.shape, axis, nd)
    if known is not None and all(isinstance(d, int) for d in dims):
        parts = [known[..., j] for j in range(len(dims))] if nd else [known]
        if all(np.all((p >= -d) & (p < d)) for p, d in zip(parts, dims)):
            return None
    # (The sizes as attributes, not data as an operand: a scatter computed in its input's
    # memory must be that input's only reader.)
    checked = b.op("check_index", [indices], {"dims": list(dims), "nd": nd}, loc=op.loc).result
    return _with_operand(op, b, at, checked)


@checks.on(*DIVISIONS)
def check_divisor(op: Op, b: Builder) -> list[Value] | None:
    divisor = op.operands[1]
    if not divisor.dtype.is_int or _checked(divisor):
        return None
    known = _constant(b.graph, divisor)
    if known is not None and np.all(known):
        return None
    checked = b.op("check_nonzero", [divisor], {}, loc=op.loc).result
    return _with_operand(op, b, 1, checked)


@graph_pass("check_values", "check the indices of gathers and scatters and the divisors of"
                            " integer divisions at run time")
def check_values(graph: Graph) -> Graph:
    apply_patterns(graph, checks)
    return graph
