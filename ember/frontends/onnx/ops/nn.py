"""Converters of ONNX reductions, ArgMax/ArgMin and the matrix products (MatMul, Gemm, Einsum).

Convolutions and pools are in nn_conv.py, normalizations in nn_norm.py, Resize in
nn_resize.py, quantized ops in nn_quant.py.
"""

from __future__ import annotations

import itertools
import math
import string

import numpy as np

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter
from ember.graph.ir import Value

# ONNX reduction -> (IR op, dtypes the IR op takes: "float" or "numeric").
REDUCTIONS = {
    "ReduceSum": ("reduce_sum", "numeric"),
    "ReduceProd": ("reduce_prod", "numeric"),
    "ReduceMax": ("reduce_max", "numeric"),
    "ReduceMin": ("reduce_min", "numeric"),
    "ReduceL1": ("reduce_l1", "numeric"),
    "ReduceSumSquare": ("reduce_sum_square", "numeric"),
    "ReduceMean": ("reduce_mean", "float"),
    "ReduceL2": ("reduce_l2", "float"),
    "ReduceLogSumExp": ("reduce_logsumexp", "float"),
    "ReduceLogSum": ("reduce_sum", "float"),  # then log
}


def normalize_axes(ctx: ConvertContext, axes, rank: int) -> tuple[int, ...]:
    """`axes` as sorted non-negative ints, checked against `rank`."""
    out = []
    for a in axes:
        a = int(a)
        if not -rank <= a < rank:
            raise ctx.error(f"axis {a} is out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ctx.error(f"axes {list(axes)} repeat an axis")
    return tuple(sorted(out))


def reduction_axes(ctx: ConvertContext, rank: int) -> tuple[int, ...]:
    """The axes a Reduce* node reduces: an attribute before opset 13 (ReduceSum) or 18
    (the others), then an optional input. Empty means all axes, or none at all (the
    elementwise part still applies) under noop_with_empty_axes."""
    as_input = ctx.opset >= (13 if ctx.op_type == "ReduceSum" else 18)
    if as_input:
        axes = [] if ctx.input(1) is None else ctx.const(1, "axes").reshape(-1).tolist()
    else:
        axes = ctx.attr("axes", [])
    if not axes:
        noop = as_input and ctx.attr("noop_with_empty_axes", 0)
        return () if noop else tuple(range(rank))
    return normalize_axes(ctx, axes, rank)


@converter(*REDUCTIONS)
def reduce(ctx: ConvertContext):
    x = ctx.require(0)
    axes = reduction_axes(ctx, len(x.shape))
    keepdims = bool(ctx.attr("keepdims", 1))
    op, accepts = REDUCTIONS[ctx.op_type]
    b = ctx.b
    dtype = x.dtype
    if dtype is DType.bool:  # ReduceMax/Min on bool (opset 20): as 0/1 bytes
        if ctx.op_type not in ("ReduceMax", "ReduceMin"):
            raise ctx.unsupported("only ReduceMax and ReduceMin take bool inputs")
        x = b.cast(x, to=DType.u8)
    elif accepts == "float" and not dtype.is_float:
        # Integer means and norms: compute in f64, truncate back as the reference does.
        x = b.cast(x, to=DType.f64)
    y = getattr(b, op)(x, axes=axes, keepdims=keepdims)
    if ctx.op_type == "ReduceLogSum":
        y = b.log(y)
    return y if y.dtype is dtype else b.cast(y, to=dtype)


@converter("ArgMax", "ArgMin")
def arg_extreme(ctx: ConvertContext):
    x = ctx.require(0)
    op = ctx.b.argmax if ctx.op_type == "ArgMax" else ctx.b.argmin
    x = ctx.b.cast(x, to=DType.u8) if x.dtype is DType.bool else x
    return op(x, axis=ctx.attr("axis", 0), keepdims=bool(ctx.attr("keepdims", 1)),
              select_last_index=bool(ctx.attr("select_last_index", 0)))


# -- matrix products ---------------------------------------------------------------------


@converter("MatMul")
def matmul(ctx: ConvertContext):
    return ctx.b.matmul(ctx.require(0), ctx.require(1))


def swap_last(b, x: Value) -> Value:
    """x with its last two axes swapped."""
    rank = len(x.shape)
    perm = (*range(rank - 2), rank - 1, rank - 2)
    return b.transpose(x, perm=perm)


@converter("Gemm")
def gemm(ctx: ConvertContext):
    b = ctx.b
    a, w, c = ctx.require(0), ctx.require(1), ctx.input(2)
    if len(a.shape) != 2 or len(w.shape) != 2:
        raise ctx.error(f"A and B must be matrices, got {a.type} and {w.type}")
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if not a.dtype.is_float and (alpha != int(alpha) or beta != int(beta)):
        raise ctx.unsupported("fractional alpha or beta on integer matrices")
    if ctx.attr("transA", 0):
        a = swap_last(b, a)
    if ctx.attr("transB", 0):
        w = swap_last(b, w)
    y = b.matmul(a, w)
    if alpha != 1.0:
        y = b.mul(y, alpha)
    if c is not None and beta != 0.0:
        y = b.add(y, c if beta == 1.0 else b.mul(c, beta))
    return y


# -- Einsum ----------------------------------------------------------------------------------


class _Term:
    """An Einsum operand: a value and one label per axis."""

    def __init__(self, value: Value, labels: str):
        self.value, self.labels = value, labels

    def size(self, label: str) -> int:
        return self.value.shape[self.labels.index(label)]


def parse_einsum(ctx: ConvertContext, equation: str, ranks: list[int]):
    """(input label strings, output label string) with each '...' replaced by labels of
    its own (from the characters after 'z'), right-aligned across operands."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    specs = lhs.split(",")
    if len(specs) != len(ranks):
        raise ctx.error(f"equation '{equation}' has {len(specs)} operands, given"
                        f" {len(ranks)}")
    ell_rank = 0
    for spec, rank in zip(specs, ranks):
        if "..." in spec:
            ell_rank = max(ell_rank, rank - len(spec.replace("...", "")))
    ell = "".join(chr(0x100 + i) for i in range(ell_rank))
    inputs = []
    for spec, rank in zip(specs, ranks):
        letters = spec.replace("...", "")
        if any(c not in string.ascii_letters for c in letters):
            raise ctx.error(f"equation '{equation}' has a label that is not a letter")
        n = rank - len(letters)
        if n < 0 or (n > 0 and "..." not in spec):
            raise ctx.error(f"operand '{spec}' does not match rank {rank}")
        inputs.append(spec.replace("...", ell[ell_rank - n:]))
    if arrow:
        output = rhs.replace("...", ell)
    else:  # implicit output: the broadcast dims, then the labels used once, sorted
        counts = "".join(specs).replace("...", "")
        output = ell + "".join(sorted(c for c in set(counts) if counts.count(c) == 1))
    return inputs, output


def _diagonal(b, term: _Term) -> _Term:
    """Take the diagonal over every label repeated within the operand."""
    while True:
        repeated = next((c for c in term.labels if term.labels.count(c) > 1), None)
        if repeated is None:
            return term
        i = term.labels.index(repeated)
        j = term.labels.index(repeated, i + 1)
        rest = [k for k in range(len(term.labels)) if k not in (i, j)]
        x = b.transpose(term.value, perm=(*rest, i, j))
        n = term.value.shape[i]
        # The diagonal of an n x n block is every (n+1)-th element of its flattening.
        lead = x.shape[:-2]
        x = b.reshape(x, shape=(*lead, n * n))
        x = b.slice(x, starts=(0,) * len(lead) + (0,), ends=(*lead, n * n),
                    steps=(1,) * len(lead) + (n + 1,))
        term = _Term(x, "".join(term.labels[k] for k in rest) + repeated)


def _sum_out(b, term: _Term, keep: set[str]) -> _Term:
    axes = tuple(i for i, c in enumerate(term.labels) if c not in keep)
    if not axes:
        return term
    value = b.reduce_sum(term.value, axes=axes, keepdims=False)
    return _Term(value, "".join(c for c in term.labels if c in keep))


def _contract(b, x: _Term, y: _Term, keep: set[str]) -> _Term:
    """The product of two terms summed over their shared labels not in `keep`, as one
    batched matmul [batch, left, inner] @ [batch, inner, right]."""
    batch = [c for c in x.labels if c in y.labels and c in keep]
    inner = [c for c in x.labels if c in y.labels and c not in keep]
    left = [c for c in x.labels if c not in y.labels]
    right = [c for c in y.labels if c not in x.labels]
    sizes = {c: max(x.size(c) if c in x.labels else 1, y.size(c) if c in y.labels else 1)
             for c in x.labels + y.labels}

    def arrange(term: _Term, order: list[str], groups: list[list[str]]) -> Value:
        value = b.transpose(term.value, perm=tuple(term.labels.index(c) for c in order))
        full = tuple(sizes[c] for c in order)
        if value.shape != full:  # broadcast dims of size 1 (from '...')
            value = b.broadcast(value, shape=full)
        return b.reshape(value, shape=tuple(math.prod(sizes[c] for c in g) for g in groups))

    xv = arrange(x, batch + left + inner, [batch, left, inner])
    yv = arrange(y, batch + inner + right, [batch, inner, right])
    out = b.matmul(xv, yv)
    labels = batch + left + right
    return _Term(b.reshape(out, shape=tuple(sizes[c] for c in labels)), "".join(labels))


@converter("Einsum", since=12)
def einsum(ctx: ConvertContext):
    b = ctx.b
    values = [ctx.require(i) for i in range(len(ctx.node.input))]
    inputs, output = parse_einsum(ctx, ctx.attr("equation", ""), [len(v.shape) for v in values])
    if len(set(output)) != len(output) or any(c not in "".join(inputs) for c in output):
        raise ctx.error(f"invalid Einsum output '{ctx.attr('equation')}'")
    terms = [_diagonal(b, _Term(v, s)) for v, s in zip(values, inputs)]

    def needed(rest: list[_Term]) -> set[str]:
        return set(output).union(*(t.labels for t in rest))

    # Sum each label as soon as no later operand and not the output needs it.
    acc = _sum_out(b, terms[0], needed(terms[1:]))
    for k, term in enumerate(terms[1:], 1):
        keep = needed(terms[k + 1:])
        term = _sum_out(b, term, keep | set(acc.labels))
        acc = _sum_out(b, acc, keep | set(term.labels))
        acc = _contract(b, acc, term, keep)
    acc = _sum_out(b, acc, set(output))
    value = acc.value
    if acc.labels != output:
        value = b.transpose(value, perm=tuple(acc.labels.index(c) for c in output))
    return value



@converter("Det", since=11)
def det(ctx: ConvertContext):
    """The determinant of [..., M, M] by the Leibniz formula (a sum over the M!
    permutations), for M <= 4."""
    b = ctx.b
    x = ctx.require(0)
    *batch, m, n = x.shape
    if m != n:
        raise ctx.error(f"Det needs square matrices, got {x.type}")
    if m > 4:
        raise ctx.unsupported(f"Det of {m}x{m} matrices (at most 4x4 is supported)")
    if m == 0:
        return b.broadcast(b.constant(np.ones((), x.dtype.np)), shape=tuple(batch))
    rank = len(x.shape)
    entries = [[b.reshape(b.slice(x, starts=(0,) * (rank - 2) + (i, j),
                                  ends=(*batch, i + 1, j + 1), steps=(1,) * rank),
                          shape=tuple(batch)) for j in range(m)] for i in range(m)]
    total = None
    for perm in itertools.permutations(range(m)):
        term = entries[0][perm[0]]
        for i in range(1, m):
            term = b.mul(term, entries[i][perm[i]])
        inversions = sum(perm[i] > perm[j] for i in range(m) for j in range(i + 1, m))
        if total is None:  # the identity permutation comes first: its sign is +
            total = term
        else:
            total = (b.sub if inversions % 2 else b.add)(total, term)
    return total
