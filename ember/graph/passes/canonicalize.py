"""Canonicalization: local identities that make graphs smaller and more regular.

x + 0, x - 0, x * 1, x / 1, neg(neg(x)), not(not(x)) -> x; transpose of a transpose
composes (to nothing when the permutations cancel); reshape of a reshape is one reshape;
reshape, broadcast, cast, slice, pad and concat that change nothing disappear; `where` on
a constant condition picks its operand; a zero pad around a convolution's spatial axes
becomes the convolution's own padding. An identity
applies only when the result has the operand's exact type, so broadcasting through
`x + 0` is kept.
"""

from __future__ import annotations

import numpy as np

from ember.graph.builder import Builder
from ember.graph.ir import Op, Value
from ember.graph.passes import graph_pass
from ember.graph.passes.fold import constant_value
from ember.graph.rewrite import PatternTable, apply_patterns

canonical_patterns = PatternTable()


def _is_splat(b: Builder, value: Value, scalar: float) -> bool:
    data = constant_value(b.graph, value)
    return data is not None and data.size > 0 and bool(np.all(data == scalar))


def _same_type(op: Op, value: Value) -> list[Value] | None:
    return [value] if value.type == op.result.type else None


def _identity_operand(neutral: float, commutative: bool):
    def pattern(op: Op, b: Builder) -> list[Value] | None:
        x, y = op.operands
        if _is_splat(b, y, neutral):
            return _same_type(op, x)
        if commutative and _is_splat(b, x, neutral):
            return _same_type(op, y)
        return None

    return pattern


canonical_patterns.add("add", _identity_operand(0, commutative=True))
canonical_patterns.add("sub", _identity_operand(0, commutative=False))
canonical_patterns.add("mul", _identity_operand(1, commutative=True))
canonical_patterns.add("div", _identity_operand(1, commutative=False))


@canonical_patterns.on("neg", "not", "bitwise_not")
def involution(op: Op, b: Builder) -> list[Value] | None:
    inner = op.operands[0].producer
    if inner is not None and inner.name == op.name:
        return [inner.operands[0]]
    return None


@canonical_patterns.on("transpose")
def compose_transposes(op: Op, b: Builder) -> list[Value] | None:
    perm = op.attrs["perm"]
    if list(perm) == list(range(len(perm))):
        return [op.operands[0]]
    inner = op.operands[0].producer
    if inner is None or inner.name != "transpose":
        return None
    composed = tuple(inner.attrs["perm"][p] for p in perm)
    if composed == tuple(range(len(composed))):
        return [inner.operands[0]]
    return [b.transpose(inner.operands[0], perm=composed)]


@canonical_patterns.on("reshape")
def fold_reshapes(op: Op, b: Builder) -> list[Value] | None:
    x = op.operands[0]
    if x.type == op.result.type:
        return [x]
    inner = x.producer
    if inner is not None and inner.name == "reshape":
        return [b.reshape(inner.operands[0], shape=op.attrs["shape"])]
    return None


@canonical_patterns.on("broadcast", "cast")
def drop_no_op(op: Op, b: Builder) -> list[Value] | None:
    return _same_type(op, op.operands[0])


@canonical_patterns.on("slice")
def drop_full_slice(op: Op, b: Builder) -> list[Value] | None:
    x = op.operands[0]
    full = all(s == 0 and e == d and st == 1 for s, e, st, d in
               zip(op.attrs["starts"], op.attrs["ends"], op.attrs["steps"], x.shape))
    return [x] if full else None


@canonical_patterns.on("concat")
def drop_single_concat(op: Op, b: Builder) -> list[Value] | None:
    return [op.operands[0]] if len(op.operands) == 1 else None


@canonical_patterns.on("pad")
def drop_empty_pad(op: Op, b: Builder) -> list[Value] | None:
    return [op.operands[0]] if not any(op.attrs["pads"]) else None


@canonical_patterns.on("conv")
def absorb_zero_pad(op: Op, b: Builder) -> list[Value] | None:
    """conv(pad(x) with zeros around the spatial axes) is a conv of x with more padding."""
    pad = op.operands[0].producer
    if (pad is None or pad.name != "pad" or pad.attrs["mode"] != "constant"
            or pad.attrs["value"] != 0.0):
        return None
    rank = len(op.operands[0].shape)
    begins, ends = pad.attrs["pads"][:rank], pad.attrs["pads"][rank:]
    if any(begins[:2]) or any(ends[:2]) or min(pad.attrs["pads"]) < 0:
        return None
    nd = rank - 2
    pads = list(op.attrs["pads"]) or [0] * (2 * nd)
    pads = [p + q for p, q in zip(pads, [*begins[2:], *ends[2:]])]
    return [b.op("conv", [pad.operands[0], *op.operands[1:]], {**op.attrs, "pads": pads},
                 loc=op.loc).result]


@canonical_patterns.on("where")
def constant_condition(op: Op, b: Builder) -> list[Value] | None:
    cond = constant_value(b.graph, op.operands[0])
    if cond is None or cond.size == 0:
        return None
    if np.all(cond):
        return _same_type(op, op.operands[1])
    if not np.any(cond):
        return _same_type(op, op.operands[2])
    return None


@graph_pass("canonicalize", "apply local identities (x+0, x*1, transpose/reshape chains, no-ops)")
def canonicalize(graph):
    apply_patterns(graph, canonical_patterns)
    return graph
