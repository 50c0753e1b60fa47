"""What may fuse: op categories, the shapes of a fused kernel, and decisions with reasons.

Every graph op declares one category (`category=` in its `define`, ember/graph/ops/):

- **elementwise**: the value at an index is a function of the operands at the same
  (broadcast) index: add, exp, where, cast, ... and `broadcast`;
- **index map**: injective data movement whose value at an index is one load at a computed
  index: reshape, transpose, slice, iota;
- **reduction**: reduce_sum, reduce_prod, reduce_max, reduce_min;
- **contraction**: matmul, packed_matmul, conv, packed_conv, conv_transpose, max_pool, avg_pool,
  winograd_output: ops with a fast schedule of their own, which take fused consumers (an
  epilogue) but never producers;
- **opaque**: everything else; never fused.

Elementwise and index-map ops are *inlined*: a fused kernel computes their value where it
is used, as an expression, instead of storing it. A group of ops fuses when it has one of
four shapes (its `kind`), each lowering to one kernel:

- `injective`: only inlined ops; every output has the same shape, the kernel's one nest.
- `reduction`: one reduction whose input is computed by inlined producers, followed by an
  epilogue of elementwise ops on its result (same shape), e.g. mean = sum(x) * 1/n.
- `row`: reductions over the same axes of inputs of the same shape S (a "row"), and
  elementwise ops on their results: for each row, the reductions run in order into
  scalars and the outputs are written in one pass (softmax, layer-norm, RMS-norm).
- `contraction`: a contraction and an epilogue of elementwise ops on its result (bias,
  batch-norm scale and shift, activation, residual add, cast).

`classify` says which kind a group is, or why it is none; `can_fuse` adds the cost side:
inlining must not recompute a value of an op declared `expensive` many times.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ember.graph.ir import Op, Value
from ember.graph.ops.common import normalize_axes
from ember.graph.symbolic import size_hint

# Softmax and layer-norm need two reductions per row; each more would re-read the row.
MAX_ROW_REDUCTIONS = 2
KINDS = ("injective", "reduction", "row", "contraction")


def category(op: Op) -> str:
    """elementwise, index map, reduction, contraction or opaque, as the op declares."""
    return op.opdef.category


def inlinable(op: Op) -> bool:
    return category(op) in ("elementwise", "index map")


@dataclass(frozen=True)
class FusionPlan:
    """How a group lowers: its kind, its root (the reduction or contraction, if any), the
    shape of its main nest and, for `row`, the reduced axes."""

    kind: str
    shape: tuple[int, ...]
    root: Op | None = None
    axes: tuple[int, ...] = ()
    reductions: tuple[Op, ...] = ()

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True)
class Refusal:
    """Why a group cannot be one kernel; falsy, so `if classify(...)` reads naturally."""

    reason: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True)
class Decision:
    """The answer of `can_fuse`: yes with the plan and the bytes saved, or no with a reason."""

    plan: FusionPlan | None
    reason: str = ""
    bytes_saved: int = 0
    details: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.plan is not None


def reachable_from(sources: Iterable[Op], ops: Sequence[Op]) -> set[Op]:
    """The ops of `ops` (in order) that use a result of `sources`, transitively."""
    reached = set(sources)
    values = {r for op in reached for r in op.results}
    for op in ops:
        if op not in reached and any(v in values for v in op.operands):
            reached.add(op)
            values.update(op.results)
    return reached


def classify(ops: Sequence[Op], outputs: Sequence[Value]) -> FusionPlan | Refusal:
    """The kind of kernel the group `ops` (in program order) lowers to, given the values
    `outputs` it must write; or the reason it cannot be one kernel."""
    if not ops:
        return Refusal("an empty group")
    members = set(ops)
    for value in outputs:
        if value.producer not in members:
            return Refusal(f"it yields {value!r}, which it does not compute")
    for op in ops:
        if category(op) == "opaque":
            return Refusal(f"{op.where()} is not fusable")
        if op.regions:
            return Refusal(f"{op.where()} has regions")
    contractions = [op for op in ops if category(op) == "contraction"]
    reductions = [op for op in ops if category(op) == "reduction"]
    if len(contractions) > 1:
        return Refusal(f"two contractions ({contractions[0].where()} and"
                       f" {contractions[1].where()}) cannot share a kernel")
    if contractions and reductions:
        return Refusal(f"a contraction ({contractions[0].where()}) and a reduction"
                       f" ({reductions[0].where()}) cannot share a kernel")
    if contractions:
        return _with_epilogue("contraction", contractions[0], ops, outputs)
    if len(reductions) == 1:
        plan = _with_epilogue("reduction", reductions[0], ops, outputs)
        if plan:
            return plan
    if reductions:
        return _row(reductions, ops, outputs)
    shapes = {v.shape for v in outputs}
    if len(shapes) > 1:
        return Refusal("outputs of different shapes "
                       + ", ".join(sorted(str(list(s)) for s in shapes)) + " need two nests")
    return FusionPlan("injective", outputs[0].shape if outputs else ops[-1].results[0].shape)


def _with_epilogue(kind: str, root: Op, ops: Sequence[Op],
                   outputs: Sequence[Value]) -> FusionPlan | Refusal:
    """A root (reduction or contraction) with inlined producers (reductions only) and an
    epilogue: elementwise ops on the root's value, at the root's own index."""
    members = set(ops)
    shape = root.result.shape
    epilogue = reachable_from([root], ops) - {root}
    for value in root.operands:
        producer = value.producer
        if kind == "contraction" and producer in members:
            return Refusal(f"{root.where()} would recompute its producer {producer.where()}"
                           " at every use (contractions take no producers)")
    for op in epilogue:
        if category(op) != "elementwise":
            return Refusal(f"{op.where()} after {root.where()} is not elementwise")
        if op.result.shape != shape:
            return Refusal(f"{op.where()} changes the shape of {root.where()}'s result")
        for value in op.operands:
            if (value.producer is root or value.producer in epilogue) and value.shape != shape:
                return Refusal(f"{op.where()} broadcasts a value computed in the epilogue")
    for value in outputs:
        if value.producer is not root and value.producer not in epilogue:
            return Refusal(f"{value.producer.where()} is needed outside the group but is"
                           f" inlined into {root.where()}")
    if kind == "reduction" and any(category(op) == "reduction" for op in ops if op is not root):
        return Refusal("more than one reduction")
    return FusionPlan(kind, shape, root)


def _row(reductions: Sequence[Op], ops: Sequence[Op],
         outputs: Sequence[Value]) -> FusionPlan | Refusal:
    """Reductions over the same axes of same-shaped inputs, and elementwise ops on them."""
    first = reductions[0]
    shape = first.operands[0].shape
    axes = normalize_axes(first.attrs["axes"], len(shape))
    if not axes:
        return Refusal(f"{first.where()} reduces no axis")
    if len(reductions) > MAX_ROW_REDUCTIONS:
        return Refusal(f"{len(reductions)} reductions in one row kernel (at most"
                       f" {MAX_ROW_REDUCTIONS}: each re-reads the row and recomputes its"
                       " inlined producers)")
    for op in reductions:
        if op.operands[0].shape != shape or normalize_axes(op.attrs["axes"], len(shape)) != axes:
            return Refusal(f"{op.where()} and {first.where()} reduce different rows")
        if not op.attrs["keepdims"]:
            return Refusal(f"{op.where()} drops the reduced axes (row fusion keeps them)")
    reduced = tuple(1 if a in axes else d for a, d in enumerate(shape))
    row_shapes = {shape, reduced}
    dependent = reachable_from(reductions, ops)
    for op in dependent:
        if op in reductions:
            continue
        if category(op) != "elementwise":
            return Refusal(f"{op.where()} moves data computed from a row's reduction")
        if op.result.shape not in row_shapes:
            return Refusal(f"{op.where()} has shape {list(op.result.shape)}, outside the row"
                           f" {list(shape)}")
        for value in op.operands:
            if value.producer in dependent and value.shape not in row_shapes:
                return Refusal(f"{op.where()} reads a reduced value of another shape")
    for value in outputs:
        if value.shape not in row_shapes:
            return Refusal(f"output {value!r} of {value.producer.where()} is not of the row's"
                           f" shape {list(shape)} or {list(reduced)}")
    return FusionPlan("row", shape, None, axes, tuple(reductions))


def iterations(plan: FusionPlan) -> int:
    """About how many times a kernel of `plan` evaluates its inlined expressions."""
    count = 1
    for d in plan.shape:
        count *= size_hint(d)
    if plan.kind == "reduction" and plan.root is not None:
        count = max(count, size_hint(plan.root.operands[0].type.numel))
    return count


def recomputed(plan: FusionPlan, ops: Sequence[Op]) -> Op | None:
    """An expensive inlined op that the kernel would evaluate for many more elements than
    it has (its value broadcast), if any."""
    total = iterations(plan)
    for op in ops:
        # Each element read recomputes an inlined value: worth it only for cheap ops.
        if "expensive" in op.opdef.traits and inlinable(op) and \
                2 * size_hint(op.result.type.numel) <= total:
            if plan.kind in ("reduction", "contraction", "row") and _epilogue_sized(op, plan):
                continue
            return op
    return None


def _epilogue_sized(op: Op, plan: FusionPlan) -> bool:
    """Whether `op` runs once per output element of a root (an epilogue op, not recomputed)."""
    if plan.kind == "row":
        return op.result.shape == tuple(1 if a in plan.axes else d
                                        for a, d in enumerate(plan.shape))
    return op.result.shape == plan.shape
