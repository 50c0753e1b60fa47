"""Helpers shared by op definitions: shape rules and operand checks.

Inference functions raise ShapeError with a plain message; the caller prefixes the op
and its origin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ember.dtypes import DType
from ember.errors import ShapeError
from ember.graph.ir import TensorType


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy broadcasting of shapes, or a ShapeError naming the dims that clash."""
    rank = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(rank):
        dim = 1
        for shape in shapes:
            d = shape[axis - rank + len(shape)] if axis - rank + len(shape) >= 0 else 1
            if d == 1:
                continue
            if dim not in (1, d):
                raise ShapeError(
                    f"shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast"
                    f" (dim {axis - rank} is {dim} vs {d})"
                )
            dim = d
        result.append(dim)
    return tuple(result)


def broadcastable_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [-rank, rank) as a non-negative index (a scalar has no axis)."""
    if not -rank <= axis < rank:
        raise ShapeError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def axis_of(t: TensorType, axis: int, what: str = "operand") -> int:
    """`axis` of `t` as a non-negative index; names `what` when `t` is a scalar."""
    if t.rank == 0:
        raise ShapeError(f"{what} must have rank >= 1, got {t}")
    return normalize_axis(axis, t.rank)


def normalize_axes(axes: Iterable[int], rank: int) -> tuple[int, ...]:
    normalized = [normalize_axis(a, rank) for a in axes]
    if len(set(normalized)) != len(normalized):
        raise ShapeError(f"axes {list(axes)} repeat an axis")
    return tuple(sorted(normalized))


def same_dtype(types: Sequence[TensorType], what: str = "operands") -> DType:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        raise ShapeError(f"{what} must have one dtype, got {', '.join(str(t) for t in types)}")
    return types[0].dtype


def require_dtype(t: TensorType, allowed: Iterable[DType], what: str = "operand") -> None:
    allowed = frozenset(allowed)
    if t.dtype not in allowed:
        names = ", ".join(sorted(d.value for d in allowed))
        raise ShapeError(f"{what} has dtype {t.dtype}, expected one of {names}")


def require_rank(t: TensorType, rank: int | Iterable[int], what: str = "operand") -> None:
    ranks = {rank} if isinstance(rank, int) else set(rank)
    if t.rank not in ranks:
        want = " or ".join(str(r) for r in sorted(ranks))
        raise ShapeError(f"{what} must have rank {want}, got {t}")


def require_scalar(t: TensorType, dtype: DType | Iterable[DType], what: str) -> None:
    if t.shape != ():
        raise ShapeError(f"{what} must be a scalar, got {t}")
    require_dtype(t, [dtype] if isinstance(dtype, DType) else dtype, what)


def require_len(values: Sequence, length: int, what: str) -> None:
    if len(values) != length:
        raise ShapeError(f"{what} must have {length} entries, got {len(values)}")
