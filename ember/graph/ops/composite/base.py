"""Helpers shared by the composite op definitions."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from ember.dtypes import FLOAT_TYPES, INT_TYPES, DType
from ember.errors import ShapeError
from ember.graph.ir import Value
from ember.graph.ops.common import (
    require_dtype,
)
from ember.graph.ops.registry import Attr, define

HALF_TYPES = frozenset({DType.f16, DType.bf16})
FLOAT_OR_INT = FLOAT_TYPES | INT_TYPES



# -- helpers -------------------------------------------------------------------------------
def composite(name: str, *, arity: int | tuple[int, int | None], infer, reference, decompose,
              attrs: dict[str, Attr] | None = None, summary: str = "",
              elementwise: bool = False) -> None:
    traits = ("composite", "pure", *(("elementwise",) if elementwise else ()))
    define(name, arity=arity, infer=infer, reference=reference, attrs=attrs, traits=traits,
           decompose=decompose, summary=summary, family="composite")


def in_f32(fn: Callable) -> Callable:
    """Wrap a decomposition so that f16/bf16 operands compute in f32 and round at the end."""

    @functools.wraps(fn)
    def decompose(b, operands: Sequence[Value], attrs: dict) -> list[Value]:
        if not any(v.dtype in HALF_TYPES for v in operands):
            return list(fn(b, list(operands), attrs))
        half = next(v.dtype for v in operands if v.dtype in HALF_TYPES)
        wide = [b.cast(v, to=DType.f32) if v.dtype in HALF_TYPES else v for v in operands]
        results = fn(b, wide, attrs)
        return [b.cast(r, to=half) if r.dtype is DType.f32 else r for r in results]

    return decompose


def scalar(b, value: float, like: Value) -> Value:
    """A scalar constant of `like`'s dtype (for ops like `where` whose first operand is not)."""
    return b.constant(np.asarray(value, dtype=like.dtype.np))


def channel_shape(rank: int, channels: int) -> tuple[int, ...]:
    """The shape that broadcasts a per-channel [C] vector against [N, C, *] of `rank`."""
    return (channels,) + (1,) * (rank - 2)


def float_unary_infer(check: Callable[[dict], None] | None = None, allowed=FLOAT_TYPES):
    def infer(types, attrs):
        require_dtype(types[0], allowed)
        if check is not None:
            check(attrs)
        return types[0]

    return infer


def finite(*names: str) -> Callable[[dict], None]:
    def check(attrs):
        for name in names:
            if not math.isfinite(attrs[name]):
                raise ShapeError(f"{name} must be finite, got {attrs[name]}")

    return check
